"""AgentCore Runtime: the control-plane lookup the refusals before billing make
(``bedrock-agentcore-control``), ``InvokeAgentRuntime`` (``bedrock-agentcore``, StartRollout) and
``StopRuntimeSession`` (FinishRollout, and whoever abandons a rollout).

One agent per runtime session: ``invoke`` makes exactly one attempt (botocore's retries are off for
it), because a retry would send the same ``runtimeSessionId`` again and a request that was accepted
before its answer was lost would then run two agents in one session. What can be retried raises
`AgentRuntimeThrottled` or `AgentRuntimeUnavailable`, and the state machine's Retry runs StartRollout
again, which opens a fresh session (new sid). ``stop_session`` is idempotent (a stop of a session
that is gone is success), so its client keeps botocore's standard retries.

``GetAgentRuntime`` (botocore model ``bedrock-agentcore-control``: ``GET /runtimes/{agentRuntimeId}/``)
takes the runtime *id*, the last part of the ARN ``arn:PARTITION:bedrock-agentcore:REGION:ACCOUNT:
runtime/ID``, and answers in the region its client is built for; so the client is built in the ARN's
region. boto3 honours ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL`` (the local ACR emulator).
"""

from __future__ import annotations

import functools
from typing import Any

from botocore.config import Config
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
from stepwise.stackinfo import region_of_arn

#: InvokeAgentRuntime error codes that mean "too fast" (the state machine retries with backoff and jitter).
#: No session was created: ServiceQuotaExceededException is the account's active-session quota.
THROTTLING_CODES = frozenset({"ThrottlingException", "ServiceQuotaExceededException", "RetryableConflictException",
                              "TooManyRequestsException"})
#: InvokeAgentRuntime error codes of the service failing (retried like throttling, in a fresh session).
UNAVAILABLE_CODES = frozenset({"InternalServerException", "ServiceUnavailableException", "ServiceUnavailable",
                               "InternalFailure"})
#: StopRuntimeSession's answer for a session that is "not found or already terminated" (the developer
#: guide's "Stop a running session" example): the session is gone, which is what a stop wants.
SESSION_GONE_CODES = frozenset({"ResourceNotFoundException"})

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
    """ACR refused the invoke for rate or for the active-session quota (retried by the state machine
    with backoff and jitter, in a fresh session). No session was created."""


class AgentRuntimeUnavailable(RuntimeError):
    """ACR failed the invoke (5xx), or the connection failed or timed out: the state machine retries it
    in a fresh session. ``maybe_started``: the request may have reached the agent (a read timeout, a
    5xx after the body was sent), so its session may exist and is stopped before the retry."""

    def __init__(self, message: str, *, maybe_started: bool = True) -> None:
        super().__init__(message)
        self.maybe_started = maybe_started


@functools.lru_cache(maxsize=8)
def _data_client(region: str, _endpoint: str, retries: bool) -> Any:
    import boto3

    # invoke: one attempt (module doc); stop: botocore's standard retries (4 attempts, idempotent).
    policy = {"mode": "standard", "max_attempts": 4} if retries else {"mode": "standard", "total_max_attempts": 1}
    return boto3.client("bedrock-agentcore", region_name=region, config=client_config(retries=policy))


def _runtime_region(agent_runtime_arn: str, default_region: str) -> str:
    parts = agent_runtime_arn.split(":")
    return parts[3] if len(parts) > 3 and parts[3] else default_region


def data_client(agent_runtime_arn: str, default_region: str, *, retries: bool = False) -> Any:
    """A ``bedrock-agentcore`` client in the runtime's own region (read from its ARN), one per
    region, endpoint, retry policy and container (creating a boto3 client costs ~10-50 ms of CPU).
    ``retries=False`` (invokes): botocore makes one attempt; True: its standard retries."""
    return _data_client(_runtime_region(agent_runtime_arn, default_region),
                        settings.current().endpoint("BEDROCK_AGENTCORE"), retries)


def invoke(agent_runtime_arn: str, default_region: str, *, session_id: str, payload: bytes) -> int | None:
    """InvokeAgentRuntime of ``payload`` (JSON) in runtime session ``session_id``; returns the status
    code. The response stream is closed unread (the agent's result arrives in S3).

    One attempt: a retry would reuse ``session_id`` (module doc).

    Raises:
        AgentRuntimeThrottled: refused for rate or quota (`THROTTLING_CODES`); no session was created.
        AgentRuntimeUnavailable: a 5xx (`UNAVAILABLE_CODES`, or any 5xx status), or the connection failed
            or timed out; ``maybe_started`` says whether the session may exist.
        botocore's ClientError: any other refusal (the session may exist: RuntimeClientError is the agent's answer).
    """
    try:
        resp = data_client(agent_runtime_arn, default_region).invoke_agent_runtime(
            agentRuntimeArn=agent_runtime_arn, runtimeSessionId=session_id,
            payload=payload, contentType="application/json", accept="application/json",
        )
    except ClientError as e:
        code = e.response.get("Error", {}).get("Code", "")
        status = int(e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in THROTTLING_CODES:
            raise AgentRuntimeThrottled(f"InvokeAgentRuntime throttled ({code}): {_message(e)}") from e
        if code in UNAVAILABLE_CODES or status >= 500:
            raise AgentRuntimeUnavailable(f"InvokeAgentRuntime failed ({code or status}): {_message(e)}") from e
        raise
    except (EndpointConnectionError, ConnectTimeoutError) as e:  # the request never left
        raise AgentRuntimeUnavailable(f"InvokeAgentRuntime could not connect: {e}", maybe_started=False) from e
    except (ReadTimeoutError, ConnectionClosedError) as e:  # sent; accepted or not, nobody knows
        raise AgentRuntimeUnavailable(f"InvokeAgentRuntime got no answer: {e}") from e
    stream = resp.get("response")
    if stream is not None and hasattr(stream, "close"):
        stream.close()
    return resp.get("statusCode")


def _message(e: ClientError) -> str:
    return str(e.response.get("Error", {}).get("Message", ""))[:300]


@functools.lru_cache(maxsize=1)
def min_session_id_length() -> int:
    """``runtimeSessionId``'s minimum length in botocore's ``bedrock-agentcore`` model (33)."""
    import botocore.session

    model = botocore.session.get_session().get_service_model("bedrock-agentcore")
    shape = model.operation_model("StopRuntimeSession").input_shape.members["runtimeSessionId"]
    return int(shape.metadata.get("min", 1))


def stop_session(agent_runtime_arn: str, default_region: str, *, session_id: str) -> bool:
    """StopRuntimeSession of ``session_id`` (the toolkit's ``AgentCoreHttpSession.shutdown`` does the
    same after every rollout): True when it stopped the session, False when the session was already
    gone (`SESSION_GONE_CODES`: ended, timed out, or never started), which is not an error. An id shorter
    than the model's minimum (`min_session_id_length`) never named a runtime session: False, no call.

    Raises:
        botocore's ClientError: any other refusal, after botocore's standard retries (throttling, 5xx).
        botocore's BotoCoreError: no connection after those retries.
    """
    if len(session_id) < min_session_id_length():
        return False
    try:
        data_client(agent_runtime_arn, default_region, retries=True).stop_runtime_session(
            agentRuntimeArn=agent_runtime_arn, runtimeSessionId=session_id)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code", "") in SESSION_GONE_CODES:
            return False
        raise
    return True
