"""PollSession, StopSession, Cleanup and ContinueRun: the training session's lifecycle.

- PollSession: DescribeTrainingSession until ``Running`` (bounded by ``STEPWISE_SESSION_START_TIMEOUT``
  seconds, default 1800, from creation); then, when resuming from a checkpoint, load_state with
  the optimizer and rebind the sampler to the resumed weights before the first step; in an eval-only
  run, bind the sampler to the model package it evaluates (``eval_model_package_arn``).
- StopSession: every terminal path of the state machine (success and the catch-all). Stops only
  a session this execution owns, or the session of the run it was started to continue
  (continue-as-new) and has not taken over yet (`stepwise.core.sweeping.may_stop_session`), so a
  refused second execution cannot stop the owner's session; also ends the runtime sessions of
  rollouts still in flight (`end_abandoned_rollouts`); then writes the run's end
  (``runs/{run_id}/summary.json``: status, reason, checkpoints, final weights), whose notification
  runs the Track function.
- Cleanup: EventBridge "Step Functions Execution Status Change" (ABORTED / TIMED_OUT / FAILED),
  where no Catch runs; same ownership rule.
- ContinueRun: start the next execution of the run (continue-as-new; moto's engine cannot run the
  ``states:startExecution`` integration, so the stack and the local engine both do it here), after
  recording it in state.json as the run's successor.
"""

from __future__ import annotations

from typing import Any

from stepwise.aws import sagemaker, task_tokens
from stepwise.aws.runstore import RunNotFound, RunOwnedElsewhere
from stepwise.core import ledger
from stepwise.core.ledger import count_parent_history, history_after
from stepwise.core.operations import weights_usage
from stepwise.core.phases import final_weights, plan_eval_weights, plan_resume
from stepwise.core.sweeping import REFUSED, may_stop_session
from stepwise.events import ContinueEvent, ExecutionStatusChange, RunEvent, StopEvent
from stepwise.executions import ABNORMAL_END_STATUSES, continuation_name, execution_arn_of, resolve_run
from stepwise.handlers._common import (bind, drive, entrypoint, logger, now, poll_seconds, run_config, settings,
                                       sfn_client, store)
from stepwise.handlers._rollout_sessions import end_abandoned_rollouts
from stepwise.layout import estimate_key, run_summary_key
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
            else:
                arn = cfg.resume_from_model_package
                state = rs.update_state(run.run_id, lambda s: plan_resume(s, arn), execution_arn=run.execution_arn)
        state, _, _ = drive(run.run_id, run.execution_arn, ("resume", "resume_rebind"))
        if not state.resume_loaded:
            return {"ready": False, "status": "LoadingCheckpoint", "wait_seconds": poll_seconds()}
        logger.info("resumed from checkpoint", extra={"sampler_model_package_arn": state.sampler_model_package_arn})
    return {"ready": True, "status": sagemaker.RUNNING, "wait_seconds": poll_seconds()}


def _tracking_status(reason: str) -> str:
    """The run's end status (MLflow's run statuses) for a stop reason: finished, stopped by the user, or failed."""
    if reason == "finished":
        return "FINISHED"
    if reason == "execution ABORTED":
        return "KILLED"
    return "FAILED"


def stop_owned_session(execution_arn: str, execution_name: str, execution_input: Any, *, reason: str) -> dict[str, Any]:
    """Stop the run's session if ``execution_arn`` owns the run; mark state.json. Idempotent."""
    rs = store()
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
    end_abandoned_rollouts(rs, cfg, state)  # rollouts in flight: their runtime sessions would bill on
    # the execution's last transitions: its history since PlanStep counted it, and the state after this one
    newest, events = task_tokens.history_since(sfn_client(), execution_arn, history_after(state))
    estimate = rs.get_json_or(estimate_key(run_id)) if reason == "finished" else None

    def mark(s: RunState) -> None:
        if not may_stop_session(s, execution_arn):
            raise RunOwnedElsewhere(f"run {run_id!r} was taken over by {s.owner_execution_arn} while {execution_arn} stopped it")
        if created is not None and not s.session_stopped:
            s.session_created_at = created  # the session's own clock for its final seconds
        ledger.close_session(s, stopped_at)
        if newest is not None:
            count_parent_history(s, newest, events)
            s.ledger.usage.state_transitions += TAIL_TRANSITIONS
        s.session_stopped = True
        if s.session_status != REFUSED:
            s.session_status = "Stopping"
        if reason == "finished":
            s.finished = True
        elif s.stop_reason is None:
            s.stop_reason = reason
        s.ledger.final = ledger.final_report(s, cfg, stopped_at, estimate)

    state = rs.update_state(run_id, mark, execution_arn=None)  # the owner, or its successor (checked in mark)
    cost = state.ledger.final or {}
    logger.info("training session stopped", extra={"training_session_name": state.training_session_name, "reason": reason,
                                                   "cost": cost.get("line")})
    if reason == "finished" and cfg.keep_model_packages == "best_and_last" and not state.eval_only:
        state = apply_retention(run_id, execution_arn, cfg, state)
    report = weights_report(state, cfg.region)
    out = {"stopped": True, "training_session_name": state.training_session_name, **report, "cost": cost}
    if state.eval_only:
        out["eval"] = eval_report(run_id, state)
    if state.deleted_packages:
        out["deleted_model_packages"] = list(state.deleted_packages)
    # The run's end: its S3 notification runs Track, which ends the MLflow and W&B runs and
    # renders the report page's last state (off this path).
    rs.put_json(run_summary_key(run_id), {
        "status": _tracking_status(reason), "reason": reason if reason != "finished" else (state.stop_reason or "finished"),
        "execution_arn": execution_arn, "step": state.step, "policy_version": state.policy_version,
        "ended_at": now(), **{k: v for k, v in out.items() if k not in ("stopped", "training_session_name")}})
    return out


