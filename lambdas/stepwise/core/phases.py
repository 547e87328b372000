"""The run's phases, pure: write-ahead plans of SageMaker operations and what their completion means.

Every phase is a list of operations planned write-ahead in ``state.pending`` (sequence numbers
and client tokens fixed before anything is sent, :func:`plan_training_ops`). A handler *drives*
the phase (`stepwise.aws.sagemaker.drive`): it (re)submits what is planned, polls what is submitted,
and, when every operation succeeded, applies the phase's transition (:func:`complete_phase`).
Re-running a handler with the same input is therefore harmless: a re-sent training operation
carries the same (sequenceNumber, clientToken) and the runtime applies it once (docs/internals.md).

Phases and transitions (reference `train_grpo.py` step: forward_backward, optim_step, then
``save_weights_and_get_sampling_client`` = saveWeights + loadWeightsForSampling):

- ``train``  [forward_backward/0..n-1, optim_step, save_weights] -> ``rebind``
- ``rebind`` [load_weights_for_sampling(saved ARN)] -> commit sampler ARN, policy version, step + 1
- ``resume`` [load_state(with optimizer), save_weights] -> ``resume_rebind`` -> commit sampler ARN
- eval-only runs: ``resume_rebind`` [load_weights_for_sampling(the evaluated package)] -> commit sampler ARN
- ``checkpoint`` [save_state] or [save_weights] -> record the checkpoint

A resumed run whose session was stopped moves onto a new session at its newest ``save_state``
checkpoint (:func:`rewind_to_checkpoint`). Pure functions of `stepwise.records.RunState`: no
boto3, no environment, no I/O.
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from stepwise.core import ledger
from stepwise.core.operations import forward_backward_metrics, saved_state_arn, saved_weights_arn
from stepwise.core.staleness import session_time_metrics, staleness_loss_metrics
from stepwise.records import Checkpoint, GroupFrontier, PendingOperation, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: Namespace of the deterministic client tokens (uuid5).
CLIENT_TOKEN_NAMESPACE = uuid.UUID("6f0b6c1e-5d0a-4f4e-9a51-5e8f3b1f2c7d")


class PhaseMismatch(RuntimeError):
    """The handler was called while the run is in another phase (names both)."""


# ---------------------------------------------------------------------------- names and tokens


def session_name_for(run_id: str) -> str:
    """Deterministic training-session name of a run (a retried Init never creates a second one).

    Shape: ``stepwise-{sanitized run id, <= 44 chars}-{8 hex of sha256(run id)}``, within the
    API's ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``.
    """
    clean = re.sub(r"[^a-zA-Z0-9]+", "-", run_id).strip("-")[:44].strip("-") or "run"
    return f"stepwise-{clean}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def resume_session_name(run_id: str, segment: int) -> str:
    """The session of a resumed run: deterministic per (run, segment), so a retried Init adopts it."""
    return session_name_for(f"{run_id}/resume-{segment}")


def client_token(run_id: str, session_name: str, step: int | str, operation: str) -> str:
    """uuid5 over ``run/session/step/operation`` (operation includes the chunk, e.g. ``forward_backward/3``)."""
    return str(uuid.uuid5(CLIENT_TOKEN_NAMESPACE, f"{run_id}/{session_name}/{step}/{operation}"))


def plan_training_ops(state: RunState, names: list[str], *, tag: int | str) -> list[PendingOperation]:
    """Allocate consecutive sequence numbers and deterministic tokens for ``names`` (write-ahead).

    Mutates ``state`` (``last_sequence_number``, ``pending``); the caller persists it before
    submitting anything. ``tag`` (usually the step) scopes the client tokens.
    """
    ops = []
    for name in names:
        state.last_sequence_number += 1
        ops.append(
            PendingOperation(
                name=name,
                kind="training",
                sequence_number=state.last_sequence_number,
                client_token=client_token(state.run_id, state.training_session_name, tag, name),
            )
        )
    state.pending = ops
    return ops


# ---------------------------------------------------------------------------- plans


def plan_train_phase(state: RunState, num_chunks: int) -> None:
    """Plan a step's training operations (write-ahead). Idempotent once planned."""
    if state.phase == "train":
        return
    if state.phase != "idle":
        raise PhaseMismatch(f"cannot start training step {state.step}: run is in phase {state.phase!r}")
    names = [f"forward_backward/{i}" for i in range(num_chunks)] + ["optim_step", "save_weights"]
    plan_training_ops(state, names, tag=state.step)
    for op in state.pending:
        if op.name == "save_weights":
            op.description = f"stepwise {state.run_id} step {state.step + 1} sampler weights"
    state.phase = "train"


