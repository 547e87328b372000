"""Session lifecycle: Cleanup and StopSession stop only the owner's session; continuations take over
only from their parent; a session that fails to start fails the run; resume loads the checkpoint."""

from __future__ import annotations

import json

import pytest
from tests.support.pipeline import BUCKET, Stack, execution_arn, init_run, new_run_id, run_ref, wait_ready

from stepwise.aws.runstore import RunOwnedElsewhere, RunStore
from stepwise.aws.sagemaker import SessionFailed
from stepwise.events import ExecutionStatusChange, RunEvent, StopEvent
from stepwise.handlers.init import take_over
from stepwise.handlers.session import cleanup, poll_session, stop


def _event(status: str, arn: str, name: str, input_: dict | None = None) -> ExecutionStatusChange:
    return ExecutionStatusChange.model_validate(
        {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
         "detail": {"status": status, "executionArn": arn, "name": name, "input": json.dumps(input_ or {})}})


def _stops(stack: Stack) -> int:
    return stack.sim.counters.get("StopTrainingSession", 0)


def test_cleanup_stops_the_session_only_for_the_owner_on_abnormal_ends(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    before = _stops(stack)
    assert cleanup(_event("SUCCEEDED", execution_arn(run_id), run_id))["stopped"] is False
    assert cleanup(_event("FAILED", execution_arn(run_id) + "x", run_id))["stopped"] is False  # not the owner
    assert _stops(stack) == before
    out = cleanup(_event("TIMED_OUT", execution_arn(run_id), run_id))
    assert out["stopped"] is True and _stops(stack) == before + 1
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.session_stopped and state.stop_reason == "execution TIMED_OUT"
    assert state.training_session_name not in stack.sim.running_sessions()
    # Idempotent: the catch-all path and the rule may both run.
    assert stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={},
                          reason="failed", error={"Error": "X", "Cause": "y"}))["stopped"] is True


def test_a_run_that_stops_with_rollouts_in_flight_stops_their_runtime_sessions(stack):
    """StopExecution, a failure, a timeout: the Map's children are abandoned and their FinishRollout never
    runs, so Cleanup (and StopSession on the catch-all) close and stop the sessions of every rollout that
    was started and has no record; a finished rollout's session is left alone (before: they billed until
    ACR's idle timeout)."""
    from stepwise.events import FinishEvent, StartEvent
    from stepwise.handlers.plan import plan
    from stepwise.handlers.rollout import finish, start
    from stepwise.layout import session_key

    agent = stack.agent
    agent.write_results = False
    run_id = new_run_id("abandon")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    sids = [start(StartEvent.model_validate({"task_token": f"t{i}", "run": run_ref(run_id), "batch": p["batch"],
                                             "item": item}))["sid"] for i, item in enumerate(items[:3])]
    finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": items[0], "result": None,
                                       "error": {"Error": "AgentError", "Cause": "boom"}}))
    assert sorted(agent.active_sessions(run_id)) == sorted(sids[1:])
    stops = len(agent.stop_calls)
    out = cleanup(_event("ABORTED", execution_arn(run_id), run_id))
    assert out["stopped"] is True
    assert agent.active_sessions(run_id) == [] and sorted(agent.stop_calls[stops:]) == sorted(sids[1:])
    for sid in sids[1:]:
        assert json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())["closed"] is True
    agent.write_results = True


def test_a_continuation_takes_over_only_from_its_parent(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config())
    rs = RunStore(BUCKET, stack.s3)
    child = execution_arn(run_id) + "--1"
    with pytest.raises(RunOwnedElsewhere):
        take_over(rs, run_id, child, {"run_id": run_id, "parent_execution_arn": "arn:someone-else", "segment": 1})
    state = take_over(rs, run_id, child, {"run_id": run_id, "parent_execution_arn": execution_arn(run_id), "segment": 1})
    assert state.owner_execution_arn == child and state.segment == 1
    with pytest.raises(RunOwnedElsewhere):  # the parent can no longer drive the run
        poll_session(RunEvent.model_validate({"run": run_ref(run_id)}))
    # A cleanup for the old execution leaves the new owner's session running.
    assert cleanup(_event("FAILED", execution_arn(run_id), run_id))["stopped"] is False
    assert state.training_session_name in stack.sim.running_sessions()


def test_a_session_that_never_runs_fails_the_poll(stack):
    stack.sim.set_session_start("fail")
    try:
        run_id = new_run_id()
        init_run(stack, run_id, stack.config())
        with pytest.raises(SessionFailed, match="Failed"):
            wait_ready(run_id)
    finally:
        stack.sim.set_session_start("ok")


def test_resume_loads_the_checkpoint_with_optimizer_and_rebinds_the_sampler(stack):
    from stepwise.handlers.plan import plan
    from stepwise.handlers.train import checkpoint

    run_id = new_run_id()
    init_run(stack, run_id, stack.config(max_prompts=2, epochs=1))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    rs = RunStore(BUCKET, stack.s3)
    rs.update_state(run_id, lambda s: setattr(s, "epoch", 1), execution_arn=ev.run.execution_arn)  # as if trained
    assert plan(ev)["action"] == "checkpoint"
    while not checkpoint(ev)["done"]:
        pass
    saved = rs.read_state(run_id)[0].checkpoints[-1].model_package_arn

    before = dict(stack.sim.counters)
    resumed = new_run_id("resumed")
    init_run(stack, resumed, stack.config(resume_from_model_package=saved))
    assert wait_ready(resumed)["ready"]
    state, _ = rs.read_state(resumed)
    assert state.resume_loaded and state.sampler_model_package_arn.startswith("arn:aws:sagemaker:")
    assert state.last_sequence_number == 2 and state.phase == "idle" and state.step == 0
    for kind in ("load_state", "save_weights", "load_weights_for_sampling"):
        assert stack.sim.counters.get(kind, 0) - before.get(kind, 0) == 1, kind
