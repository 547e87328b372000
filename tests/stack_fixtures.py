"""The synthesized stack, once per pytest process and context (a synthesis takes about 8 s).

``synthesized()`` is the default app (``cdk.json``'s context, cdk-nag applied), as ``cdk synth``
builds it; ``synthesized(SCOPED_CONTEXT)`` sets every context value the stack accepts. Each call
returns the same stack and a fresh copy of its template (tests may not share mutations).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

REGION = "us-west-2"
ACCOUNT = "111122223333"
RUNTIME = f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:runtime/toy_agent-AbC123"
SM_ROLE = f"arn:aws:iam::{ACCOUNT}:role/StepwiseSageMakerSessions"
AGENT_ROLE = f"arn:aws:iam::{ACCOUNT}:role/AgentCoreRuntimeRole"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:stepwise-runs"
KMS_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
MLFLOW_SERVER = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-tracking-server/stepwise"
DATA_BUCKETS = ("my-datasets", "my-session-outputs")
GATEWAY_CONCURRENCY = 200

#: Every context value the stack accepts, set.
SCOPED_CONTEXT: dict[str, Any] = {
    "agentRuntimeArns": RUNTIME, "sagemakerRoleArns": SM_ROLE, "agentRoleArns": AGENT_ROLE,
    "notificationTopicArn": TOPIC, "stackName": "StepwiseScoped", "kmsKeyArn": KMS_KEY,
    "mlflowTrackingServerArns": MLFLOW_SERVER, "dataBuckets": ",".join(DATA_BUCKETS),
    "gatewayReservedConcurrency": str(GATEWAY_CONCURRENCY),
}


@functools.lru_cache(maxsize=None)
def _synth(context_json: str) -> tuple[Any, dict]:
    from aws_cdk import assertions

    from app import build_app

    _, stack = build_app(json.loads(context_json) or None)
    return stack, assertions.Template.from_stack(stack).to_json()


def synthesized(context: dict[str, Any] | None = None) -> tuple[Any, dict]:
    """``(stack, template)`` of the app built with ``context`` over ``cdk.json``'s."""
    stack, template = _synth(json.dumps(context or {}, sort_keys=True))
    return stack, copy.deepcopy(template)
