"""AgentCore Runtime: the control-plane lookup the refusals before billing make
(``bedrock-agentcore-control``), and ``InvokeAgentRuntime`` (``bedrock-agentcore``, StartRollout).

``GetAgentRuntime`` (botocore model ``bedrock-agentcore-control``: ``GET /runtimes/{agentRuntimeId}/``)
takes the runtime *id*, the last part of the ARN ``arn:PARTITION:bedrock-agentcore:REGION:ACCOUNT:
runtime/ID``, and answers in the region its client is built for; so the client is built in the ARN's
region. boto3 honours ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL`` (the local ACR emulator).
"""

from __future__ import annotations

import functools
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from stepwise import settings
from stepwise.aws.clients import client_config
from stepwise.stackinfo import region_of_arn

#: InvokeAgentRuntime error codes that mean "too fast" (the state machine retries with backoff and jitter).
THROTTLING_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException", "RetryableConflictException",
                              "TooManyRequestsException"})

#: The status in which a runtime can be invoked (the model's ``AgentRuntimeStatus`` enum).
READY = "READY"


def runtime_id(arn: str) -> str:
    """``ID`` of ``...:runtime/ID`` (raises ValueError for another resource)."""
    _, sep, rid = arn.partition(":runtime/")
    if not sep or not rid:
        raise ValueError(f"not an AgentCore runtime ARN (expected ...:runtime/ID): {arn!r}")
    return rid.split("/", 1)[0]


@functools.lru_cache(maxsize=8)
def _client(region: str, _endpoint: str) -> Any:
    import boto3

    return boto3.client("bedrock-agentcore-control", region_name=region,
                        config=Config(retries={"mode": "standard", "max_attempts": 4}))


def client_for(arn: str) -> Any:
    """A ``bedrock-agentcore-control`` client in the runtime's region (one per region and endpoint)."""
    return _client(region_of_arn(arn), settings.current().endpoint("BEDROCK_AGENTCORE_CONTROL"))


def get_agent_runtime(arn: str) -> dict[str, Any]:
    """GetAgentRuntime of the runtime ``arn`` names (raises botocore's ClientError)."""
    return client_for(arn).get_agent_runtime(agentRuntimeId=runtime_id(arn))


def runtime_problem(arn: str) -> str:
    """'' if the runtime exists, is this ARN and is READY; else what is wrong, in words."""
    region = region_of_arn(arn)
    try:
        rt = get_agent_runtime(arn)
    except ClientError as e:
        err = e.response.get("Error", {})
        code, msg = err.get("Code", ""), err.get("Message", "")
        if code == "ResourceNotFoundException":
            return f"no agent runtime {runtime_id(arn)!r} in {region} (GetAgentRuntime: {code}: {msg})"
        if code == "AccessDeniedException":
            return f"the runtime cannot be looked up with these credentials (GetAgentRuntime: {code}: {msg})"
        return f"the runtime cannot be checked (GetAgentRuntime: {code}: {msg})"
    except BotoCoreError as e:  # no endpoint, no credentials: nothing was learnt about the runtime
        return f"the runtime cannot be checked (GetAgentRuntime: {e})"
    found = rt.get("agentRuntimeArn", "")
    if found and found != arn:
        return f"runtime {runtime_id(arn)!r} in {region} is {found}, not this ARN (another account?)"
    status = rt.get("status", "")
    if status != READY:
        reason = f": {rt['failureReason']}" if rt.get("failureReason") else ""
        return f"the runtime's status is {status}, not {READY}, so it cannot be invoked{reason}"
    return ""


class AgentRuntimeThrottled(RuntimeError):
    """ACR refused the invoke for rate (retried by the state machine with backoff and jitter)."""


@functools.lru_cache(maxsize=8)
def _data_client(region: str, _endpoint: str) -> Any:
    import boto3

    # Few in-client retries: the state machine's Retry (backoff + full jitter) paces throttled starts.
    return boto3.client("bedrock-agentcore", region_name=region,
                        config=client_config(retries={"mode": "standard", "max_attempts": 2}))


def data_client(agent_runtime_arn: str, default_region: str) -> Any:
    """A ``bedrock-agentcore`` client in the runtime's own region (read from its ARN), one per
    region, endpoint and container (creating a boto3 client costs ~10-50 ms of CPU)."""
    parts = agent_runtime_arn.split(":")
    region = parts[3] if len(parts) > 3 and parts[3] else default_region
    return _data_client(region, settings.current().endpoint("BEDROCK_AGENTCORE"))


def invoke(agent_runtime_arn: str, default_region: str, *, session_id: str, payload: bytes) -> int | None:
    """InvokeAgentRuntime of ``payload`` (JSON) in runtime session ``session_id``; returns the status
    code. The response stream is closed unread (the agent's result arrives in S3).

    Raises:
        AgentRuntimeThrottled: refused for rate (`THROTTLING_CODES`).
        botocore's ClientError: any other refusal.
    """
    try:
        resp = data_client(agent_runtime_arn, default_region).invoke_agent_runtime(
            agentRuntimeArn=agent_runtime_arn, runtimeSessionId=session_id,
            payload=payload, contentType="application/json", accept="application/json",
        )
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        if code in THROTTLING_CODES:
            raise AgentRuntimeThrottled(f"InvokeAgentRuntime throttled ({code}) for sid {session_id}") from e
        raise
    stream = resp.get("response")
    if stream is not None and hasattr(stream, "close"):
        stream.close()
    return resp.get("statusCode")
