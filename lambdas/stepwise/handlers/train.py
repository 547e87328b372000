"""SubmitTrain, PollOperation, Rebind and Checkpoint: the session's operations, driven from state.json.

Each handler checks the run's phase and drives it (`stepwise.aws.sagemaker.drive`); the phases, their
write-ahead plans and transitions are `stepwise.core.phases` (reference `train_grpo.py` step:
forward_backward, optim_step, then ``save_weights_and_get_sampling_client`` = saveWeights +
loadWeightsForSampling). Re-running a handler with the same input is harmless: a re-sent training
operation carries the same (sequenceNumber, clientToken) and the runtime applies it once.

Rebind also keeps the run's current sampler (``runs/{run_id}/sampler/current.json``) around the load,
by the run's ``sampler_binding`` (`stepwise.core.sampler_binding`): ``turn_gate`` closes the gate and
waits, through the state machine's Wait, until the turns in flight drained (or a bound passed) before it
submits the load; ``next_turn`` names the package being loaded; every binding publishes the new sampler,
gate open, once the load is committed.
"""

from __future__ import annotations

from typing import Any

from stepwise.aws import sampler_gate
from stepwise.aws.runstore import RunStore
from stepwise.core import sampler_binding as binding_rules
from stepwise.core.phases import PhaseMismatch, plan_train_phase
from stepwise.events import RunEvent
from stepwise.handlers._common import (
    bind,
    drive,
    emit,
    entrypoint,
    logger,
    now,
    poll_seconds,
    run_config,
    store,
    write_summary,
)
from stepwise.records import RunSampler, RunState, SamplerPolicy


def _result(done: bool, **extra: Any) -> dict[str, Any]:
    return {"done": done, "wait_seconds": poll_seconds(), **extra}


def _train_result(done: bool, run_id: str, **extra: Any) -> dict[str, Any]:
    """A training handler's answer; ``rebind_in_branch``: whether the overlapped step's training branch
    rebinds itself (`stepwise.core.sampler_binding.rebind_during_rollouts`), and ``rebound`` False (Rebind's
    answer says True once it committed): the state machine reads both after the Parallel state joins."""
    cfg = run_config(run_id)
    return _result(done, rebind_in_branch=binding_rules.rebind_during_rollouts(cfg.sampler_binding, cfg.max_staleness,
                                                                                  cfg.admission),
                   rebound=False, **extra)


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
    return _train_result(state.phase != "train", run.run_id, step=step)


def poll(event: RunEvent) -> dict[str, Any]:
    """Poll the step's training operations; done when they all succeeded (the run moves to rebind)."""
    run = event.run
    step = store().owned_state(run.run_id, run.execution_arn).step
    bind(run_id=run.run_id, step=step)
    state, _, reported = drive(run.run_id, run.execution_arn, ("train",))
    _report_train(run.run_id, step, reported)
    return _train_result(state.phase != "train", run.run_id, step=step)


def _loading(state: RunState) -> SamplerPolicy:
    """The sampler the rebind phase's load makes current (the next policy version)."""
    return SamplerPolicy(training_session_name=state.training_session_name,
                         sampler_model_package_arn=state.pending[0].argument or "", policy_version=state.policy_version + 1)


def _before_load(rs: RunStore, run_id: str, state: RunState, binding: str) -> dict[str, Any] | None:
    """What the binding asks before the load is submitted: ``turn_gate`` closes the gate (the PUT comes
    before the listing: `stepwise.core.sampler_binding.drain_verdict`) and answers Rebind's wait while
    turns are in flight; ``next_turn`` names the package being loaded. None: submit the load now."""
    if state.phase != "rebind" or not state.pending or state.pending[0].operation_id is not None:
        return None
    policy, loading, t = SamplerPolicy.of(state), _loading(state), now()
    if binding == "next_turn":
        sampler_gate.write_current(rs, run_id, binding_rules.announce_load(policy, loading, t))
        return None
    if binding != "turn_gate":
        return None
    closed = binding_rules.close_gate(sampler_gate.read_current(rs, run_id), policy, loading, t)
    sampler_gate.write_current(rs, run_id, closed)
    verdict = binding_rules.drain_verdict(closed.closed_at or t, sampler_gate.lease_deadlines(rs, run_id), now())
    if not verdict.ready:
        return _result(False, step=state.step, wait_seconds=binding_rules.DRAIN_POLL_SECONDS,
                       turns_in_flight=verdict.in_flight)
    if verdict.in_flight:  # the drain passed its bound: say so in the step's metrics
        logger.warning("loading new weights with turns in flight", extra={"turns": verdict.in_flight,
                                                                           "waited_s": round(verdict.waited_s, 1)})
        sampler_gate.write_current(rs, run_id, closed.model_copy(update={"turns_at_load": verdict.in_flight}))
    return None


def _after_load(rs: RunStore, run_id: str, state: RunState, done: bool, binding: str) -> RunSampler | None:
    """Once the load is committed, the run's current sampler is the new one, gate open (every binding);
    while a gated load runs, its gate's deadline is renewed. Returns the current sampler when done."""
    gated = binding == "turn_gate" and state.phase == "rebind" and bool(state.pending)
    if not done and not gated:
        return None
    current = sampler_gate.read_current(rs, run_id)
    policy = SamplerPolicy.of(state)
    if done:
        if (current is not None and current.gate == "open" and not current.loading_model_package_arn
                and SamplerPolicy.model_validate(current.model_dump()) == policy):
            return current  # a repeated call: already published
        opened = binding_rules.open_gate(policy, now(), current)
        sampler_gate.write_current(rs, run_id, opened)
        return opened
    if gated:
        sampler_gate.write_current(rs, run_id, binding_rules.close_gate(current, policy, _loading(state), now()))
    return None


def rebind(event: RunEvent) -> dict[str, Any]:
    """load_weights_for_sampling of the saved weights, then commit the sampler ARN and policy version; around
    the load, the run's current sampler and gate (module docstring). ``done`` False with ``wait_seconds``:
    call again after that Wait (the load runs, or turns still drain at a closed gate)."""
    run = event.run
    before = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=before.step)
    if before.phase == "train":
        raise PhaseMismatch("Rebind called before the training operations completed")
    rs = store()
    binding = run_config(run.run_id).sampler_binding
    waiting = _before_load(rs, run.run_id, before, binding)
    if waiting is not None:
        return waiting
    state, done, _ = drive(run.run_id, run.execution_arn, ("rebind",))
    current = _after_load(rs, run.run_id, state, done, binding)
    if done and state.step_metrics.get("step") == state.step - 1:
        # The step's summary is written once, complete: sampling, advantages, train/* and the new policy.
        summary = dict(state.step_metrics, decision="train", policy_version=state.policy_version,
                       sampler_model_package_arn=state.sampler_model_package_arn,
                       **binding_rules.gate_metrics(current))
        write_summary(run.run_id, state.step - 1, summary)
        # the session's busy/idle split and the step's cost are known only now
        # (`stepwise.core.staleness.session_time_metrics`, `stepwise.core.ledger.close_step`)
        _report_train(run.run_id, state.step - 1, {k: v for k, v in state.step_metrics.items()
                                                   if k in ("time/session_busy", "time/session_idle", "time/step_wall")
                                                   or k.startswith(("cost/", "budget/"))})
        logger.info("sampler rebound", extra={"policy_version": state.policy_version})
    return _result(done, step=state.step, policy_version=state.policy_version, rebound=done)


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
