"""The "Judge groups" function and what ComputeAdvantages and Init do with a judge, on moto, the SageMaker simulator
and the Bedrock emulator: a step trained on the judge's scores (summary, ledger), the judging resumed across
invocations, the refusals before billing, and the rollout view's judge score and reason."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from stepwise.aws.runstore import RunStore
from stepwise.core.preflight import RunRefused
from stepwise.events import BatchEvent, RunEvent
from stepwise.handlers import advantages, plan, train
from stepwise.handlers import judge as judge_handler
from stepwise.layout import judge_progress_key, summary_key
from stepwise.records import JudgeProgress
from tests.support.judge import MODEL, RUBRIC, roll_out_toy
from tests.support.pipeline import BUCKET, init_run, new_run_id, run_ref, session_creates, wait_ready


@dataclass
class LambdaContext:
    function_name: str = "stepwise-JudgeGroups"
    memory_limit_in_mb: int = 1024
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:stepwise-JudgeGroups"
    aws_request_id: str = "req"


@pytest.fixture(scope="module")
def bedrock(stack):
    from local.bedrock import BedrockEmulator

    emulator = BedrockEmulator(region="us-east-1", allowed_model_ids=(MODEL,)).start()
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_RUNTIME", emulator.url)
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK", emulator.url)
    stack.mp.setenv("STEPWISE_JUDGE_MODEL_IDS", MODEL)
    yield emulator
    emulator.stop()


@pytest.fixture
def emulator(bedrock):
    from local.bedrock import BedrockCounters, Faults

    bedrock.faults, bedrock.counters = Faults(), BedrockCounters()
    return bedrock


def _run(stack, algorithm: str = "grpo", max_num_gen_batches: int = 10, batch_size: int = 2,
         **judge) -> tuple[str, RunEvent]:
    run_id = new_run_id("judge")
    config = stack.config(batch_size=batch_size, responses_per_prompt=4, algorithm=algorithm,
                          max_num_gen_batches=max_num_gen_batches,
                          judge={"model_id": MODEL, "rubric": RUBRIC, "fallback": "no_signal", **judge})
    init_run(stack, run_id, config)
    assert wait_ready(run_id)["ready"]
    return run_id, RunEvent.model_validate({"run": run_ref(run_id)})


def _rolled_out(stack, run_id: str, ev: RunEvent, right=lambda item: item["member"] % 2 == 0) -> tuple[dict, BatchEvent]:
    p = plan.plan(ev)
    assert p["action"] == "rollout" and p["judge"] is True
    roll_out_toy(stack, run_id, p, right)
    return p, BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]})


def test_a_step_trains_on_the_judge_s_scores_and_its_summary_and_ledger_count_the_judge(stack, emulator):
    run_id, ev = _run(stack)
    _, batch = _rolled_out(stack, run_id, ev)
    out = judge_handler.judge(batch)
    assert out["done"] and out["judge"] == 2 and out["pending"] == 0 and out["wait_seconds"] >= 1
    decision = advantages.compute(batch)
    assert decision["decision"] == "train" and decision["mean_reward"] == 0.5  # every other member names the digit
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    m = state.step_metrics
    assert m["judge/judged_groups"] == 2 and m["judge/mean_score"] == 5.0 and m["judge/fallback_groups"] == 0
    assert m["judge/mean_agent_reward"] == 0.0 and m["advantages/zero_groups_fraction"] == 0.0
    usage = state.ledger.usage
    assert usage.judge_requests == 2 and usage.judge_input_tokens == emulator.counters.input_tokens
    assert usage.judge_output_tokens == emulator.counters.output_tokens
    assert usage.lambda_requests.get("JudgeGroups", 0) >= 0  # the function's own invocation rides its progress record
    while not train.submit(ev)["done"]:
        pass
    while not train.rebind(ev)["done"]:
        pass
    summary = rs.get_json(summary_key(run_id, 0))
    expected = (emulator.counters.input_tokens * 0.035 + emulator.counters.output_tokens * 0.14) / 1e6
    assert summary["cost/judge_usd"] == pytest.approx(expected) and summary["cost/judge_requests"] == 2
    assert summary["judge/judged_groups"] == 2


def test_the_rollout_view_shows_each_rollout_s_judge_score_and_reason(stack, emulator):
    from stepwise.views.run import read_step
    from stepwise_cli.commands.rollouts import group_lines

    run_id, ev = _run(stack)
    _, batch = _rolled_out(stack, run_id, ev)
    judge_handler.judge(batch)
    advantages.compute(batch)
    view = read_step(RunStore(BUCKET, stack.s3), run_id, 0)
    rollouts = view.rollouts
    assert sorted(v.record.judge_score for v in rollouts) == [0, 0, 0, 0, 10, 10, 10, 10]
    assert all(v.reward == v.record.judge_score / 10 and v.record.agent_reward == 0.0 for v in rollouts)
    right = next(v for v in rollouts if v.record.judge_score == 10)
    assert right.record.judge_reason.startswith("names the right digit") and right.advantage > 0
    assert right.selection == "trained" and right.to_json()["agent_reward"] == 0.0
    text = "\n".join(group_lines(0, view.groups[0]))
    assert "judge's reason: names the right digit" in text and "  10.00   0.000  " in text


def test_judging_resumes_across_invocations_when_throttling_outlasts_one(stack, emulator, monkeypatch):
    run_id, ev = _run(stack)
    _, batch = _rolled_out(stack, run_id, ev)
    emulator.inject(throttle=1)
    monkeypatch.setattr(judge_handler, "invocation_budget", lambda *a: 0.0)  # out of time at once
    event = batch.model_dump()
    first = judge_handler.handler(event, LambdaContext())  # through the entrypoint: the invocation measures itself
    assert first["done"] is False and first["pending"] == 2
    monkeypatch.undo()
    second = judge_handler.handler(event, LambdaContext())
    assert second["done"] is True and second["judge"] == 2
    progress = JudgeProgress.model_validate(RunStore(BUCKET, stack.s3).get_json(judge_progress_key(run_id, 0, 0)))
    assert progress.invocations == 2 and progress.done and progress.usage.lambda_requests.get("JudgeGroups") == 2


def test_a_re_done_step_s_batch_is_judged_afresh_not_as_the_abandoned_attempt_s(stack, emulator):
    """An earlier attempt at the step (a resumed run rewinds and re-does it) left a finished progress record whose
    max_wait_seconds clock ran out long ago: the new rollouts get a new start, not an instant fallback."""
    from stepwise.records import Usage

    run_id, ev = _run(stack, max_wait_seconds=60)
    _, batch = _rolled_out(stack, run_id, ev)
    rs = RunStore(BUCKET, stack.s3)
    stale = JudgeProgress(step=0, generation_batch=0, started_at=1.0, rollouts="an-abandoned-attempt", invocations=3,
                          done=True, usage=Usage(judge_requests=9))
    rs.put_json(judge_progress_key(run_id, 0, 0), stale.model_dump())
    emulator.inject(throttle=1)
    out = judge_handler.judge(batch)
    assert out["done"] and out["judge"] == 2 and out["fallback"] == 0
    progress = JudgeProgress.model_validate(rs.get_json(judge_progress_key(run_id, 0, 0)))
    assert progress.invocations == 1 and progress.started_at > 1.0 and progress.rollouts == judge_handler.batch_fingerprint(
        rs.batch_rollouts(run_id, 0, 0))
    assert progress.usage is None or progress.usage.judge_requests == 0  # the finished attempt's was counted then


def test_a_batch_whose_every_group_falls_back_trains_nothing_with_no_signal(stack, emulator):
    run_id, ev = _run(stack, max_attempts=1)
    _, batch = _rolled_out(stack, run_id, ev)
    emulator.inject(malformed=2)
    assert judge_handler.judge(batch)["fallback"] == 2
    decision = advantages.compute(batch)
    m = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    assert decision["decision"] in ("train", "skip") and decision["mean_reward"] == 0.0
    metrics = m.step_metrics or {}
    if metrics:
        assert metrics["judge/fallback_groups"] == 2 and metrics["advantages/zero_groups_fraction"] == 1.0


def test_dapo_reads_every_generation_batch_s_judgements_and_bills_each_once(stack, emulator):
    """A first generation batch all wrong (no signal: DAPO asks for another), a second half right: the step trains
    on the second's groups, its summary counts the judge over both, the ledger each batch's requests once."""
    run_id, ev = _run(stack, algorithm="dapo", max_num_gen_batches=3, batch_size=2)
    _, first = _rolled_out(stack, run_id, ev, right=lambda item: False)
    assert judge_handler.judge(first)["judge"] == 2
    assert advantages.compute(first)["decision"] == "need_more"
    _, second = _rolled_out(stack, run_id, ev)
    assert second.batch.generation_batch == 1 and judge_handler.judge(second)["judge"] == 2
    assert advantages.compute(second)["decision"] == "train"
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    assert state.step_metrics["judge/groups"] == 4 and state.step_metrics["sampling/kept_groups"] == 2
    assert state.ledger.usage.judge_requests == 4 == emulator.counters.answered


def test_without_a_judge_the_plan_skips_the_judge_and_its_function_does_nothing(stack, emulator):
    run_id = new_run_id("nojudge")
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    assert p["judge"] is False
    out = judge_handler.judge(BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}))
    assert out["done"] and out["skipped"] == "no judge" and emulator.counters.converse == 0


def test_init_refuses_a_judge_the_stack_does_not_grant_before_any_session(stack, emulator):
    before = session_creates(stack)
    with pytest.raises(RunRefused, match="judge.model_id: the stack does not grant the judge bedrock:InvokeModel"):
        init_run(stack, new_run_id("refused"), stack.config(judge={"model_id": "amazon.nova-pro-v1:0", "rubric": RUBRIC}))
    assert session_creates(stack) == before


def test_init_refuses_a_granted_model_bedrock_does_not_offer_before_any_session(stack, emulator, monkeypatch):
    monkeypatch.setenv("STEPWISE_JUDGE_MODEL_IDS", f"{MODEL},us.amazon.titan-text-v1:0")
    before = session_creates(stack)
    with pytest.raises(RunRefused, match="judge.model_id: Bedrock has no such model or inference profile in us-east-1"):
        init_run(stack, new_run_id("refused"), stack.config(judge={"model_id": "us.amazon.titan-text-v1:0", "rubric": RUBRIC}))
    assert session_creates(stack) == before and emulator.counters.lookups >= 1


# ---------------------------------------------------------------------------- the group engine (admission: group)


@pytest.fixture(scope="module")
def group_machine(stack):
    """A rollout-group state machine in moto that does nothing (one Pass): AdmitGroups starts real executions of it,
    while the tests below play each group's states (its rollouts, "Judge the group", "Record group complete")."""
    sfn = stack.moto.client("stepfunctions")
    definition = {"StartAt": "Played by the test", "States": {"Played by the test": {"Type": "Pass", "End": True}}}
    return sfn.create_state_machine(name="judge-test-groups", definition=json.dumps(definition),
                                    roleArn="arn:aws:iam::123456789012:role/judge-test-groups")["stateMachineArn"]


