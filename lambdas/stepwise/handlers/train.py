"""SubmitTrain, PollOperation, Rebind and Checkpoint: the session's operations, driven from state.json.

Every phase is a list of operations planned write-ahead in ``state.pending`` (sequence numbers
and client tokens fixed before anything is sent, `stepwise.training.plan_training_ops`). A
handler *drives* the phase: it (re)submits what is planned, polls what is submitted, and, when
every operation succeeded, applies the phase's transition. Re-running a handler with the same
input is therefore harmless: a re-sent training operation carries the same (sequenceNumber,
clientToken) and the runtime applies it once.

Phases and transitions (reference `train_grpo.py` step: forward_backward, optim_step, then
``save_weights_and_get_sampling_client`` = saveWeights + loadWeightsForSampling):

- ``train``  [forward_backward/0..n-1, optim_step, save_weights] -> ``rebind``
- ``rebind`` [load_weights_for_sampling(saved ARN)] -> commit sampler ARN, policy version, step + 1
- ``resume`` [load_state(with optimizer), save_weights] -> ``resume_rebind`` -> commit sampler ARN
- ``checkpoint`` [save_state] or [save_weights] -> record the checkpoint
"""

from __future__ import annotations

import time
from typing import Any

from stepwise import training
from stepwise.handlers._common import (
    RunEvent,
    bind,
    emit,
    inline_wait_seconds,
    logger,
    now,
    poll_seconds,
    run_config,
    store,
    write_summary,
)
from stepwise.layout import datums_key
from stepwise.records import Checkpoint, PendingOperation, RunState


#: Seconds between status reads while a handler polls inline (its budget: STEPWISE_INLINE_WAIT_SECONDS).
POLL_INTERVAL_S = 0.25


class PhaseMismatch(RuntimeError):
    """The handler was called while the run is in another phase (names both)."""


# ---------------------------------------------------------------------------- pure transitions


def plan_train_phase(state: RunState, num_chunks: int) -> None:
    """Plan a step's training operations (write-ahead). Idempotent once planned."""
    if state.phase == "train":
        return
    if state.phase != "idle":
        raise PhaseMismatch(f"cannot start training step {state.step}: run is in phase {state.phase!r}")
    names = [f"forward_backward/{i}" for i in range(num_chunks)] + ["optim_step", "save_weights"]
    training.plan_training_ops(state, names, tag=state.step)
    for op in state.pending:
        if op.name == "save_weights":
            op.description = f"stepwise {state.run_id} step {state.step + 1} sampler weights"
    state.phase = "train"


def plan_checkpoint(state: RunState, reason: str) -> None:
    """Plan a save (``reason``: "save_every" | "final" -> save_state, "weights_at_end" -> save_weights)."""
    if state.phase == "checkpoint":
        return
    if state.phase != "idle":
        raise PhaseMismatch(f"cannot checkpoint: run is in phase {state.phase!r}")
    name = "save_weights" if reason == "weights_at_end" else "save_state"
    training.plan_training_ops(state, [name], tag=f"{state.step}/{reason}")
    state.pending[0].description = f"stepwise {state.run_id} step {state.step} ({reason})"
    state.phase = "checkpoint"
    state.checkpoint_reason = reason


def plan_resume(state: RunState, model_package_arn: str) -> None:
    if state.phase == "resume":
        return
    training.plan_training_ops(state, ["load_state", "save_weights"], tag="resume")
    state.pending[0].argument = model_package_arn
    state.pending[1].description = f"stepwise {state.run_id} resumed sampler weights"
    state.phase = "resume"


def _sampling_op(arn: str) -> PendingOperation:
    return PendingOperation(name="load_weights_for_sampling", kind="sampling", argument=arn)


def _saved_weights(state: RunState) -> str:
    op = next(o for o in state.pending if o.name == "save_weights")
    return training.saved_weights_arn(op.result or {})


