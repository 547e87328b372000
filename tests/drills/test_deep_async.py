"""Drills of the group engine (``admission: group``, deep asynchrony) through the whole training loop: moto's
Step Functions engine runs the real ASL (the training loop and one rollout-group execution per group) with
the real handlers in-process, the SageMaker simulator counts every optimizer step, and a loopback agent
plays ACR, its rollouts of some prompts slow (a straggler holds one slot, never the step).

One local stack for the module; each run is tiny (8 prompts, batch_size 2 x 2 rollouts: 4 steps). They
check what the issue asks of a run that stops, continues as a new execution, or resumes in the middle
of deep asynchrony: no session left billing, no group trained twice, none skipped, nothing discarded, no
trained rollout past ``max_staleness``. One more runs the group engine with a judge (the Bedrock emulator): each
rollout group judges its own group, throttled once, and the steps train on the judge's scores.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest

from stepwise.executions import continuation_name
from stepwise.layout import buffer_key, state_key, summary_key
from tests.support.pipeline import FakeAgent, Stack, wait_execution as _wait

BUCKET = "stepwise-deep-async-drill"
PROMPTS = 8
GROUPS = PROMPTS  # one epoch: every prompt one group


#: Prompt p3's rollouts (group 3) end only when a drill opens this gate: the straggler of its batch.
GATE = threading.Event()


def _slow_prompts(body: dict) -> float:
    """Group 3's rollouts wait for `GATE`; prompt p6's take 1.5 s, the others 0.2 s."""
    if body.get("prompt") == "p3":
        GATE.wait(120)
    return 1.5 if body.get("prompt") == "p6" else 0.2


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = FakeAgent()
    agent.result_delay = _slow_prompts
    arns, sm_arn = stack.deploy(agent, "deepasync")
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(PROMPTS)]
    base = stack.config(dataset_path=stack.put_dataset("data/train.jsonl", rows), max_rollout_time=30,
                        admission="group", max_staleness=2, sampling_steps_ahead=1, save_every=2, epochs=1,
                        loss="cispo", clip_low_threshold=0.0, clip_high_threshold=2.0)
    stack.sim.set_latency("forward_backward", 0.5)
    yield stack, agent, sm_arn, base, arns
    GATE.set()
    agent.stop()
    stack.stop()


def _json(s3, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _get(s3, key: str) -> dict | None:
    try:
        return _json(s3, key)
    except s3.exceptions.NoSuchKey:
        return None


def _optim(sim) -> int:
    return sim.counters.get("optim_step", 0)


def _consumed(s3, run_id: str, steps: int) -> list[int]:
    """Every group id the steps' summaries say they trained (with repeats, if any)."""
    return [g for s in range(steps) for g, _ in _json(s3, summary_key(run_id, s))["consumed_groups"]]


def _group_executions(stack: Stack, run_id: str) -> list[dict]:
    sfn = stack.moto.client("stepfunctions")
    pages = sfn.get_paginator("list_executions").paginate(stateMachineArn=stack.group_state_machine_arn)
    return [e for p in pages for e in p["executions"] if e["name"].startswith(run_id[:56])]


def _states_entered(stack: Stack, run_id: str) -> list[list[str]]:
    """The names of the states each of the run's group executions entered, in order (its members' too)."""
    sfn = stack.moto.client("stepfunctions")
    out = []
    for e in _group_executions(stack, run_id):
        history = sfn.get_execution_history(executionArn=e["executionArn"], maxResults=1000)["events"]
        out.append([h["stateEnteredEventDetails"]["name"] for h in history if h["type"].endswith("StateEntered")])
    return out


def _wait_for(predicate, timeout: float = 120.0, what: str = "") -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = predicate()
        if got:
            return got
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _no_billing(stack: Stack, agent: FakeAgent, run_id: str) -> None:
    """Nothing of the run bills any more: its training session stopped, no ACR session of it active, no
    group execution running."""
    state = _json(stack.s3, state_key(run_id))
    assert state["session_stopped"] and state["training_session_name"] not in stack.sim.running_sessions()
    assert _wait_for(lambda: not agent.active_sessions(run_id) or None, 30, "the run's ACR sessions to stop") is None \
        or not agent.active_sessions(run_id)
    _wait_for(lambda: all(e["status"] != "RUNNING" for e in _group_executions(stack, run_id)) or None, 60,
              "the run's group executions to end")


