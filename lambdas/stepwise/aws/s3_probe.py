"""S3 lookups for the refusals before billing (`stepwise.core.preflight`): read-only, one call each.

Each function answers '' when the location is usable, else the problem in words (the caller adds
the field and the value). An answer of AccessDenied means the caller's credentials (Init's role,
or the operator's for ``stepwise validate --check-aws``) cannot reach it; when S3 cannot be asked at
all (no endpoint, no credentials: botocore's BotoCoreError) the answer says it cannot be checked.
"""

from __future__ import annotations

from typing import Any

from botocore.exceptions import BotoCoreError, ClientError


def _code(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Code", ""))


def bucket_problem(s3: Any, bucket: str) -> str:
    """HeadBucket: '' if the bucket exists and these credentials may use it."""
    try:
        s3.head_bucket(Bucket=bucket)
    except ClientError as e:
        code = _code(e)
        if code in ("404", "NoSuchBucket", "NotFound"):
            return f"bucket {bucket!r} does not exist"
        if code in ("403", "AccessDenied", "Forbidden"):
            return f"bucket {bucket!r} is not reachable with these credentials (HeadBucket: access denied)"
        return f"bucket {bucket!r} cannot be checked (HeadBucket: {code or e})"
    except BotoCoreError as e:  # no endpoint, no credentials: nothing was learnt (as agentcore_control says)
        return f"bucket {bucket!r} cannot be checked (HeadBucket: {e})"
    return ""


def as_prefix(key: str) -> str:
    """``key`` as a "folder" prefix: ends with ``/`` unless it is '' (the bucket's root)."""
    return key if not key or key.endswith("/") else key + "/"


def prefix_problem(s3: Any, bucket: str, key: str) -> str:
    """ListObjectsV2: '' if at least one file sits directly under the prefix ``key`` (what Init
    copies for the gateway: ``handlers.init.cache_tokenizer``)."""
    prefix = as_prefix(key)
    try:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
            if any(obj["Key"] != prefix for obj in page.get("Contents", [])):
                return ""
    except ClientError as e:
        return f"prefix s3://{bucket}/{prefix} cannot be listed (ListObjectsV2: {_code(e) or e})"
    except BotoCoreError as e:
        return f"prefix s3://{bucket}/{prefix} cannot be listed (ListObjectsV2: {e})"
    return f"no files directly under s3://{bucket}/{prefix}"


def probes(s3: Any, tokens: list | None = None) -> Any:
    """The real lookups of the refusals before billing (`stepwise.core.preflight.Probes`): these S3
    checks with client ``s3``, the runtime's `stepwise.aws.agentcore.runtime_problem`, the base model's
    `stepwise.aws.hub.base_model_problem` and its tokenizer's `stepwise.aws.hub.tokenizer_source` (with ``tokens``,
    default this process's `stepwise.aws.hub.token_sources`), the model packages'
    `stepwise.aws.sagemaker.model_package_problem` and the judge model's `stepwise.aws.bedrock.model_problem`."""
    from stepwise.aws.agentcore import runtime_problem
    from stepwise.aws.bedrock import model_problem
    from stepwise.aws.hub import base_model_problem, tokenizer_probe
    from stepwise.aws.sagemaker import model_package_problem
    from stepwise.core.preflight import Probes

    return Probes(bucket=bucket_problem, prefix=prefix_problem, runtime=runtime_problem, s3=s3,
                  base_model=base_model_problem, tokenizer=tokenizer_probe(tokens), model_package=model_package_problem,
                  judge_model=model_problem)