def plan_checkpoint(state: RunState, reason: str, *, groups: GroupFrontier | None = None) -> None:
    """Plan a save (``reason``: "save_every" | "final" -> save_state, "weights_at_end" -> save_weights).
    ``groups``: the group engine's frontier at this point, which the checkpoint records (a resume redoes
    the groups it had not consumed)."""
    if state.phase == "checkpoint":
        return
    if state.phase != "idle":
        raise PhaseMismatch(f"cannot checkpoint: run is in phase {state.phase!r}")
    if state.ahead_batch is not None:
        # The checkpoint records the cursor a resume rewinds to; it must not include a batch rolled
        # out ahead (`stepwise.core.staleness.roll_out_ahead_blocker` keeps the two apart).
        raise PhaseMismatch(f"cannot checkpoint at step {state.step}: step {state.ahead_batch.step}'s first batch "
                            "is rolled out ahead")
    name = "save_weights" if reason == "weights_at_end" else "save_state"
    plan_training_ops(state, [name], tag=f"{state.step}/{reason}")
    state.pending[0].description = f"stepwise {state.run_id} step {state.step} ({reason})"
    state.phase = "checkpoint"
    state.checkpoint_reason = reason  # type: ignore[assignment]  # a CheckpointReason
    state.checkpoint_groups = groups


def plan_resume(state: RunState, model_package_arn: str) -> None:
    """Plan loading ``model_package_arn`` with its optimizer state, then saving sampler weights."""
    if state.phase == "resume":
        return
    plan_training_ops(state, ["load_state", "save_weights"], tag="resume")
    state.pending[0].argument = model_package_arn
    state.pending[1].description = f"stepwise {state.run_id} resumed sampler weights"
    state.phase = "resume"


def plan_initial_sampler(state: RunState) -> None:
    """Save the base weights as the first sampler (``save_weights``, then bind the sampler to them), so no
    rollout samples the base model (``""``) while a step trains: the group engine admits groups while a
    step trains from the first step on, and for the service a sample without a model package is "the
    session's latest checkpoint" (`stepwise.core.staleness.roll_out_ahead_blocker`). Idempotent once planned."""
    if state.phase == "resume":
        return
    plan_training_ops(state, ["save_weights"], tag="initial")
    state.pending[0].description = f"stepwise {state.run_id} base weights (the first sampler)"
    state.phase = "resume"


def plan_eval_weights(state: RunState, model_package_arn: str) -> None:
    """An eval-only run: bind the sampler to ``model_package_arn`` (load_weights_for_sampling, then the
    ``resume_rebind`` commit: sampler ARN set, ``resume_loaded``). No training operation, so no sequence
    number: the SDK's ``ServiceClient.create_sampling_client(model_package_arn=...)`` samples saved weights
    the same way, from a session of the package's base model. Idempotent once planned."""
    if state.phase == "resume_rebind":
        return
    if state.phase != "idle":
        raise PhaseMismatch(f"cannot load weights to evaluate: run is in phase {state.phase!r}")
    state.pending = [_sampling_op(model_package_arn)]
    state.phase = "resume_rebind"


def _sampling_op(arn: str) -> PendingOperation:
    return PendingOperation(name="load_weights_for_sampling", kind="sampling", argument=arn)


def _saved_weights(state: RunState) -> str:
    op = next(o for o in state.pending if o.name == "save_weights")
    return saved_weights_arn(op.result or {})


# ---------------------------------------------------------------------------- completion


def _created(state: RunState, arn: str) -> None:
    """Note a model package the run saved (``state.created_packages``: what retention may delete)."""
    if arn and arn not in state.created_packages:
        state.created_packages.append(arn)


