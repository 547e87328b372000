"""Amazon Bedrock: the group judge's Converse call (``bedrock-runtime``) and the lookups the refusals before
billing make (``bedrock`` control plane).

``converse`` sends one Converse request (botocore's ``bedrock-runtime`` 2023-09-30 model: ``POST
/model/{modelId}/converse``; the IAM action is ``bedrock:InvokeModel``) and makes exactly one attempt:
botocore's own retries are off, so every attempt passes the judge's requests-per-second limiter and its
deadline (`stepwise.judging`). How a failure is treated is classified here, once:

- `is_throttled`: the service said "later" (ThrottlingException, ServiceUnavailableException,
  InternalServerException, ModelNotReadyException, ModelTimeoutException, HTTP 429 / 5xx) or the request
  never got an answer (connection errors, a read past ``judge.timeout_seconds``): waited out and sent again,
  never failing the step;
- `is_refused`: the judge cannot be called at all (AccessDeniedException, ResourceNotFoundException,
  UnrecognizedClientException, ...): every group would fail alike, so the run fails loudly (preflight
  should have refused it);
- anything else (ValidationException: the judged text too long for the model; ModelErrorException) counts
  as an invalid answer of the group (`stepwise.judging` asks again, then falls back).

``model_problem`` (Init's refusal and ``stepwise validate --check-aws``) looks a model up where the run
calls it: GetInferenceProfile for an inference profile (its id, ``us.`` ..., or ARN), GetFoundationModel
for a foundation model, and says what stops the judge from calling it on demand.

boto3 honours ``AWS_ENDPOINT_URL_BEDROCK_RUNTIME`` and ``AWS_ENDPOINT_URL_BEDROCK`` (the local Bedrock
emulator, `local.bedrock`).
"""

from __future__ import annotations

import functools
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from stepwise import settings
from stepwise.aws.clients import client_config
from stepwise.core.prices import BEDROCK_PROFILE_PREFIXES

#: Error codes after which the same request may succeed later (the Bedrock API reference's errors of
#: Converse: throttling, 5xx, a model still loading or slow).
THROTTLING_CODES = frozenset({"ThrottlingException", "ServiceUnavailableException", "InternalServerException",
                              "ModelNotReadyException", "ModelTimeoutException", "TooManyRequestsException",
                              "ServiceQuotaExceededException", "InternalFailure", "ServiceUnavailable"})
#: Error codes that mean the judge cannot be called at all (IAM, the model, the credentials).
REFUSED_CODES = frozenset({"AccessDeniedException", "ResourceNotFoundException", "UnrecognizedClientException",
                           "AccessDenied", "ExpiredTokenException", "InvalidSignatureException"})
#: Connection-level failures: no answer came back (a read past the timeout included).
_NO_ANSWER = (ConnectTimeoutError, ReadTimeoutError, EndpointConnectionError, ConnectionClosedError)


def error_code(error: BaseException) -> str:
    """The service's error code of a botocore ClientError ('' for anything else)."""
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code", ""))
    return ""


def describe(error: BaseException) -> str:
    """``Code (HTTP status): message`` of a ClientError, else ``Type: message``."""
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{error_code(error)} ({status}): {error.response.get('Error', {}).get('Message', '')}"
    return f"{type(error).__name__}: {error}"


def is_throttled(error: BaseException) -> bool:
    """Whether the request may succeed if sent again later (see the module doc)."""
    if isinstance(error, _NO_ANSWER):
        return True
    if isinstance(error, ClientError):
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        return error_code(error) in THROTTLING_CODES or status == 429 or status >= 500
    return False


def is_refused(error: BaseException) -> bool:
    """Whether the judge cannot be called at all (IAM, a model that does not exist, the credentials), or the
    client is not pointed anywhere it may call (a BotoCoreError that is not a connection failure)."""
    if isinstance(error, ClientError):
        return error_code(error) in REFUSED_CODES
    return isinstance(error, BotoCoreError) and not isinstance(error, _NO_ANSWER)


@functools.lru_cache(maxsize=16)
def _runtime(region: str, timeout_s: float, pool: int, _endpoint: str) -> Any:
    import boto3

    config = client_config(read_timeout=timeout_s, connect_timeout=min(10.0, timeout_s),
                           retries={"mode": "standard", "total_max_attempts": 1}, max_pool_connections=pool)
    return boto3.client("bedrock-runtime", region_name=region or None, config=config)


