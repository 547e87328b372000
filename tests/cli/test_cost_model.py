"""The per-step cost model: transitions read off the real ASL, linear scaling, prices, `stepwise cost`."""

from __future__ import annotations

import copy
from dataclasses import replace
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise_cli.main import main
from state_machine.definition import load_asl
from stepwise_cli import cost
from stepwise.config import load_run_config

BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent",
    "dataset_path": "s3://bkt/train.jsonl",
    "batch_size": 4,
    "responses_per_prompt": 2,
}


def test_transition_counts_follow_the_deployed_asl():
    counts = cost.asl_step_counts()
    states = load_asl()["States"]
    # a training step visits each state of its path once; the rollout child has its own states
    assert counts["train_step"] == len(cost._walk(states, cost.STEP_START, cost.TRAIN_STEP_CHOICES, cost.STEP_START))
    # a rollout's own path: Pace start, Start rollout, Finish rollout (the states after them run only on a failure)
    child = states["Roll out generation batch"]["ItemProcessor"]
    assert counts["rollout_child"] == 3 == len(cost._walk(child["States"], child["StartAt"], {}, ""))
    assert child["States"][child["StartAt"]]["Next"] == "Start rollout"
    assert child["States"]["Start rollout"]["Next"] == "Finish rollout" and child["States"]["Finish rollout"]["End"]
    assert counts["train_poll"] == 3 and counts["rebind_poll"] == 3  # Wait, Check/Rebind, the Choice again
    assert counts["generation_batch"] < counts["train_step"] and counts["eval_batch"] < counts["train_step"]


def test_a_renamed_state_breaks_the_model_loudly():
    asl = copy.deepcopy(load_asl())
    asl["States"]["Submit the step"] = asl["States"].pop("Submit training step")
    with pytest.raises(KeyError, match="Submit training step"):
        cost.asl_step_counts(asl)


def test_rollout_part_scales_with_rollouts_and_turns():
    a = cost.Assumptions(turns_per_rollout=2)
    small = cost.estimate(load_run_config(BASE), a)
    big = cost.estimate(load_run_config({**BASE, "responses_per_prompt": 4}), a)
    counts, mem = cost.asl_step_counts(), cost._memory()
    one = cost.rollout_usage(2, a, counts, mem)
    extra = 4 * 2  # 8 more rollouts
    # and the invokes ACR refuses: each one more StartRollout (two PUTs) and one more transition
    refused = big["flow"]["refused"] - small["flow"]["refused"]
    retry = cost.Usage(state_transitions=1).lambda_call(mem["StartRollout"], a.handler_seconds["StartRollout"])
    retry.s3({"put": 2})
    per_rollout = a.advantages_seconds_per_rollout * mem["ComputeAdvantages"] / 1024  # its GB-s per rollout
    for k in ("lambda_gb_seconds", "lambda_requests", "state_transitions", "s3_put_class", "s3_get_class"):
        grown = extra * getattr(one, k) + refused * getattr(retry, k) + (extra * per_rollout if k == "lambda_gb_seconds" else 0)
        assert big["usage_per_step"][k] == pytest.approx(small["usage_per_step"][k] + grown)
    # per rollout: 3 handlers + 2 gateway calls; the gateway's GB-s = 1024 MB x 5 s per call
    assert one.lambda_requests == 5
    assert one.lambda_gb_seconds == pytest.approx(0.5 * 0.5 + 0.25 * 0.15 + 1.0 * 0.6 + 2 * 1.0 * 5.0)
    assert one.state_transitions == counts["rollout_child"]


def test_prices_turn_units_into_dollars():
    u = cost.Usage(lambda_gb_seconds=1_000_000, lambda_requests=1_000_000, state_transitions=1000,
                   s3_put_class=1000, s3_get_class=1000)
    usd = u.dollars()
    assert usd["lambda_duration"] == pytest.approx(16.6667)
    assert usd["lambda_requests"] == pytest.approx(0.20)
    assert usd["step_functions"] == pytest.approx(0.025)
    assert usd["s3_requests"] == pytest.approx(0.0054)
    assert usd["total"] == pytest.approx(16.6667 + 0.20 + 0.025 + 0.0054)