def _group_run(stack, algorithm: str = "grpo", steps_ahead: int = 0, **judge) -> tuple[str, RunEvent]:
    run_id = new_run_id("gjudge")
    config = stack.config(batch_size=2, responses_per_prompt=4, algorithm=algorithm, max_num_gen_batches=3,
                          admission="group", max_staleness=1, sampling_steps_ahead=steps_ahead,
                          judge={"model_id": MODEL, "rubric": RUBRIC, "fallback": "no_signal", **judge})
    init_run(stack, run_id, config)
    assert wait_ready(run_id)["ready"]
    return run_id, RunEvent.model_validate({"run": run_ref(run_id)})


def _groups_rolled_out(stack, run_id: str, arn: str, right, reward=None) -> tuple[dict, list[BatchEvent]]:
    """PlanStep and AdmitGroups of a group-engine step, then each admitted group's rollouts through FinishRollout
    (the toy agent replying the right digit when ``right(group, item)``, its own reward ``reward(group, item)``):
    the plan and each group's batch event (what its rollout group execution hands "Judge the group")."""
    from stepwise.config import load_run_config
    from stepwise.events import AdmitEvent
    from stepwise.handlers import _groups, groups
    from stepwise.layout import items_key
    from stepwise.records import GroupEntry, SamplerPolicy

    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    assert p["action"] == "groups" and p["judge"] is True
    admitted = groups.admit(AdmitEvent.model_validate({"run": run_ref(run_id), "group_state_machine_arn": arn}))
    assert admitted["admitted"] >= 2
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    cfg = load_run_config(rs.get_json(f"runs/{run_id}/config.json"))
    events = []
    for g in admitted["groups"]:
        batch = _groups.group_batch(cfg, GroupEntry(id=g, members=4, status="running"), SamplerPolicy.of(state))
        group_plan = {"items_key": items_key(run_id, batch.step, 0, "train", **batch.folder), "batch": batch.model_dump()}
        roll_out_toy(stack, run_id, group_plan, lambda item, g=g: right(g, item),
                     None if reward is None else (lambda item, g=g: reward(g, item)))
        events.append(BatchEvent.model_validate({"run": run_ref(run_id), "batch": batch.model_dump()}))
    return p, events


