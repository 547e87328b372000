"""Captured turns replay into exactly the TraceRecords the toolkit's in-process
RolloutGateway produces for the same requests and sampler outputs.

Our gateway samples from a scripted sampler (tool calls need scripted outputs); the
reference gateway is given, for each prompt, the very output our gateway got (and fails
if it renders a prompt ours did not send). Our side is replayed from S3 through
``stepwise.core.replay.replay_turns`` as FinishRollout does.
"""

from __future__ import annotations

import asyncio
import dataclasses

import anthropic
import openai
import pytest

from tests.support.gateway import (
    MotoS3,
    ReferenceGateway,
    ReplaySampler,
    ScriptedSampler,
    api_key,
    cache_tokenizer,
    fixed_factory,
    load_tokenizer,
    open_session,
    serve_ours,
    turn_objects,
)
from stepwise.core.replay import replay_turns

RUN = "run-parity"
REWARD = 0.75
TOOLS = [{"type": "function", "function": {"name": "delegate", "description": "ask a sub-agent", "parameters": {
    "type": "object", "properties": {"task": {"type": "string"}}, "required": ["task"]}}}]
DELEGATE = '<tool_call>\n{"name": "delegate", "arguments": {"task": "add 2 and 3"}}\n</tool_call>'


@pytest.fixture(scope="module")
def stack():
    s3 = MotoS3()
    cache_tokenizer(s3.client, RUN)
    tok = load_tokenizer()
    yield s3, tok
    s3.stop()


def multi_turn_openai(base_url: str, key: str) -> None:
    """An agent that calls a tool, reads its result, answers, and takes a follow-up."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    messages = [{"role": "system", "content": "You are a calculator agent."},
                {"role": "user", "content": "What is 2+3?"}]
    for tool_result in ("5", None):
        reply = client.chat.completions.create(model="m", messages=messages, tools=TOOLS).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))
        if reply.tool_calls:
            messages.append({"role": "tool", "tool_call_id": reply.tool_calls[0].id, "content": tool_result})
    messages.append({"role": "user", "content": "And doubled?"})
    for _ in client.chat.completions.create(model="m", messages=messages, tools=TOOLS, stream=True):
        pass


def forked_sub_agent_openai(base_url: str, key: str) -> None:
    """A main agent delegates to a sub-agent (its own system prompt and history, same
    session), then finishes with the sub-agent's answer: two branches of one tree."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    main = [{"role": "system", "content": "You are the planner."}, {"role": "user", "content": "Compute 2+3."}]
    first = client.chat.completions.create(model="m", messages=main, tools=TOOLS).choices[0].message
    main.append(first.model_dump(exclude_none=True))
    sub = [{"role": "system", "content": "You are the worker."}, {"role": "user", "content": "add 2 and 3"}]
    s1 = client.chat.completions.create(model="m", messages=sub).choices[0].message
    sub += [s1.model_dump(exclude_none=True), {"role": "user", "content": "Only the number."}]
    s2 = client.chat.completions.create(model="m", messages=sub).choices[0].message
    main.append({"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": s2.content})
    client.chat.completions.create(model="m", messages=main, tools=TOOLS)


def multi_turn_anthropic(base_url: str, key: str) -> None:
    client = anthropic.Anthropic(base_url=base_url.removesuffix("/v1"), api_key=key, max_retries=0)
    tools = [{"name": "delegate", "description": "ask a sub-agent", "input_schema": TOOLS[0]["function"]["parameters"]}]
    messages = [{"role": "user", "content": "What is 2+3?"}]
    first = client.messages.create(model="m", max_tokens=64, system="Be exact.", messages=messages, tools=tools)
    tool_use = next(b for b in first.content if b.type == "tool_use")
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "5"}]}]
    second = client.messages.create(model="m", max_tokens=64, system="Be exact.", messages=messages, tools=tools)
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in second.content]},
                 {"role": "user", "content": "Thanks. Doubled?"}]
    with client.messages.stream(model="m", max_tokens=64, system="Be exact.", messages=messages, tools=tools) as s:
        s.get_final_message()


SCENARIOS = {
    "openai-multi-turn": (multi_turn_openai, [DELEGATE, "It is 5.", "Doubled it is 10."]),
    "openai-forked-sub-agent": (forked_sub_agent_openai, [DELEGATE, "2 plus 3 is 5", "5", "The answer is 5."]),
    "anthropic-multi-turn": (multi_turn_anthropic, [DELEGATE, "It is 5.", "10."]),
}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_replayed_turns_equal_the_in_process_gateways_records(stack, name):
    s3, tok = stack
    agent, script = SCENARIOS[name]
    sid, record = open_session(s3.client, RUN)

    sampler = ScriptedSampler(tok, script=list(script))
    ours = serve_ours(s3.new_client(), fixed_factory(sampler))
    try:
        agent(ours.base_url, api_key(sid))  # our gateway: the rollout's api key
        # Listed before stopping: a stopping server cancels a streamed turn still being written.
        turns = turn_objects(s3.client, RUN, sid, expect=len(script))
    finally:
        ours.stop()
    assert len(turns) == len(script) == len(sampler.calls)
    replayed = replay_turns(sid, turns, REWARD, tok, max_context_tokens=record["max_context_tokens"])

    ref = ReferenceGateway(ReplaySampler(list(sampler.calls)), tok)
    try:
        ref.open(sid, record)
        agent(ref.url + "/v1", sid)  # the in-process reference: the sid is its key
        expected = ref.finish(sid, REWARD)
    finally:
        ref.stop()

    assert [dataclasses.asdict(r) for r in replayed] == [dataclasses.asdict(r) for r in expected]
    # Non-trivial: every record trains on sampled tokens with their logprobs, and the
    # forked conversation really is two trajectories.
    assert expected and all(1 in r.loss_mask and r.reward == REWARD and r.rollout_id == sid for r in expected)
    if "forked" in name:
        assert len(expected) == 2
    else:
        assert len(expected) == 1 and sum(r.loss_mask.count(1) for r in expected) == sum(
            len(t["turn"]["output_ids"]) for t in turns.values())


def test_concurrent_sub_agent_turns_never_overwrite_each_other(stack):
    """Sub-agents of one session sampling at once: every turn gets its own object."""
    s3, tok = stack
    sid, _ = open_session(s3.client, RUN)
    sampler = ScriptedSampler(tok, default="working", delay=0.05)
    ours = serve_ours(s3.new_client(), fixed_factory(sampler))

    async def run_all():
        client = openai.AsyncOpenAI(base_url=ours.base_url, api_key=api_key(sid), max_retries=0)
        await asyncio.gather(*[
            client.chat.completions.create(model="m", messages=[{"role": "system", "content": f"worker {i}"},
                                                                {"role": "user", "content": "go"}])
            for i in range(8)])
        await client.close()

    try:
        asyncio.run(run_all())
    finally:
        ours.stop()
    turns = turn_objects(s3.client, RUN, sid)
    assert len(turns) == 8
    assert sorted(t["prompt_messages"][0]["content"] for t in turns.values()) == [f"worker {i}" for i in range(8)]
    assert len(replay_turns(sid, turns, 1.0)) == 8
