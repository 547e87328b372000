"""replay_turns: captured turns -> the TraceRecords the in-process gateway yields.

Pinned by hand on fake token ids (multi-turn, branching sub-agent, truncation), and checked
end to end against the toolkit's real RolloutGateway (OpenAI adapter, the tiny model's
tokenizer, HfTemplateRenderer): turns captured at its `record_turn` seam, round-tripped
through JSON as S3 would, replay to exactly what its `finish_session` returns.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
import uuid
from pathlib import Path

import pytest
from agentcore_rl_toolkit.rollout_gateway import BaseTrace, Status, TrajectoryManager, TurnRecord

from stepwise.core.replay import ReplayError, record_from_json, record_to_json, replay_turns

SID = "3f1e9c1a-0000-4000-8000-000000000001"
SYS = {"role": "system", "content": "You are a math agent."}
USER1 = {"role": "user", "content": "2+2?"}
ASST_A = {"role": "assistant", "content": "calc"}
TOOL = {"role": "tool", "content": "4"}
SUB_SYS = {"role": "system", "content": "You are a checker."}
SUB_USER = {"role": "user", "content": "check 4"}


def turn_body(prompt_ids, output_ids, logprobs, messages, response, finish="stop"):
    return {
        "sid": SID,
        "turn": {"prompt_ids": prompt_ids, "output_ids": output_ids, "finish_reason": finish,
                 "output_log_probs": logprobs, "ill_formed": False},
        "prompt_messages": messages,
        "response_message": response,
        "metadata": {"sid": SID},
        "sampler_model_package_arn": "", "policy_version": 0, "completed_at": 0.0,
    }


# turn 1: [sys, user] -> "calc"; turn 2 (clean extension, tool result appended) -> "4";
# turn 3: a sub-agent with its own system prompt (a second tree branch).
T1 = turn_body([1, 2, 3], [4, 5], [-0.1, -0.2], [SYS, USER1], ASST_A)
T2 = turn_body([1, 2, 3, 4, 5, 6, 7], [8], [-0.3], [SYS, USER1, ASST_A, TOOL],
               {"role": "assistant", "content": "4"}, finish="length")
T3 = turn_body([9, 9], [10], [-0.4], [SUB_SYS, SUB_USER], {"role": "assistant", "content": "ok"})
TURNS = {"00000000000000000001-a": T1, "00000000000000000002-b": T2, "00000000000000000003-c": T3}


def feed_directly(bodies, reward, max_sample_tokens=0):
    manager = TrajectoryManager()
    for b in bodies:
        manager.record_turn(SID, turn=TurnRecord(**b["turn"]), prompt_messages=b["prompt_messages"],
                            response_message=b["response_message"], metadata=b["metadata"])
    return manager.get_trajectory(SID, base_sample=BaseTrace(rollout_id=SID), reward=reward,
                                  max_sample_tokens=max_sample_tokens)


def test_multi_turn_and_sub_agent_records_by_hand():
    main, sub = replay_turns(SID, TURNS, 0.5)
    assert main.token_ids == [1, 2, 3, 4, 5, 6, 7, 8]
    assert main.loss_mask == [1, 1, 0, 0, 1]  # tool-result tokens 6, 7 are not trained
    assert main.logprobs == [-0.1, -0.2, 0.0, 0.0, -0.3]
    assert (main.response_length, main.reward, main.rollout_id, main.status) == (5, 0.5, SID, Status.COMPLETED)
    assert main.metadata == {"truncated": True, "use_tool": False, "ill_formed": False}  # last turn hit length
    assert (sub.token_ids, sub.loss_mask, sub.logprobs, sub.reward) == ([9, 9, 10], [1], [-0.4], 0.5)
    assert sub.metadata["truncated"] is False


def test_equals_a_manager_fed_directly_and_key_order_decides():
    expected = [record_to_json(r) for r in feed_directly([T1, T2, T3], 1.0)]
    shuffled = {k: TURNS[k] for k in reversed(list(TURNS))}  # dict order is irrelevant, key order is not
    assert [record_to_json(r) for r in replay_turns(SID, shuffled, 1.0)] == expected
    assert [record_to_json(r) for r in replay_turns(SID, [T1, T2, T3], 1.0)] == expected
    # replayed out of order, turn 1 lands as a sibling branch: a different result
    assert [record_to_json(r) for r in replay_turns(SID, [T2, T1, T3], 1.0)] != expected


def test_max_context_tokens_truncates_like_the_gateway():
    got = replay_turns(SID, TURNS, 0.0, max_context_tokens=6)
    assert got[0].token_ids == [1, 2, 3, 4, 5, 6] and got[0].loss_mask == [1, 1, 0]
    assert [record_to_json(r) for r in got] == [record_to_json(r) for r in feed_directly([T1, T2, T3], 0.0, 6)]


def test_tokenizer_decodes_the_trained_tail():
    class ByteTokenizer:  # decode() is all finish_session uses
        def decode(self, ids, skip_special_tokens=True):
            assert skip_special_tokens is False
            return "|".join(map(str, ids))

    main, sub = replay_turns(SID, TURNS, 0.0, ByteTokenizer())
    assert main.response == "4|5|6|7|8" and sub.response == "10"


def test_no_turns_and_malformed_turns():
    assert replay_turns(SID, {}, 1.0) == []
    bad = {**T1, "turn": {"prompt_ids": [1], "finish_reason": "stop"}}
    with pytest.raises(ReplayError, match=r"turn k1: .*missing \['output_ids'\]"):
        replay_turns(SID, {"k1": bad}, 1.0)
    with pytest.raises(ReplayError, match=r"turn #0: .*KeyError"):
        replay_turns(SID, [{"turn": T1["turn"]}], 1.0)


def test_record_json_round_trip():
    for r in replay_turns(SID, TURNS, 0.25):
        data = json.loads(json.dumps(record_to_json(r)))
        assert data["status"] == "completed"
        assert record_from_json(data) == r
    with pytest.raises(ValueError, match=r"unknown TraceRecord fields \['oops'\]"):
        record_from_json({**record_to_json(r), "oops": 1})


# ---------------------------------------------------------------- against the real gateway

TINY_MODEL = Path(__file__).resolve().parents[2] / "local" / "assets" / "tiny-model"


@pytest.mark.skipif(not (TINY_MODEL / "tokenizer.json").exists(), reason="tiny model assets not present")
def test_replay_equals_the_in_process_gateway_finish_session():
    from aiohttp.test_utils import TestClient, TestServer
    from agentcore_rl_toolkit.rollout_gateway import HfTemplateRenderer, RolloutGateway
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(TINY_MODEL))
    replies = iter(["Let me compute.", "The answer is 4.", "Looks right."])

    class ScriptedBackend:  # the sampler, not under test: scripted text, fixed logprobs
        async def generate(self, *, prompt_ids, sampling_params, session_id=None, **_):
            out = tokenizer.encode(next(replies), add_special_tokens=False) + [tokenizer.eos_token_id]
            return TurnRecord(prompt_ids=list(prompt_ids), output_ids=out, finish_reason="stop",
                              output_log_probs=[-0.5] * len(out))

    gateway = RolloutGateway(backend=ScriptedBackend(), renderer=HfTemplateRenderer(tokenizer),
                             tokenizer=tokenizer, adapters=["openai"])
    captured: dict[str, dict] = {}
    record_turn = gateway.manager.record_turn

    def capture(sid, *, turn, prompt_messages, response_message, metadata=None):
        # what the serverless gateway's turn recorder persists: the record_turn arguments, as JSON
        key = f"{time.time_ns():020d}-{uuid.uuid4().hex}"
        captured[key] = json.loads(json.dumps({
            "sid": sid, "turn": dataclasses.asdict(turn), "prompt_messages": prompt_messages,
            "response_message": response_message, "metadata": metadata,
        }))
        record_turn(sid, turn=turn, prompt_messages=prompt_messages, response_message=response_message,
                    metadata=metadata)

    gateway.manager.record_turn = capture
    max_context = 4096

    async def run() -> list:
        gateway.create_session(SID, sampling_defaults={"max_new_tokens": 64, "temperature": 1.0},
                               max_context_tokens=max_context)
        async with TestClient(TestServer(gateway.app, host="127.0.0.1")) as client:
            headers = {"Authorization": f"Bearer {SID}"}

            async def chat(messages):
                resp = await client.post("/v1/chat/completions", json={"model": "m", "messages": messages},
                                         headers=headers)
                assert resp.status == 200, await resp.text()
                return (await resp.json())["choices"][0]["message"]

            convo = [{"role": "system", "content": "Solve it."}, {"role": "user", "content": "2+2?"}]
            first = await chat(convo)
            convo += [{"role": "assistant", "content": first["content"]}, {"role": "user", "content": "and?"}]
            await chat(convo)
            await chat([{"role": "system", "content": "Check."}, {"role": "user", "content": "4?"}])
        return await gateway.finish_session(SID, base_sample=BaseTrace(rollout_id=SID), reward=1.0)

    expected = asyncio.run(run())
    assert len(captured) == 3 and len(expected) >= 2
    replayed = replay_turns(SID, captured, 1.0, tokenizer, max_context_tokens=max_context)
    assert [record_to_json(r) for r in replayed] == [record_to_json(r) for r in expected]
    assert all(r.response for r in replayed) and any(sum(r.loss_mask) < len(r.loss_mask) for r in replayed)
