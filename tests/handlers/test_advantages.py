"""ComputeAdvantages: DAPO dynamic sampling across generation batches, the cap, and retry idempotence."""

from __future__ import annotations

import json

import pytest
from tests.support.pipeline import BUCKET, Stack, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.handlers import advantages, plan, train
from stepwise.events import BatchEvent, RunEvent
from stepwise.aws.runstore import RunStore
from stepwise.layout import datums_prefix, rollouts_prefix, summary_key


def _dapo_run(stack: Stack, **config) -> tuple[str, RunEvent]:
    run_id = new_run_id("dapo")
    init_run(stack, run_id, stack.config(algorithm="dapo", max_num_gen_batches=2, **config))
    assert wait_ready(run_id)["ready"]
    return run_id, RunEvent.model_validate({"run": run_ref(run_id)})


def _generation_batch(stack: Stack, run_id: str, ev: RunEvent, rewards: list[float]) -> tuple[dict, dict]:
    p = plan.plan(ev)
    assert p["action"] == "rollout"
    roll_out_batch(stack, run_id, p, rewards)
    batch = BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]})
    return p, advantages.compute(batch)


def test_dapo_keeps_informative_groups_across_generation_batches(stack):
    run_id, ev = _dapo_run(stack)
    p0, d0 = _generation_batch(stack, run_id, ev, [1.0, 0.0, 0.5, 0.5])  # one informative group of two
    assert d0["decision"] == "need_more" and p0["batch"]["generation_batch"] == 0
    p1, d1 = _generation_batch(stack, run_id, ev, [0.0, 0.0, 0.0, 1.0])  # another one, from new prompts
    assert (p1["batch"]["step"], p1["batch"]["generation_batch"]) == (0, 1)
    assert d1["decision"] == "train" and d1["num_datums"] == 4
    rs = RunStore(BUCKET, stack.s3)
    datums = [d for k in rs.list_keys(datums_prefix(run_id, 0)) for d in rs.get_json(k)]
    # gen0's first group (members 0, 1) and gen1's second group (members 2, 3): tokens 10+i, 11, 12
    assert [d["modelInput"]["chunks"][0]["tokens"][4] for d in datums] == [10, 11, 12, 13]
    state, _ = rs.read_state(run_id)
    assert state.cursor == 4 and state.generation_batch == 1 and len(state.datum_chunks) == 1

    again = advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p1["batch"]}))
    assert again == d1  # a retried ComputeAdvantages returns the recorded decision, changing nothing
    assert rs.read_state(run_id)[0].model_dump() == state.model_dump()

    assert not rs.exists(summary_key(run_id, 0))  # written once, when the step is trained
    while not train.submit(ev)["done"]:
        pass
    while not train.rebind(ev)["done"]:
        pass
    summary = rs.get_json(summary_key(run_id, 0))
    assert summary["sampling/generation_batches"] == 2 and summary["sampling/kept_groups"] == 2
    assert summary["sampling/filtered_fraction"] == 0.5 and summary["sampler/num_rollouts"] == 8
    assert "train/loss" in summary and "time/train" in summary and summary["policy_version"] == 1


def test_hitting_max_num_gen_batches_checkpoints_and_stops_with_a_reason(stack):
    run_id, ev = _dapo_run(stack)
    assert _generation_batch(stack, run_id, ev, [1.0, 1.0, 0.0, 0.0])[1]["decision"] == "need_more"
    assert _generation_batch(stack, run_id, ev, [1.0, 0.0, 0.0, 0.0])[1]["decision"] == "cap_reached"
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert "max_num_gen_batches (2) reached at step 0 with 1/2" in state.stop_reason
    nxt = plan.plan(ev)
    assert nxt["action"] == "checkpoint" and nxt["reason"] == "final save_state"
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=summary_key(run_id, 0))["Body"].read())
    assert summary["decision"] == "cap_reached" and summary["sampling/kept_groups"] == 1


def test_a_batch_that_is_not_the_planned_one_is_refused(stack):
    run_id, ev = _dapo_run(stack)
    p = plan.plan(ev)
    stale = dict(p["batch"], generation_batch=3)
    with pytest.raises(advantages.BatchMismatch):
        advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": stale}))