@pytest.mark.e2e  # ~30 s: one tiny run
def test_a_deep_async_run_trains_every_group_once_within_k_and_discards_nothing(local):
    stack, agent, sm_arn, base, _ = local
    sfn = stack.moto.client("stepfunctions")
    run_id = f"deep-{uuid.uuid4().hex[:6]}"
    before = _optim(stack.sim)
    GATE.clear()
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    # the straggler (group 3) holds one slot, never the step: steps 0 and 1 train without it ...
    _wait_for(lambda: (st := _get(stack.s3, state_key(run_id))) and st["step"] >= 2, 120, "steps 0 and 1")
    held = _json(stack.s3, buffer_key(run_id))
    assert any(g["id"] == 3 and g["status"] == "running" for g in held["groups"]), held["groups"]
    # ... and step 2 waits for it (after step 2 it would be past max_staleness 2): pacing, not discarding
    time.sleep(1.0)
    assert _json(stack.s3, state_key(run_id))["step"] == 2
    GATE.set()
    d = _wait(sfn, arn)
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _json(stack.s3, state_key(run_id))
    assert (state["step"], state["policy_version"], state["finished"]) == (4, 4, True)
    assert _optim(stack.sim) - before == 4  # each step applied once
    assert sorted(_consumed(stack.s3, run_id, 4)) == list(range(GROUPS))  # none twice, none skipped
    summaries = [_json(stack.s3, summary_key(run_id, s)) for s in range(4)]
    for s in summaries:
        assert s["staleness/past_k"] == 0 and s["staleness/max"] <= 2 and s["rollouts/discarded"] == 0
        assert s["groups/trained"] == 2 and s["groups/forced"] == 0
        assert sum(s[f"staleness/hist/{j}"] for j in range(3)) == 4  # every trained rollout counted
    # group 3 trained in step 2, two versions after it sampled, with later groups trained before it
    assert [g for g, _ in summaries[2]["consumed_groups"]].count(3) == 1 and summaries[2]["staleness/hist/2"] >= 2
    assert max(_consumed(stack.s3, run_id, 2)) > 3
    # every rollout record names the version of each of its turns, and the first counts
    buffer = _json(stack.s3, buffer_key(run_id))
    assert buffer["groups"] == [] and buffer["next_group"] == GROUPS and buffer["discarded_rollouts"] == 0
    assert sim_sessions_stopped(stack, state)
    _no_billing(stack, agent, run_id)
    # without a judge a group's own states are its Map, "Judge the group?" (straight to the record) and the record:
    # the transitions RecordGroupComplete counts, no judge state entered
    from state_machine.definition import child_states
    from stepwise.handlers.advantages import GROUP_TRANSITIONS

    members = set(child_states())
    for entered in _states_entered(stack, run_id):
        own = [name for name in entered if name not in members]
        assert own == ["Roll out the group", "Judge the group?", "Record group complete"] == own[:GROUP_TRANSITIONS]


def sim_sessions_stopped(stack: Stack, state: dict) -> bool:
    return state["training_session_name"] not in stack.sim.running_sessions()


@pytest.mark.e2e  # ~40 s: a stopped run
def test_stop_in_the_middle_of_deep_async_stops_every_group_and_every_acr_session(local):
    stack, agent, sm_arn, base, arns = local
    sfn = stack.moto.client("stepfunctions")
    run_id = f"deep-stop-{uuid.uuid4().hex[:6]}"
    GATE.clear()  # group 3 stays in flight
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    # stop once step 1 trained with groups in flight (a slow prompt's among them)
    _wait_for(lambda: (st := _get(stack.s3, state_key(run_id))) and st["step"] >= 1
              and (b := _get(stack.s3, buffer_key(run_id))) and any(g["status"] == "running" for g in b["groups"]),
              120, "step 1 with groups in flight")
    assert agent.active_sessions(run_id), "the drill must stop the run with rollouts in flight"
    sfn.stop_execution(executionArn=arn, cause="drill: operator stop in the middle of deep async")
    d = _wait(sfn, arn, timeout=30)
    assert d["status"] == "ABORTED"
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "name": run_id, "status": "ABORTED", "input": d.get("input")}}
    resp = stack.moto.client("lambda").invoke(FunctionName=arns["Cleanup"], Payload=json.dumps(event).encode())
    assert not resp.get("FunctionError"), resp["Payload"].read()
    buffer = _json(stack.s3, buffer_key(run_id))
    assert buffer["stopping"]
    _no_billing(stack, agent, run_id)
    GATE.set()
    stopped = [e for e in _group_executions(stack, run_id) if e["status"] == "ABORTED"]
    assert stopped, "the running groups' executions were stopped"