def complete_phase(state: RunState, *, now: Callable[[], float] = time.time, cfg: RunConfig | None = None) -> dict[str, Any]:
    """Apply the transition of a phase whose operations all succeeded; returns metrics to report
    (``train/*``, ``optim/*`` and ``time/train`` seconds since the first submit, by ``now``).
    With ``cfg``, a rebind also ends the step in the cost ledger (`stepwise.core.ledger.close_step`:
    its ``cost/*`` and ``budget/*`` keys join ``state.step_metrics``).

    Raises:
        PhaseMismatch: the run is idle (no operations to complete).
        OperationFailed: a save completed without a model package ARN.
    """
    out: dict[str, Any] = {}
    if state.phase == "train":
        fb = [o for o in state.pending if o.name.startswith("forward_backward/")]
        out = {
            f"train/{k}": v
            for k, v in forward_backward_metrics([o.result or {} for o in fb], state.datum_chunks).items()
        }
        by_staleness = [o.result.get("by_staleness") for o in fb if o.result and o.result.get("by_staleness")]
        out.update(staleness_loss_metrics(by_staleness))
        optim = next(o for o in state.pending if o.name == "optim_step")
        out.update({f"optim/{k}": v for k, v in ((optim.result or {}).get("optimizerStep") or {}).get("metrics", {}).items()})
        started = min((o.submitted_at for o in state.pending if o.submitted_at), default=None)
        if started:
            out["time/train"] = now() - started
        state.train_started_at = started
        state.step_metrics.update(out)
        _created(state, _saved_weights(state))
        state.pending = [_sampling_op(_saved_weights(state))]
        state.phase = "rebind"
    elif state.phase == "resume":
        _created(state, _saved_weights(state))
        state.pending = [_sampling_op(_saved_weights(state))]
        state.phase = "resume_rebind"
    elif state.phase in ("rebind", "resume_rebind"):
        state.sampler_model_package_arn = state.pending[0].argument or ""
        if state.phase == "rebind":
            rebound = now()
            if state.train_started_at is not None:
                # The previous step's rebind, or this step's start when later (an eval, a checkpoint
                # or a resume in between); with a batch rolled out ahead the start is the earlier.
                marks = [t for t in (state.last_rebound_at, state.step_started_at) if t is not None]
                state.step_metrics.update(session_time_metrics(
                    train_started_at=state.train_started_at, rebound_at=rebound,
                    previous_end=max(marks) if marks else None))
            state.last_rebound_at = rebound
            if cfg is not None:
                state.step_metrics.update(ledger.close_step(state, cfg, rebound, state.step))
                state.step_metrics.update(ledger.check_metrics(state))
            state.train_started_at = None
            state.policy_version += 1
            state.step += 1
            state.generation_batch = 0
            state.kept_groups = 0
            state.datum_chunks = []
            state.datum_staleness = []
        else:
            state.resume_loaded = True
        state.pending = []
        state.phase = "idle"
        out = {"policy_version": state.policy_version}
    elif state.phase == "checkpoint":
        op = state.pending[0]
        arn = saved_weights_arn(op.result or {}) if op.name == "save_weights" else saved_state_arn(op.result or {})
        kind = "weights" if op.name == "save_weights" else "state"
        _created(state, arn)
        state.checkpoints.append(Checkpoint(step=state.step, kind=kind, model_package_arn=arn, reason=state.checkpoint_reason,
                                            epoch=state.epoch, cursor=state.cursor, policy_version=state.policy_version,
                                            groups=state.checkpoint_groups))
        state.checkpoint_groups = None
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


# ---------------------------------------------------------------------------- resume


def is_failure_stop(reason: str | None) -> bool:
    """A stop reason a resume clears: the catch-all's ``failed: ...`` or Cleanup's ``execution ...``
    (ABORTED / TIMED_OUT / FAILED). End-of-data reasons (DAPO cap, dataset exhausted) stay."""
    return reason is not None and reason.startswith(("failed", "execution "))


