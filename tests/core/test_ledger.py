"""The cost ledger (`stepwise.core.ledger`): prices, state transitions from histories, a step's share,
the projection, the comparison with the estimate."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.planning import cfg, state

from stepwise.core import ledger, prices
from stepwise.records import StepCost, Usage


def _usage(**kw) -> Usage:
    return Usage(**kw)


def test_parts_are_priced_from_the_one_table_and_the_configs_rates():
    c = cfg(session_usd_per_hour=12.0, acr_vcpus=0.5, acr_memory_gb=4.0)
    u = _usage(lambda_gb_seconds={"Gateway": 600_000.0, "PlanStep": 400_000.0}, lambda_requests={"Gateway": 1_000_000},
               state_transitions=40_000, s3_put_class=2_000, s3_get_class=10_000, acr_vcpu_seconds=7200.0,
               acr_gb_seconds=3600.0)
    got = ledger.part_usd(u, 1800.0, c)
    assert got["session"] == pytest.approx(6.0)  # half an hour at $12
    assert got["agent"] == pytest.approx(2 * 0.0895 + 1 * 0.00945)
    assert got["lambda"] == pytest.approx(1_000_000 * 0.0000166667 + 0.20)
    assert got["step_functions"] == pytest.approx(1.0)
    assert got["s3"] == pytest.approx(0.01 + 0.004)
    assert got["stack"] == pytest.approx(got["lambda"] + got["step_functions"] + got["s3"])
    assert got["total"] == pytest.approx(got["session"] + got["agent"] + got["stack"])
    unpriced = ledger.part_usd(u, 1800.0, cfg())
    assert "session" not in unpriced and unpriced["total"] == pytest.approx(got["total"] - 6.0)
    assert ledger.part_usd(u, 0, c, architecture="arm64")["lambda"] < got["lambda"]


@pytest.mark.parametrize(("op", "kind"), [("PutObject", "put"), ("ListObjectsV2", "put"), ("CopyObject", "put"),
                                          ("CreateBucket", "put"), ("GetObject", "get"), ("HeadObject", "get"),
                                          ("HeadBucket", "get"), ("DeleteObject", None)])
def test_s3_operations_fall_in_their_price_class(op, kind):
    assert prices.s3_request_class(op) == kind


def _history(*types: str) -> list[dict]:
    return [{"id": i + 1, "type": t} for i, t in enumerate(types)]


def test_transitions_are_states_entered_plus_task_retries():
    events = _history("ExecutionStarted", "TaskStateEntered", "LambdaFunctionScheduled", "LambdaFunctionStarted",
                      "LambdaFunctionFailed", "LambdaFunctionScheduled", "LambdaFunctionSucceeded", "TaskStateExited",
                      "ChoiceStateEntered", "ChoiceStateExited", "MapStateEntered", "MapRunStarted", "MapRunSucceeded",
                      "WaitStateEntered", "TaskStateEntered", "TaskScheduled", "TaskSubmitted", "TaskSucceeded",
                      "SucceedStateEntered", "ExecutionSucceeded")
    # 6 states entered (2 tasks, a choice, a map, a wait, a succeed) + 1 retry of the first task
    assert ledger.transitions_in(events) == 7


@settings(max_examples=60, deadline=None)
@given(states=st.lists(st.sampled_from(["Task", "Choice", "Wait", "Map", "Pass"]), max_size=30),
       retries=st.lists(st.integers(0, 3), max_size=30))
def test_each_retry_adds_one_transition_whatever_the_path(states, retries):
    events, expected = [], 0
    for i, kind in enumerate(states):
        events.append({"type": f"{kind}StateEntered"})
        expected += 1
        if kind == "Task":
            n = retries[i] if i < len(retries) else 0
            events += [{"type": "LambdaFunctionScheduled"}] * (1 + n)
            expected += n
    assert ledger.transitions_in([{**e, "id": i + 1} for i, e in enumerate(events)]) == expected


def test_the_parent_history_is_counted_once_per_event_and_anew_in_each_execution():
    s = state()
    h = _history("ExecutionStarted", "TaskStateEntered", "LambdaFunctionScheduled", "ChoiceStateEntered")
    assert ledger.count_parent_history(s, 4, h) == 2
    assert ledger.count_parent_history(s, 4, h) == 0  # the same events again: nothing new
    more = h + [{"id": 5, "type": "TaskStateEntered"}, {"id": 6, "type": "LambdaFunctionScheduled"}]
    assert ledger.count_parent_history(s, 6, more) == 1 and ledger.history_after(s) == 6
    s.segment = 1  # continue-as-new: event ids restart
    assert ledger.history_after(s) == 0
    assert ledger.count_parent_history(s, 2, _history("ExecutionStarted", "TaskStateEntered")) == 1
    assert s.ledger.usage.state_transitions == 4


def test_a_rollout_childs_states_are_the_asls():
    from state_machine.definition import load_asl

    def maps(states):
        for st_ in states.values():
            if st_["Type"] == "Map":
                yield st_
            for branch in st_.get("Branches", []):
                yield from maps(branch["States"])

    found = [m for m in maps(load_asl()["States"]) if (m.get("ItemProcessor") or {}).get("ProcessorConfig", {}).get("Mode") == "DISTRIBUTED"]
    assert len(found) == 2  # the step's and the next step's (overlapped) generation batch
    from stepwise.handlers.rollout import FINISH_ROLLOUT_RETRIES

    for m in found:
        states = m["ItemProcessor"]["States"]
        # a rollout's own path: Pace start -> Start rollout -> Finish rollout (End); the rest runs only when Finish
        # keeps failing
        path = [m["ItemProcessor"]["StartAt"]]
        while not states[path[-1]].get("End"):
            path.append(states[path[-1]]["Next"])
        assert len(path) == ledger.CHILD_STATES
        for task in states.values():  # each task counts its own retries from the context object
            if task["Type"] == "Task":
                params = task["Parameters"].get("Payload", task["Parameters"])
                params = params.get("recheck", params)  # OnRolloutResult's re-check: its request in "recheck"
                assert params["retry_count.$"] == "$$.State.RetryCount"
        # "Record failed rollout" counts Finish rollout's spent retries: they are all spent (States.ALL)
        assert [states[p]["Type"] for p in path[:ledger.PACE_STATES]] == ["Wait"]  # Pace start, never retried
        finish_retry = states[path[-1]]["Retry"]
        assert [r["ErrorEquals"] for r in finish_retry] == [["States.ALL"]]
        assert finish_retry[0]["MaxAttempts"] == FINISH_ROLLOUT_RETRIES
    assert ledger.task_transitions(None) == 1 and ledger.task_transitions(3) == 4


def test_steps_are_marked_from_the_first_steps_start_and_the_window_keeps_the_last_five():
    c = cfg(session_usd_per_hour=36.0)  # $0.01 a second
    s = state(session_created_at=1000.0, step_started_at=1100.0)
    s.ledger.usage.add(_usage(s3_put_class=200))  # start-up: in the total only
    ledger.open_first_step(s, 1100.0)
    costs = []
    for step in range(7):
        s.ledger.usage.add(_usage(state_transitions=40 * (step + 1)))
        out = ledger.close_step(s, c, 1110.0 + 10 * step, step)
        costs.append(out)
        assert out["cost/session_seconds"] == pytest.approx(10.0)
        assert out["cost/session_usd"] == pytest.approx(0.10)
        assert out["cost/step_functions_usd"] == pytest.approx(40 * (step + 1) * 0.025 / 1000)
        assert out["cost/step_usd"] == pytest.approx(sum(out[f"cost/{p}_usd"] for p in ledger.PARTS if f"cost/{p}_usd" in out))
        s.step += 1
    assert [x.step for x in s.ledger.recent_steps] == [2, 3, 4, 5, 6]
    startup = 100 * 0.01 + 200 * 0.005 / 1000  # the session's 100 s before step 0, and the uploads
    assert costs[-1]["cost/total_usd"] == pytest.approx(startup + sum(x["cost/step_usd"] for x in costs))
    assert costs[-1]["cost/session_hours"] == pytest.approx(170 / 3600)
    proj = ledger.step_projection(s)
    assert proj.usd == pytest.approx(max(x["cost/step_usd"] for x in costs[2:]))
    assert proj.session_seconds == pytest.approx(10.0) and proj.wall_seconds == pytest.approx(10.0)


def test_a_stopped_session_stops_counting_and_a_resumed_one_adds_to_it():
    s = state(session_created_at=100.0)
    assert ledger.session_seconds(s, 150.0) == 50.0
    ledger.close_session(s, 160.0)
    s.session_stopped = True
    ledger.close_session(s, 190.0)  # already stopped: nothing more
    assert ledger.session_seconds(s, 1000.0) == 60.0
    s.session_stopped, s.session_created_at = False, 500.0  # `stepwise resume`: a new session
    assert ledger.session_seconds(s, 530.0) == 90.0


def test_the_end_compares_the_ledger_with_the_estimate_for_the_steps_trained():
    c = cfg(session_usd_per_hour=3600.0)
    s = state(session_created_at=100.0, step=4)
    s.ledger.usage.add(_usage(acr_vcpu_seconds=3600.0))
    estimate = {"per_step": {"session": 10.0, "agent": 0.05, "lambda": 0.0, "step_functions": 0.0, "s3": 0.0,
                             "stack": 0.0, "total": 10.05, "session_hours": 10 / 3600}, "prices_as_of": "x"}
    final = ledger.final_report(s, c, 145.0, estimate)
    assert final["line"] == "this run cost $45.09: session $45.00 (0.013 h), agent $0.0895, stack $0.0000"
    cmp = final["estimate"]
    assert cmp["total"]["estimate"] == pytest.approx(40.2) and cmp["total"]["ledger"] == pytest.approx(45.0895)
    assert cmp["total"]["percent"] == pytest.approx(100 * 4.8895 / 40.2)
    assert cmp["session"]["difference"] == pytest.approx(5.0)
    assert final["estimate_line"] == "estimated $40.20 for 4 steps; the ledger says $45.09: +$4.89 (+12%)"
    assert "estimate" not in ledger.final_report(s, c, 145.0, None)
    # the start-up the ledger's total holds once (the session before the first step) is added once, not per step
    with_startup = {**estimate, "startup": {"session": 5.0, "total": 5.0, "session_hours": 5 / 3600}}
    cmp = ledger.final_report(s, c, 145.0, with_startup)["estimate"]
    assert cmp["total"]["estimate"] == pytest.approx(45.2) and cmp["session"]["difference"] == pytest.approx(0.0)
    assert cmp["session_hours"]["estimate"] == pytest.approx(45 / 3600)


@settings(max_examples=60, deadline=None)
@given(a=st.dictionaries(st.sampled_from(["Gateway", "PlanStep", "Init"]), st.floats(0, 1e6), max_size=3),
       b=st.dictionaries(st.sampled_from(["Gateway", "StartRollout"]), st.floats(0, 1e6), max_size=2),
       n=st.integers(0, 10**6), m=st.integers(0, 10**6))
def test_a_steps_usage_is_the_difference_of_two_totals(a, b, n, m):
    first = Usage(lambda_gb_seconds=a, state_transitions=n)
    second = Usage(lambda_gb_seconds=b, s3_get_class=m)
    total = first.model_copy(deep=True).add(second)
    back = total.minus(first)
    assert back.s3_get_class == m and back.state_transitions == 0
    for k, v in b.items():
        assert back.lambda_gb_seconds[k] == pytest.approx(v, abs=1e-6)
    assert StepCost(step=0, usd=1.0, session_seconds=0, wall_seconds=0).usd == 1.0


def test_the_judge_is_its_own_part_priced_from_the_table_or_the_config_and_in_the_step_s_cost():
    """The group judge's Bedrock requests and tokens (docs/judge.md): priced at the judge model's price per million
    tokens, in the total the budget limits read, its units beside it in the step summary."""
    u = _usage(judge_requests=10, judge_input_tokens=2_000_000, judge_output_tokens=500_000)
    micro = cfg(judge={"model_id": "us.amazon.nova-micro-v1:0", "rubric": "r"})
    got = ledger.part_usd(u, 0.0, micro)
    assert got["judge"] == pytest.approx(2 * 0.035 + 0.5 * 0.14) and got["total"] == pytest.approx(got["judge"])
    own = cfg(judge={"model_id": "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p", "rubric": "r",
                     "usd_per_million_input_tokens": 1.0, "usd_per_million_output_tokens": 4.0})
    assert ledger.part_usd(u, 0.0, own)["judge"] == pytest.approx(2.0 + 2.0)
    unpriced = cfg(judge={"model_id": "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/p", "rubric": "r"})
    assert "judge" not in ledger.part_usd(u, 0.0, unpriced) and "judge" not in ledger.part_usd(u, 0.0, cfg())
    s = state(session_created_at=1.0)
    ledger.open_first_step(s, 1.0)
    s.ledger.usage.add(u)
    out = ledger.close_step(s, micro, 10.0, 0)
    assert out["cost/judge_usd"] == pytest.approx(got["judge"]) and out["cost/judge_requests"] == 10
    assert out["cost/judge_input_tokens"] == 2_000_000 and out["cost/judge_output_tokens"] == 500_000
    assert out["cost/step_usd"] == pytest.approx(sum(out[f"cost/{p}_usd"] for p in ledger.PARTS if f"cost/{p}_usd" in out))
    assert s.ledger.recent_steps[-1].usd == pytest.approx(out["cost/step_usd"])  # what max_cost_usd projects from
    assert "judge $" in ledger.cost_line(ledger.totals(s, micro, 10.0))
    assert "cost/judge_usd" not in ledger.close_step(state(), cfg(), 10.0, 0)