def test_a_batch_whose_every_rollout_failed_fails_the_run_instead_of_training(stack):
    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish

    run_id = new_run_id()
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    for item in items:  # e.g. a wrong agent ARN: every InvokeAgentRuntime is refused
        finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item, "result": None,
                                           "error": {"Error": "ResourceNotFoundException", "Cause": "no such runtime"}}))
    with pytest.raises(advantages.RolloutsFailed, match="all 4 rollouts .* ResourceNotFoundException: no such runtime"):
        advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))


def test_a_rollout_without_a_record_is_a_failed_rollout_of_its_group_and_a_batch_without_any_fails(stack):
    """The Map tolerates a failed child, so an item may have no record: it becomes an ``error`` rollout
    (reward 0.0, cause RolloutLost) in its group, written once, and the step trains on the group at full
    size; a batch with no record at all fails the run with RolloutsFailed (before: RolloutsMissing
    failed the run for one lost item)."""
    from stepwise.layout import rollouts_prefix

    def records(run_id):
        keys = sorted(o["Key"] for o in stack.s3.list_objects_v2(
            Bucket=BUCKET, Prefix=rollouts_prefix(run_id, 0, 0, "train")).get("Contents", []))
        return {k: json.loads(stack.s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in keys}

    run_id = new_run_id("lost")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    roll_out_batch(stack, run_id, p, [1.0, 0.0, 1.0, 0.0])
    batch = BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]})
    first_key, lost = next(iter(records(run_id).items()))
    stack.s3.delete_object(Bucket=BUCKET, Key=first_key)
    out = advantages.compute(batch)
    assert out["decision"] == "train"
    [recorded] = [r for k, r in records(run_id).items() if k.endswith(f"/lost-{lost['i']}.json")]
    assert recorded["status"] == "error" and recorded["reward"] == 0.0 and recorded["error"]["error"] == "RolloutLost"
    assert (recorded["i"], recorded["input_id"], recorded["member"]) == (lost["i"], lost["input_id"], lost["member"])
    state = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=f"runs/{run_id}/state.json")["Body"].read())
    assert state["step_metrics"]["sampler/num_rollouts"] == 4  # the group kept its size

    run_id = new_run_id("alllost")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    with pytest.raises(advantages.RolloutsFailed, match="all 4 rollouts .* 4 x RolloutLost"):
        advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))


def test_the_step_summary_carries_behaviour_metrics_of_every_rollout(stack):
    """Turns, tokens, durations and status counts reach the step's metrics (and so its summary and EMF)."""
    from tests.support.pipeline import play_rollout

    from stepwise.handlers._common import run_config
    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish, session_record
    from stepwise.layout import session_key
    from stepwise.records import BatchRef

    run_id = new_run_id("behaviour")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    for item in items[:-1]:
        sid = f"sid-{item['i']}-{run_id}"
        record = session_record(run_config(run_id), run_id, BatchRef.model_validate(p["batch"]), sid, item["input_id"],
                                item["i"])
        stack.s3.put_object(Bucket=BUCKET, Key=session_key(sid), Body=record.model_dump_json().encode())  # as StartRollout
        key = play_rollout(stack, run_id, sid, item["input_id"], float(item["i"] % 2), [10, 11, 12 + item["i"]])
        finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                           "result": {"sid": sid, "result_key": key}, "error": None}))
    finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": items[-1], "result": None,
                                       "error": {"Error": "States.Timeout", "Cause": "no result"}}))
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))["decision"] == "train"
    m = RunStore(BUCKET, stack.s3).read_state(run_id)[0].step_metrics  # the summary Rebind writes
    n = len(items)
    assert (m["rollouts/num_ok"], m["rollouts/num_error"], m["rollouts/num_timeout"]) == (n - 1, 0, 1)
    assert m["behaviour/turns_per_rollout"] == (n - 1) / n and m["behaviour/sampled_tokens_per_rollout"] == 3 * (n - 1) / n
    assert m["behaviour/truncated_turns_fraction"] == 0.0 and m["behaviour/tool_calls_per_rollout"] == 0.0
    assert 0.0 <= m["time/rollout_duration_p50"] <= m["time/rollout_duration_p95"] < 30
    assert (m["sampler/reward_min"], m["sampler/reward_max"]) == (0.0, 1.0)
    assert "advantages/zero_groups_fraction" in m