def test_training_wait_adds_poll_rounds():
    a = cost.Assumptions()  # the functions' defaults: 30 s polled inline, then 10 s of Wait a round
    assert (a.inline_wait_seconds, a.poll_seconds) == (30.0, 10)
    assert cost.poll_rounds(30, a) == 0 and cost.poll_rounds(70, a) == 1 and cost.poll_rounds(71, a) == 2
    five = cost.Assumptions(inline_wait_seconds=5.0)
    assert cost.poll_rounds(5, five) == 0 and cost.poll_rounds(20, five) == 1 and cost.poll_rounds(21, five) == 2
    cfg = load_run_config(BASE)
    fast = cost.estimate(cfg, cost.Assumptions(train_seconds=5))["usage_per_step"]
    slow = cost.estimate(cfg, cost.Assumptions(train_seconds=65))["usage_per_step"]
    assert slow["state_transitions"] - fast["state_transitions"] == 1 * 3
    slow5 = cost.estimate(cfg, cost.Assumptions(train_seconds=65, inline_wait_seconds=5.0))["usage_per_step"]
    fast5 = cost.estimate(cfg, cost.Assumptions(train_seconds=5, inline_wait_seconds=5.0))["usage_per_step"]
    assert slow5["state_transitions"] - fast5["state_transitions"] == 4 * 3


def test_dapo_upper_bound_and_eval_share():
    dapo = load_run_config({**BASE, "algorithm": "dapo", "max_num_gen_batches": 5})
    est = cost.estimate(dapo)
    assert est["usd_per_step_upper"]["total"] > 3 * est["usd_per_step"]["total"]  # 5 generation batches
    with_eval = load_run_config({**BASE, "eval_dataset_path": "s3://bkt/e.jsonl", "eval_every": 2, "eval_max_prompts": 8})
    plain = cost.estimate(load_run_config(BASE))
    assert cost.estimate(with_eval)["usage_per_step"]["lambda_requests"] > plain["usage_per_step"]["lambda_requests"]


@pytest.mark.parametrize("flag, value, fragment", [
    ("--steps", "-5", "at least 1"), ("--steps", "0", "at least 1"),
    ("--turns-per-rollout", "nan", "a finite number"), ("--turns-per-rollout", "-3", "0 or more"),
    ("--seconds-per-turn", "inf", "a finite number"), ("--train-seconds", "-1", "0 or more"),
    ("--gen-batches-per-step", "0", "at least 1"), ("--session-usd-per-hour", "-1", "more than 0"),
    ("--session-usd-per-hour", "nan", "a finite number"), ("--session-usd-per-hour", "20000", "at most 10000"),
])
def test_cost_refuses_assumptions_that_make_nonsense(tmp_path, capsys, flag, value, fragment):
    """Negative, NaN or infinite assumptions printed negative or NaN dollars (run of -5 steps: $-0.1324);
    --session-usd-per-hour bypassed the config field's bounds. Each is a usage error naming the flag."""
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps(BASE))
    with pytest.raises(SystemExit) as e:
        main(["cost", str(cfg), flag, value])
    err = capsys.readouterr().err
    assert e.value.code == 2 and f"argument {flag}" in err and fragment in err and value in err, err


def test_cost_command(tmp_path, capsys):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"payload": {"q": i}}) + "\n" for i in range(10)))
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({**BASE, "dataset_path": str(train), "epochs": 3}))
    assert main(["cost", str(cfg), "--json"]) == 0
    est = json.loads(capsys.readouterr().out)
    assert est["total_steps"] == 6  # 10 rows // 4 = 2 steps x 3 epochs
    assert est["usd_per_run"]["total"] == pytest.approx(6 * est["usd_per_step"]["total"])
    assert main(["cost", str(cfg), "--steps", "100"]) == 0
    out = capsys.readouterr().out
    assert "run of 100 steps" in out and "run (100 steps)" in out and "no session_usd_per_hour" in out


