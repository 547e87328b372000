"""RecordEval with groups and named eval sets, eval-only runs and retention, through the real handlers
on moto and the simulator: the summary's pass@k / mixed@k equal a direct count of the rollout records
in S3, each set reports under its name, an eval-only run loads the weights it evaluates, rolls out its
eval once and finishes without a training operation or a checkpoint, and ``best_and_last`` deletes
only the intermediate model packages at the run's end."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.exceptions import ClientError
from tests.support.pipeline import BUCKET, execution_arn, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.aws.runstore import RunStore
from stepwise.events import BatchEvent, RunEvent
from stepwise.handlers import advantages, plan
from stepwise.layout import eval_results_key, rollouts_prefix


def _json(stack, key: str):
    return json.loads(stack.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _eval_sets(stack) -> dict:
    main = stack.put_dataset("data/eval-main.jsonl", [{"prompt": f"m{i}", "answer": "1"} for i in range(3)])
    hard = stack.put_dataset("data/eval-hard.jsonl", [{"prompt": f"h{i}", "answer": "2"} for i in range(2)])
    return {"eval_dataset_path": main, "eval_datasets": {"hard": hard}, "eval_group_size": 3,
            "eval_temperature": 1.0, "eval_pass_k": [1, 2, 3]}


def test_a_group_eval_over_two_named_sets_reports_each_and_matches_a_direct_count(stack):
    run_id = new_run_id("geval")
    init_run(stack, run_id, stack.config(max_prompts=2, eval_before_train=True, **_eval_sets(stack)))
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    assert p["batch"]["kind"] == "eval" and p["num_items"] == 5 * 3  # 3 + 2 prompts, 3 rollouts each
    # item i = prompt i // 3, member i % 3: prompt 0 all solved, 1 mixed, 2 none, hard 0 mixed, hard 1 none
    rewards = [1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0]
    roll_out_batch(stack, run_id, p, [float(r) for r in rewards])
    summary = advantages.record_eval(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))

    # the direct count, from the rollout records RecordEval read
    prefix = rollouts_prefix(run_id, 0, 0, "eval")
    records = [_json(stack, o["Key"]) for o in stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    solved: dict[int, int] = {}
    for r in records:
        solved[r["row"]] = solved.get(r["row"], 0) + (r["reward"] >= 1.0)
    main, hard = [solved[row] for row in (0, 1, 2)], [solved[row] for row in (3, 4)]
    assert summary["eval/pass@3"] == sum(c > 0 for c in main) / 3 == 2 / 3
    assert summary["eval/mixed@3"] == sum(0 < c < 3 for c in main) / 3
    assert summary["eval/all_pass@3"] == sum(c == 3 for c in main) / 3
    assert summary["eval/pass@1"] == sum(c / 3 for c in main) / 3
    assert summary["eval/accuracy"] == sum(main) / 9 and summary["eval/mean@3"] == summary["eval/accuracy"]
    assert summary["eval/hard/pass@3"] == 0.5 and summary["eval/hard/mixed@3"] == 0.5
    assert summary["eval/hard/accuracy"] == sum(hard) / 6 and summary["eval/hard/prompts"] == 2
    assert summary["eval/prompts"] == 3 and summary["eval/rollouts"] == summary["eval/n"] == 9
    assert summary["eval_sets"] == ["", "hard"] and summary["evaluated_model_package_arn"] == ""

    results = _json(stack, eval_results_key(run_id, 0))
    assert [(x["eval_set"], x["row"], x["successes"]) for x in results["prompts"]] == [
        ("", 0, 3), ("", 1, 1), ("", 2, 0), ("hard", 0, 1), ("hard", 1, 0)]
    assert results["group_size"] == 3 and results["pass_k"] == [1, 2, 3]
    assert len({x["fingerprint"] for x in results["prompts"]}) == 5


def _checkpoint(stack) -> str:
    """A save_state model package of a fresh run (its final checkpoint)."""
    from stepwise.handlers.train import checkpoint

    run_id = new_run_id("ckpt")
    init_run(stack, run_id, stack.config(max_prompts=2, epochs=1))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    rs = RunStore(BUCKET, stack.s3)
    rs.update_state(run_id, lambda s: setattr(s, "epoch", 1), execution_arn=ev.run.execution_arn)  # as if trained
    assert plan.plan(ev)["action"] == "checkpoint"
    while not checkpoint(ev)["done"]:
        pass
    return rs.read_state(run_id)[0].checkpoints[-1].model_package_arn


def test_an_eval_only_run_loads_the_package_evaluates_once_and_finishes_without_training(stack):
    saved = _checkpoint(stack)
    before = dict(stack.sim.counters)
    run_id = new_run_id("evalonly")
    cfg = stack.config(eval_only=True, eval_model_package_arn=saved, eval_max_prompts=0, **_eval_sets(stack))
    init_run(stack, run_id, cfg)
    assert wait_ready(run_id)["ready"]
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    assert state.sampler_model_package_arn == saved and state.dataset_rows == 0 and state.last_sequence_number == 0
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    p = plan.plan(ev)
    assert p["batch"]["kind"] == "eval" and p["batch"]["final"] and p["num_items"] == 15
    assert p["batch"]["policy"]["sampler_model_package_arn"] == saved
    roll_out_batch(stack, run_id, p, [1.0] * 15)
    summary = advantages.record_eval(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert summary["eval_only"] and summary["evaluated_model_package_arn"] == saved and summary["eval/accuracy"] == 1.0
    assert plan.plan(ev)["action"] == "finish"
    delta = {k: stack.sim.counters.get(k, 0) - before.get(k, 0) for k in stack.sim.counters}
    assert delta.get("load_weights_for_sampling") == 1
    for kind in ("forward_backward", "optim_step", "save_weights", "save_state", "load_state"):
        assert not delta.get(kind), kind
    assert rs.read_state(run_id)[0].checkpoints == []


def test_an_eval_only_run_of_the_base_model_needs_no_weights(stack):
    run_id = new_run_id("evalbase")
    init_run(stack, run_id, stack.config(eval_only=True, **_eval_sets(stack)))
    assert wait_ready(run_id)["ready"]
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.resume_loaded and state.sampler_model_package_arn == "" and state.phase == "idle"
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    assert p["batch"]["kind"] == "eval" and p["batch"]["policy"]["sampler_model_package_arn"] == ""


def test_retention_best_and_last_deletes_only_the_intermediate_packages_and_says_so(stack):
    from stepwise.core.phases import plan_checkpoint
    from stepwise.events import StopEvent
    from stepwise.handlers.session import stop
    from stepwise.handlers.train import checkpoint
    from stepwise.records import EvalPoint

    run_id = new_run_id("retain")
    init_run(stack, run_id, stack.config(max_prompts=2, keep_model_packages="best_and_last"))
    assert wait_ready(run_id)["ready"]
    ev = RunEvent.model_validate({"run": run_ref(run_id)})
    rs = RunStore(BUCKET, stack.s3)
    for step in (1, 2, 3):  # three save_state checkpoints, as save_every would leave them
        rs.update_state(run_id, lambda s, step=step: (setattr(s, "step", step), plan_checkpoint(s, "save_every")),
                        execution_arn=ev.run.execution_arn)
        while not checkpoint(ev)["done"]:
            pass
    arns = [c.model_package_arn for c in rs.read_state(run_id)[0].checkpoints]
    assert rs.read_state(run_id)[0].created_packages == arns
    rs.update_state(run_id, lambda s: setattr(s, "best", EvalPoint(step=2, value=0.9, model_package_arn=arns[1])),
                    execution_arn=ev.run.execution_arn)
    out = stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, reason="finished"))
    assert out["deleted_model_packages"] == [arns[0]]  # arns[1] is the best, arns[2] the newest checkpoint
    assert out["best_model"]["model_package_arn"] == arns[1]
    sm = boto3.client("sagemaker", endpoint_url=stack.sim.url)
    with pytest.raises(ClientError, match="does not exist"):
        sm.describe_model_package(ModelPackageName=arns[0])
    for kept in arns[1:]:
        assert sm.describe_model_package(ModelPackageName=kept)["ModelPackageArn"] == kept
    assert rs.read_state(run_id)[0].deleted_packages == [arns[0]]
