"""SubmitTrain, PollOperation, Rebind and Checkpoint: the session's operations, driven from state.json.

Each handler checks the run's phase and drives it (`stepwise.aws.sagemaker.drive`); the phases, their
write-ahead plans and transitions are `stepwise.core.phases` (reference `train_grpo.py` step:
forward_backward, optim_step, then ``save_weights_and_get_sampling_client`` = saveWeights +
loadWeightsForSampling). Re-running a handler with the same input is harmless: a re-sent training
operation carries the same (sequenceNumber, clientToken) and the runtime applies it once.
"""

from __future__ import annotations

from typing import Any

from stepwise.core.phases import PhaseMismatch, plan_train_phase
from stepwise.events import RunEvent
from stepwise.handlers._common import bind, drive, emit, entrypoint, logger, poll_seconds, store, write_summary


def _result(done: bool, **extra: Any) -> dict[str, Any]:
    return {"done": done, "wait_seconds": poll_seconds(), **extra}


def _report_train(run_id: str, step: int, metrics_: dict[str, Any]) -> None:
    """Emit the train/* metrics of a completed training phase (they join the step summary at Rebind)."""
    numeric = {k: v for k, v in metrics_.items() if isinstance(v, (int, float)) and k != "policy_version"}
    if numeric:
        emit(numeric, run_id=run_id)


# ---------------------------------------------------------------------------- handlers


def submit(event: RunEvent) -> dict[str, Any]:
    """Plan (write-ahead) and submit the step's operations; poll briefly. Same input twice = one step."""
    rs = store()
    run = event.run
    state = rs.owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    if state.phase == "idle":
        if not state.datum_chunks:
            raise PhaseMismatch(f"step {state.step} has no datums to train on (ComputeAdvantages did not run)")
        chunks = len(state.datum_chunks)
        state = rs.update_state(run.run_id, lambda s: plan_train_phase(s, chunks), execution_arn=run.execution_arn)
    elif state.phase not in ("train", "rebind"):
        raise PhaseMismatch(f"SubmitTrain called in phase {state.phase!r}")
    step = state.step
    state, _, reported = drive(run.run_id, run.execution_arn, ("train",))
    _report_train(run.run_id, step, reported)
    return _result(state.phase != "train", step=step)


def poll(event: RunEvent) -> dict[str, Any]:
    """Poll the step's training operations; done when they all succeeded (the run moves to rebind)."""
    run = event.run
    step = store().owned_state(run.run_id, run.execution_arn).step
    bind(run_id=run.run_id, step=step)
    state, _, reported = drive(run.run_id, run.execution_arn, ("train",))
    _report_train(run.run_id, step, reported)
    return _result(state.phase != "train", step=step)


def rebind(event: RunEvent) -> dict[str, Any]:
    """load_weights_for_sampling of the saved weights, then commit the sampler ARN and policy version."""
    run = event.run
    before = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=before.step)
    if before.phase == "train":
        raise PhaseMismatch("Rebind called before the training operations completed")
    state, done, _ = drive(run.run_id, run.execution_arn, ("rebind",))
    if done and state.step_metrics.get("step") == state.step - 1:
        # The step's summary is written once, complete: sampling, advantages, train/* and the new policy.
        summary = dict(state.step_metrics, decision="train", policy_version=state.policy_version,
                       sampler_model_package_arn=state.sampler_model_package_arn)
        write_summary(run.run_id, state.step - 1, summary)
        # the session's busy/idle split and the step's cost are known only now
        # (`stepwise.core.staleness.session_time_metrics`, `stepwise.core.ledger.close_step`)
        _report_train(run.run_id, state.step - 1, {k: v for k, v in state.step_metrics.items()
                                                   if k in ("time/session_busy", "time/session_idle", "time/step_wall")
                                                   or k.startswith(("cost/", "budget/"))})
        logger.info("sampler rebound", extra={"policy_version": state.policy_version})
    return _result(done, step=state.step, policy_version=state.policy_version)


def checkpoint(event: RunEvent) -> dict[str, Any]:
    """Drive the checkpoint PlanStep planned (save_state, or save_weights at the end)."""
    run = event.run
    state = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    if state.phase not in ("checkpoint", "idle"):
        raise PhaseMismatch(f"Checkpoint called in phase {state.phase!r}")
    state, done, reported = drive(run.run_id, run.execution_arn, ("checkpoint",))
    if done and reported.get("model_package_arn"):
        logger.info("checkpoint saved", extra={"model_package_arn": reported["model_package_arn"]})
    return _result(done, step=state.step)


submit_handler = entrypoint(RunEvent, submit, transient_retry=True)
poll_handler = entrypoint(RunEvent, poll, transient_retry=True)
rebind_handler = entrypoint(RunEvent, rebind, transient_retry=True)
checkpoint_handler = entrypoint(RunEvent, checkpoint, transient_retry=True)
