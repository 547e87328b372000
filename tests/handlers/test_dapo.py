"""DAPO in the handlers, on moto + the SageMaker simulator: Clip-Higher on the wire,
data checks before billing, opt-in overlong shaping, the dataset cursor across epochs, and the
final eval the reference skipped (last step skipped for having no datums), for GRPO and DAPO."""

from __future__ import annotations

import json
import uuid

import pytest
from tests.support.pipeline import BUCKET, Stack, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.config import ConfigError, load_run_config
from stepwise.datasets import DatasetError
from stepwise.handlers import advantages, plan, train
from stepwise.events import BatchEvent, RunEvent
from stepwise.layout import result_key, summaries_prefix, summary_key
from stepwise.aws.runstore import RunStore


def _start(stack: Stack, **config) -> tuple[str, RunEvent]:
    run_id = new_run_id("dapo")
    init_run(stack, run_id, stack.config(**config))
    assert wait_ready(run_id)["ready"]
    return run_id, RunEvent.model_validate({"run": run_ref(run_id)})


def _batch(stack: Stack, run_id: str, ev: RunEvent, rewards: list[float], **kw) -> tuple[dict, dict]:
    p = plan.plan(ev)
    assert p["action"] == "rollout" and p["batch"]["kind"] == "train", p
    roll_out_batch(stack, run_id, p, rewards, **kw)
    return p, advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))


def _train(ev: RunEvent) -> None:
    while not train.submit(ev)["done"]:
        pass
    while not train.rebind(ev)["done"]:
        pass


# ------------------------------------------------------------------ Clip-Higher


@pytest.mark.parametrize("loss", ["ppo", "cispo"])
def test_clip_thresholds_reach_the_training_service_as_loss_fn_config(stack, monkeypatch, loss):
    from local.simulator import engine

    received: list[tuple[str, object]] = []
    original = engine.forward_backward

    def spy(state, config, *, backward):  # what the simulator was sent, then its normal work
        received.append((config["lossFnName"], config.get("lossFnConfig")))
        return original(state, config, backward=backward)

    monkeypatch.setattr(engine, "forward_backward", spy)
    run_id, ev = _start(stack, algorithm="dapo", loss=loss, clip_low_threshold=0.8, clip_high_threshold=1.28)
    assert _batch(stack, run_id, ev, [1.0, 0.0, 0.0, 1.0])[1]["decision"] == "train"
    _train(ev)
    assert received and all(r == (loss, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}) for r in received)


@pytest.mark.parametrize("loss", ["importance_sampling", "cross_entropy"])
def test_clip_thresholds_with_a_loss_that_takes_none_are_refused_clearly(stack, loss):
    with pytest.raises(ConfigError) as e:
        load_run_config(stack.config(algorithm="dapo", loss=loss, clip_high_threshold=1.28))
    text = str(e.value)
    if loss == "cross_entropy":  # not a policy loss the pipeline trains with at all
        assert "loss: Input should be 'ppo', 'importance_sampling' or 'cispo'" in text
    else:
        assert "clip_high_threshold: applies only to loss 'ppo' or 'cispo', but loss is 'importance_sampling'" in text


# ------------------------------------------------------------------ data checks before billing


def test_a_dataset_smaller_than_batch_size_is_refused_before_any_session(stack, tmp_path):
    from stepwise_cli.commands.validate import check_datasets

    small = stack.put_dataset(f"data/small-{uuid.uuid4().hex[:6]}.jsonl", [{"prompt": "q"}] * 3)
    config = stack.config(algorithm="dapo", batch_size=4, dataset_path=small)
    rows, errors = check_datasets(load_run_config(config), s3_client=stack.s3)  # stepwise validate --check-datasets
    assert errors == [f"dataset_path: {small}: 3 rows, need at least 4 (batch_size)"] and not rows
    before = stack.sim.counters.get("CreateTrainingSession", 0)
    with pytest.raises(DatasetError, match="3 rows, need at least 4"):
        init_run(stack, new_run_id("small"), config)
    assert stack.sim.counters.get("CreateTrainingSession", 0) == before  # nothing billed


