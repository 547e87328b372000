"""Every billed training session is stopped: sessions that expire, sessions stopped twice, the
continue-as-new window, and the scheduled sweeper for executions that ended without a stop.

The SageMaker simulator answers through the real SDK and botocore (its ``expire`` fault moves a
session to ``Expired`` as a real session would); the handlers run against moto's S3 and Step
Functions.
"""

from __future__ import annotations

import json
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


# ---------------------------------------------------------------------------- continue-as-new and the sweeper

WAITS = json.dumps({"StartAt": "Run", "States": {"Run": {"Type": "Wait", "Seconds": 600, "End": True}}})
ENDS = json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}})


def _machines(stack) -> tuple[str, str]:
    """Two stand-in state machines in moto: one whose executions keep RUNNING, one whose succeed at once."""
    from local import resources

    return (resources.create_state_machine(stack.moto, "leak-drill-runs", WAITS),
            resources.create_state_machine(stack.moto, "leak-drill-ends", ENDS))


def _start(stack, sm_arn: str, name: str, body: dict | None = None, until: str = "RUNNING") -> str:
    sfn = stack.moto.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=name, input=json.dumps(body or {}))["executionArn"]
    deadline = time.monotonic() + 30
    while sfn.describe_execution(executionArn=arn)["status"] != until:
        assert time.monotonic() < deadline, f"{name} never {until}"
        time.sleep(0.1)
    return arn


def _init_owned(stack, run_id: str, owner_arn: str) -> str:
    """Init the run as the execution ``owner_arn``; returns its training session's name."""
    from stepwise.events import InitEvent
    from stepwise.handlers.init import initialize

    initialize(InitEvent(input=stack.config(), execution_arn=owner_arn, execution_name=run_id))
    return RunStore(BUCKET, stack.s3).read_state(run_id)[0].training_session_name


def test_a_successor_that_fails_before_taking_the_run_over_stops_the_session_itself(stack):
    """Continue-as-new: ContinueRun records the next execution before starting it; if that execution's
    Init fails before it takes the run over, its catch-all (or Cleanup) may still stop the session
    (before: both answered "not the owner" and the session billed on)."""
    from stepwise.events import ContinueEvent, ExecutionStatusChange
    from stepwise.handlers.init import take_over
    from stepwise.handlers.session import cleanup, continue_run

    runs, ends = _machines(stack)
    run_id = new_run_id("handover")
    parent = _start(stack, ends, run_id, until="SUCCEEDED")  # "Handed over to the next execution"
    session = _init_owned(stack, run_id, parent)
    out = continue_run(ContinueEvent.model_validate({"run": {"run_id": run_id, "execution_arn": parent},
                                                     "state_machine_arn": runs}))
    successor = out["execution_arn"]
    rs = RunStore(BUCKET, stack.s3)
    assert rs.read_state(run_id)[0].successor_execution_arn == successor  # recorded before it started

    # A stranger (not the recorded successor) still cannot stop it.
    assert stop(StopEvent(execution_arn=successor + "x", execution_name=run_id, input={}))["stopped"] is False
    assert session in stack.sim.running_sessions()
    # The successor's Init failed before take_over: its catch-all stops the session.
    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": parent, "segment": 1}}
    out = stop(StopEvent(execution_arn=successor, execution_name=f"{run_id}--1", input=cont,
                         error={"Error": "States.TaskFailed", "Cause": "drill: Init failed"}))
    assert out["stopped"] is True and session not in stack.sim.running_sessions()
    state = rs.read_state(run_id)[0]
    assert state.session_stopped and state.stop_reason == "failed: States.TaskFailed"
    assert state.owner_execution_arn == parent  # nobody took the run over
    # Cleanup for the successor's FAILED end is as entitled (idempotent with the catch-all).
    ev = ExecutionStatusChange.model_validate({"detail": {"status": "FAILED", "executionArn": successor,
                                                          "name": f"{run_id}--1", "input": json.dumps(cont)}})
    assert cleanup(ev)["stopped"] is True

    # Once the successor takes over, the parent may no longer stop the new owner's session.
    other = new_run_id("handover-taken")
    parent2 = _start(stack, ends, other, until="SUCCEEDED")
    session2 = _init_owned(stack, other, parent2)
    succ2 = continue_run(ContinueEvent.model_validate({"run": {"run_id": other, "execution_arn": parent2},
                                                       "state_machine_arn": runs}))["execution_arn"]
    state2 = take_over(rs, other, succ2, {"run_id": other, "parent_execution_arn": parent2, "segment": 1})
    assert state2.owner_execution_arn == succ2 and state2.successor_execution_arn is None
    assert stop(StopEvent(execution_arn=parent2, execution_name=other, input={}))["stopped"] is False
    assert session2 in stack.sim.running_sessions()
    stack.moto.client("stepfunctions").stop_execution(executionArn=succ2)
    cont2 = {"continuation": {"run_id": other, "parent_execution_arn": parent2, "segment": 1}}
    assert stop(StopEvent(execution_arn=succ2, execution_name=f"{other}--1", input=cont2))["stopped"] is True


