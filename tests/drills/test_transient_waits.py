"""Transient service answers wait, they do not fail: throttling, 5xx and the 503 "not ready" of a
runtime warming up after ``Running`` or binding a checkpoint just saved are "not done yet" for the
training, rebind and checkpoint operations, within the operation's own ``train_op_timeout``; what
the handlers still raise for a transient error reaches the state machine as `TransientServiceError`,
which every training-loop task retries.

The faults are the SageMaker simulator's, answered on the SDK's botocore wire path; each window
is longer than the 12 s the handlers' in-call retries covered before, so these fail without the
waits.
"""

from __future__ import annotations

import time

import pytest
from tests.support.pipeline import BUCKET, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.aws.runstore import RunStore
from stepwise.core.operations import OperationTimedOut
from stepwise.events import BatchEvent, RunEvent
from stepwise.handlers import advantages, plan, train
from stepwise.handlers._common import TransientServiceError

#: Longer than the in-call retries of a runtime call before (6 attempts, at most 11.5 s of backoff).
WINDOW_S = 14


@pytest.fixture(autouse=True)
def _clean(stack):
    stack.sim.clear_faults()
    yield
    stack.sim.clear_faults()


def _trainable_run(stack, **config) -> tuple[str, RunEvent]:
    run_id = new_run_id("transient")
    init_run(stack, run_id, stack.config(**config))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    roll_out_batch(stack, run_id, p, [1.0, 0.0, 0.0, 1.0])
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))["decision"] == "train"
    return run_id, ev


def _until_done(call, ev: RunEvent, first: dict, timeout: float = 90) -> tuple[dict, int]:
    """Call ``call(ev)`` as the state machine's Wait/poll loop does (1 s apart) until done."""
    out, calls, deadline = first, 1, time.monotonic() + timeout
    while not out["done"]:
        assert time.monotonic() < deadline, f"not done after {timeout}s: {out}"
        time.sleep(1)
        out, calls = call(ev), calls + 1
    return out, calls


def test_a_runtime_not_ready_or_binding_for_a_while_waits_and_the_step_is_applied_once(stack):
    run_id, ev = _trainable_run(stack)
    before = dict(stack.sim.counters)
    # The runtime answers 503 to every training submit for WINDOW_S (the SDK's warm-up after Running).
    stack.sim.inject_fault(f"unavailable:ExecuteTrainingOperation:{WINDOW_S}s")
    started = time.monotonic()
    first = train.submit(ev)
    assert first["done"] is False  # not ready: not done yet, not a failure
    out, calls = _until_done(train.poll, ev, first)
    assert time.monotonic() - started >= WINDOW_S - 1 and calls >= 3
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.phase == "rebind" and all(op.waiting_since is None for op in state.pending)

    # The saved weights are still binding: loadWeightsForSampling answers 503 for WINDOW_S.
    stack.sim.inject_fault(f"unavailable:ExecuteSamplingOperation:{WINDOW_S}s")
    started = time.monotonic()
    first = train.rebind(ev)
    assert first["done"] is False
    out, _ = _until_done(train.rebind, ev, first)
    assert time.monotonic() - started >= WINDOW_S - 1 and out["policy_version"] == 1
    after = stack.sim.counters
    for kind in ("forward_backward", "optim_step", "save_weights", "load_weights_for_sampling"):
        assert after.get(kind, 0) - before.get(kind, 0) == 1, kind  # applied once each
    assert after["ExecuteTrainingOperation"] - before.get("ExecuteTrainingOperation", 0) > 3  # refused, then sent


def test_throttled_polls_wait_and_a_refusal_past_train_op_timeout_fails_naming_the_service_answer(stack):
    run_id, ev = _trainable_run(stack, train_op_timeout=4)
    # Every poll throttled for a while: the step completes once they are answered again.
    stack.sim.inject_fault("throttle:GetTrainingOperationResult:3s")
    out, _ = _until_done(train.poll, ev, train.submit(ev))
    assert out["done"]
    # A refusal that outlasts train_op_timeout (4 s) fails the operation, naming what the service answered.
    stack.sim.inject_fault("throttle:ExecuteSamplingOperation:60s")
    with pytest.raises(OperationTimedOut, match=r"load_weights_for_sampling could not be submitted for \d+s "
                                                r"\(train_op_timeout 4s\); the service still answers ThrottlingException \(429\)"):
        _until_done(train.rebind, ev, train.rebind(ev), timeout=30)


def test_a_transient_error_a_handler_still_raises_reaches_the_state_machine_as_a_retried_error(stack):
    stack.sim.set_session_start("ok", seconds=30)  # Created: PollSession asks DescribeTrainingSession
    run_id = new_run_id("transient-poll")
    try:
        init_run(stack, run_id, stack.config())
    finally:
        stack.sim.set_session_start("ok", seconds=0)
    from local.engine import LambdaContext
    from stepwise.handlers.session import poll_handler

    def invoke() -> dict:
        return poll_handler({"run": run_ref(run_id)}, LambdaContext("PollSession", 512, "arn:aws:lambda:local", 60))

    # Throttled beyond botocore's own retries of the control plane (4 attempts).
    stack.sim.inject_fault("throttle:DescribeTrainingSession:8")
    with pytest.raises(TransientServiceError, match="ThrottlingException"):
        invoke()
    stack.sim.clear_faults()
    assert invoke()["ready"] is False  # the state machine's retry succeeds
