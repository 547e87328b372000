"""PollSession, StopSession, Cleanup and ContinueRun: the training session's lifecycle.

- PollSession: DescribeTrainingSession until ``Running`` (bounded by ``STEPWISE_SESSION_START_TIMEOUT``
  seconds, default 1800, from creation); then, when resuming from a checkpoint, load_state with
  the optimizer and rebind the sampler to the resumed weights before the first step; in an eval-only
  run, bind the sampler to the model package it evaluates (``eval_model_package_arn``).
- StopSession: every terminal path of the state machine (success and the catch-all). Stops only
  a session this execution owns, or the session of the run it was started to continue
  (continue-as-new) and has not taken over yet (`stepwise.core.sweeping.may_stop_session`), so a
  refused second execution cannot stop the owner's session; records the run's end at once
  (``state.json`` and ``runs/{run_id}/summary.json``: status, reason, checkpoints, final weights, whose
  notification runs the Track function); then, in the time it has left, ends the runtime sessions of
  rollouts still in flight and applies retention ``best_and_last``, handing what is left to the
  session sweeper (`stepwise.handlers._leftovers`).
- Cleanup: EventBridge "Step Functions Execution Status Change" (ABORTED / TIMED_OUT / FAILED),
  where no Catch runs; same ownership rule.
- ContinueRun: start the next execution of the run (continue-as-new; moto's engine cannot run the
  ``states:startExecution`` integration, so the stack and the local engine both do it here), after
  recording it in state.json as the run's successor.
"""

from __future__ import annotations

from typing import Any

from stepwise.aws import sagemaker, task_tokens
from stepwise.aws.runstore import RunNotFound
from stepwise.core.ledger import history_after
from stepwise.core.phases import plan_eval_weights, plan_initial_sampler, plan_resume
from stepwise.core.sweeping import REFUSED, hand_over, mark_stopped, may_stop_session
from stepwise.events import ContinueEvent, ExecutionStatusChange, RunEvent, StopEvent
from stepwise.executions import ABNORMAL_END_STATUSES, continuation_name, execution_arn_of, resolve_run
from stepwise.handlers import _leftovers
from stepwise.handlers._common import (bind, drive, entrypoint, invocation_deadline, logger, now, poll_seconds,
                                       run_config, settings, sfn_client, store)
from stepwise.handlers._groups import stop_groups
from stepwise.handlers._leftovers import MARGIN_S
from stepwise.handlers._run_end import run_end, write_run_summary
from stepwise.handlers._run_end import tracking_status as _tracking_status  # noqa: F401 - tests read it here
from stepwise.layout import estimate_key
from stepwise.records import RunState

#: States an execution enters after StopSession or ContinueRun read its history: the Succeed state
#: ("Training finished", "Handed over to the next execution"); the catch-all's Fail state likewise.
TAIL_TRANSITIONS = 1


class SessionStartTimeout(TimeoutError):
    """The training session did not reach Running in time."""


def session_start_timeout() -> float:
    return settings().session_start_timeout