def complete_phase(state: RunState) -> dict[str, Any]:
    """Apply the transition of a phase whose operations all succeeded; returns metrics to report."""
    out: dict[str, Any] = {}
    if state.phase == "train":
        fb = [o for o in state.pending if o.name.startswith("forward_backward/")]
        out = {
            f"train/{k}": v
            for k, v in training.forward_backward_metrics([o.result or {} for o in fb], state.datum_chunks).items()
        }
        optim = next(o for o in state.pending if o.name == "optim_step")
        out.update({f"optim/{k}": v for k, v in ((optim.result or {}).get("optimizerStep") or {}).get("metrics", {}).items()})
        started = min((o.submitted_at for o in state.pending if o.submitted_at), default=None)
        if started:
            out["time/train"] = now() - started
        state.step_metrics.update(out)
        state.pending = [_sampling_op(_saved_weights(state))]
        state.phase = "rebind"
    elif state.phase == "resume":
        state.pending = [_sampling_op(_saved_weights(state))]
        state.phase = "resume_rebind"
    elif state.phase in ("rebind", "resume_rebind"):
        state.sampler_model_package_arn = state.pending[0].argument or ""
        if state.phase == "rebind":
            state.policy_version += 1
            state.step += 1
            state.generation_batch = 0
            state.kept_groups = 0
            state.datum_chunks = []
        else:
            state.resume_loaded = True
        state.pending = []
        state.phase = "idle"
        out = {"policy_version": state.policy_version}
    elif state.phase == "checkpoint":
        op = state.pending[0]
        arn = training.saved_weights_arn(op.result or {}) if op.name == "save_weights" else training.saved_state_arn(op.result or {})
        kind = "weights" if op.name == "save_weights" else "state"
        state.checkpoints.append(Checkpoint(step=state.step, kind=kind, model_package_arn=arn, reason=state.checkpoint_reason,
                                            epoch=state.epoch, cursor=state.cursor, policy_version=state.policy_version))
        if state.checkpoint_reason == "final":
            state.final_checkpoint_done = True
        elif state.checkpoint_reason == "weights_at_end":
            state.final_weights_done = True
        state.pending = []
        state.phase = "idle"
        state.checkpoint_reason = ""
        out = {"model_package_arn": arn}
    else:
        raise PhaseMismatch(f"no operations to complete in phase {state.phase!r}")
    return out


# ---------------------------------------------------------------------------- the driver


def _operation_config(run_id: str, step: int, op: PendingOperation, cfg: Any) -> dict[str, Any]:
    """The ``operationConfig`` of a planned op (datum chunks are read back from S3: same bytes on a retry)."""
    if op.name.startswith("forward_backward/"):
        chunk = int(op.name.split("/")[1])
        datums = store().get_json(datums_key(run_id, step, chunk))
        return training.forward_backward_config(datums, cfg.loss, cfg.loss_fn_config)
    if op.name == "optim_step":
        return training.optim_step_config(cfg.learning_rate)
    if op.name == "save_weights":
        return training.save_weights_config(op.description)
    if op.name == "save_state":
        return training.save_state_config(op.description)
    if op.name == "load_state":
        return training.load_state_config(op.argument or "", with_optimizer=True)
    if op.name == "load_weights_for_sampling":
        return training.load_weights_for_sampling_config(op.argument or "")
    raise ValueError(f"unknown operation {op.name!r}")


