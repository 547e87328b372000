"""The GSM8K math agent against the real gateway (scripted sampler, the tiny tokenizer's Qwen3 template):
it stops where docs/agent-contract.md says an agent must -- at the rollout's turn budget (429), on a rollout
that is over (401) and on a context too long (400 context_length_exceeded) -- and returns the answer it
has instead of raising (before, every one of these failed the rollout as an agent error)."""

from __future__ import annotations

import json

import pytest
from tests.support.gateway import api_key, open_session, scripted_gateway

from local.agents import math_agent

RUN = "run-math-agent"
TOOL_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "16 - 3 - 4"}}\n</tool_call>'


@pytest.fixture(scope="module")
def stack():
    yield from scripted_gateway(RUN)


def payload(gw, sid: str) -> dict:
    return {"prompt": "How many eggs are left?", "answer": "9",
            "_rollout": {"base_url": gw.url, "api_key": api_key(sid), "model_id": "m", "exp_id": f"rollout-results/{RUN}",
                         "input_id": "q", "s3_bucket": "b", "sampling_params": {"temperature": 1.0, "max_tokens": 64}}}


def test_the_agent_stops_at_the_turn_budget_and_scores_what_it_has(stack):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_turns=3)
    before = len(sampler.calls)
    sampler.script[:] = [TOOL_CALL] * 10  # a model that never stops calling the calculator
    out = math_agent.solve(payload(gw, sid))
    assert len(sampler.calls) - before == 3  # three turns sampled, the fourth refused: no retry of a 429 budget
    assert (out["turns"], out["tool_calls"], out["rewards"]) == (3, 3, 0.0)
    assert out["stop_reason"].startswith("gateway 429") and "max_turns=3" in out["stop_reason"]
    sampler.script[:] = []
    # the gateway tells the official clients not to retry a spent budget (they retry every other 429)
    import httpx

    refused = httpx.post(f"{gw.url}/v1/chat/completions", headers={"authorization": f"Bearer {api_key(sid)}"},
                         json={"model": "m", "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert refused.status_code == 429 and refused.headers["x-should-retry"] == "false"


def test_the_agent_answers_with_the_calculators_result_within_the_budget(stack):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_turns=3)
    sampler.script[:] = [TOOL_CALL, "16 - 3 - 4 = 9\n#### 9"]
    out = math_agent.solve(payload(gw, sid))
    assert (out["turns"], out["tool_calls"], out["rewards"], out["stop_reason"]) == (2, 1, 1.0, "end_turn")
    sampler.script[:] = []


def test_a_rollout_that_is_over_and_a_context_too_long_end_the_rollout_without_raising(stack):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, closed=True)
    out = math_agent.solve(payload(gw, sid))
    assert out["stop_reason"].startswith("gateway 401") and (out["turns"], out["rewards"]) == (0, 0.0)
    sid, _ = open_session(s3.client, RUN, max_context_tokens=16)
    out = math_agent.solve(payload(gw, sid))
    assert out["stop_reason"].startswith("gateway 400 context_length_exceeded") and out["turns"] == 0
    json.dumps(out)  # the result the toolkit writes to S3


def test_any_other_gateway_error_still_fails_the_rollout(stack):
    import openai

    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    bad = payload(gw, sid)
    bad["_rollout"]["sampling_params"]["temperature"] = "hot"  # a bug in the agent: the gateway's 400
    with pytest.raises(openai.BadRequestError):
        math_agent.solve(bad)
