"""Secrets Manager: a secret's string, read once per container (the W&B API key of the Track function).

``GetSecretValue`` (botocore ``secretsmanager`` model); the stack grants it on the one secret it is
told about (CDK context ``wandbApiKeySecretArn``). The value is never logged.
"""

from __future__ import annotations

import json
import threading
from typing import Any

_CACHE: dict[str, str] = {}
_LOCK = threading.Lock()


def secret_string(arn: str, *, client: Any = None, field: str = "") -> str:
    """The secret's ``SecretString`` (cached per container); with ``field``, that key of its JSON
    (a secret stored as ``{"WANDB_API_KEY": "..."}``). A JSON secret with one string value gives that
    value when ``field`` is ''. Raises botocore's ClientError (AccessDenied, ResourceNotFound) or
    KeyError naming the missing field."""
    with _LOCK:
        if arn not in _CACHE:
            if client is None:
                import boto3

                from stepwise.aws.clients import client_config

                client = boto3.client("secretsmanager", region_name=_region(arn), config=client_config())
            _CACHE[arn] = client.get_secret_value(SecretId=arn)["SecretString"]
        text = _CACHE[arn]
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        if field:
            if field not in body:
                raise KeyError(f"secret {arn} has no field {field!r} (fields: {sorted(body)})")
            return str(body[field])
        values = [v for v in body.values() if isinstance(v, str)]
        if len(values) == 1:
            return values[0]
    return text


def _region(arn: str) -> str | None:
    parts = arn.split(":")
    return parts[3] if len(parts) > 4 and parts[3] else None