def test_session_hours_per_step_in_both_modes():
    """Overlapped steps: the session is billed for a step's whole wall time; overlapping the next step's
    rollouts with this step's training and rebind turns their sum into their max on overlapped steps."""
    a = cost.Assumptions(rollout_seconds=60, train_seconds=50, rebind_seconds=10, orchestration_seconds=5,
                         advantages_seconds_per_rollout=0.0)
    cfg = load_run_config({**BASE, "steps_per_execution": 1000, "save_every": -1})
    seq = cost.session_per_step(cfg, a, 0)
    assert seq == {"wall_seconds": 125.0, "busy_seconds": 60.0, "idle_seconds": 65.0,
                   "session_hours": pytest.approx(125 / 3600)}
    f = cost.overlapped_fraction(cfg)
    assert f == pytest.approx(1 - 1 / 1000)
    ovl = cost.session_per_step(cfg, a, 1)
    assert ovl["wall_seconds"] == pytest.approx(f * 75 + (1 - f) * 125)  # max(60, 50) + 10 + 5: rebind after the join
    # save_every and continue-as-new boundaries run sequentially
    assert cost.overlapped_fraction(load_run_config({**BASE, "steps_per_execution": 10, "save_every": 10})) == \
        pytest.approx(0.8)
    # DAPO's extra generation batches stay sequential in both modes
    assert cost.session_per_step(cfg, a, 1, gen_batches=3)["wall_seconds"] - ovl["wall_seconds"] == \
        pytest.approx(2 * 65 * f + (1 - f) * 2 * 65)  # 2 x (60 + 5)
    est = cost.estimate(load_run_config({**BASE, "max_staleness": 1}), a)
    assert set(est["session_per_step"]) == {"0", "1"} and est["max_staleness"] == 1
    assert est["session_per_step"]["1"]["session_hours"] < est["session_per_step"]["0"]["session_hours"]


def test_overlapped_steps_walk_the_parallel_state():
    counts = cost.asl_step_counts()
    states = load_asl()["States"]
    branches = states[cost.OVERLAP_PARALLEL]["Branches"]
    # the overlapped path skips the sequential Map and training states, then enters the Parallel and
    # both of its branches (train; plan ahead + the next step's Map), then the rebind after the join
    assert counts["overlapped_step"] == (
        len(cost._walk(states, cost.STEP_START, cost.OVERLAPPED_STEP_CHOICES, cost.STEP_START))
        + sum(len(cost._walk(b["States"], b["StartAt"], cost.OVERLAP_BRANCH_CHOICES, "")) for b in branches))
    one = cost.estimate(load_run_config({**BASE, "max_staleness": 1}))["usage_per_step"]
    zero = cost.estimate(load_run_config(BASE))["usage_per_step"]
    assert one["state_transitions"] > zero["state_transitions"]  # the Parallel and its branch ends
    assert one["lambda_requests"] > zero["lambda_requests"]  # the plan ahead


def test_cost_command_prints_both_modes(tmp_path, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({**BASE, "max_staleness": 1}))
    assert main(["cost", str(cfg), "--steps", "10", "--rollout-seconds", "60", "--train-seconds", "50",
                 "--session-usd-per-hour", "10"]) == 0
    out = capsys.readouterr().out
    seq, ovl = [line for line in out.splitlines() if "session-hours" in line]
    assert seq.lstrip().startswith("sequential (max_staleness 0)") and "this config" not in seq
    assert ovl.lstrip().startswith("overlapped (max_staleness 1)") and ovl.endswith("<- this config")
    assert "$" in ovl


