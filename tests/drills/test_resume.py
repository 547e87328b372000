"""Drill: a run whose session was stopped by a failure is resumed (`stepwise resume`'s continuation,
``"resume": true``): Init clears the failure, creates a new session, and PollSession loads the
newest save_state checkpoint with its optimizer; step/epoch/cursor rewind to that checkpoint and
the re-done step trains on its own rollouts only (the abandoned timeline's records are ignored)."""

from __future__ import annotations

import uuid

import pytest
from tests.support.pipeline import BUCKET, Stack, execution_arn, init_run, new_run_id, play_rollout, run_ref, wait_ready

from stepwise.core.phases import rewind_to_checkpoint
from stepwise.handlers import advantages, plan, train
from stepwise.events import BatchEvent, FinishEvent, InitEvent, RunEvent, StopEvent
from stepwise.handlers.init import initialize
from stepwise.handlers.rollout import finish
from stepwise.handlers.session import poll_session, stop
from stepwise.layout import start_marker_key, summary_key
from stepwise.records import BatchRef, Checkpoint, RunState
from stepwise.aws.runstore import RunStore


def _roll_out(stack: Stack, ref: dict, p: dict, rewards: list[float]) -> None:
    """Start markers, captured turns, results and FinishRollout for every item (StartRollout's traces)."""
    rs = RunStore(BUCKET, stack.s3)
    batch = BatchRef.model_validate(p["batch"])
    for item in rs.get_json(p["items_key"]):
        sid = str(uuid.uuid4())
        rs.put_json(start_marker_key(ref["run_id"], batch.step, batch.generation_batch, batch.kind, item["i"]),
                    {"sid": sid, "input_id": item["input_id"]})
        key = play_rollout(stack, ref["run_id"], sid, item["input_id"], rewards[item["i"]], [10 + item["i"], 11])
        finish(FinishEvent.model_validate({"run": ref, "batch": p["batch"], "item": item,
                                           "result": {"sid": sid, "result_key": key}, "error": None}))


def _train_step(stack: Stack, ref: dict) -> dict:
    ev = RunEvent.model_validate({"run": ref})
    p = plan.plan(ev)
    while p["action"] == "checkpoint":
        while not train.checkpoint(ev)["done"]:
            pass
        p = plan.plan(ev)
    assert p["action"] == "rollout" and p["batch"]["kind"] == "train", p
    _roll_out(stack, ref, p, [1.0, 0.0, 0.0, 1.0])
    assert advantages.compute(BatchEvent.model_validate({"run": ref, "batch": p["batch"]}))["decision"] == "train"
    out = train.submit(ev)
    while not out["done"]:
        out = train.poll(ev)
    while not train.rebind(ev)["done"]:
        pass
    return p


def test_rewind_is_pure_and_restarts_from_scratch_without_a_checkpoint():
    state = RunState(run_id="r", owner_execution_arn="a", training_session_name="old", step=5, epoch=2, cursor=4,
                     policy_version=5, last_sequence_number=17, session_stopped=True, phase="train",
                     checkpoints=[Checkpoint(step=4, kind="weights", model_package_arn="arn:w")])
    assert rewind_to_checkpoint(state, session_name="new", created_at=1.0) is None
    assert (state.step, state.epoch, state.cursor, state.policy_version, state.last_sequence_number) == (0, 0, 0, 0, 0)
    assert state.phase == "idle" and state.resume_loaded and state.checkpoints == [] and not state.session_stopped
    state.session_stopped = True
    rewind_to_checkpoint(state, session_name="new2", created_at=2.0, base_resume_arn="arn:base")
    assert not state.resume_loaded  # PollSession loads resume_from_model_package, as on a first start


@pytest.mark.e2e  # ~40 s: two steps, a failure, a new session, a third step
def test_a_failed_run_resumes_on_a_new_session_from_its_newest_checkpoint(stack):
    rs = RunStore(BUCKET, stack.s3)
    run_id = new_run_id("resume")
    ref = run_ref(run_id)
    init_run(stack, run_id, stack.config(save_every=1, max_prompts=4, epochs=3))
    assert wait_ready(run_id)["ready"]
    _train_step(stack, ref)  # step 0 -> 1
    p1 = _train_step(stack, ref)  # save_state at step 1, then step 1 -> 2
    saved = rs.read_state(run_id)[0]
    ckpt = saved.checkpoints[-1]
    assert (ckpt.kind, ckpt.step, ckpt.epoch, ckpt.cursor, ckpt.policy_version) == ("state", 1, saved.epoch, 2, 1)
    assert saved.step == 2 and saved.cursor == 4

    # The run fails (catch-all): its session is stopped.
    stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={}, reason="failed",
                   error={"Error": "OperationFailed", "Cause": "drill"}))
    old_session = saved.training_session_name
    assert old_session not in stack.sim.running_sessions()
    failed = rs.read_state(run_id)[0]
    assert failed.session_stopped and failed.stop_reason.startswith("failed")

    # `stepwise resume`: a continuation with resume: true, owned from the failed execution.
    before = dict(stack.sim.counters)
    child = execution_arn(run_id) + "--1"
    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": execution_arn(run_id), "segment": 1, "resume": True}}
    out = initialize(InitEvent(input=cont, execution_arn=child, execution_name=f"{run_id}--1"))
    assert out["session"]["ready"] is False
    initialize(InitEvent(input=cont, execution_arn=child, execution_name=f"{run_id}--1"))  # a retried Init adopts
    state = rs.read_state(run_id)[0]
    assert state.training_session_name != old_session and state.stop_reason is None and not state.session_stopped
    assert (state.step, state.epoch, state.cursor, state.policy_version) == (1, ckpt.epoch, 2, 1)
    assert state.last_sequence_number == 2 and state.phase == "resume"
    assert stack.sim.counters.get("CreateTrainingSession", 0) - before.get("CreateTrainingSession", 0) == 2  # adopted

    cref = {"run_id": run_id, "execution_arn": child}
    for _ in range(100):
        if poll_session(RunEvent.model_validate({"run": cref}))["ready"]:
            break
    state = rs.read_state(run_id)[0]
    assert state.resume_loaded and state.phase == "idle" and state.sampler_model_package_arn
    assert stack.sim.counters["load_state"] - before.get("load_state", 0) == 1

    # Step 1 again: the same rows, trained once, on the new timeline's rollouts only.
    p = _train_step(stack, cref)
    assert p["batch"]["step"] == 1 and p["items_key"] == p1["items_key"]
    summary = rs.get_json(summary_key(run_id, 1))
    assert summary["sampler/num_datums"] == 4 and summary["policy_version"] == 2
    final = rs.read_state(run_id)[0]
    assert final.step == 2 and final.policy_version == 2 and final.last_sequence_number == 5
    assert stack.sim.counters["optim_step"] - before.get("optim_step", 0) == 1
    assert stack.sim.running_sessions() == [state.training_session_name]
    stop(StopEvent(execution_arn=child, execution_name=f"{run_id}--1", input=cont))
    assert stack.sim.running_sessions() == []