def test_the_sweeper_stops_sessions_no_execution_drives_and_nothing_else(stack):
    """EventBridge never delivered Cleanup: an execution stopped from the console left its session
    running. The sweeper stops it (and records it in state.json, resumable), and leaves alone the
    session of a running execution, one handed over to a running successor, and another stack's."""
    from stepwise.core.sweeping import SWEPT_REASON_PREFIX, TAG_BUCKET, TAG_RUN_ID
    from stepwise.events import ContinueEvent, SweepEvent
    from stepwise.handlers.session import continue_run
    from stepwise.handlers.sweeper import sweep
    from tests.support.simulator import control_client

    runs, ends = _machines(stack)
    sfn = stack.moto.client("stepfunctions")
    rs = RunStore(BUCKET, stack.s3)
    sm = control_client(stack.sim)
    for name in stack.sim.running_sessions():  # sessions earlier tests of the module left running
        sm.stop_training_session(TrainingSessionName=name)

    live_run, aborted_run, handed_run = new_run_id("sweep-live"), new_run_id("sweep-aborted"), new_run_id("sweep-handed")
    live = _init_owned(stack, live_run, _start(stack, runs, live_run))
    aborted_owner = _start(stack, runs, aborted_run)
    aborted = _init_owned(stack, aborted_run, aborted_owner)
    sfn.stop_execution(executionArn=aborted_owner, cause="console stop; its Cleanup event was never delivered")
    handed_parent = _start(stack, ends, handed_run, until="SUCCEEDED")
    handed = _init_owned(stack, handed_run, handed_parent)
    successor = continue_run(ContinueEvent.model_validate({"run": {"run_id": handed_run, "execution_arn": handed_parent},
                                                           "state_machine_arn": runs}))["execution_arn"]
    # Another stack's session (tagged with its own bucket) and a user's own session named like ours.
    foreign = f"stepwise-{new_run_id('other-stack')}"
    request = {**{k: v for k, v in sm.describe_training_session(TrainingSessionName=live)["TrainingSessionDetail"].items()
                  if k in ("RoleArn", "LoraConfig", "ModelConfig", "OutputConfig", "ModelPackageGroupArn")}}
    sm.create_training_session(TrainingSessionName=foreign, **request,
                               Tags=[{"Key": TAG_BUCKET, "Value": "another-stacks-bucket"}, {"Key": TAG_RUN_ID, "Value": aborted_run}])
    users = f"stepwise-{new_run_id('users-own')}"
    sm.create_training_session(TrainingSessionName=users, **request)
    assert {live, aborted, handed, foreign, users} <= set(stack.sim.running_sessions())

    report = sweep(SweepEvent(grace_seconds=0))
    assert [(x["session"], x["run_id"]) for x in report["stopped"]] == [(aborted, aborted_run)]
    assert "ended ABORTED" in report["stopped"][0]["reason"] and report["errors"] == []
    left = {x["session"]: x["reason"] for x in report["left"]}
    assert "RUNNING" in left[live] and f"handed over to execution {successor}" in left[handed]
    assert left[foreign] == left[users] == "not a session of this stack"
    running = set(stack.sim.running_sessions())
    assert aborted not in running and {live, handed, foreign, users} <= running
    state = rs.read_state(aborted_run)[0]
    assert state.session_stopped and state.stop_reason.startswith(SWEPT_REASON_PREFIX)
    from stepwise.core.phases import is_failure_stop

    assert is_failure_stop(state.stop_reason)  # stepwise resume continues it on a new session

    # The successor ends before taking the run over: nothing can stop the session now but the sweeper.
    sfn.stop_execution(executionArn=successor)
    report = sweep(SweepEvent(grace_seconds=0))
    assert [x["session"] for x in report["stopped"]] == [handed]
    assert "before taking the run over" in report["stopped"][0]["reason"]
    assert sweep(SweepEvent(grace_seconds=0))["stopped"] == []  # idempotent: nothing left to stop
    for name in (live, foreign, users):
        sm.stop_training_session(TrainingSessionName=name)


