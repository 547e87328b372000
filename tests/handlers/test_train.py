"""SubmitTrain / PollOperation / Rebind / Checkpoint against the simulator: idempotent, reference-exact."""

from __future__ import annotations

import json

from tests.support.pipeline import BUCKET, Stack, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.core.phases import plan_train_phase
from stepwise.handlers import advantages, plan, train
from stepwise.events import BatchEvent, RunEvent
from stepwise.aws.runstore import RunStore
from stepwise.layout import datums_prefix, rollouts_prefix, state_key, summary_key


def _ready_run(stack: Stack, rewards: list[float], output_ids=None, **config) -> tuple[str, RunEvent, dict]:
    run_id = new_run_id()
    init_run(stack, run_id, stack.config(**config))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    roll_out_batch(stack, run_id, p, rewards, output_ids)
    decision = advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert decision["decision"] == "train"
    return run_id, ev, p


def test_a_retried_submit_train_applies_one_optimizer_step(stack):
    run_id, ev, _ = _ready_run(stack, [1.0, 0.0, 0.0, 1.0])
    rs = RunStore(BUCKET, stack.s3)
    # Plan the step write-ahead, then keep that state: it is what a Lambda that crashed right
    # after sending its operations (before recording their ids) leaves behind.
    rs.update_state(run_id, lambda s: plan_train_phase(s, len(s.datum_chunks)), execution_arn=ev.run.execution_arn)
    planned, _ = rs.read_state(run_id)
    seqs = [op.sequence_number for op in planned.pending]
    assert seqs == [1, 2, 3] and len({op.client_token for op in planned.pending}) == 3

    before = dict(stack.sim.counters)
    first = train.submit(ev)
    rs.put_json(state_key(run_id), planned.model_dump())  # the crash: ids never recorded
    second = train.submit(ev)  # the retry re-sends the same (sequenceNumber, clientToken) pairs
    while not second["done"]:
        second = train.poll(ev)
    assert first["done"] and second["done"]
    after = stack.sim.counters
    assert after["optim_step"] - before.get("optim_step", 0) == 1
    assert after["forward_backward"] - before.get("forward_backward", 0) == 1
    assert after["save_weights"] - before.get("save_weights", 0) == 1
    assert after["ExecuteTrainingOperation"] - before.get("ExecuteTrainingOperation", 0) == 6  # sent twice, applied once

    rebound = train.rebind(ev)
    assert rebound["done"] and rebound["policy_version"] == 1
    state, _ = rs.read_state(run_id)
    assert state.step == 1 and state.phase == "idle" and state.sampler_model_package_arn.startswith("arn:aws:sagemaker:")
    assert state.last_sequence_number == 3
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=summary_key(run_id, 0))["Body"].read())
    assert summary["sampler/mean_reward"] == 0.5 and summary["sampler/num_datums"] == 4
    assert "train/loss" in summary and summary["policy_version"] == 1


def test_submitted_datums_equal_the_reference_loops_field_for_field(stack):
    from agentcore_rl_toolkit.backends.experimental.sagemaker.datum import trace_record_to_datum
    from agentcore_rl_toolkit.backends.experimental.sagemaker.train_grpo import compute_grpo_advantages

    from stepwise.core.replay import record_from_json

    rewards = [1.0, 0.0, 0.25, 0.25]  # the second group has std 0: centered, not normalized
    ids = [[40, 41, 42], [50, 51], [60, 61, 62, 63], [70]]
    run_id, _, p = _ready_run(stack, rewards, ids)
    rs = RunStore(BUCKET, stack.s3)
    rollouts = sorted((rs.get_json(k) for k in rs.list_keys(rollouts_prefix(run_id, 0, 0))), key=lambda r: r["i"])

    # The reference train_grpo.py loop over the same trajectories and rewards.
    expected = []
    for start in (0, 2):
        group = rollouts[start:start + 2]
        advs = compute_grpo_advantages([r["reward"] for r in group])
        for r, adv in zip(group, advs, strict=True):
            for rec in r["records"]:
                datum = trace_record_to_datum(record_from_json(rec), adv)
                if datum is not None:
                    expected.append(datum)
    submitted = [d for k in rs.list_keys(datums_prefix(run_id, 0)) for d in rs.get_json(k)]
    assert submitted == expected
    assert len(submitted) == 4 and submitted[2]["lossFnInputs"]["advantages"]["data"][-1] == 0.0