def drive(run_id: str, execution_arn: str, phases: tuple[str, ...], *, budget_s: float) -> tuple[RunState, bool, dict[str, Any]]:
    """Submit planned ops, poll submitted ones, complete finished phases, for up to ``budget_s`` seconds.

    Stops with ``done=True`` when the run leaves ``phases`` (returns to idle). Returns
    ``(state, done, metrics of completed phases)``.
    """
    rs = store()
    cfg = run_config(run_id)
    rt = training.runtime(cfg.region)
    deadline = time.monotonic() + budget_s
    reported: dict[str, Any] = {}
    while True:
        state = rs.owned_state(run_id, execution_arn)
        if state.phase not in phases:
            return state, True, reported
        submitted: dict[str, tuple[str, float]] = {}
        for op in sorted(state.pending, key=lambda o: (o.sequence_number or 0)):
            if op.operation_id is not None:
                continue
            config = _operation_config(run_id, state.step, op, cfg)
            if op.kind == "training":
                op_id = training.submit_training_op(rt, state.training_session_name, op, config)
            else:
                op_id = training.submit_sampling_op(rt, state.training_session_name, config)
            submitted[op.name] = (op_id, now())

        results: dict[str, Any] = {}

        def change(s: RunState) -> None:
            results.clear()
            for op in s.pending:
                if op.name in submitted and op.operation_id is None:
                    op.operation_id, op.submitted_at = submitted[op.name]
                    op.status = "Submitted"
            if training.advance_pending(rt, s, timeout_s=cfg.train_op_timeout):
                results.update(complete_phase(s))
                results["_completed"] = True

        state = rs.update_state(run_id, change, execution_arn=execution_arn)
        if results.pop("_completed", False):
            reported.update(results)
            continue
        if time.monotonic() >= deadline:
            return state, False, reported
        time.sleep(POLL_INTERVAL_S)


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
    state, _, reported = drive(run.run_id, run.execution_arn, ("train",), budget_s=inline_wait_seconds())
    _report_train(run.run_id, step, reported)
    return _result(state.phase != "train", step=step)


def poll(event: RunEvent) -> dict[str, Any]:
    """Poll the step's training operations; done when they all succeeded (the run moves to rebind)."""
    run = event.run
    step = store().owned_state(run.run_id, run.execution_arn).step
    bind(run_id=run.run_id, step=step)
    state, _, reported = drive(run.run_id, run.execution_arn, ("train",), budget_s=inline_wait_seconds())
    _report_train(run.run_id, step, reported)
    return _result(state.phase != "train", step=step)


def rebind(event: RunEvent) -> dict[str, Any]:
    """load_weights_for_sampling of the saved weights, then commit the sampler ARN and policy version."""
    run = event.run
    before = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=before.step)
    if before.phase == "train":
        raise PhaseMismatch("Rebind called before the training operations completed")
    state, done, _ = drive(run.run_id, run.execution_arn, ("rebind",), budget_s=inline_wait_seconds())
    if done and state.step_metrics.get("step") == state.step - 1:
        # The step's summary is written once, complete: sampling, advantages, train/* and the new policy.
        summary = dict(state.step_metrics, decision="train", policy_version=state.policy_version,
                       sampler_model_package_arn=state.sampler_model_package_arn)
        write_summary(run.run_id, state.step - 1, summary)
        logger.info("sampler rebound", extra={"policy_version": state.policy_version})
    return _result(done, step=state.step, policy_version=state.policy_version)


def checkpoint(event: RunEvent) -> dict[str, Any]:
    """Drive the checkpoint PlanStep planned (save_state, or save_weights at the end)."""
    run = event.run
    state = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    if state.phase not in ("checkpoint", "idle"):
        raise PhaseMismatch(f"Checkpoint called in phase {state.phase!r}")
    state, done, reported = drive(run.run_id, run.execution_arn, ("checkpoint",), budget_s=inline_wait_seconds())
    if done and reported.get("model_package_arn"):
        logger.info("checkpoint saved", extra={"model_package_arn": reported["model_package_arn"]})
    return _result(done, step=state.step)


@logger.inject_lambda_context(clear_state=True)
def submit_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return submit(RunEvent.model_validate(event))


@logger.inject_lambda_context(clear_state=True)
def poll_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return poll(RunEvent.model_validate(event))


@logger.inject_lambda_context(clear_state=True)
def rebind_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return rebind(RunEvent.model_validate(event))


@logger.inject_lambda_context(clear_state=True)
def checkpoint_handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return checkpoint(RunEvent.model_validate(event))