def test_a_batch_flows_at_the_lowest_of_its_limits_and_what_waits_in_flight_holds_its_acr_session():
    """`cost.rollout_flow`: rollouts finish at the lowest of acr_tps_limit, the Map's concurrency over one
    rollout's ACR session (Little's law) and --rollouts-per-second. When the bound comes after the invoke (the
    sampler; on the local stack, the machine), the Map still keeps its concurrency in flight, so each rollout
    is in flight concurrency / rate seconds and its ACR session with it: 1,024 toy rollouts at 200 in flight and
    8 a second, 25 s each (the ledger measured 24.9 s a session where the estimate said 0.9, $0.06 against
    $1.53 of agent)."""
    toy = {**BASE, "acr_tps_limit": 25, "max_turns_per_rollout": 2}
    fast = cost.Assumptions(turns_per_rollout=1, seconds_per_turn=0.4, agent_overhead_seconds=0.5)
    big = load_run_config({**toy, "batch_size": 128, "responses_per_prompt": 8})
    f = cost.rollout_flow(big, fast)
    assert (f.concurrency, f.bound, f.rate, f.latency) == (200, "acr_tps_limit", 25.0 * 0.45, 0.9)  # invokes + stops
    assert f.wall == pytest.approx(1024 / 11.25 + 0.9)
    slow = cost.rollout_flow(big, replace(fast, rollouts_per_second=8.0))
    assert (slow.bound, slow.rate, slow.latency) == ("rollouts_per_second", 8.0, 25.0)
    assert slow.wall == pytest.approx(1024 / 8 + 0.9)
    agent = lambda a: cost.estimate(big, a)["parts_per_step"]["agent"]  # noqa: E731
    assert agent(replace(fast, rollouts_per_second=8.0)) == pytest.approx(agent(fast) * 25.0 / 0.9)
    # a measured Map time slower than the limits allow says the same
    given = cost.rollout_flow(big, replace(fast, rollout_seconds=156.0))
    assert given.bound == "rollout_seconds" and given.latency == pytest.approx(200 * (156.0 - 0.9) / 1024)
    # a measured Map time the paced starts explain (the toy: 64 in 6.69 s, 11 started a second) is theirs:
    # no ACR session waits, each is the agent's own time (the ledger: 0.53 s a session)
    toy_batch = load_run_config({**toy, "batch_size": 8, "responses_per_prompt": 8})
    paced = cost.rollout_flow(toy_batch, replace(fast, rollout_seconds=6.69))
    assert (paced.bound, paced.latency) == ("acr_tps_limit", 0.9)
    # long agents: the Map's concurrency binds before the rate limit, and nobody waits
    long = cost.rollout_flow(big, replace(fast, seconds_per_turn=60.0))
    assert long.bound == "concurrency" and long.rate == pytest.approx(200 / 60.5) and long.latency == 60.5


def test_invokes_over_the_rate_limit_are_refused_and_retried_more_as_the_burst_outgrows_it():
    """`cost.refused_invokes`: invokes beyond acr_tps_limit are throttled and retried with the Start rollout
    state's Retry (read off the ASL), each retry one more StartRollout and transition in the estimate. A
    batch's first burst is paced ("Pace start", `stepwise.core.planning.start_offsets`), so it passes; the
    children the Map starts as rollouts end outrun the limit when rollouts end faster than it (Little's law:
    200 in flight for 2 s each is 100 a second against 25). Measured on the local stack (toy task,
    acr_tps_limit 25) before the pacing: 37 refused a batch of 64 in flight (the model then said 57)."""
    retry = cost.start_retry()
    assert retry == {"interval": 1.0, "backoff": 2.0, "max_delay": 30.0, "attempts": 8.0}
    assert cost.refused_invokes(20, 20, 25.0, 1.0, retry) == 0.0  # a burst within the limit passes
    assert cost.refused_invokes(64, 64, 25.0, 8.0, retry) == 0.0  # a paced burst beyond it too
    assert cost.refused_invokes(1024, 200, 25.0, 25.0, retry) == 0.0  # 8 a second end and start
    assert 500 <= cost.refused_invokes(1024, 200, 25.0, 2.0, retry)  # 100 a second end and start
    assert cost.refused_invokes(1024, 200, 250.0, 2.0, retry) == 0.0
    est = cost.estimate(load_run_config({**BASE, "batch_size": 64, "responses_per_prompt": 8, "acr_tps_limit": 5}))
    assert est["flow"]["refused"] > 0


