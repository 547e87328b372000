"""The check that nothing is left billing after an end-to-end test (``tests/conftest.py`` runs it after
every test).

A run that ended must leave no AgentCore runtime session active and no training session that was not
stopped. Two kinds of stack report their runs:

- `local.stack.LocalStack` (``stepwise run-local`` and the tests that call ``run_local``): when it stops,
  before its services do, it hands its `billing_report` to its observers (`watch_local_stacks`):
  the ACR emulator's active sessions and the simulator's sessions not ended.
- `tests.support.pipeline.Stack` (the drills that start executions on the real ASL, with `FakeAgent` as
  ACR's data plane): `tests.support.pipeline.wait_execution` reports each execution that ended
  (`execution_ended`); at the test's end the run's training session (``state.json``) must not bill in the
  stack's simulator and its sessions in the stack's agent must be stopped, unless an execution of the run
  still runs then (a test that leaves a run going checks nothing about it).

Tests that deliberately leave something billing say so with ``@pytest.mark.leaves_billing("why")``.
"""

from __future__ import annotations

import json
import threading
import weakref
from typing import Any

#: Training session statuses that no longer bill (`local.stack.ENDED_TRAINING_SESSION_STATUSES`).
ENDED = frozenset({"Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed"})

_lock = threading.Lock()
_reports: list[dict[str, Any]] = []
_ended: list[tuple[Any, str, str]] = []  # (sfn client, execution ARN, run id)
#: Live `tests.support.pipeline.Stack` s (registered by their constructor).
STACKS: "weakref.WeakSet[Any]" = weakref.WeakSet()


def local_stack_stopped(report: dict[str, Any]) -> None:
    """A `local.stack.LocalStack` observer: keep its billing report for the check."""
    with _lock:
        _reports.append(report)


def execution_ended(sfn: Any, description: dict[str, Any]) -> None:
    """An execution of a pipeline `Stack` ended (`tests.support.pipeline.wait_execution`)."""
    from stepwise.executions import resolve_run

    run_id, _ = resolve_run(description.get("name", ""), description.get("input"))
    with _lock:
        _ended.append((sfn, description["executionArn"], run_id))


def begin() -> None:
    """Forget what earlier tests reported."""
    with _lock:
        _reports.clear()
        _ended.clear()


def _local_leaks(report: dict[str, Any]) -> list[str]:
    out = []
    if report.get("acr_active"):
        out.append(f"{len(report['acr_active'])} AgentCore runtime session(s) still active when the local stack "
                   f"stopped ({report.get('acr')})")
    if report.get("training_sessions"):
        out.append(f"training session(s) not stopped when the local stack stopped: {report['training_sessions']}")
    return out


def _running(sfn: Any, run_id: str) -> bool:
    """Whether an execution of ``run_id`` (its first or a continuation) still runs."""
    from stepwise.executions import resolve_run

    for machine in sfn.list_state_machines().get("stateMachines", []):
        for ex in sfn.list_executions(stateMachineArn=machine["stateMachineArn"], statusFilter="RUNNING").get("executions", []):
            if ex["name"] == run_id:
                return True
            desc = sfn.describe_execution(executionArn=ex["executionArn"])
            if resolve_run(desc["name"], desc.get("input"))[0] == run_id:
                return True
    return False


def _pipeline_leaks(run_id: str) -> list[str]:
    from stepwise.layout import state_key

    out: list[str] = []
    for stack in list(STACKS):
        try:
            state = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=state_key(run_id))["Body"].read())
        except Exception:  # not this stack's run (or a run refused before it had a state)
            continue
        if _running(stack.moto.client("stepfunctions"), run_id):
            continue
        status = stack.sim.session_statuses().get(state.get("training_session_name"))
        if status is not None and status not in ENDED:
            out.append(f"run {run_id}: training session {state.get('training_session_name')} is {status} after its "
                       f"execution ended")
        agent = getattr(stack, "agent", None)
        active = agent.active_sessions(run_id) if agent is not None else []
        if active:
            out.append(f"run {run_id}: {len(active)} AgentCore runtime session(s) never stopped: {active[:5]}")
    return out


def leaks() -> list[str]:
    """What the runs that ended since `begin` left billing, in words (empty: nothing)."""
    with _lock:
        reports, ended = list(_reports), list(_ended)
    out: list[str] = []
    for report in reports:
        out.extend(_local_leaks(report))
    for run_id in dict.fromkeys(r for _s, _a, r in ended):
        out.extend(_pipeline_leaks(run_id))
    return out