@pytest.mark.e2e  # ~40 s: one step per execution
def test_continue_as_new_hands_groups_in_flight_to_the_next_execution(local):
    stack, agent, sm_arn, base, _ = local
    sfn = stack.moto.client("stepfunctions")
    run_id = f"deep-can-{uuid.uuid4().hex[:6]}"
    GATE.set()
    before = _optim(stack.sim)
    # per_rollout here (the others run the default turn_gate): the engine works with either binding
    cfg = {**base, "steps_per_execution": 1, "save_every": 0, "sampler_binding": "per_rollout"}
    first = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(cfg))["executionArn"]
    assert _wait(sfn, first)["status"] == "SUCCEEDED"
    # each execution runs one step and hands over; the groups it admitted run on under the next one
    for segment in range(1, 8):
        arn = f"{first.rsplit(':', 1)[0]}:{continuation_name(run_id, segment)}"
        d = _wait_for(lambda: _describe(sfn, arn), 60, f"segment {segment}")
        d = _wait(sfn, arn)
        assert d["status"] == "SUCCEEDED", d.get("cause")
        if _json(stack.s3, state_key(run_id))["finished"]:
            break
    state = _json(stack.s3, state_key(run_id))
    assert (state["step"], state["finished"]) == (4, True) and state["segment"] >= 3
    assert _optim(stack.sim) - before == 4
    assert sorted(_consumed(stack.s3, run_id, 4)) == list(range(GROUPS))
    # groups admitted under one execution were trained under a later one
    buffer = _json(stack.s3, buffer_key(run_id))
    assert buffer["groups"] == [] and buffer["discarded_rollouts"] == 0
    _no_billing(stack, agent, run_id)


def _describe(sfn, arn: str) -> dict | None:
    try:
        return sfn.describe_execution(executionArn=arn)
    except sfn.exceptions.ExecutionDoesNotExist:
        return None


@pytest.mark.e2e  # ~60 s: a stopped run, then the resumed rest
def test_resume_in_the_middle_of_deep_async_reuses_complete_groups_and_trains_each_once(local):
    stack, agent, sm_arn, base, arns = local
    sfn = stack.moto.client("stepfunctions")
    run_id = f"deep-resume-{uuid.uuid4().hex[:6]}"
    GATE.clear()  # group 3 stays in flight until the stop
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    # after the step-2 checkpoint, while step 2 waits or trains with groups in flight
    _wait_for(lambda: (st := _get(stack.s3, state_key(run_id))) and st["step"] >= 2
              and any(c["reason"] == "save_every" for c in st["checkpoints"])
              and (b := _get(stack.s3, buffer_key(run_id))) and any(g["status"] == "running" for g in b["groups"]),
              120, "step 2 after its checkpoint, groups in flight")
    sfn.stop_execution(executionArn=arn, cause="drill: a failure in the middle of deep async")
    d = _wait(sfn, arn, timeout=30)
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "name": run_id, "status": "ABORTED", "input": d.get("input")}}
    resp = stack.moto.client("lambda").invoke(FunctionName=arns["Cleanup"], Payload=json.dumps(event).encode())
    assert not resp.get("FunctionError"), resp["Payload"].read()
    stopped = _json(stack.s3, state_key(run_id))
    _no_billing(stack, agent, run_id)
    (ckpt,) = [c for c in stopped["checkpoints"] if c["reason"] == "save_every"]
    assert ckpt["step"] == 2 and ckpt["groups"] is not None and 3 in ckpt["groups"]["unconsumed"]
    GATE.set()

    before = _optim(stack.sim)
    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": arn, "segment": 1, "resume": True}}
    second = sfn.start_execution(stateMachineArn=sm_arn, name=continuation_name(run_id, 1),
                                 input=json.dumps(cont))["executionArn"]
    d2 = _wait(sfn, second)
    assert d2["status"] == "SUCCEEDED", d2.get("cause")
    state = _json(stack.s3, state_key(run_id))
    assert (state["step"], state["policy_version"], state["finished"]) == (4, 4, True)
    assert _optim(stack.sim) - before == 2  # steps 2 and 3, once each, on the new session
    # the final lineage (steps 0-1 before the checkpoint, 2-3 after the resume) trained every group once
    assert sorted(_consumed(stack.s3, run_id, 4)) == list(range(GROUPS))
    for s in range(4):
        assert _json(stack.s3, summary_key(run_id, s))["staleness/past_k"] == 0
    _no_billing(stack, agent, run_id)