def _record(ev: BatchEvent, arn: str) -> dict:
    from stepwise.events import GroupEvent

    return advantages.record_group(GroupEvent.model_validate({**ev.model_dump(), "group_state_machine_arn": arn}))


def test_a_group_engine_step_trains_on_the_judge_s_scores_and_its_ledger_counts_each_group_s_judge(
        stack, emulator, group_machine):
    """admission: group with a judge: each group is judged on its own (its record beside its rollouts), the step
    trains on the judged rewards (the agent's are all 0.0), its summary has the judge's metrics and cost/judge_usd,
    and the ledger every group's requests and tokens once."""
    from stepwise.layout import judge_record_key
    from stepwise.records import JudgeRecord

    run_id, ev = _group_run(stack)
    p, groups_ = _groups_rolled_out(stack, run_id, group_machine, lambda g, item: item["member"] % 2 == 0)
    rs = RunStore(BUCKET, stack.s3)
    for group in groups_:
        out = judge_handler.judge(group)
        assert out["done"] and out["judge"] == 1 and out["groups"] == 1
        b = group.batch
        (iid,) = {r.input_id for r in rs.batch_rollouts(run_id, b.step, 0, **b.folder)}
        record = JudgeRecord.model_validate(rs.get_json(judge_record_key(run_id, b.step, 0, iid, **b.folder)))
        assert sorted(record.scores_G) == [0, 0, 10, 10] and record.source == "judge"
        assert judge_handler.judge(group)["judge"] == 1 and emulator.counters.answered == groups_.index(group) + 1
        assert _record(group, group_machine)["status"] == "complete"
        progress = JudgeProgress.model_validate(rs.get_json(judge_progress_key(run_id, b.step, 0, **b.folder)))
        assert progress.done and progress.invocations == 2
    batch = BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]})
    decision = advantages.compute(batch)
    assert decision["decision"] == "train" and decision["mean_reward"] == 0.5 and decision["groups"] == 2
    state, _ = rs.read_state(run_id)
    m = state.step_metrics
    assert m["judge/judged_groups"] == 2 and m["judge/mean_score"] == 5.0 and m["judge/mean_agent_reward"] == 0.0
    assert m["advantages/zero_groups_fraction"] == 0.0
    usage = state.ledger.usage
    assert usage.judge_requests == 2 == emulator.counters.answered
    assert usage.judge_input_tokens == emulator.counters.input_tokens
    assert usage.judge_output_tokens == emulator.counters.output_tokens
    while not train.submit(ev)["done"]:
        pass
    while not train.rebind(ev)["done"]:
        pass
    summary = rs.get_json(summary_key(run_id, 0))
    expected = (emulator.counters.input_tokens * 0.035 + emulator.counters.output_tokens * 0.14) / 1e6
    assert summary["cost/judge_usd"] == pytest.approx(expected) and summary["cost/judge_requests"] == 2


