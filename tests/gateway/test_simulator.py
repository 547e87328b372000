"""The gateway against the SageMaker simulator, through the production sampler path:
session record -> SDK ``SamplingClient`` (no ServiceClient) -> toolkit
``SageMakerSdkBackend`` -> the simulator's sampling operations."""

from __future__ import annotations

import dataclasses
import json

import anthropic
import httpx
import openai
import pytest

from tests.support.gateway import (
    MotoS3,
    ReferenceGateway,
    ReplaySampler,
    api_key,
    cache_tokenizer,
    load_tokenizer,
    open_session,
    serve_ours,
    turn_objects,
)
from stepwise.core.replay import replay_turns, turn_record_from_json

RUN = "run-sim"
SAMPLING = {"max_new_tokens": 512, "temperature": 1.0}  # the service's maxTokens floor is 512


@pytest.fixture(scope="module")
def stack():
    from local.simulator import start_simulator
    from sagemaker.train.training_session import ServiceClient

    sim = start_simulator()
    mp = pytest.MonkeyPatch()
    for key, value in sim.env.items():
        mp.setenv(key, value)
    s3 = MotoS3()
    cache_tokenizer(s3.client, RUN)
    svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn,
                        s3_output_path=sim.s3_output_path)
    tc = svc.create_lora_training_client(base_model="stepwise-tiny")
    gw = serve_ours(s3.new_client(), None)  # the default, SDK-backed sampler factory
    try:
        yield s3, sim, gw, tc.training_session_name
    finally:
        gw.stop()
        svc.stop_session(tc.training_session_name)
        del tc
        s3.stop()
        mp.undo()
        sim.stop()


def _session(stack, **fields):
    s3, sim, gw, name = stack
    return open_session(s3.client, RUN, training_session_name=name, sampler_model_package_arn="",
                        sampling_defaults=SAMPLING, max_context_tokens=4096, **fields)


def _samples(sim) -> int:
    return sim.counters.get("sample", 0)


def _check_captured(stack, sid, n):
    s3 = stack[0]
    turns = turn_objects(s3.client, RUN, sid, expect=n)
    assert len(turns) == n
    for body in turns.values():
        turn = body["turn"]
        assert turn["output_ids"] and len(turn["output_log_probs"]) == len(turn["output_ids"])
        assert all(lp <= 0.0 for lp in turn["output_log_probs"])
        assert body["sampler_model_package_arn"] == "" and body["policy_version"] == 3
    return turns


def test_openai_plain_and_streaming_sample_from_the_session(stack):
    s3, sim, gw, name = stack
    sid, _ = _session(stack)
    before = _samples(sim)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    resp = client.chat.completions.create(model="stepwise-tiny", messages=[{"role": "user", "content": "7"}])
    assert isinstance(resp.choices[0].message.content, str) and resp.usage.completion_tokens > 0
    chunks = list(client.chat.completions.create(model="stepwise-tiny", stream=True,
                                                 messages=[{"role": "user", "content": "7"}]))
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")
    assert _samples(sim) == before + 2
    _check_captured(stack, sid, 2)


def test_anthropic_plain_and_streaming_sample_from_the_session(stack):
    s3, sim, gw, name = stack
    sid, _ = _session(stack)
    before = _samples(sim)
    client = anthropic.Anthropic(base_url=gw.url, api_key=api_key(sid), max_retries=0)
    msg = client.messages.create(model="stepwise-tiny", max_tokens=512, messages=[{"role": "user", "content": "3"}])
    assert msg.stop_reason in ("end_turn", "max_tokens") and msg.usage.output_tokens > 0
    with client.messages.stream(model="stepwise-tiny", max_tokens=512,
                                messages=[{"role": "user", "content": "3"}]) as stream:
        final = stream.get_final_message()
    assert final.stop_reason in ("end_turn", "max_tokens")
    assert _samples(sim) == before + 2
    _check_captured(stack, sid, 2)


def test_seeded_sessions_sample_the_same_tokens_through_the_sdk_and_another_seed_does_not(stack):
    """The seed reaches the runtime's SamplingParams.seed (the SDK path), and the simulator honours it."""
    s3, sim, gw, name = stack

    def rollout(seed):
        sid, _ = _session(stack, sampling_seed=seed)
        client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
        for digit in "3141592":  # seven turns at temperature 1, each a fresh context
            client.chat.completions.create(model="stepwise-tiny", messages=[{"role": "user", "content": digit}])
        turns = turn_objects(s3.client, RUN, sid, expect=7)
        return [body["turn"]["output_ids"] for _, body in sorted(turns.items())]

    first, again, other = rollout(11), rollout(11), rollout(12)
    assert first == again
    assert first != other


