"""Step Functions from the handlers: resuming a rollout's task (SendTaskSuccess), the execution's
history (its length for PlanStep's history budget, its new events for the cost ledger's state
transitions), continue-as-new (ContinueRun's StartExecution) and an execution's status (the session
sweeper).

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


#: Events read per GetExecutionHistory page (the API's maximum).
HISTORY_PAGE = 1000


def history_since(sfn: Any, execution_arn: str, after_event: int, *, max_pages: int = 25) -> tuple[int | None, list[dict[str, Any]]]:
    """``(newest event id, the events newer than after_event)`` of the execution's history, read newest
    first (GetExecutionHistory, ``reverseOrder``, pages of `HISTORY_PAGE`) until an event at or before
    ``after_event`` (0 = the whole history, at most ``max_pages`` pages: 25,000 events, a Standard
    execution's limit). One call when fewer than 1,000 events are new. ``(None, [])`` when Step
    Functions does not know the execution (a handler invoked outside one); other errors raise."""
    events: list[dict[str, Any]] = []
    token = None
    for _ in range(max_pages):
        kwargs: dict[str, Any] = {"executionArn": execution_arn, "reverseOrder": True, "maxResults": HISTORY_PAGE}
        if token:
            kwargs["nextToken"] = token
        try:
            page = sfn.get_execution_history(**kwargs)
        except (sfn.exceptions.ExecutionDoesNotExist, sfn.exceptions.InvalidArn):
            return None, []
        fresh = [e for e in page.get("events", []) if int(e["id"]) > after_event]
        events.extend(fresh)
        token = page.get("nextToken")
        if not token or len(fresh) < len(page.get("events", [])):
            break
    newest = max((int(e["id"]) for e in events), default=after_event or None)
    return newest, events


def start_execution(sfn: Any, state_machine_arn: str, name: str, body: dict[str, Any]) -> str:
    """StartExecution of ``state_machine_arn`` named ``name`` with input ``body``; returns its ARN.
    Idempotent: an execution of that name that already exists (a retried ContinueRun) is returned."""
    try:
        return sfn.start_execution(stateMachineArn=state_machine_arn, name=name, input=json.dumps(body))["executionArn"]
    except sfn.exceptions.ExecutionAlreadyExists:
        from stepwise.executions import execution_arn_of

        return execution_arn_of(state_machine_arn, name)


def execution_status(sfn: Any, execution_arn: str) -> tuple[str | None, float | None]:
    """``(status, stop date)`` of ``execution_arn`` from DescribeExecution: the status (RUNNING,
    SUCCEEDED, FAILED, TIMED_OUT, ABORTED, PENDING_REDRIVE) and, once it ended, its ``stopDate`` (epoch
    seconds; None while it runs). ``("GONE", None)`` when Step Functions does not know it (never
    started, closed more than 90 days ago, or started so recently that DescribeExecution, eventually
    consistent, does not see it yet); ``(None, None)`` when it cannot be read (logged: access denied, a
    malformed ARN, ...). Throttling and 5xx raise after botocore's retries."""
    from botocore.exceptions import ClientError

    try:
        resp = sfn.describe_execution(executionArn=execution_arn)
    except sfn.exceptions.ExecutionDoesNotExist:
        return "GONE", None
    except (sfn.exceptions.InvalidArn, ClientError) as e:
        from stepwise.aws.sagemaker import is_transient

        if isinstance(e, ClientError) and is_transient(e):
            raise
        log.warning("cannot read execution %s: %s", execution_arn, e)
        return None, None
    stopped = resp.get("stopDate")
    return str(resp["status"]), (stopped.timestamp() if hasattr(stopped, "timestamp") else
                                 float(stopped) if stopped is not None else None)


def stop_execution(sfn: Any, execution_arn: str, *, error: str, cause: str) -> bool:
    """StopExecution of ``execution_arn``; False when it is not running (already ended, or unknown to Step
    Functions). Other errors raise."""
    from botocore.exceptions import ClientError

    try:
        sfn.stop_execution(executionArn=execution_arn, error=error[:256], cause=cause[:32768])
        return True
    except sfn.exceptions.ExecutionDoesNotExist:
        return False
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("ExecutionAlreadyEnded", "ValidationException"):
            return False
        raise
