"""Every billed training session is stopped: sessions that expire, sessions stopped twice, the
continue-as-new window, and the scheduled sweeper for executions that ended without a stop.

The SageMaker simulator answers through the real SDK and botocore (its ``expire`` fault moves a
session to ``Expired`` as a real session would); the handlers run against moto's S3 and Step
Functions.
"""

from __future__ import annotations

import time

import pytest
from tests.support.pipeline import BUCKET, execution_arn, init_run, new_run_id, run_ref, wait_ready

from stepwise.aws import sagemaker
from stepwise.aws.runstore import RunStore
from stepwise.events import RunEvent, StopEvent
from stepwise.handlers.session import poll_session, stop


def test_an_expired_session_ends_the_start_wait_at_once_with_its_reason_and_stopping_it_is_success(stack):
    stack.sim.set_session_start("ok", seconds=30)  # the session stays Created: PollSession waits
    run_id = new_run_id("expired")
    try:
        init_run(stack, run_id, stack.config())
    finally:
        stack.sim.set_session_start("ok", seconds=0)
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    assert poll_session(ev)["ready"] is False
    stack.sim.inject_fault("expire:DescribeTrainingSession:1")  # the session expires before the next poll
    started = time.monotonic()
    with pytest.raises(sagemaker.SessionFailed, match=r"is Expired: the training session expired \(injected fault\)"):
        poll_session(ev)
    assert time.monotonic() - started < 5  # at once, not at STEPWISE_SESSION_START_TIMEOUT (1800 s)
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert stack.sim.session_statuses()[state.training_session_name] == "Expired"

    # The catch-all's StopSession: an Expired session is already ended, the stop is success.
    before = stack.sim.counters.get("StopTrainingSession", 0)
    out = stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={},
                         error={"Error": "SessionFailed", "Cause": "drill"}))
    assert out["stopped"] is True
    assert stack.sim.counters["StopTrainingSession"] == before + 1  # asked, refused as a transition from Expired
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.session_stopped and state.stop_reason == "failed: SessionFailed"
    assert stack.sim.session_statuses()[state.training_session_name] == "Expired"


def test_stopping_a_session_in_every_ended_status_is_success_and_an_active_one_is_stopped(stack):
    """`stepwise.aws.sagemaker.stop_session` against the simulator: Expired, Stopping, Stopped are
    done (False: nothing to stop), Running is stopped (True), a session never created is done."""
    from stepwise.config import RunConfig

    run_id = new_run_id("stops")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    cfg = RunConfig.model_validate(stack.config())
    name = state.training_session_name
    assert sagemaker.stop_session(cfg, name) is True
    assert stack.sim.session_statuses()[name] in ("Stopping", "Stopped")
    assert sagemaker.stop_session(cfg, name) is False  # twice: the SDK's own no-op
    assert sagemaker.stop_session(cfg, "stepwise-never-created-00000000") is False

    other = new_run_id("stops-expired")
    init_run(stack, other, stack.config())
    expired = rs.read_state(other)[0].training_session_name
    stack.sim.expire_session(expired)
    assert sagemaker.stop_session(cfg, expired) is False  # the SDK's stop_session raises here