def poll_session(event: RunEvent) -> dict[str, Any]:
    rs = store()
    run = event.run
    bind(run_id=run.run_id)
    state = rs.owned_state(run.run_id, run.execution_arn)
    cfg = run_config(run.run_id)
    if state.session_status != sagemaker.RUNNING:
        status, reason = sagemaker.describe_session(sagemaker.control_plane(cfg.region), state.training_session_name)
        if status in sagemaker.FAILED_SESSION_STATUSES:
            raise sagemaker.SessionFailed(
                f"training session {state.training_session_name} is {status}{f': {reason}' if reason else ''}"
            )
        if status != sagemaker.RUNNING:
            waited = now() - state.session_created_at
            if waited > session_start_timeout():
                raise SessionStartTimeout(
                    f"training session {state.training_session_name} still {status} after {waited:.0f}s "
                    f"(STEPWISE_SESSION_START_TIMEOUT={session_start_timeout():g})"
                )
            if status != state.session_status:
                rs.update_state(run.run_id, lambda s: setattr(s, "session_status", status), execution_arn=run.execution_arn)
            return {"ready": False, "status": status, "wait_seconds": poll_seconds()}
        state = rs.update_state(run.run_id, lambda s: setattr(s, "session_status", status), execution_arn=run.execution_arn)
        logger.info("training session running", extra={"training_session_name": state.training_session_name})
    if not state.resume_loaded:
        if state.phase == "idle":
            if cfg.eval_only:
                arn = cfg.eval_model_package_arn
                state = rs.update_state(run.run_id, lambda s: plan_eval_weights(s, arn), execution_arn=run.execution_arn)
            elif cfg.resume_from_model_package or state.checkpoints:
                arn = cfg.resume_from_model_package
                state = rs.update_state(run.run_id, lambda s: plan_resume(s, arn), execution_arn=run.execution_arn)
            else:  # the group engine's first sampler: the base weights saved (plan_initial_sampler)
                state = rs.update_state(run.run_id, plan_initial_sampler, execution_arn=run.execution_arn)
        state, _, _ = drive(run.run_id, run.execution_arn, ("resume", "resume_rebind"))
        if not state.resume_loaded:
            return {"ready": False, "status": "LoadingCheckpoint", "wait_seconds": poll_seconds()}
        logger.info("resumed from checkpoint", extra={"sampler_model_package_arn": state.sampler_model_package_arn})
    return {"ready": True, "status": sagemaker.RUNNING, "wait_seconds": poll_seconds()}


def stop_owned_session(execution_arn: str, execution_name: str, execution_input: Any, *, reason: str) -> dict[str, Any]:
    """Stop the run's session if ``execution_arn`` owns the run; record the run's end; then clean up.
    Idempotent.

    In this order, so the end is recorded whatever happens to the clean-up (which grows with the run):
    1. StopTrainingSession (not for a session the run was refused: `stepwise.core.sweeping.REFUSED`);
    2. with ``admission: group``, stop the running group executions (`stepwise.handlers._groups.stop_groups`:
       no rollout starts after this), then hand the clean-up over (`stepwise.handlers._leftovers.hand_over`:
       the batches and groups whose rollouts may be in flight, retention ``best_and_last`` at a successful end);
    3. the run's end in ``state.json`` (stopped, reason, the ledger's final report) and the run summary
       (``runs/{run_id}/summary.json``: its notification runs Track, which ends the tracking runs);
    4. the clean-up, in parallel, in the time this invocation has left (`stepwise.handlers._leftovers.work_off`);
       what is left, the session sweeper finishes. Its failures are logged, never raised: they cannot
       fail a run that trained.
    """
    rs = store()
    deadline = invocation_deadline(MARGIN_S)
    run_id, _ = resolve_run(execution_name, execution_input)
    bind(run_id=run_id)
    try:
        state, _ = rs.read_state(run_id)
    except RunNotFound:
        logger.info("no run state: nothing to stop", extra={"reason": reason})
        return {"stopped": False, "why": "no run state"}
    if not may_stop_session(state, execution_arn):
        logger.warning("not the run's owner: leaving its session alone", extra={"owner": state.owner_execution_arn})
        return {"stopped": False, "why": "not the owner"}
    if execution_arn != state.owner_execution_arn:
        # continue-as-new: the successor failed before taking the run over (its Init); nobody else would stop it
        logger.warning("the run's successor stops the session it never took over", extra={"owner": state.owner_execution_arn})
    cfg = run_config(run_id)
    created = None
    if state.session_status == REFUSED:
        logger.warning("the run was refused its session: leaving that session alone",
                       extra={"training_session_name": state.training_session_name})
    else:
        created = None if state.session_stopped else sagemaker.creation_time(sagemaker.control_plane(cfg.region),
                                                                             state.training_session_name)
        sagemaker.stop_session(cfg, state.training_session_name)
    stopped_at = now()
    # the execution's last transitions: its history since PlanStep counted it, and the state after this one
    newest, events = task_tokens.history_since(sfn_client(), execution_arn, history_after(state))
    estimate = rs.get_json_or(estimate_key(run_id)) if reason == "finished" else None
    retention = reason == "finished" and cfg.keep_model_packages == "best_and_last" and not state.eval_only
    groups = stop_groups(rs, run_id, reason=reason) if cfg.admission == "group" else []
    try:
        left = _leftovers.hand_over(rs, run_id, batches=[state.current_batch, state.ahead_batch], retention=retention,
                                    reason=reason, deadline=deadline, groups=groups)
    except Exception:  # noqa: BLE001 - the end must be recorded; rollouts then end at ACR's idle timeout
        logger.exception("could not record the run's leftovers")
        left = None

    def mark(s: RunState) -> None:
        mark_stopped(s, cfg, execution_arn, reason=reason, stopped_at=stopped_at, created_at=created,
                     newest_event=newest, events=events, tail_transitions=TAIL_TRANSITIONS, estimate=estimate)

    state = rs.update_state(run_id, mark, execution_arn=None)  # the owner, or its successor (mark_stopped checks)
    cost = state.ledger.final or {}
    logger.info("training session stopped", extra={"training_session_name": state.training_session_name, "reason": reason,
                                                   "cost": cost.get("line")})
    # The run's end: its S3 notification runs Track, which ends the MLflow and W&B runs and
    # renders the report page's last state (off this path).
    out = write_run_summary(rs, state, cfg, reason=reason, execution_arn=execution_arn, cost=cost, retention=retention)
    if left is None:
        return out
    # The clean-up, in the time left; the sweeper finishes what this leaves.
    report = _leftovers.work_off(rs, cfg, run_id, deadline=deadline)
    if report.get("packages_deleted"):
        try:
            state, _ = rs.read_state(run_id)
            out = run_end(rs, state, cfg, cost, retention=retention)
        except Exception:  # noqa: BLE001 - the output then lists what was known at the end
            logger.exception("could not read the run's state after retention")
    out["leftovers"] = {k: v for k, v in report.items() if k != "run_id"}
    return out