def test_the_judge_s_share_is_projected_per_group_and_priced(capsys):
    base = load_run_config(BASE)
    judged = load_run_config({**BASE, "judge": {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "x" * 400}})
    a = cost.Assumptions(judge_chars_per_member=2000, judge_output_tokens_per_member=40, judge_attempts_per_group=1.0)
    j = cost.judge_per_step(judged, a)
    assert j["requests"] == 4 and j["input_tokens"] == pytest.approx(4 * (1600 + 400 + 2 * 2000) / 4)
    assert j["output_tokens"] == 4 * 2 * 40 and j["usd"] == pytest.approx((6000 * 0.035 + 320 * 0.14) / 1e6)
    with_judge, without = cost.estimate(judged, a), cost.estimate(base, a)
    assert with_judge["parts_per_step"]["judge"] == pytest.approx(j["usd"])
    assert with_judge["parts_per_step"]["total"] == pytest.approx(
        without["parts_per_step"]["total"] + j["usd"] + with_judge["parts_per_step"]["stack"]
        - without["parts_per_step"]["stack"])
    # the judge's state, function and reads: "Judge groups" and its Choice, one invocation per generation batch
    assert with_judge["usage_per_step"]["state_transitions"] - without["usage_per_step"]["state_transitions"] == 2
    assert with_judge["usage_per_step"]["lambda_requests"] - without["usage_per_step"]["lambda_requests"] == 1
    assert "judge" not in without["parts_per_step"] and cost.judge_per_step(base, a) is None