def _grpo_batch(stack: Stack, run_id: str, with_turns: list[bool], rewards: list[float]) -> dict:
    """Plan the next GRPO batch and finish its rollouts; a rollout without turns is an empty one
    (the agent returned a reward without calling its LLM: nothing to train on)."""
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    roll_out_batch(stack, run_id, p, rewards, with_turns=with_turns)
    return p


def test_grpo_summaries_count_empty_rollouts_and_every_all_equal_group(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config(responses_per_prompt=3))
    assert wait_ready(run_id)["ready"]
    # group 0: [0.1] * 3 (all-equal, but centered to ~1e-17, not 0.0); group 1 has one empty rollout
    p = _grpo_batch(stack, run_id, [True] * 5 + [False], [0.1, 0.1, 0.1, 1.0, 0.0, 0.0])
    out = advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert out["decision"] == "train"
    m = RunStore(BUCKET).read_state(run_id)[0].step_metrics
    assert m["sampling/empty_rollouts"] == 1.0 and m["sampling/kept_groups"] == 2.0  # as DAPO's summaries
    assert m["sampling/generation_batches"] == 1.0 and m["sampling/filtered_fraction"] == 0.0
    assert m["advantages/zero_groups_fraction"] == 0.5


def test_consecutive_steps_without_a_datum_fail_the_run_naming_what_the_rollouts_reported(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config(max_consecutive_empty_steps=2, max_prompts=6))
    assert wait_ready(run_id)["ready"]
    rs = RunStore(BUCKET)
    p = _grpo_batch(stack, run_id, [False] * 4, [1.0, 0.0, 1.0, 0.0])
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))["decision"] == "skip"
    assert rs.read_state(run_id)[0].empty_steps == 1
    p = _grpo_batch(stack, run_id, [False] * 4, [1.0, 0.0, 1.0, 0.0])
    with pytest.raises(advantages.NoTrainingSignal) as e:
        advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert str(e.value) == ("2 consecutive step(s) (0 to 1) produced no trainable datum (max_consecutive_empty_steps 2); "
                            "step 1's 4 rollouts: 0 error, 0 timeout, 4 ok; 4 without a captured turn")
    summary = rs.get_json(summary_key(run_id, 1))  # the operator still sees the step
    assert summary["decision"] == "skip" and summary["sampling/empty_rollouts"] == 4.0


def test_a_batch_of_agent_errors_and_timeouts_fails_the_run_with_the_causes_counted(stack):
    import uuid

    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish
    from stepwise.layout import result_key

    run_id = new_run_id()
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    for item in items[:3]:  # the toolkit's record of an agent that raised (status_code 500)
        sid = str(uuid.uuid4())
        key = result_key(run_id, item["input_id"], sid)
        body = {"status_code": 500, "stop_reason": "Error code: 401 - unknown session", "rewards": 1.0}
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())
        finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                           "result": {"sid": sid, "result_key": key}, "error": None}))
    finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": items[3], "result": None,
                                       "error": {"Error": "States.Timeout", "Cause": ""}}))
    with pytest.raises(advantages.RolloutsFailed) as e:
        advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert str(e.value) == ("all 4 rollouts of the train batch of step 0 (generation batch 0) failed: 3 error, 1 timeout, "
                            "0 ok; 4 without a captured turn; 3 x AgentError: Error code: 401 - unknown session; "
                            "1 x States.Timeout: no result within 30 s (max_rollout_time)")