def apply_retention(run_id: str, execution_arn: str, cfg: Any, state: RunState) -> RunState:
    """``keep_model_packages: best_and_last`` at a successful end: delete the model packages the run
    created except the best, the final weights and the final checkpoint
    (`stepwise.core.selection.packages_to_delete`), recording each deleted one in
    ``state.deleted_packages`` (so a retry deletes only the rest). A package that cannot be deleted is
    logged and kept: the run succeeded, and a package left behind costs storage, not a session."""
    from stepwise.core.selection import packages_to_delete

    delete, kept = packages_to_delete(state)
    deleted: list[str] = []
    for arn in delete:
        try:
            sagemaker.delete_model_package(cfg, arn)
            deleted.append(arn)
        except Exception as e:  # noqa: BLE001 - reported and kept, see above
            logger.error("could not delete a model package", extra={"model_package_arn": arn, "error": str(e)[:500]})
    if deleted:
        state = store().update_state(run_id, lambda s: s.deleted_packages.extend(
            a for a in deleted if a not in s.deleted_packages), execution_arn=execution_arn)
    logger.info("retention best_and_last", extra={"deleted": deleted, "kept": kept})
    return state


def eval_report(run_id: str, state: RunState) -> dict[str, Any]:
    """An eval-only run's result for the execution's output: what was evaluated (``evaluated_model_package_arn``,
    ``""`` = the base model), the eval sets and their ``eval/*`` metrics (the eval's summary), where its
    summary and per-prompt results are; ``{}`` before the eval was recorded."""
    from stepwise.layout import eval_results_key, eval_summary_key

    if state.last_eval_step is None:
        return {}
    summary = store().get_json_or(eval_summary_key(run_id, state.last_eval_step)) or {}
    metrics = {k: v for k, v in summary.items() if k.startswith("eval/") and isinstance(v, (int, float))}
    return {"evaluated_model_package_arn": summary.get("evaluated_model_package_arn", state.sampler_model_package_arn),
            "eval_sets": summary.get("eval_sets", []), "metrics": metrics,
            "summary_key": eval_summary_key(run_id, state.last_eval_step),
            "results_key": eval_results_key(run_id, state.last_eval_step)}


def weights_report(state: RunState, region: str) -> dict[str, Any]:
    """What the run leaves behind, for the execution's output: every checkpoint (step, kind, reason,
    model package ARN), the final weights (`stepwise.core.phases.final_weights`; ``None`` = nothing trained),
    the best model (`stepwise.core.selection`: ``{step, value, model_package_arn}`` of the eval that scored
    best, ``""`` = the base model; ``None`` without an eval) and how to sample or deploy the final weights."""
    final = final_weights(state)
    out: dict[str, Any] = {
        "checkpoints": [c.model_dump(include={"step", "kind", "reason", "model_package_arn"}) for c in state.checkpoints],
        "final_weights": final.model_dump(include={"step", "kind", "reason", "model_package_arn", "policy_version"})
        if final else None,
        "best_model": state.best.model_dump() if state.best is not None and not state.eval_only else None,
    }
    if final is not None:
        out["use_final_weights"] = weights_usage(final.model_package_arn, region)
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

    def hand_over(s: RunState) -> None:
        s.successor_execution_arn = successor
        if newest is not None:
            count_parent_history(s, newest, events)
            s.ledger.usage.state_transitions += TAIL_TRANSITIONS

    rs.update_state(run.run_id, hand_over, execution_arn=run.execution_arn)
    arn = task_tokens.start_execution(sfn_client(), event.state_machine_arn, name, body)
    logger.info("continued as a new execution", extra={"next_execution": arn, "segment": segment})
    return {"execution_arn": arn, "name": name}


poll_handler = entrypoint(RunEvent, poll_session, transient_retry=True)
stop_handler = entrypoint(StopEvent, stop, transient_retry=True)
cleanup_handler = entrypoint(ExecutionStatusChange, cleanup, transient_retry=True)
continue_handler = entrypoint(ContinueEvent, continue_run, transient_retry=True)