@pytest.mark.e2e  # ~30 s: one tiny DAPO run
def test_dapo_filters_equal_reward_groups_at_once_and_counts_them_toward_the_next_step(local):
    """DAPO with the group engine: a complete group whose rewards are all equal leaves the buffer at once (its
    slot is free for the next group) and is counted in the next step's generation batches; every group is
    trained or filtered exactly once."""
    stack, agent, sm_arn, base, _ = local
    sfn = stack.moto.client("stepfunctions")
    run_id = f"deep-dapo-{uuid.uuid4().hex[:6]}"
    GATE.set()
    agent.reward_fn = lambda body, reward: 0.0 if body.get("prompt") in ("p1", "p4") else reward
    try:
        cfg = {**base, "algorithm": "dapo", "max_num_gen_batches": 3, "save_every": 0}
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(cfg))["executionArn"]
        d = _wait(sfn, arn)
    finally:
        agent.reward_fn = None
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _json(stack.s3, state_key(run_id))
    assert state["step"] == 3  # 6 informative groups of 8, 2 a step
    summaries = [_json(stack.s3, summary_key(run_id, s)) for s in range(3)]
    trained = [g for s in summaries for g, _ in s["consumed_groups"]]
    filtered = [g for s in summaries for g, _ in s["filtered_groups"]]
    assert sorted(filtered) == [1, 4] and sorted(trained + filtered) == list(range(GROUPS))
    assert all(s["groups/trained"] == 2 for s in summaries)
    # a step that took a filtered group used more than one generation batch's groups
    assert any(s["sampling/generation_batches"] == 2 and s["groups/filtered"] >= 1 for s in summaries)
    shown = _read_side_shows_what_each_step_trained(stack, run_id, 3, judged=False)
    assert sorted(shown) == [(g, "filtered" if g in (1, 4) else "trained") for g in range(GROUPS)]
    _no_billing(stack, agent, run_id)


