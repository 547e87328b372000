"""`stepwise resume RUN`: continue a failed, stopped or timed-out run from its saved state.

All run state is in S3, so a run can always be continued by a new execution. Which way:

- **redrive** (``RedriveExecution``) when Step Functions allows it (the newest execution is
  FAILED / ABORTED / TIMED_OUT and ``redriveStatus`` is ``REDRIVABLE``) *and* the run's training
  session was not stopped (``state.json`` ``session_stopped`` is false): the execution restarts
  from the state that failed, with the same session;
- otherwise a **new execution of the same run**: a continuation named ``{run_id[:70]}--{n}``
  whose input is ``{"continuation": {"run_id", "parent_execution_arn": <the run's owner>,
  "segment": n, "resume": true}}``. Init takes the run over from its owner (the failed
  execution) and, because of ``resume``, may recreate a stopped training session from the
  last ``save_state`` checkpoint (docs/internals.md, "Resuming a run").

Refused: a run with a running execution, a finished run, and a run that never got a
``state.json`` (Init failed on its input: fix the config and `stepwise start` a new run id).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from typing import Any, Literal

from stepwise.executions import ABNORMAL_END_STATUSES, CONTINUATION_RE, continuation_name
from stepwise_cli.commands._runs import (
    EXIT_OK,
    CommandError,
    Deployment,
    add_stack_arguments,
    console_url,
    deployment,
    execution_lines,
    run_executions,
    run_state,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (the execution name)")
    parser.add_argument("--no-redrive", action="store_true", help="always start a new execution of the run")
    from stepwise_cli.grammar import add_json

    add_json(parser, "{run_id, action, reason, execution_arn, console_url}")
    add_stack_arguments(parser)


@dataclass(frozen=True)
class ResumePlan:
    """What `resume` will do: ``action`` and why; ``execution`` is the newest execution."""

    action: Literal["redrive", "new_execution"]
    reason: str
    execution: dict[str, Any]


def plan_resume(run_id: str, newest: dict[str, Any] | None, state: dict[str, Any] | None, *,
                allow_redrive: bool = True) -> ResumePlan:
    """Decide how to resume (pure). ``newest`` is DescribeExecution of the run's newest execution.

    Raises:
        CommandError: the run cannot be resumed (running, finished, unknown, never initialised).
    """
    if newest is None and state is None:
        raise CommandError(f"no run {run_id!r}: no execution of that name and no state.json")
    if state is None:
        raise CommandError(
            f"run {run_id!r} has no state.json: its first execution failed before the run was set up "
            f"({(newest or {}).get('error') or 'see the console'}). Fix the config, then "
            "`stepwise start` it with a new --run-id (execution names cannot be reused)"
        )
    status = (newest or {}).get("status")
    if status == "RUNNING":
        raise CommandError(f"run {run_id!r} is running ({newest['executionArn']}); nothing to resume")
    if state.get("finished"):
        raise CommandError(f"run {run_id!r} finished (step {state.get('step')}); start a new run to train further")
    if newest is None:
        return ResumePlan("new_execution", "the run has state but no execution in this state machine", {})
    if (allow_redrive and status in ABNORMAL_END_STATUSES
            and newest.get("redriveStatus") == "REDRIVABLE" and not state.get("session_stopped")):
        return ResumePlan("redrive", f"{status} execution is redrivable and its training session is live", newest)
    why = (f"newest execution {status}" +
           (f", redrive status {newest.get('redriveStatus')}" if newest.get("redriveStatus") else "") +
           (", training session stopped" if state.get("session_stopped") else ""))
    return ResumePlan("new_execution", why, newest)


def next_segment_name(run_id: str, state: dict[str, Any], existing_names: list[str]) -> tuple[str, int]:
    """``(execution name, segment)`` of the next continuation: above the state's segment and every used name."""
    used = [int(m.group("segment")) for n in existing_names if (m := CONTINUATION_RE.match(n))]
    segment = max([int(state.get("segment", 0)), *used]) + 1
    return continuation_name(run_id, segment), segment


def continuation_input(run_id: str, state: dict[str, Any], segment: int) -> dict[str, Any]:
    """The execution input of a resumed run (the continuation contract of `stepwise.handlers._common.resolve_run`)."""
    return {"continuation": {"run_id": run_id, "parent_execution_arn": state["owner_execution_arn"],
                             "segment": segment, "resume": True}}


def resume(dep: Deployment, run_id: str, *, allow_redrive: bool = True) -> dict[str, Any]:
    """Resume the run; returns ``{action, reason, execution_arn, console_url}``."""
    from botocore.exceptions import ClientError

    executions = run_executions(dep, run_id)
    newest = dep.sfn.describe_execution(executionArn=executions[-1]["executionArn"]) if executions else None
    state = run_state(dep, run_id)
    plan = plan_resume(run_id, newest, state, allow_redrive=allow_redrive)
    reason = plan.reason
    if plan.action == "redrive":
        try:
            dep.sfn.redrive_execution(executionArn=plan.execution["executionArn"])
            arn = plan.execution["executionArn"]
            return {"action": "redrive", "reason": reason, "execution_arn": arn, "console_url": console_url(arn)}
        except (ClientError, NotImplementedError) as e:
            code = getattr(e, "response", {}).get("Error", {}).get("Code", type(e).__name__)
            reason = f"redrive refused ({code}); starting a new execution instead"
    assert state is not None
    name, segment = next_segment_name(run_id, state, [e["name"] for e in executions])
    arn = dep.sfn.start_execution(stateMachineArn=dep.state_machine_arn, name=name,
                                  input=json.dumps(continuation_input(run_id, state, segment)))["executionArn"]
    return {"action": "new_execution", "reason": reason, "execution_arn": arn, "console_url": console_url(arn)}


def run(args: argparse.Namespace) -> int:
    out = resume(deployment(args), args.run, allow_redrive=not getattr(args, "no_redrive", False))
    if getattr(args, "json", False):
        print(json.dumps({"run_id": args.run, **out}, default=str))
        return EXIT_OK
    verb = "redrove" if out["action"] == "redrive" else "started a new execution of"
    print(f"{verb} run {args.run} ({out['reason']})")
    print("\n".join(execution_lines(args.run, out["execution_arn"])))
    return EXIT_OK
