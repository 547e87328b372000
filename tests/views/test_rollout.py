"""stepwise.views.rollout: conversations, trained spans and failure causes as a person reads them.

The TraceRecords are made by the real replay (`stepwise.core.replay.replay_turns`, the toolkit's
TrajectoryManager) from captured turns, so "trained" means what the datums train.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.replay import record_to_json, replay_turns
from stepwise.views.rollout import conversation, failure_groups, token_spans, trained_turns
from tests.core.test_replay import SID, SUB_SYS, SUB_USER, T1, T2, T3, turn_body


def rollout(i, input_id, member, reward, *, status="ok", reason=None, error=None, gen=0, version=3):
    return {"sid": f"sid-{gen}-{i}", "i": i, "input_id": input_id, "row": 0, "member": member, "kind": "train",
            "step": 5, "generation_batch": gen, "reward": reward, "reward_reason": reason, "status": status,
            "error": error, "num_turns": 2, "tool_calls": 1, "sampled_tokens": 7, "duration_s": 1.5,
            "policy_version": version}


STEP = [rollout(0, "p0", 0, 1.0), rollout(1, "p0", 1, 0.0), rollout(2, "p0", 2, 0.0, reason="no reward"),
        rollout(3, "p1", 0, 1.0), rollout(4, "p1", 1, 1.0), rollout(5, "p1", 2, 1.0),
        rollout(6, "p2", 0, 0.0, status="timeout", error={"error": "States.Timeout", "cause": "late"}),
        rollout(7, "p2", 1, 0.0), rollout(8, "p2", 2, 0.5)]


def test_conversation_shows_each_message_once_with_tool_calls_and_the_trained_turns():
    calc = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "calculator", "arguments": '{"e": "2+2"}'}}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "4"}
    t1 = turn_body([1, 2, 3], [4, 5], [-0.1, -0.2], [T1["prompt_messages"][0], T1["prompt_messages"][1]], calc)
    t2 = turn_body([1, 2, 3, 4, 5, 6, 7], [8], [-0.3], [*t1["prompt_messages"], calc, tool],
                   {"role": "assistant", "content": "4"})
    records = [record_to_json(r) for r in replay_turns(SID, [t1, t2], 1.0)]
    msgs = conversation([t1, t2], records)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant"]
    assert msgs[2]["tool_calls"] == [{"id": "c1", "name": "calculator", "arguments": '{"e": "2+2"}'}]
    assert msgs[3]["tool_call_id"] == "c1" and msgs[3]["content"] == "4"
    assert [(m["turn"], m["trained"], m["output_tokens"]) for m in msgs if "turn" in m] == [(1, True, 2), (2, True, 1)]


def test_a_sub_agent_branch_is_marked_and_a_turn_outside_every_record_is_not_trained():
    records = [record_to_json(r) for r in replay_turns(SID, [T1, T2, T3], 0.5)]
    msgs = conversation([T1, T2, T3], records)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool", "assistant", "branch",
                                         "system", "user", "assistant"]
    assert msgs[6]["content"] == SUB_SYS["content"] and msgs[7]["content"] == SUB_USER["content"]
    assert trained_turns([T1, T2, T3], records) == [True, True, True]
    cut = [record_to_json(r) for r in replay_turns(SID, [T1, T2, T3], 0.5, max_context_tokens=5)]
    assert trained_turns([T1, T2, T3], cut) == [True, False, True]  # turn 2's token was cut off the record
    assert conversation([T1])[-1]["trained"] is None  # no records: unknown, not "not trained"
    assert [m["trained"] for m in conversation([T1, T2, T3], records, trained=False) if "turn" in m] == [False] * 3
    assert [m["trained"] for m in conversation([T1, T2, T3], records, trained=None) if "turn" in m] == [None] * 3


def test_token_spans_of_a_replayed_record_split_prompt_trained_and_masked():
    main = record_to_json(replay_turns(SID, [T1, T2], 1.0)[0])  # tokens 1..8, mask [1, 1, 0, 0, 1] on 4..8
    spans = token_spans(main, decode=lambda ids: ",".join(map(str, ids)))
    assert [(s.region, s.trained, s.text) for s in spans] == [
        ("prompt", False, "1,2,3"), ("response", True, "4,5"), ("response", False, "6,7"), ("response", True, "8")]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 50_000), min_size=0, max_size=60), st.data())
def test_spans_partition_the_tokens_and_follow_the_loss_mask(token_ids, data):
    n_mask = data.draw(st.integers(0, len(token_ids)))
    mask = data.draw(st.lists(st.integers(0, 1), min_size=n_mask, max_size=n_mask))
    spans = token_spans({"token_ids": token_ids, "loss_mask": mask})
    assert [t for s in spans for t in s.token_ids] == token_ids
    flat = [int(s.trained) for s in spans if s.region == "response" for _ in s.token_ids]
    assert flat == mask
    assert all(not s.trained for s in spans if s.region == "prompt")
    assert all(a.trained != b.trained for a, b in zip(spans[1:], spans[2:]))  # maximal runs


def test_failures_are_counted_by_cause_most_common_first():
    found = failure_groups(STEP + [rollout(9, "p3", 0, 0.0, status="timeout",
                                           error={"error": "States.Timeout", "cause": "late"})])
    assert [(f["cause"], f["status"], f["count"]) for f in found] == [
        ("States.Timeout: late", "timeout", 2), ("no reward", "ok", 1)]
    assert found[0]["examples"][0] == {"step": 5, "kind": "train", "sid": "sid-0-6", "input_id": "p2"}


_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
                     max_leaves=8)
_MESSAGE = st.fixed_dictionaries({}, optional={"role": _JSON, "content": _JSON, "tool_calls": _JSON,
                                               "tool_call_id": _JSON, "name": _JSON})
_TURN = st.fixed_dictionaries({}, optional={
    "prompt_messages": st.one_of(st.lists(st.one_of(_MESSAGE, _JSON), max_size=3), _JSON),
    "response_message": st.one_of(_MESSAGE, _JSON),
    "turn": st.one_of(st.fixed_dictionaries({}, optional={"output_ids": _JSON, "finish_reason": _JSON,
                                                           "ill_formed": _JSON}), _JSON)})


@settings(max_examples=200, deadline=None)
@given(turns=st.lists(st.one_of(_TURN, _JSON), max_size=3))
def test_captured_turns_of_any_shape_are_shown_not_refused(turns):
    """The turns `stepwise rollouts --show` and the report page read hold what the agent sent (its messages)
    and what the gateway captured: whatever JSON they hold, `conversation` returns messages with text roles
    and contents (``tool_calls: 5`` raised TypeError, ``output_ids: [1, "x"]`` ValueError)."""
    out = conversation(turns)
    assert all(isinstance(m["role"], str) and isinstance(m["content"], str) for m in out)
    assert all(isinstance(c["arguments"], str) for m in out for c in m.get("tool_calls", []))
