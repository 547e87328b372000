"""AgentCore Runtime control-plane lookups (``bedrock-agentcore-control``) for the refusals before billing.

``GetAgentRuntime`` (botocore model ``bedrock-agentcore-control``: ``GET /runtimes/{agentRuntimeId}/``)
takes the runtime *id*, the last part of the ARN ``arn:PARTITION:bedrock-agentcore:REGION:ACCOUNT:
runtime/ID``, and answers in the region its client is built for; so the client is built in the ARN's
region. boto3 honours ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL`` (the local ACR emulator).
"""

from __future__ import annotations

import functools
import os
from typing import Any

from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from stepwise.stackinfo import region_of_arn

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
    return _client(region_of_arn(arn), os.environ.get("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL", ""))


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