def rewind_to_checkpoint(state: RunState, *, session_name: str, created_at: float, base_resume_arn: str = "") -> Checkpoint | None:
    """Move a run whose session was stopped onto a new session at its newest ``save_state`` checkpoint (pure).

    Rewinds step / epoch / cursor / policy version to the checkpoint, drops what was in flight
    (pending operations, the planned batch, the step's metrics, checkpoints saved after it), resets
    the sequence numbers (a new session starts at 1) and plans ``load_state`` (with optimizer) +
    ``save_weights`` write-ahead; PollSession drives them once the session runs. Without any
    ``save_state`` checkpoint the run restarts from step 0 (from ``resume_from_model_package`` if
    the config names one). Returns the checkpoint used, or None.
    """
    states = [c for c in state.checkpoints if c.kind == "state"]
    ckpt = max(states, key=lambda c: c.step) if states else None
    state.training_session_name = session_name
    state.session_status = "Creating"
    state.session_created_at = created_at
    state.session_stopped = False
    state.last_sequence_number = 0
    state.pending = []
    state.phase = "idle"
    state.checkpoint_reason = ""
    state.checkpoint_groups = None
    state.current_batch = None
    # a batch rolled out ahead belongs to a step after the checkpoint: redone from its cursor
    state.ahead_batch, state.ahead_started_at, state.ahead_cursor_start = None, None, 0
    state.train_started_at = state.last_rebound_at = None
    state.last_decision = None
    state.step_metrics = {}
    state.datum_chunks = []
    state.empty_steps, state.empty_steps_report = 0, ""
    state.generation_batch = 0
    state.kept_groups = 0
    state.eval_step_pending = None
    state.sampler_model_package_arn = ""
    state.finished = False
    if ckpt is None:
        state.step = state.epoch = state.cursor = state.policy_version = 0
        state.checkpoints = []
        state.resume_loaded = not base_resume_arn
    else:
        state.step = ckpt.step
        if ckpt.epoch >= 0 and ckpt.cursor >= 0:
            state.epoch, state.cursor = ckpt.epoch, ckpt.cursor
        state.policy_version = ckpt.policy_version if ckpt.policy_version >= 0 else ckpt.step
        state.checkpoints = [c for c in state.checkpoints if c.step <= ckpt.step]
        state.resume_loaded = False
        plan_resume(state, ckpt.model_package_arn)
    state.step_cursor_start = state.cursor
    # Evals at or before the checkpoint's step evaluated the very weights the run restarts from
    # (the baseline at step 0 included): they stand and are not run again. Later ones are redone.
    state.eval_steps = [s for s in state.eval_steps if s <= state.step]
    state.eval_history = [p for p in state.eval_history if p.step <= state.step]
    if state.best is not None and state.best.step > state.step:
        state.best = None  # Init's resume recomputes it from the history kept (stepwise.core.selection.refresh_best)
    if state.last_eval_step is not None and state.last_eval_step > state.step:
        state.last_eval_step = state.step if state.step in state.eval_steps else None
    state.final_eval_done = state.final_eval_done and state.last_eval_step == state.step
    state.final_checkpoint_done = any(c.reason == "final" and c.step == state.step for c in state.checkpoints)
    state.final_weights_done = any(c.reason == "weights_at_end" and c.step == state.step for c in state.checkpoints)
    state.segment_start_step = state.step
    return ckpt


def final_weights(state: RunState) -> Checkpoint | None:
    """The run's final weights, as a ``kind="weights"`` `Checkpoint` (a ``save_weights_for_sampler``
    model package: LoRA weights without optimizer state, the SDK's deployable kind), or ``None``
    when no step was trained (the sampler is still the base model) or the run was eval-only.

    The ``save_weights_at_end`` checkpoint when one was saved; else the sampler's current model
    package, which SubmitTrain saves after every optimizer step (``reason="sampler"``, ``step`` =
    steps completed, ``policy_version`` = optimizer steps applied).
    """
    if state.eval_only:  # its sampler is the package it evaluated, not weights it made
        return None
    at_end = [c for c in state.checkpoints if c.kind == "weights" and c.reason == "weights_at_end"]
    if at_end:
        return max(at_end, key=lambda c: c.step)
    if not state.sampler_model_package_arn:
        return None
    return Checkpoint(step=state.step, kind="weights", model_package_arn=state.sampler_model_package_arn,
                      reason="sampler", epoch=state.epoch, policy_version=state.policy_version)