def test_eval_rollouts_whose_agent_raised_count_as_failed_and_score_zero(stack):
    import uuid

    from stepwise.events import FinishEvent
    from stepwise.handlers.rollout import finish
    from stepwise.layout import result_key

    run_id = new_run_id("eval")
    eval_path = stack.put_dataset("data/eval-fail.jsonl", [{"prompt": "e0", "answer": "0"}, {"prompt": "e1", "answer": "1"}])
    init_run(stack, run_id, stack.config(max_prompts=2, eval_dataset_path=eval_path, eval_before_train=True))
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))  # the baseline eval
    assert p["batch"]["kind"] == "eval" and p["num_items"] == 2
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    bodies = [{"status_code": 500, "stop_reason": "boom", "rewards": 1.0}, {"rewards": 1.0, "status_code": 200}]
    for item, body in zip(items, bodies):
        sid = str(uuid.uuid4())
        key = result_key(run_id, item["input_id"], sid)
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps(body).encode())
        finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                           "result": {"sid": sid, "result_key": key}, "error": None}))
    summary = advantages.record_eval(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert summary["eval/failed_rollouts"] == 1 and summary["eval/accuracy"] == 0.5 and summary["eval/n"] == 2


def test_a_run_that_ends_without_one_optimizer_step_after_empty_steps_fails(stack):
    from stepwise.core.planning import NoTrainingSignal

    run_id = new_run_id()
    init_run(stack, run_id, stack.config(max_prompts=2))  # one step, fewer than max_consecutive_empty_steps (3)
    assert wait_ready(run_id)["ready"]
    p = _grpo_batch(stack, run_id, [False] * 4, [1.0, 0.0, 1.0, 0.0])
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))["decision"] == "skip"
    with pytest.raises(NoTrainingSignal) as e:  # instead of a final checkpoint and SUCCEEDED with nothing trained
        plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    assert str(e.value) == ("the run ended after 1 step(s) without one optimizer step; its last 1 step(s) produced no "
                            "trainable datum; step 0's 4 rollouts: 0 error, 0 timeout, 4 ok; 4 without a captured turn")
    state = RunStore(BUCKET).read_state(run_id)[0]
    assert not state.checkpoints and state.phase == "idle"


def _stale_batch(stack: Stack, max_staleness: int, versions_later: int) -> tuple[str, dict, BatchEvent]:
    """A GRPO batch rolled out on policy version 0, then the run's policy moved ``versions_later`` on."""
    run_id = new_run_id("stale")
    init_run(stack, run_id, stack.config(max_staleness=max_staleness))
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    roll_out_batch(stack, run_id, p, [1.0, 0.0, 0.0, 1.0])
    rs = RunStore(BUCKET, stack.s3)

    def later(s):
        s.policy_version += versions_later

    rs.update_state(run_id, later, execution_arn=None)
    return run_id, p, BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]})


def test_compute_advantages_refuses_rollouts_older_than_max_staleness(stack):
    from stepwise.core.staleness import StalenessExceeded

    rs = RunStore(BUCKET, stack.s3)
    for max_staleness, later in ((0, 1), (1, 2)):
        run_id, _, batch = _stale_batch(stack, max_staleness, later)
        with pytest.raises(StalenessExceeded, match=rf"step 0 would update policy version {later} with 4 rollout"):
            advantages.compute(batch)
        assert rs.list_keys(datums_prefix(run_id, 0)) == []  # refused before any datum is written
        assert rs.read_state(run_id)[0].current_batch is not None  # the state did not move on


def test_one_version_old_rollouts_train_at_max_staleness_1_and_the_staleness_is_reported(stack):
    run_id, _, batch = _stale_batch(stack, 1, 1)
    result = advantages.compute(batch)
    assert result["decision"] == "train" and result["roll_out_next"] is True  # into the Parallel state
    rs = RunStore(BUCKET, stack.s3)
    records = [rs.get_json(k) for k in rs.list_keys(rollouts_prefix(run_id, 0, 0))]
    assert {r["policy_version"] for r in records} == {0}  # what each rollout sampled with
    metrics_ = rs.read_state(run_id)[0].step_metrics
    assert (metrics_["staleness/max"], metrics_["staleness/mean"], metrics_["staleness/stale_fraction"]) == (1.0, 1.0, 1.0)
    datums = [d for k in rs.list_keys(datums_prefix(run_id, 0)) for d in rs.get_json(k)]
    # the sampling logprobs ride in every datum: the losses weight each token by exp(logp - logq)
    assert datums and all(-0.5 in d["lossFnInputs"]["logprobs"]["data"] for d in datums)