def test_refusals_never_reach_the_simulator(stack):
    s3, sim, gw, name = stack
    closed, _ = _session(stack, closed=True)
    capped, _ = _session(stack, max_turns=1)
    live, _ = _session(stack)
    openai.OpenAI(base_url=gw.base_url, api_key=api_key(capped), max_retries=0).chat.completions.create(
        model="m", messages=[{"role": "user", "content": "1"}])
    before = _samples(sim)
    chat = {"model": "m", "messages": [{"role": "user", "content": "1"}]}
    cases = [
        (closed, json.dumps(chat).encode(), 401),
        ("unknown-sid", json.dumps(chat).encode(), 401),
        (live, b"{oops", 400),
        (live, json.dumps({**chat, "max_tokens": "x"}).encode(), 400),
        (live, json.dumps({**chat, "messages": [{"role": "user", "content": "y" * 7_000_000}]}).encode(), 413),
        (capped, json.dumps(chat).encode(), 429),
    ]
    for sid, raw, status in cases:
        r = httpx.post(gw.base_url + "/chat/completions", content=raw, timeout=30,
                       headers={"authorization": f"Bearer {api_key(sid)}", "content-type": "application/json"})
        assert r.status_code == status, (status, r.text)
    assert _samples(sim) == before


def test_a_request_the_sampler_rejects_is_a_400_with_its_reason(stack):
    s3, sim, gw, name = stack
    sid, _ = _session(stack)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    with pytest.raises(openai.BadRequestError, match="512"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "1"}], max_tokens=30)
    assert turn_objects(s3.client, RUN, sid) == {}


def multi_turn(base_url: str, key: str) -> None:
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    messages = [{"role": "system", "content": "Answer with the next digit."}]
    for digit in ("1", "4", "8"):
        messages.append({"role": "user", "content": digit})
        reply = client.chat.completions.create(model="m", messages=messages).choices[0].message
        messages.append(reply.model_dump(exclude_none=True))


def forked_sub_agent(base_url: str, key: str) -> None:
    """A planner hands a sub-task to a worker (own system prompt, same session), then goes on
    with the worker's answer: two branches of one trajectory tree."""
    client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
    main = [{"role": "system", "content": "You plan."}, {"role": "user", "content": "2"}]
    main.append(client.chat.completions.create(model="m", messages=main).choices[0].message.model_dump(
        exclude_none=True))
    sub = [{"role": "system", "content": "You work."}, {"role": "user", "content": "5"}]
    sub.append(client.chat.completions.create(model="m", messages=sub).choices[0].message.model_dump(
        exclude_none=True))
    sub.append({"role": "user", "content": "6"})
    answer = client.chat.completions.create(model="m", messages=sub).choices[0].message.content
    main.append({"role": "user", "content": f"worker says {answer}"})
    client.chat.completions.create(model="m", messages=main)


@pytest.mark.parametrize("agent, n_turns", [(multi_turn, 3), (forked_sub_agent, 4)], ids=["multi-turn", "forked"])
def test_conversations_replay_to_the_in_process_records(stack, agent, n_turns):
    s3, sim, gw, name = stack
    sid, record = _session(stack)
    agent(gw.base_url, api_key(sid))  # our gateway: the rollout's api key
    turns = _check_captured(stack, sid, n_turns)
    replayed = replay_turns(sid, turns, 1.0, load_tokenizer(), max_context_tokens=record["max_context_tokens"])
    outputs = [(b["turn"]["prompt_ids"], turn_record_from_json(b["turn"])) for b in turns.values()]
    ref = ReferenceGateway(ReplaySampler(outputs), load_tokenizer())
    try:
        ref.open(sid, record)
        agent(ref.url + "/v1", sid)  # the in-process reference: the sid is its key
        expected = ref.finish(sid, 1.0)
    finally:
        ref.stop()
    assert [dataclasses.asdict(r) for r in replayed] == [dataclasses.asdict(r) for r in expected]
    assert expected and sum(r.loss_mask.count(1) for r in expected) == sum(
        len(b["turn"]["output_ids"]) for b in turns.values())
    if agent is forked_sub_agent:
        assert len(expected) >= 2