@pytest.mark.e2e  # ~10 s: one tiny judged run
def test_a_judged_deep_async_run_trains_on_each_group_s_judge_and_waits_out_a_throttle_in_its_group(local, monkeypatch):
    """A judge with the group engine, through the real state machines: each rollout group judges its own group
    ("Judge the group", the Bedrock emulator on loopback) before "Record group complete". The agent rewards every
    rollout 0.0 and the judge prefers each group's first member, so a step has signal only from the judge. The
    first judge invocation runs out of time and Bedrock throttles once: that group goes through "Wait for the
    group's judge" and back, and the run goes on. 4 prompts: 2 steps of 2 groups x 2 rollouts."""
    from local.bedrock import BedrockEmulator, JudgeCall
    from stepwise.handlers import judge as judge_handler
    from stepwise.layout import judge_progress_key
    from stepwise.records import JudgeProgress
    from tests.support.judge import MODEL

    stack, agent, sm_arn, base, _ = local
    sfn = stack.moto.client("stepfunctions")
    emulator = BedrockEmulator(region="us-east-1", allowed_model_ids=(MODEL,)).start()
    for k, v in {**emulator.env, "STEPWISE_JUDGE_MODEL_IDS": MODEL}.items():
        monkeypatch.setenv(k, v)

    def first_is_best(call: JudgeCall) -> list[tuple[float, str]]:
        return [(call.hi if k == 0 else call.lo, f"attempt {k + 1}") for k in range(len(call.attempts))]

    emulator.scorer = first_is_best
    calls = []

    def budget(*args):  # the first invocation runs out of time at once
        calls.append(args)
        return 0.0 if len(calls) == 1 else judge_handler.MARGIN_S * 10

    monkeypatch.setattr(judge_handler, "invocation_budget", budget)
    emulator.inject(throttle=1)
    GATE.set()
    agent.reward_fn = lambda body, reward: 0.0  # the agent has no answer key
    run_id = f"deep-judge-{uuid.uuid4().hex[:6]}"
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in (0, 1, 2, 4)]
    cfg = {**base, "dataset_path": stack.put_dataset(f"data/{run_id}.jsonl", rows), "save_every": 0,
           "judge": {"model_id": MODEL, "rubric": "the first is best", "concurrency": 2}}
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(cfg))["executionArn"]
        d = _wait(sfn, arn)
    finally:
        agent.reward_fn = None
        emulator.stop()
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _json(stack.s3, state_key(run_id))
    assert (state["step"], state["finished"]) == (2, True)
    for s in range(2):
        summary = _json(stack.s3, summary_key(run_id, s))
        assert summary["judge/judged_groups"] == 2 and summary["judge/mean_agent_reward"] == 0.0
        assert summary["sampler/mean_reward"] == 0.5 and summary["advantages/zero_groups_fraction"] == 0.0
        assert summary["rollouts/discarded"] == 0 and summary["staleness/past_k"] == 0
    assert sorted(_consumed(stack.s3, run_id, 2)) == [0, 1, 2, 3]
    _read_side_shows_what_each_step_trained(stack, run_id, 2, judged=True)
    # every group judged in its own execution; one of them waited once for its judge, none twice
    entered = [name for names in _states_entered(stack, run_id) for name in names]
    assert entered.count("Judge the group?") == 4 and entered.count("Wait for the group's judge") == 1
    assert entered.count("Judge the group") == 5 and entered.count("Record group complete") == 4
    progress = [JudgeProgress.model_validate(_json(stack.s3, judge_progress_key(run_id, 0, 0, group=g)))
                for g in range(4)]
    assert all(p.done for p in progress) and sorted(p.invocations for p in progress) == [1, 1, 1, 2]
    assert emulator.counters.throttled == 1
    # what judging used reached the ledger, once
    usage = state["ledger"]["usage"]
    assert usage["judge_requests"] == emulator.counters.answered >= 1
    assert usage["judge_input_tokens"] == emulator.counters.input_tokens
    _no_billing(stack, agent, run_id)


def _read_side_shows_what_each_step_trained(stack: Stack, run_id: str, steps: int, *, judged: bool
                                            ) -> list[tuple[int, str]]:
    """What `stepwise rollouts` and the report page read of each step of a group-engine run (through the bucket,
    `stepwise.views.run.read_step`): the groups the step consumed, in the order it chose them, then those DAPO
    filtered for it, every member of a judged run with the judge's score, and the advantage of each trained
    rollout the one its datum carried. Returns ``(group, mark)`` of every group shown."""
    from stepwise.aws.runstore import RunStore
    from stepwise.layout import datums_prefix
    from stepwise.views.run import read_step

    store = RunStore(BUCKET, stack.s3)
    out = []
    for s in range(steps):
        summary = _json(stack.s3, summary_key(run_id, s))
        view = read_step(store, run_id, s)
        assert [[g.group, g.attempt] for g in view.groups] == summary["consumed_groups"] + summary["filtered_groups"]
        assert [g.selection for g in view.groups] == ["trained"] * 2 + ["filtered"] * len(summary["filtered_groups"])
        assert view.decision == "train" and all(len(g.rollouts) == 2 for g in view.groups)
        trained = [r for r in view.rollouts if r.selection == "trained"]
        assert all(r.record.judge_score is not None and r.record.agent_reward == 0.0 for r in trained) or not judged
        assert all(r.staleness is not None and 0 <= r.staleness <= 2 for r in trained)
        listed = stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=datums_prefix(run_id, s))["Contents"]
        datums = [d for k in sorted(o["Key"] for o in listed) for d in _json(stack.s3, k)]
        carried = [next(a for a in d["lossFnInputs"]["advantages"]["data"] if a != 0) for d in datums]
        shown = [r.advantage for r in trained for rec in r.record.records if any(rec["loss_mask"])]
        assert carried == shown and len(carried) == 4, (carried, shown)
        out += [(g.group, g.selection) for g in view.groups]
    return out