def test_a_sweep_in_every_window_of_a_continue_as_new_hand_over_leaves_the_live_session_alone(stack, monkeypatch):
    """DescribeExecution is eventually consistent: the local engine hides each new successor for 3 s
    (`InvocationFaults.hide_new_executions`). A sweep runs in every window of the hand-over: owner running;
    successor recorded but not started; started but not visible; owner ended with the successor still
    invisible; successor visible, not yet owner; successor the owner. None stops the session (before, the
    window "owner ended, successor invisible" was swept: marked stopped and the successor's run failed).
    After the successor ends and the grace period passes, the sweeper still stops the orphan."""
    from stepwise.aws import task_tokens
    from stepwise.events import ContinueEvent, SweepEvent
    from stepwise.handlers.init import take_over
    from stepwise.handlers.session import continue_run
    from stepwise.handlers.sweeper import sweep

    runs, _ = _machines(stack)
    sfn = stack.moto.client("stepfunctions")
    grace, hidden = 5.0, 3.0
    stack.mp.setenv("STEPWISE_SWEEP_GRACE_SECONDS", str(grace))
    faults = stack.moto.dispatcher.faults
    faults.hide_new_executions(hidden, match=lambda arn: "--" in arn.rsplit(":", 1)[-1])
    run_id = new_run_id("windows")
    owner = _start(stack, runs, run_id)
    session = _init_owned(stack, run_id, owner)
    rs = RunStore(BUCKET, stack.s3)
    seen: dict[str, str] = {}

    def sweep_in(window: str) -> None:
        report = sweep(SweepEvent())
        assert report["stopped"] == [] and report["errors"] == [], (window, report)
        seen[window] = next(x["reason"] for x in report["left"] if x["session"] == session)
        assert session in stack.sim.running_sessions() and not rs.read_state(run_id)[0].session_stopped, window

    sweep_in("owner running")
    start_execution = task_tokens.start_execution

    def start_with_sweeps(*args, **kwargs):
        sweep_in("successor recorded, not started")
        arn = start_execution(*args, **kwargs)
        sweep_in("successor started, not visible")
        return arn

    monkeypatch.setattr(task_tokens, "start_execution", start_with_sweeps)
    try:
        successor = continue_run(ContinueEvent.model_validate({"run": {"run_id": run_id, "execution_arn": owner},
                                                               "state_machine_arn": runs}))["execution_arn"]
        sfn.stop_execution(executionArn=owner)  # the owner's end ("Handed over to the next execution")
        sweep_in("owner ended, successor not visible")
        assert faults.unseen >= 2
        time.sleep(hidden)
        sweep_in("successor visible, not the owner yet")
        take_over(rs, run_id, successor, {"run_id": run_id, "parent_execution_arn": owner, "segment": 1})
        sweep_in("successor the owner")
    finally:
        monkeypatch.setattr(task_tokens, "start_execution", start_execution)
        faults.show_new_executions()
    assert "grace period" in seen["owner ended, successor not visible"], seen
    assert "RUNNING" in seen["successor the owner"], seen
    # The rule still acts once nothing changed for the grace period: the successor ends without a stop.
    sfn.stop_execution(executionArn=successor)
    sweep_in("successor just ended")
    time.sleep(grace)
    report = sweep(SweepEvent())
    assert [x["session"] for x in report["stopped"]] == [session] and session not in stack.sim.running_sessions()