def test_dapo_in_the_group_engine_filters_a_group_all_equal_by_the_judge_and_keeps_one_only_the_judge_tells_apart(
        stack, emulator, group_machine):
    """RecordGroupComplete frees a slot on the rewards the estimator will read: group 0's agent rewards differ (1, 0,
    1, 0) but every member names the right digit (the judge scores all 10: filtered); group 1's agent rewards are
    all 0.0 but only half name it (the judge tells them apart: kept)."""
    run_id, _ = _group_run(stack, algorithm="dapo")
    first, second = (0, 1)
    _, groups_ = _groups_rolled_out(stack, run_id, group_machine,
                                    right=lambda g, item: g == first or item["member"] % 2 == 0,
                                    reward=lambda g, item: float(g == first and item["member"] % 2 == 0))
    for group in groups_:
        assert judge_handler.judge(group)["done"]
    assert [group.batch.group for group in groups_] == [first, second]
    recorded = [_record(group, group_machine) for group in groups_]
    assert [r["status"] for r in recorded] == ["filtered", "complete"]
    assert [r["informative"] for r in recorded] == [False, True]


def test_a_group_recorded_while_a_step_takes_its_groups_keeps_its_judge_usage_for_the_next_step(
        stack, emulator, group_machine):
    """ComputeAdvantages reads the buffer's usage not yet in the ledger (take_groups), then takes its groups out in a
    later conditional write (consume_groups): a group recorded complete in between (its judge's requests) stays in
    the buffer for the next step instead of being reset with what the step read."""
    from stepwise.config import load_run_config

    run_id, _ = _group_run(stack, steps_ahead=1)
    p, groups_ = _groups_rolled_out(stack, run_id, group_machine, lambda g, item: item["member"] % 2 == 0)
    assert len(groups_) == 4  # capacity (d + 1) x batch_size
    for group in groups_:
        judge_handler.judge(group)
    for group in groups_[:2]:
        _record(group, group_machine)
    rs = RunStore(BUCKET, stack.s3)
    state, _ = rs.read_state(run_id)
    cfg = load_run_config(rs.get_json(f"runs/{run_id}/config.json"))
    batch = BatchEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"]}).batch
    taken = advantages.take_groups(run_id, batch, state, cfg)
    assert taken.ready.chosen == [(0, 0), (1, 0)] and taken.pending_usage.judge_requests == 2
    _record(groups_[2], group_machine)  # completes while the step computes
    advantages.consume_groups(run_id, batch, state, cfg, taken, "train")
    left = rs.read_buffer(run_id)[0].pending_usage
    assert left.judge_requests == 1 and left.state_transitions >= advantages.GROUP_TRANSITIONS


