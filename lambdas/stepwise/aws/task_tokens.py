"""Step Functions from the handlers: resuming a rollout's task (SendTaskSuccess), the execution's
history length (PlanStep's history budget) and continue-as-new (ContinueRun's StartExecution).

Every call takes the client, so the caller decides which one (one per container and environment:
`stepwise.handlers._common.Dependencies`).
"""

from __future__ import annotations

import json
import logging
from typing import Any

log = logging.getLogger(__name__)


def send_result(sfn: Any, token: str, output: dict[str, Any]) -> str | None:
    """SendTaskSuccess of ``token`` with ``output``; None when it was sent, else why the task is gone
    (``TaskTimedOut``, ``InvalidToken`` or ``TaskDoesNotExist``: a duplicate or late result). Other
    errors raise."""
    try:
        sfn.send_task_success(taskToken=token, output=json.dumps(output))
        return None
    except (sfn.exceptions.TaskTimedOut, sfn.exceptions.InvalidToken, sfn.exceptions.TaskDoesNotExist) as e:
        return type(e).__name__


def history_length(sfn: Any, execution_arn: str) -> int | None:
    """The id of the execution's newest history event: its history's length, in one small call
    (GetExecutionHistory, newest first, one event). None when Step Functions does not know the
    execution (a handler invoked outside one, as in handler tests); other errors raise."""
    try:
        events = sfn.get_execution_history(executionArn=execution_arn, reverseOrder=True, maxResults=1)["events"]
    except (sfn.exceptions.ExecutionDoesNotExist, sfn.exceptions.InvalidArn):
        return None
    return max((int(e["id"]) for e in events), default=0)


def start_execution(sfn: Any, state_machine_arn: str, name: str, body: dict[str, Any]) -> str:
    """StartExecution of ``state_machine_arn`` named ``name`` with input ``body``; returns its ARN.
    Idempotent: an execution of that name that already exists (a retried ContinueRun) is returned."""
    try:
        return sfn.start_execution(stateMachineArn=state_machine_arn, name=name, input=json.dumps(body))["executionArn"]
    except sfn.exceptions.ExecutionAlreadyExists:
        return f"{state_machine_arn.replace(':stateMachine:', ':execution:')}:{name}"