def test_a_foreign_session_whose_name_contains_stepwise_is_never_touched_and_never_an_error(stack):
    """ListTrainingSessions filters by "name contains": a user's ``my-stepwise-x`` is listed, and the
    stack's grant (``training-session/stepwise-*``, modelled by the simulator's ``grant_sessions``) denies
    describing it. The sweeper keeps only names starting ``stepwise-``: no call on it, no error (before:
    AccessDenied, and every sweep failed)."""
    from stepwise.events import SweepEvent
    from stepwise.handlers.sweeper import sweep
    from tests.support.simulator import control_client, session_request

    sm = control_client(stack.sim)
    sm.create_training_session(**session_request(stack.sim, "my-stepwise-x"))
    stack.sim.grant_sessions("stepwise-*")
    try:
        report = sweep(SweepEvent(grace_seconds=0))
    finally:
        stack.sim.grant_sessions(None)
    assert report["errors"] == []
    assert "my-stepwise-x" not in [x["session"] for part in ("stopped", "left") for x in report[part]]
    assert "my-stepwise-x" in stack.sim.running_sessions()
    sm.stop_training_session(TrainingSessionName="my-stepwise-x")


def test_every_session_the_sweeper_stops_is_in_the_ledger_before_and_after_a_resume(stack):
    """An execution stopped from the console with no Cleanup: the sweeper stops its session, and the
    seconds that session billed (its CreationTime to the stop) join the cost ledger, where they stay when
    `stepwise resume` continues the run on a new session (before: missing both times, so max_cost_usd and
    max_session_hours counted less than AWS bills). The swept run's end is recorded as a stop path's is
    (the run summary, so Track ends its tracking runs)."""
    from stepwise.events import InitEvent, SweepEvent
    from stepwise.handlers.init import initialize
    from stepwise.handlers.sweeper import sweep
    from stepwise.layout import run_summary_key

    runs, _ = _machines(stack)
    sfn = stack.moto.client("stepfunctions")
    rs = RunStore(BUCKET, stack.s3)
    run_id = new_run_id("swept-ledger")
    owner = _start(stack, runs, run_id)
    first = _init_owned(stack, run_id, owner)
    time.sleep(1.5)
    sfn.stop_execution(executionArn=owner)  # no Cleanup ever runs
    report = sweep(SweepEvent(grace_seconds=0))
    assert [x["session"] for x in report["stopped"]] == [first]
    billed = stack.sim.session_seconds()[first]["seconds"]
    state = rs.read_state(run_id)[0]
    assert billed >= 1.5 and abs(state.ledger.sessions_closed_seconds - billed) < 0.5, (state.ledger, billed)
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=run_summary_key(run_id))["Body"].read())
    assert summary["status"] == "FAILED" and summary["reason"].startswith("execution ended without stopping")

    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": owner, "segment": 1, "resume": True}}
    resumed = _start(stack, runs, f"{run_id}--1", cont)
    initialize(InitEvent(input=cont, execution_arn=resumed, execution_name=f"{run_id}--1"))
    second = rs.read_state(run_id)[0].training_session_name
    assert second != first
    time.sleep(1.0)
    out = stop(StopEvent(execution_arn=resumed, execution_name=f"{run_id}--1", input=cont,
                         error={"Error": "X", "Cause": "drill"}))
    assert out["stopped"] is True
    seconds = stack.sim.session_seconds()
    both = seconds[first]["seconds"] + seconds[second]["seconds"]
    state = rs.read_state(run_id)[0]
    assert abs(state.ledger.sessions_closed_seconds - both) < 1.0, (state.ledger.sessions_closed_seconds, both)