# ---------------------------------------------------------------------------- the state machine


@pytest.mark.e2e
def test_the_state_machine_judges_every_step_s_batch_overlapped_and_waits_out_a_long_throttle(stack, emulator,
                                                                                             monkeypatch):
    """The deployed ASL on moto's engine with the real handlers, ``max_staleness: 1``: the batch each step rolls out
    ahead in the Parallel branch reaches "Judge groups" through "Train or eval batch?" like the first; an invocation
    whose time runs out under throttling sends the run through "Wait for the judge" and back, and the step goes on."""
    import json

    from local.bedrock import JudgeCall
    from tests.support.pipeline import FakeAgent, wait_execution

    def first_attempt_best(call: JudgeCall) -> list[tuple[float, str]]:  # the stand-in agent's replies are all alike
        return [(call.hi if k == 0 else call.lo, f"attempt {k + 1}") for k in range(len(call.attempts))]

    monkeypatch.setattr(emulator, "scorer", first_attempt_best)
    calls = []

    def budget(*args):  # the first invocation runs out of time at once
        calls.append(args)
        return 0.0 if len(calls) == 1 else judge_handler.MARGIN_S * 10

    monkeypatch.setattr(judge_handler, "invocation_budget", budget)
    emulator.inject(throttle=1)
    agent = FakeAgent()
    try:
        _, sm_arn = stack.deploy(agent, "judge-drill")
        sfn = stack.moto.client("stepfunctions")
        run_id = new_run_id("judged")
        config = stack.config(batch_size=2, responses_per_prompt=2, max_staleness=1, max_steps=3, max_rollout_time=20,
                              judge={"model_id": MODEL, "rubric": "the first is best", "concurrency": 2})
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(config))["executionArn"]
        done = wait_execution(sfn, arn)
        assert done["status"] == "SUCCEEDED", done.get("cause")
    finally:
        agent.stop()
    rs = RunStore(BUCKET, stack.s3)
    for step in range(3):
        progress = JudgeProgress.model_validate(rs.get_json(judge_progress_key(run_id, step, 0)))
        summary = rs.get_json(summary_key(run_id, step))
        assert progress.done and summary["judge/judged_groups"] == 2 and summary["sampler/mean_reward"] == 0.5
        # the stand-in agent replies alike every step: the later steps' groups are the first's text, read from the cache
        paid = step == 0
        assert summary["judge/cached_groups"] == (0 if paid else 2) and (summary["cost/judge_usd"] > 0) == paid
        assert summary["cost/judge_requests"] == (2 if paid else 0)
    assert JudgeProgress.model_validate(rs.get_json(judge_progress_key(run_id, 0, 0))).invocations == 2
    entered = [e["stateEnteredEventDetails"]["name"] for e in sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
               if e["type"].endswith("StateEntered")]
    assert entered.count("Judge groups") == 4 and entered.count("Wait for the judge") == 1
    assert rs.read_state(run_id)[0].ledger.usage.lambda_requests.get("JudgeGroups", 0) == 4
