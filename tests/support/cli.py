"""Helpers for the operator-command tests: a moto deployment (bucket + a small state machine).

The fixtures ``moto_env`` and ``moto_dep`` that build it are in ``tests/conftest.py``.

The state machine stands in for the training loop where the tests exercise the commands, not
the pipeline: input ``{"fail": true}`` fails at once, ``{"wait": N}`` waits N seconds then succeeds,
anything else waits 60 seconds then succeeds, so an execution stays RUNNING while a test stops it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

REGION = "us-east-1"
ROLE = "arn:aws:iam::123456789012:role/StepwiseStates"
BUCKET = "stepwise-cli-test"

DEFINITION = {
    "StartAt": "Choose",
    "States": {
        "Choose": {"Type": "Choice", "Choices": [{"Variable": "$.fail", "IsPresent": True, "Next": "Boom"},
                                                 {"Variable": "$.wait", "IsPresent": True, "Next": "Wait as told"}],
                   "Default": "Wait a while"},
        "Wait a while": {"Type": "Wait", "Seconds": 60, "Next": "Done"},
        "Wait as told": {"Type": "Wait", "SecondsPath": "$.wait", "Next": "Done"},
        "Done": {"Type": "Succeed"},
        "Boom": {"Type": "Fail", "Error": "Boom", "Cause": "failed on purpose"},
    },
}

BASE_CONFIG = {
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent",
    "batch_size": 2,
    "responses_per_prompt": 2,
}


@dataclass
class MotoDeployment:
    bucket: str
    state_machine_arn: str
    s3: Any
    sfn: Any

    @property
    def flags(self) -> list[str]:
        return ["--bucket", self.bucket, "--state-machine-arn", self.state_machine_arn, "--region", REGION]

    def put_json(self, key: str, obj: Any) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=json.dumps(obj).encode())

    def get_json(self, key: str) -> Any:
        return json.loads(self.s3.get_object(Bucket=self.bucket, Key=key)["Body"].read())


def run_state(run_id: str, execution_arn: str, **extra: Any) -> dict[str, Any]:
    """A ``state.json`` body (the fields the commands read; RunState's own defaults otherwise)."""
    from stepwise.records import RunState

    return RunState(run_id=run_id, owner_execution_arn=execution_arn,
                    training_session_name=f"stepwise-{run_id}", **extra).model_dump()


def wait_status(sfn: Any, arn: str, statuses: tuple[str, ...], timeout: float = 10.0) -> dict[str, Any]:
    import time

    deadline = time.monotonic() + timeout
    while True:
        desc = sfn.describe_execution(executionArn=arn)
        if desc["status"] in statuses or time.monotonic() > deadline:
            return desc
        time.sleep(0.05)