def runtime_client(region: str, *, timeout_s: float, concurrency: int) -> Any:
    """A ``bedrock-runtime`` client in ``region``: one attempt per call (botocore retries off), the read timeout
    ``timeout_s``, a connection per concurrent group (one per region, settings and endpoint)."""
    return _runtime(region, float(timeout_s), max(2, int(concurrency)),
                    settings.current().endpoint("BEDROCK_RUNTIME"))


def converse(client: Any, request: dict[str, Any]) -> dict[str, Any]:
    """One Converse request (``request`` = the boto3 keyword arguments, `stepwise.core.judge.converse_request`);
    the response without its ``ResponseMetadata``. Raises botocore's errors (classify with `is_throttled`,
    `is_refused`)."""
    response = dict(client.converse(**request))
    response.pop("ResponseMetadata", None)
    return response


def answer_usage(response: dict[str, Any]) -> tuple[int, int]:
    """``(inputTokens, outputTokens)`` of a Converse response's ``usage`` (0 for what it lacks)."""
    usage = response.get("usage") or {}

    def count(name: str) -> int:
        try:
            return max(0, int(usage.get(name) or 0))
        except (TypeError, ValueError):
            return 0
    return count("inputTokens"), count("outputTokens")


# ---------------------------------------------------------------------------- the refusals before billing


@functools.lru_cache(maxsize=8)
def _control(region: str, _endpoint: str) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client("bedrock", region_name=region or None, config=Config(retries={"mode": "standard",
                                                                                       "max_attempts": 4}))


def control_client(region: str) -> Any:
    """A ``bedrock`` control-plane client in ``region``."""
    return _control(region, settings.current().endpoint("BEDROCK"))


def is_inference_profile(model_id: str) -> bool:
    """Whether ``model_id`` names an inference profile (a system profile id such as ``us.amazon.nova-micro-v1:0``,
    or an inference profile / application inference profile ARN) rather than a foundation model."""
    if model_id.startswith("arn:"):
        return ":inference-profile/" in model_id or ":application-inference-profile/" in model_id
    return model_id.startswith(BEDROCK_PROFILE_PREFIXES)


def model_problem(region: str, model_id: str, client: Any = None) -> str:
    """'' when the judge can call ``model_id`` on demand in ``region``; else what is wrong, in words: the model or
    profile does not exist there, is not ACTIVE, is a foundation model that is invoked only through an
    inference profile (the profile id to use is named) or that cannot be looked up with these credentials."""
    client = client or control_client(region)
    try:
        if is_inference_profile(model_id):
            profile = client.get_inference_profile(inferenceProfileIdentifier=model_id)
            status = profile.get("status")
            return "" if status in (None, "ACTIVE") else f"the inference profile is {status}, not ACTIVE"
        details = client.get_foundation_model(modelIdentifier=model_id).get("modelDetails") or {}
    except ClientError as e:
        code = error_code(e)
        if code in ("ResourceNotFoundException", "ValidationException"):
            return f"Bedrock has no such model or inference profile in {region} ({describe(e)})"
        if code in ("AccessDeniedException", "AccessDenied"):
            return f"cannot be looked up with these credentials in {region} ({describe(e)})"
        return f"cannot be checked ({describe(e)})"
    except BotoCoreError as e:
        return f"cannot be checked ({type(e).__name__}: {e})"
    lifecycle = (details.get("modelLifecycle") or {}).get("status")
    if lifecycle not in (None, "ACTIVE", "LEGACY"):
        return f"the model's lifecycle status is {lifecycle}"
    kinds = details.get("inferenceTypesSupported") or []
    if kinds and "ON_DEMAND" not in kinds:
        geo = {"ap": "apac"}.get(region.split("-", 1)[0], region.split("-", 1)[0])
        return (f"the model is not offered on demand in {region} (inferenceTypesSupported: {', '.join(kinds)}): call "
                f"it through a cross-Region inference profile, e.g. {geo}.{model_id} or global.{model_id}")
    text = "TEXT" in (details.get("outputModalities") or ["TEXT"])
    return "" if text else "the model does not answer in text"