def test_checkpoint_planned_by_plan_step_saves_state_once(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config(epochs=1, max_prompts=2, algorithm="dapo", max_num_gen_batches=1))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    # every group all-equal and one generation batch allowed: DAPO's cap, which checkpoints and stops
    roll_out_batch(stack, run_id, p, [1.0, 1.0, 1.0, 1.0])
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))["decision"] == "cap_reached"
    before = stack.sim.counters.get("save_state", 0)
    assert plan.plan(ev)["action"] == "checkpoint"  # epochs done: the final save_state
    assert plan.plan(ev)["action"] == "checkpoint"  # a retried PlanStep re-plans the same save
    out = train.checkpoint(ev)
    while not out["done"]:
        out = train.checkpoint(ev)
    assert stack.sim.counters["save_state"] - before == 1
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.final_checkpoint_done and state.checkpoints[-1].reason == "final"
    assert plan.plan(ev)["action"] == "finish"


class _LambdaContext:
    """What Lambda passes a handler about its invocation that `stepwise.handlers._common.drive` reads: the
    time left (``get_remaining_time_in_millis``), from a real clock."""

    def __init__(self, seconds: float) -> None:
        import time

        self._end = time.monotonic() + seconds
        self.function_name, self.memory_limit_in_mb, self.aws_request_id = "SubmitTrain", "2048", "req-1"
        self.invoked_function_arn = "arn:aws:lambda:us-east-1:123456789012:function:SubmitTrain"
        self.function_version, self.log_group_name, self.log_stream_name = "$LATEST", "/aws/lambda/SubmitTrain", "s"

    def get_remaining_time_in_millis(self) -> int:
        import time

        return int(max(0.0, self._end - time.monotonic()) * 1000)


def test_a_training_op_longer_than_the_old_inline_wait_is_seen_ending_inline_within_the_invocation_s_time(stack, monkeypatch):
    """An 8 s optim_step (the async benchmark's) outlasted the 5 s a handler polled inline: its end was seen
    after the state machine's 10 s Wait, every step (the session idle 10 s). The handlers poll inline 30 s
    now (`STEPWISE_INLINE_WAIT_SECONDS`), so a handler sees the end itself; but never past the invocation's
    time left less 15 s: with 17 s left SubmitTrain hands the 6 s operation to the state machine's Wait."""
    import time

    from stepwise import settings
    from stepwise.handlers import _common

    monkeypatch.delenv("STEPWISE_INLINE_WAIT_SECONDS")  # the functions' default, not the test stack's 10 s
    assert settings.current().inline_wait_seconds == 30.0 and _common.DRIVE_MARGIN_S == 15.0
    run_id, ev, _ = _ready_run(stack, [1.0, 0.0, 0.0, 1.0])
    stack.sim.set_latency("optim_step", 6.0)
    try:
        t0 = time.monotonic()
        short = train.submit_handler(ev.model_dump(mode="json"), _LambdaContext(17.0))
        took = time.monotonic() - t0
        assert not short["done"] and took < 17.0, (short, took)  # it returns within the invocation's time
        t0 = time.monotonic()
        full = train.poll_handler(ev.model_dump(mode="json"), _LambdaContext(60.0))
        assert full["done"] and time.monotonic() - t0 < 15.0, full  # the op's end seen inline, not after a Wait
    finally:
        stack.sim.clear_faults()