# ------------------------------------------------------------------ overlong shaping (DAPO eq. 13)


def test_overlong_shaping_is_off_by_default_and_refused_for_grpo(stack):
    assert load_run_config(stack.config()).overlong_buffer_len == 0
    with pytest.raises(ConfigError, match="overlong_buffer_len: overlong shaping applies only to algorithm 'dapo'"):
        load_run_config(stack.config(overlong_buffer_len=4, max_tokens_per_rollout=16))


def test_overlong_shaping_penalises_long_responses_before_the_filter(stack):
    # L_max = 8, L_cache = 4: lengths 3 and 4 are free, 6 costs (4 - 6) / 4 = -0.5, 9 costs -1 (eq. 13)
    lengths = [3, 6, 4, 9]
    ids = [[20 + j for j in range(n)] for n in lengths]
    run_id, ev = _start(stack, algorithm="dapo", max_num_gen_batches=2, max_tokens_per_rollout=8,
                        overlong_buffer_len=4, overlong_penalty_factor=1.0)
    # every agent reward is 1.0: without shaping both groups would be all-equal and filtered
    p, d = _batch(stack, run_id, ev, [1.0] * 4, output_ids=ids)
    assert d["decision"] == "train" and d["num_datums"] == 4
    assert d["mean_reward"] == pytest.approx((1.0 + 0.5 + 1.0 + 0.0) / 4)
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    assert state.step_metrics["sampling/kept_groups"] == 2 and state.step_metrics["sampling/filtered_fraction"] == 0

    run_id, ev = _start(stack, algorithm="dapo", max_num_gen_batches=2, max_tokens_per_rollout=8)
    p, d = _batch(stack, run_id, ev, [1.0] * 4, output_ids=ids)  # shaping off: the same batch is filtered out
    assert d["decision"] == "need_more" and d["mean_reward"] == 1.0


# ------------------------------------------------------------------ the dataset cursor across epochs


def test_generation_batches_walk_the_data_across_epochs_without_repeats_or_gaps(stack):
    payloads = [{"prompt": f"q{i}"} for i in range(6)]
    data = stack.put_dataset(f"data/six-{uuid.uuid4().hex[:6]}.jsonl", payloads)
    run_id, ev = _start(stack, algorithm="dapo", batch_size=2, epochs=2, max_num_gen_batches=4, dataset_path=data)
    rows, epochs = [], []
    for rewards in ([1.0] * 4, [0.0] * 4, [1.0] * 4, [1.0, 0.0, 1.0, 0.0]):  # 3 filtered, then ready
        p, d = _batch(stack, run_id, ev, rewards)
        prompts = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"].replace("items", "prompts"))["Body"].read())
        rows.append([payloads.index(v) for v in prompts.values()])
        epochs.append(RunStore(BUCKET, stack.s3).read_state(run_id)[0].epoch)
    assert d["decision"] == "train"
    assert rows == [[0, 1], [2, 3], [4, 5], [0, 1]] and epochs == [0, 0, 0, 1]  # the 4th batch opens epoch 1
    _train(ev)
    p, d = _batch(stack, run_id, ev, [1.0, 0.0, 0.0, 1.0])
    assert (p["batch"]["step"], p["batch"]["generation_batch"]) == (1, 0)
    prompts = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"].replace("items", "prompts"))["Body"].read())
    assert [payloads.index(v) for v in prompts.values()] == [2, 3]  # step 1 continues where step 0 stopped


# ------------------------------------------------------------------ the final eval (reference bug)


