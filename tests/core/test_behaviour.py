"""Behaviour metrics: counted from the turns the real gateway captures, summarised per step.

The turns come from our gateway app (the toolkit's OpenAI adapter and renderer, the S3 turn
recorder) with a scripted sampler: the tiny model does not emit tool calls or ill-formed markup by
itself. Percentiles are checked against the stdlib's ``statistics.quantiles``.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import openai
import pytest
from agentcore_rl_toolkit.rollout_gateway.trajectory import TurnRecord

from tests.support.gateway import ScriptedSampler, api_key, open_session, scripted_gateway, turn_objects
from stepwise.core.behaviour import ROLLOUT_STATUSES, behaviour_metrics, rollout_behaviour

RUN = "run-behaviour"
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]


@dataclass
class LengthCappedSampler(ScriptedSampler):
    """A script entry starting with ``CUT:`` ends as the sampler ends a turn at max_new_tokens."""

    async def generate(self, **kwargs):
        cut = bool(self.script) and self.script[0].startswith("CUT:")
        if cut:
            self.script[0] = self.script[0].removeprefix("CUT:")
        turn = await super().generate(**kwargs)
        if cut:
            turn = TurnRecord(prompt_ids=turn.prompt_ids, output_ids=turn.output_ids[:-1], finish_reason="length",
                              output_log_probs=turn.output_log_probs[:-1])
        return turn


@pytest.fixture(scope="module")
def gateway():
    yield from scripted_gateway(RUN, LengthCappedSampler)


def test_a_rollouts_turns_count_tool_calls_truncations_and_ill_formed_turns(gateway):
    s3, sampler, gw = gateway
    sid, _ = open_session(s3.client, RUN)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    # a tool call, then text mixed with tool-call markup (the renderer cannot parse it: ill-formed),
    # then an answer cut at max_new_tokens, then a plain answer
    sampler.script[:] = [TOOL_CALL + TOOL_CALL, "I will call " + TOOL_CALL + " now", "CUT:a long answer", "5"]
    for _ in range(4):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "2+3?"}], tools=TOOLS,
                                       max_tokens=32)
    turns = list(turn_objects(s3.client, RUN, sid, expect=4).values())
    counts = rollout_behaviour(turns)
    sampled = sum(len(t.output_ids) for _, t in sampler.calls[-4:]) - 1  # the cut turn lost its end-of-turn token
    assert counts == {"num_turns": 4, "sampled_tokens": sampled, "truncated_turns": 1, "ill_formed_turns": 1,
                      "tool_calls": 2}
    assert rollout_behaviour([]) == dict.fromkeys(counts, 0)


def test_step_metrics_are_means_per_rollout_fractions_per_turn_and_status_counts():
    rollouts = [
        {"status": "ok", "num_turns": 3, "sampled_tokens": 30, "truncated_turns": 1, "ill_formed_turns": 0,
         "tool_calls": 2, "duration_s": 4.0},
        {"status": "ok", "num_turns": 1, "sampled_tokens": 10, "truncated_turns": 0, "ill_formed_turns": 1,
         "tool_calls": 0, "duration_s": 1.0},
        {"status": "timeout", "num_turns": 0, "sampled_tokens": 0, "truncated_turns": 0, "ill_formed_turns": 0,
         "tool_calls": 0, "duration_s": 9.0},
        {"status": "error", "duration_s": None},  # never started: no counts, no duration
    ]
    m = behaviour_metrics(rollouts)
    assert m["behaviour/turns_per_rollout"] == 1.0 and m["behaviour/sampled_tokens_per_rollout"] == 10.0
    assert m["behaviour/tool_calls_per_rollout"] == 0.5
    assert m["behaviour/truncated_turns_fraction"] == m["behaviour/ill_formed_turns_fraction"] == 0.25
    durations = [4.0, 1.0, 9.0]
    assert m["time/rollout_duration_p50"] == statistics.median(durations)
    assert m["time/rollout_duration_p95"] == pytest.approx(
        statistics.quantiles(durations, n=100, method="inclusive")[94])
    assert {s: m[f"rollouts/num_{s}"] for s in ROLLOUT_STATUSES} == {"ok": 2.0, "error": 1.0, "timeout": 1.0}
    assert behaviour_metrics([]) == {}
    # no turn at all (every rollout failed before its first LLM call): fractions are 0, not a division by zero
    idle = behaviour_metrics([{"status": "error"}, {"status": "error"}])
    assert idle["behaviour/truncated_turns_fraction"] == 0.0 and idle["time/rollout_duration_p95"] == 0.0