_units = st.floats(min_value=0, max_value=1e7, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(gb_s=_units, requests=st.integers(0, 10_000_000), transitions=st.integers(0, 10_000_000),
       puts=st.integers(0, 10_000_000), gets=st.integers(0, 10_000_000), hours=_units, acr_s=_units,
       usd_per_hour=st.one_of(st.none(), st.floats(0, 100)))


def test_the_estimate_prices_units_as_the_ledger_does(gb_s, requests, transitions, puts, gets, hours, acr_s,
                                                      usd_per_hour):
    """One pricing function (`stepwise.core.ledger.price`) serves the ledger and the estimate: the same units
    cost the same by part, whichever side prices them."""
    from stepwise.core import ledger
    from stepwise.records import Usage as Measured

    cfg = load_run_config(BASE).model_copy(update={"session_usd_per_hour": usd_per_hour})
    projected = cost.parts(cfg, cost.Usage(lambda_gb_seconds=gb_s, lambda_requests=requests,
                                           state_transitions=transitions, s3_put_class=puts, s3_get_class=gets),
                           hours, acr_s)
    measured = ledger.part_usd(Measured(lambda_gb_seconds={"PlanStep": gb_s}, lambda_requests={"PlanStep": requests},
                                        state_transitions=transitions, s3_put_class=puts, s3_get_class=gets,
                                        acr_vcpu_seconds=acr_s * cfg.acr_vcpus, acr_gb_seconds=acr_s * cfg.acr_memory_gb),
                               hours * 3600, cfg)
    assert set(measured) == set(projected) - {"session_hours"}
    for part, usd in measured.items():
        assert projected[part] == pytest.approx(usd, rel=1e-12, abs=1e-12), part
    stack = cost.Usage(lambda_gb_seconds=gb_s, lambda_requests=requests, state_transitions=transitions,
                       s3_put_class=puts, s3_get_class=gets).dollars()
    assert stack["total"] == pytest.approx(measured["stack"], rel=1e-12, abs=1e-12)


# ---------------------------------------------------------------------------- asynchrony (stepwise_cli.asyncmodel)


def test_the_asynchrony_model_reproduces_sync_at_d0k0_and_never_trains_past_k():
    from stepwise_cli.asyncmodel import Timing, lognormal_durations, simulate

    durations = lognormal_durations(mean_s=80, sigma=0.6, seed=1, group_size=8)
    timing = Timing(train_s=120, rebind_s=10, orchestration_s=5)
    runs = {name: simulate(kind, steps=12, batch_size=8, group_size=8, durations=durations, timing=timing,
                           steps_ahead=d, max_staleness=k)
            for name, kind, d, k in (("sync", "sync", 0, 0), ("overlap", "overlap", 0, 1), ("d0k0", "group", 0, 0),
                                     ("d1k2", "group", 1, 2), ("d2k3", "group", 2, 3))}
    assert runs["d0k0"].step_seconds == pytest.approx(runs["sync"].step_seconds)  # the same loop
    # a heavy tail: every engine that overlaps is faster, the deepest the most, and busier
    s = {k: r.s_per_step for k, r in runs.items()}
    assert s["d2k3"] < s["d1k2"] < s["overlap"] < s["sync"]
    assert runs["d2k3"].busy_fraction > 0.8 > runs["sync"].busy_fraction
    assert s["d2k3"] >= timing.train_s + timing.rebind_s  # never faster than the session can train
    for name, k in (("d1k2", 2), ("d2k3", 3)):
        assert max(runs[name].staleness_G) <= k
    # the same group gets the same durations in every engine
    assert durations(7) == lognormal_durations(mean_s=80, sigma=0.6, seed=1, group_size=8)(7)


def test_stepwise_cost_prints_what_asynchrony_is_worth(tmp_path, capsys):
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({**BASE, "batch_size": 8, "responses_per_prompt": 8, "admission": "group",
                               "max_staleness": 3, "sampling_steps_ahead": 2, "acr_tps_limit": 125}))
    assert main(["cost", str(cfg), "--steps", "10", "--turns-per-rollout", "8", "--seconds-per-turn", "10",
                 "--train-seconds", "120", "--session-usd-per-hour", "40"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.split("asynchrony (")[1].splitlines()[1:] if line.strip()}
    assert set(rows) == {"sync", "overlap", "d1k2", "d2k3"} and rows["d2k3"].endswith("<- this config")
    est = cost.estimate(load_run_config(json.loads(cfg.read_text())),
                        cost.Assumptions(turns_per_rollout=8, seconds_per_turn=10, train_seconds=120))
    table = {r["arm"]: r for r in est["asynchrony"]}
    assert table["sync"]["ratio_to_sync"] == 1.0 and table["d2k3"]["ratio_to_sync"] < table["overlap"]["ratio_to_sync"] < 1
    # this config's session-hours per step are the model's for its own arm
    assert est["parts_per_step"]["session_hours"] == pytest.approx(table["d2k3"]["session_hours_per_step"])
    # its state transitions follow the group engine's path, one own execution per group
    assert est["usage_per_step"]["state_transitions"] > cost.estimate(load_run_config(BASE))["usage_per_step"]["state_transitions"]


def test_with_the_group_engine_the_judge_is_projected_as_one_call_and_one_loop_per_group():
    """admission: group judges each group in its own rollout group ("Judge the group", "Group judged?"): per step,
    one JudgeGroups call and two transitions per group, where the batch engine has one per generation batch; the
    Bedrock requests are the same."""
    judge = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "x" * 400}
    group = {**BASE, "admission": "group", "max_staleness": 1}
    judged, base = load_run_config({**group, "judge": judge}), load_run_config(group)
    a = cost.Assumptions(judge_attempts_per_group=1.0)
    with_judge, without = cost.estimate(judged, a), cost.estimate(base, a)
    groups = judged.batch_size
    assert groups > 1
    assert with_judge["usage_per_step"]["lambda_requests"] - without["usage_per_step"]["lambda_requests"] == groups
    assert with_judge["usage_per_step"]["state_transitions"] - without["usage_per_step"]["state_transitions"] == 2 * groups
    assert with_judge["parts_per_step"]["judge"] == pytest.approx(cost.judge_per_step(judged, a)["usd"])