def _roll_out_without_turns(stack: Stack, run_id: str, p: dict, rewards: list[float]) -> None:
    """Rollouts whose agent never called its LLM: a result, no captured turn, so no datum."""
    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish

    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    for item in items:
        sid = str(uuid.uuid4())
        key = result_key(run_id, item["input_id"], sid)
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(
            {"rewards": rewards[item["i"]], "status_code": 200, "input_id": item["input_id"]}).encode())
        finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                           "result": {"sid": sid, "result_key": key}, "error": None}))


@pytest.mark.parametrize("algorithm", ["grpo", "dapo"])
def test_eval_runs_at_the_end_when_the_last_step_was_skipped_for_no_datums(stack, algorithm):
    """Reference `train_grpo.py`: a skipped step ``continue``s past the in-loop eval, and the final
    check ``global_step % eval_every == 0`` then believes an eval ran: none did at the last step."""
    eval_data = stack.put_dataset(f"data/eval-{uuid.uuid4().hex[:6]}.jsonl", [{"prompt": "e"}])
    run_id, ev = _start(stack, algorithm=algorithm, max_prompts=4, eval_every=2, eval_dataset_path=eval_data,
                        eval_before_train=False)  # the reference has no baseline eval
    assert _batch(stack, run_id, ev, [1.0, 0.0, 0.0, 1.0])[1]["decision"] == "train"
    _train(ev)
    p = plan.plan(ev)
    assert (p["batch"]["kind"], p["batch"]["step"]) == ("train", 1)
    _roll_out_without_turns(stack, run_id, p, [1.0, 0.0, 0.0, 1.0])
    d = advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert d["decision"] == "skip" and d["num_datums"] == 0  # the last step: no datums
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=summary_key(run_id, 1))["Body"].read())
    assert summary["decision"] == "skip"
    if algorithm == "dapo":
        assert summary["sampling/empty_rollouts"] == 4 and summary["sampling/kept_groups"] == 2

    e = plan.plan(ev)
    assert e["action"] == "rollout" and (e["batch"]["kind"], e["batch"]["step"]) == ("eval", 2)
    roll_out_batch(stack, run_id, e, [1.0])
    assert advantages.record_eval(BatchEvent.model_validate({"run": run_ref(run_id), "batch": e["batch"]}))["step"] == 2
    nxt = plan.plan(ev)
    assert nxt["action"] == "checkpoint" and nxt["reason"] == "final save_state"  # and no second eval
    evals = RunStore(BUCKET, stack.s3).list_keys(summaries_prefix(run_id, "evals"))
    assert [k for k in evals if k.endswith("summary.json")] == [f"runs/{run_id}/evals/2/summary.json"]


@pytest.mark.parametrize(("eval_every", "steps_done", "last_eval_step", "needed"), [
    (2, 2, None, True),   # the reference's bug: 2 % 2 == 0 says "already ran" when step 1 was skipped
    (2, 2, 2, False),     # an eval ran after the last step: not twice
    (3, 2, None, True),   # eval_every does not divide the steps
    (0, 0, None, True),   # no step ran at all: still evaluate the base policy once
])
def test_final_eval_needed_unless_an_eval_ran_after_the_last_step(stack, eval_every, steps_done, last_eval_step, needed):
    cfg = load_run_config(stack.config(eval_dataset_path="s3://bkt-x/eval.jsonl", eval_every=eval_every))
    assert cfg.final_eval_needed(steps_done, last_eval_step) is needed


def test_empty_rollouts_count_rollouts_without_a_trainable_datum(stack):
    run_id, ev = _start(stack, algorithm="dapo")
    # members 0 and 3 captured a turn that sampled nothing: no loss-mask token, so no datum
    p, d = _batch(stack, run_id, ev, [1.0, 0.0, 0.0, 1.0], output_ids=[[], [20, 21], [22], []])
    rollouts = advantages.load_rollouts(run_id, advantages.BatchRef.model_validate(p["batch"]))
    assert [len(r.records) for r in rollouts] == [0, 1, 1, 0]
    assert d["decision"] == "train" and d["num_datums"] == 2
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.step_metrics["sampling/empty_rollouts"] == 2
