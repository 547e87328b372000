"""The group judge's pure part (`stepwise.core.judge`): what the judge reads of a group, what it is asked, what a
valid answer is, how its scores become the rewards the estimator reads, and the step's judge metrics."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core import judge
from stepwise.core.advantages import compute_advantages
from stepwise.records import JudgeRecord, RolloutRecord, Usage
from tests.support.planning import cfg

RUBRIC = "Prefer the answer that names the right digit."
JUDGE = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": RUBRIC}


def run_cfg(**judge_kw):
    extra = {k: judge_kw.pop(k) for k in ("advantage_estimator", "reward_granularity") if k in judge_kw}
    return cfg(judge={**JUDGE, **judge_kw}, **extra)


def turn(system: str, question: str, reply: str, **message) -> dict:
    return {"turn": {"output_ids": [1, 2], "finish_reason": "stop"},
            "prompt_messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
            "response_message": {"role": "assistant", "content": reply, **message}}


def member(k: int, reply: str, *, status: str = "ok", result: dict | None = None, system: str = "Reply with one digit.",
           reward: float = 0.0) -> judge.JudgedMember:
    return judge.JudgedMember(member=k, sid=f"sid-{k}", status=status, agent_reward=reward,
                              turns=[turn(system, "What digit comes after 3?", reply)] if status == "ok" else [],
                              result=result)


# ---------------------------------------------------------------------------- what the judge reads


def test_the_task_every_member_shares_is_shown_once_and_each_member_s_own_part_after_it():
    g = judge.judged_group([member(0, "4"), member(1, "7")], run_cfg().judge.include)
    assert g.context.count("What digit comes after 3?") == 1 and "[system]\nReply with one digit." in g.context
    assert g.parts == ["[assistant]\n4", "[assistant]\n7"] and g.judged == [0, 1] and g.chars == [13, 13]


def test_failed_members_are_not_shown_to_the_judge():
    g = judge.judged_group([member(0, "4"), member(1, "", status="timeout"), member(2, "5")], run_cfg().judge.include)
    assert g.judged == [0, 2] and len(g.parts) == 2


def test_the_agent_s_reward_bookkeeping_and_api_key_never_reach_the_judge():
    result = {"rewards": 1.0, "answer": "4", "status_code": 200, "input_id": "x", "result_key": "k",
              "payload": {"prompt": "p", "_rollout": {"api_key": "sid.SECRET"}}}
    text = judge.judged_group([member(0, "4", result=result)], run_cfg().judge.include).parts[0]
    assert '"answer": "4"' in text and "rewards" not in text and "SECRET" not in text and "status_code" not in text
    named = run_cfg(include={"result_fields": ["payload", "rewards"]}).judge.include
    shown = judge.judged_group([member(0, "4", result=result)], named).parts[0]
    assert '"prompt": "p"' in shown and '"rewards": 1.0' in shown and "SECRET" not in shown and "_rollout" not in shown


def test_tool_calls_and_results_are_shown_unless_the_config_leaves_them_out():
    t = turn("s", "q", "", tool_calls=[{"id": "c1", "function": {"name": "calc", "arguments": '{"x": 1}'}}])
    t2 = {"turn": {"output_ids": [3]}, "prompt_messages": [*t["prompt_messages"], t["response_message"],
                                                            {"role": "tool", "tool_call_id": "c1", "content": "2"}],
          "response_message": {"role": "assistant", "content": "the answer is 2"}}
    m = judge.JudgedMember(member=0, sid="s", status="ok", agent_reward=0.0, turns=[t, t2])
    full = judge.judged_group([m], run_cfg().judge.include).parts[0]
    assert 'calls calc({"x": 1})' in full and "[tool result c1]\n2" in full and "the answer is 2" in full
    bare = judge.judged_group([m], run_cfg(include={"tool_calls": False, "tool_results": False}).judge.include).parts[0]
    assert "calc" not in bare and "tool result" not in bare and "the answer is 2" in bare


def test_each_message_and_each_member_is_cut_keeping_its_start_and_its_end():
    long = "A" * 3000 + "FINAL ANSWER 4"
    inc = run_cfg(include={"max_message_chars": 200, "max_member_chars": 300}).judge.include
    part = judge.judged_group([member(0, long)], inc).parts[0]
    assert len(part) <= 300 and part.endswith("FINAL ANSWER 4") and "characters cut" in part
    assert judge.cut("short", 10) == "short"


@given(st.text(max_size=3000), st.integers(min_value=40, max_value=2000))
@settings(max_examples=200, deadline=None)
def test_a_cut_text_never_exceeds_its_limit_and_keeps_both_ends(text, limit):
    out = judge.cut(text, limit)
    assert len(out) <= max(limit, len(text) if len(text) <= limit else limit)
    if len(text) > limit:
        assert text.startswith(out[: out.index("\n[...")]) and text.endswith(out[out.index("cut ...]\n") + 9:])


# ---------------------------------------------------------------------------- what the judge is asked


def test_the_request_forces_one_tool_whose_schema_is_one_score_and_reason_per_attempt():
    c = run_cfg(score_min=1, score_max=5).judge
    g = judge.judged_group([member(0, "4"), member(1, "7")], c.include)
    req = judge.converse_request(c, g)
    assert req["modelId"] == c.model_id and req["toolConfig"]["toolChoice"] == {"tool": {"name": judge.TOOL_NAME}}
    schema = req["toolConfig"]["tools"][0]["toolSpec"]["inputSchema"]["json"]["properties"]["scores"]
    assert schema["minItems"] == schema["maxItems"] == 2
    assert schema["items"]["properties"]["score"] == {"type": "number", "minimum": 1.0, "maximum": 5.0}
    assert RUBRIC in req["system"][0]["text"] and "<attempt 2>\n[assistant]\n7\n</attempt 2>" in req["messages"][0]["content"][0]["text"]


def test_the_botocore_model_accepts_the_request_and_a_retry_after_a_rejected_tool_call():
    import botocore.session
    from botocore.validate import validate_parameters

    c = run_cfg().judge
    req = judge.converse_request(c, judge.judged_group([member(0, "4"), member(1, "7")], c.include))
    shape = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse").input_shape
    validate_parameters(req, shape)
    answer = {"output": {"message": {"role": "assistant", "content": [
        {"toolUse": {"toolUseId": "t1", "name": judge.TOOL_NAME, "input": {"scores": []}}}]}}}
    retry = {**req, "messages": judge.retry_messages(req, answer, "attempt(s) 1, 2 missing")}
    validate_parameters(retry, shape)
    assert [m["role"] for m in retry["messages"]] == ["user", "assistant", "user"]
    result = retry["messages"][-1]["content"][0]["toolResult"]
    assert result["toolUseId"] == "t1" and result["status"] == "error" and "attempt(s) 1, 2 missing" in result["content"][0]["text"]
    text_answer = {"output": {"message": {"role": "assistant", "content": [{"text": "7 and 3"}]}}}
    assert "not valid: no JSON" in judge.retry_messages(req, text_answer, "no JSON")[-1]["content"][0]["text"]


def test_the_cache_key_changes_with_what_was_judged_and_how_not_with_anything_else():
    c = run_cfg().judge
    g = judge.judged_group([member(0, "4"), member(1, "7")], c.include)
    key = judge.cache_key(c, g)
    assert key == judge.cache_key(run_cfg().judge, judge.judged_group([member(0, "4"), member(1, "7")], c.include))
    assert key != judge.cache_key(c, judge.judged_group([member(0, "4"), member(1, "8")], c.include))
    assert key != judge.cache_key(run_cfg(rubric="Prefer short answers.").judge, g)
    assert key != judge.cache_key(run_cfg(score_max=5).judge, g)
    assert key == judge.cache_key(run_cfg(concurrency=1, requests_per_second=9).judge, g)  # how fast: not what


# ---------------------------------------------------------------------------- what a valid answer is


def answer(entries, *, as_text: bool = False) -> dict:
    if as_text:
        return {"output": {"message": {"content": [{"text": f"Scores: {json.dumps({'scores': entries})}"}]}}}
    return {"output": {"message": {"content": [{"toolUse": {"toolUseId": "t", "name": judge.TOOL_NAME,
                                                             "input": {"scores": entries}}}]}}, "stopReason": "tool_use"}


def test_a_valid_answer_gives_scores_and_one_line_reasons_in_attempt_order():
    c = run_cfg().judge
    v = judge.parse_verdict(answer([{"attempt": 2, "score": 3, "reason": "wrong\ndigit"},
                                    {"attempt": 1, "score": 10, "reason": "right"}]), 2, c)
    assert v.scores == [10.0, 3.0] and v.reasons == ["right", "wrong digit"]
    assert judge.parse_verdict(answer([{"attempt": 1, "score": "7.5", "reason": "r"}], as_text=True), 1, c).scores == [7.5]


@pytest.mark.parametrize(("entries", "problem"), [
    ([{"attempt": 1, "score": 11, "reason": "r"}, {"attempt": 2, "score": 1, "reason": "r"}], "outside the range 0 to 10"),
    ([{"attempt": 1, "score": -1, "reason": "r"}, {"attempt": 2, "score": 1, "reason": "r"}], "outside the range"),
    ([{"attempt": 1, "score": 5, "reason": "r"}], "attempt(s) 2 missing"),
    ([{"attempt": 1, "score": 5, "reason": "r"}, {"attempt": 1, "score": 5, "reason": "r"}], "attempt 1 is scored twice"),
    ([{"attempt": 3, "score": 5, "reason": "r"}], "attempt 3 does not exist"),
    ([{"attempt": 1, "score": "high", "reason": "r"}], "is not a number"),
    ([{"attempt": 1, "score": float("nan"), "reason": "r"}], "is not a number"),
    (["x"], "a scores entry is not an object"),
    ("scores", "the answer has no 'scores' list"),
])
def test_an_invalid_answer_says_what_was_wrong(entries, problem):
    with pytest.raises(judge.InvalidVerdict, match=problem.replace("(", r"\(").replace(")", r"\)")):
        judge.parse_verdict(answer(entries), 2, run_cfg().judge)


def test_malformed_json_and_no_tool_call_are_invalid_answers():
    c = run_cfg().judge
    with pytest.raises(judge.InvalidVerdict, match="malformed"):
        judge.parse_verdict({"output": {"message": {"content": [{"text": '{"scores": [{"attempt": 1,'  '}'}]}}}, 1, c)
    with pytest.raises(judge.InvalidVerdict, match="no record_scores call and no JSON"):
        judge.parse_verdict({"output": {"message": {"content": [{"text": "attempt 1 is best"}]}}, "stopReason": "max_tokens"}, 1, c)
    with pytest.raises(judge.InvalidVerdict, match="holds no message"):
        judge.parse_verdict({}, 1, c)


@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=30), st.integers(min_value=1, max_value=6))
@settings(max_examples=300, deadline=None)
def test_any_answer_is_a_valid_verdict_or_an_invalid_one_never_a_crash(value, n):
    """Whatever the model sends as the tool's input: a verdict within the range with every attempt once, or
    InvalidVerdict (a hostile-input property of the boundary)."""
    c = run_cfg().judge
    for response in (answer(value), {"output": {"message": {"content": [{"toolUse": {"name": judge.TOOL_NAME, "input": value}}]}}}):
        try:
            v = judge.parse_verdict(response, n, c)
        except judge.InvalidVerdict:
            continue
        assert len(v.scores) == len(v.reasons) == n and all(0 <= s <= 10 and math.isfinite(s) for s in v.scores)


# ---------------------------------------------------------------------------- scores -> rewards


def rollout(k: int, reward: float, *, input_id: str = "g0", status: str = "ok", turn_rewards=None) -> RolloutRecord:
    return RolloutRecord(sid=f"sid-{input_id}-{k}", i=k, input_id=input_id, row=0, member=k, step=0, reward=reward,
                         status=status, turn_rewards=turn_rewards)


def record(scores, *, input_id: str = "g0", source: str = "judge", judged=None, reason: str | None = None) -> JudgeRecord:
    n = len(scores)
    return JudgeRecord(input_id=input_id, step=0, sids_G=[f"sid-{input_id}-{k}" for k in range(n)], members_G=list(range(n)),
                       judged_G=judged or [s is not None for s in scores], scores_G=list(scores),
                       reasons_G=[f"r{k}" for k in range(n)], judged_chars_G=[10] * n, source=source,
                       fallback_reason=reason, usage=Usage(judge_requests=1, judge_input_tokens=100, judge_output_tokens=20))


def rewards(rollouts):
    return [r.reward for r in rollouts]


def test_replace_reads_the_score_mapped_to_zero_one_and_keeps_the_agent_s_reward_beside_it():
    out = judge.apply_judgements([rollout(0, 1.0), rollout(1, 0.0), rollout(2, 0.5)], {"g0": record([10, 0, 5])},
                                 run_cfg(combine="replace"))
    assert rewards(out) == [1.0, 0.0, 0.5] and [r.agent_reward for r in out] == [1.0, 0.0, 0.5]
    assert [r.judge_score for r in out] == [10, 0, 5] and [r.judge_reason for r in out] == ["r0", "r1", "r2"]


def test_add_sums_the_agent_s_reward_and_the_weighted_score_on_the_last_turn_with_per_turn_rewards():
    c = run_cfg(combine="add", weight=0.5)
    out = judge.apply_judgements([rollout(0, 1.0), rollout(1, 0.0)], {"g0": record([10, 0])}, c)
    assert rewards(out) == [1.5, 0.0]
    per_turn = run_cfg(combine="add", weight=2.0, advantage_estimator="per_turn_rloo", reward_granularity="per_turn")
    out = judge.apply_judgements([rollout(0, 1.0, turn_rewards=[1.0, 0.0]), rollout(1, 0.0, turn_rewards=[0.0, 0.0])],
                                 {"g0": record([5, 0])}, per_turn)
    assert [r.turn_rewards for r in out] == [[1.0, 1.0], [0.0, 0.0]]


def test_gdpo_normalizes_each_reward_within_the_group_before_summing():
    """GDPO (arXiv:2601.05242): rewards (1, 0) and scores (0, 10) cancel, where a plain sum would not."""
    out = judge.apply_judgements([rollout(0, 1.0), rollout(1, 0.0)], {"g0": record([0, 10])}, run_cfg(combine="gdpo"))
    assert rewards(out) == pytest.approx([0.0, 0.0], abs=1e-6)
    out = judge.apply_judgements([rollout(0, 5.0), rollout(1, 5.0), rollout(2, 5.0)], {"g0": record([0, 5, 10])},
                                 run_cfg(combine="gdpo", weight=2.0))
    assert rewards(out) == pytest.approx([-2 * math.sqrt(1.5), 0.0, 2 * math.sqrt(1.5)], rel=1e-6)


def test_a_member_that_did_not_complete_gets_the_lowest_judged_reward():
    out = judge.apply_judgements([rollout(0, 0.0), rollout(1, 0.0, status="error")], {"g0": record([7, None])}, run_cfg())
    assert rewards(out) == [0.7, 0.0] and out[1].judge_score is None


@pytest.mark.parametrize(("fallback", "expected"), [("agent_reward", [1.0, 0.0]), ("no_signal", [0.0, 0.0])])
def test_a_group_without_a_verdict_gets_the_fallback_with_its_reason(fallback, expected):
    c = run_cfg(fallback=fallback)
    out = judge.apply_judgements([rollout(0, 1.0), rollout(1, 0.0)],
                                 {"g0": record([None, None], source="fallback", reason="no valid answer in 3 attempt(s)")}, c)
    assert rewards(out) == expected and all(r.judge_score is None for r in out)
    assert all(r.judge_reason == f"fallback ({fallback}): no valid answer in 3 attempt(s)" for r in out)
    missing = judge.apply_judgements([rollout(0, 1.0), rollout(1, 0.0)], {}, c)
    assert rewards(missing) == expected and "no judge record" in missing[0].judge_reason
    if fallback == "no_signal":
        assert compute_advantages("grpo", [rewards(out)]) == [[0.0, 0.0]]


def test_without_a_judge_the_rollouts_are_untouched():
    rs = [rollout(0, 1.0), rollout(1, 0.0)]
    assert judge.apply_judgements(rs, {"g0": record([0, 10])}, cfg()) == rs


# ---------------------------------------------------------------------------- metrics


def test_agreement_is_the_judge_s_rank_correlation_with_the_agent_s_reward_within_groups():
    c = run_cfg(combine="add")
    rs = [rollout(k, r, input_id=g) for g, rewards_G in (("a", [1.0, 0.0, 0.5]), ("b", [0.0, 1.0, 1.0]), ("c", [1.0] * 3))
          for k, r in enumerate(rewards_G)]
    recs = {"a": record([9, 1, 5], input_id="a"), "b": record([8, 2, 3], input_id="b"), "c": record([1, 2, 3], input_id="c")}
    m = judge.judge_metrics(judge.apply_judgements(rs, recs, c), recs.values())
    # a: perfectly concordant (+1); b: reward ties (0, 1, 1) against (8, 2, 3): rho = -0.866; c: no reward spread, left out
    assert m["judge/agreement_groups"] == 2 and m["judge/agreement_spearman"] == pytest.approx((1 - math.sqrt(3) / 2) / 2)
    assert m["judge/groups"] == 3 and m["judge/judged_groups"] == 3 and m["judge/requests"] == 3
    assert m["judge/input_tokens"] == 300 and m["judge/mean_score"] == pytest.approx(34 / 9)


def test_a_judge_that_prefers_longer_answers_raises_the_length_bias_alarm():
    def rec(g, scores, chars):
        r = record(scores, input_id=g)
        return r.model_copy(update={"judged_chars_G": chars})

    biased = [rec(f"g{i}", [1, 5, 9], [10, 200, 900]) for i in range(4)]
    fair = [rec(f"g{i}", [9, 1, 5], [10, 200, 900]) for i in range(4)]
    m = judge.judge_metrics([], biased)
    assert m["judge/length_spearman"] == pytest.approx(1.0) and m["judge/length_bias_alarm"] == 1.0
    assert m["judge/mean_judged_chars"] == pytest.approx(370)
    assert judge.judge_metrics([], fair)["judge/length_bias_alarm"] == 0.0
    assert judge.judge_metrics([], biased[:3])["judge/length_bias_alarm"] == 0.0  # too few groups to say


def test_fallbacks_and_invalid_answers_are_counted():
    recs = [record([None, None], input_id="a", source="fallback", reason="x").model_copy(update={"attempts": 3}),
            record([1, 2], input_id="b").model_copy(update={"attempts": 2, "throttled": 4}),
            record([None, None], input_id="c", source="skipped"), record([1, 2], input_id="d", source="cache")]
    m = judge.judge_metrics([], recs)
    assert (m["judge/fallback_groups"], m["judge/skipped_groups"], m["judge/cached_groups"], m["judge/judged_groups"]) == (1, 1, 1, 2)
    assert m["judge/invalid_answers"] == 4 and m["judge/throttled"] == 4