def stop(event: StopEvent) -> dict[str, Any]:
    reason = event.reason
    if event.error:
        reason = f"failed: {event.error.get('Error', 'error')}"
        logger.error("execution failed", extra={"error": event.error.get("Error"), "cause": str(event.error.get("Cause"))[:2000]})
    return stop_owned_session(event.execution_arn, event.execution_name, event.input, reason=reason)


def cleanup(event: ExecutionStatusChange) -> dict[str, Any]:
    """EventBridge "Step Functions Execution Status Change" -> stop the session of the run it owned.

    Raises:
        KeyError: an abnormal end without ``detail.executionArn``.
    """
    detail = event.detail
    if detail.status not in ABNORMAL_END_STATUSES:
        return {"stopped": False, "why": f"status {detail.status!r} needs no cleanup"}
    if not detail.executionArn:
        raise KeyError("executionArn")
    return stop_owned_session(detail.executionArn, event.execution_name, detail.input, reason=f"execution {detail.status}")


def continue_run(event: ContinueEvent) -> dict[str, Any]:
    rs = store()
    run = event.run
    state = rs.owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    # the state transitions of this execution not counted yet (and the hand-over state after this one)
    newest, events = task_tokens.history_since(sfn_client(), run.execution_arn, history_after(state))
    segment = state.segment + 1
    name = continuation_name(run.run_id, segment)
    body = {"continuation": {"run_id": run.run_id, "parent_execution_arn": run.execution_arn, "segment": segment}}
    # Write-ahead: the successor may stop the session before it takes the run over (its Init could
    # fail first), and the sweeper leaves the session to it while it runs.
    successor = execution_arn_of(event.state_machine_arn, name)

    rs.update_state(run.run_id, lambda s: hand_over(s, successor, newest_event=newest, events=events,
                                                    tail_transitions=TAIL_TRANSITIONS),
                    execution_arn=run.execution_arn)
    arn = task_tokens.start_execution(sfn_client(), event.state_machine_arn, name, body)
    logger.info("continued as a new execution", extra={"next_execution": arn, "segment": segment})
    return {"execution_arn": arn, "name": name}


poll_handler = entrypoint(RunEvent, poll_session, transient_retry=True)
stop_handler = entrypoint(StopEvent, stop, transient_retry=True)
cleanup_handler = entrypoint(ExecutionStatusChange, cleanup, transient_retry=True)
continue_handler = entrypoint(ContinueEvent, continue_run, transient_retry=True)
