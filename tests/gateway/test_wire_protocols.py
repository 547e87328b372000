"""The gateway speaks both wire protocols to the official clients and captures each turn.

Sampler: scripted (the tiny model does not emit tool calls by itself), injected through
the gateway's sampler seam. The simulator-backed runs are in tests/gateway/test_simulator.py.
"""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from tests.support.gateway import api_key, fixed_factory, open_session, scripted_gateway, serve_ours, turn_objects

RUN = "run-wire"
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
OPENAI_TOOLS = [{"type": "function", "function": {"name": "add", "description": "add two integers", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}]
ANTHROPIC_TOOLS = [{"name": "add", "description": "add two integers", "input_schema": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}]


@pytest.fixture(scope="module")
def stack():
    for s3, sampler, gw in scripted_gateway(RUN):  # one pass; the loop's end stops the gateway and moto
        yield s3, sampler, gw, sampler.tokenizer


def _session(stack):
    s3, sampler, gw, tok = stack
    sid, record = open_session(s3.client, RUN)
    return sid, record


def test_openai_plain_turn_is_answered_and_captured(stack, capsys):
    s3, sampler, gw, tok = stack
    sid, record = _session(stack)
    sampler.script[:] = ["Hello from the sampler"]
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    resp = client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=32)
    assert resp.choices[0].message.content == "Hello from the sampler"
    assert resp.choices[0].finish_reason == "stop"
    turns = turn_objects(s3.client, RUN, sid)
    assert len(turns) == 1
    (body,) = turns.values()
    prompt_ids, sampled = sampler.calls[-1]
    assert body["turn"]["prompt_ids"] == prompt_ids
    assert body["turn"]["output_ids"] == sampled.output_ids
    assert body["turn"]["output_log_probs"] == sampled.output_log_probs
    assert body["turn"]["finish_reason"] == "stop" and body["turn"]["ill_formed"] is False
    assert body["prompt_messages"] == [{"role": "user", "content": "hi"}]
    assert body["response_message"] == {"role": "assistant", "content": "Hello from the sampler"}
    assert body["sampler_model_package_arn"] == record["sampler_model_package_arn"]
    assert body["policy_version"] == 3 and body["sid"] == sid and body["metadata"] == {"sid": sid}
    # The prompt was rendered with the run's chat template, ending in the generation header.
    assert tok.decode(prompt_ids).endswith("<|im_start|>assistant\n")
    # One EMF record per served turn (CloudWatch metrics from the log stream), without the sid.
    emf = [line for line in capsys.readouterr().out.splitlines() if "GatewayTurnOverhead" in line]
    assert len(emf) == 1 and '"GatewayTurnBytes":[' in emf[0] and sid not in emf[0]


def test_openai_streaming_turn(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = ["streamed words"]
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    chunks = list(client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], stream=True))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "streamed words"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert len(turn_objects(s3.client, RUN, sid, expect=1)) == 1


def test_openai_tool_call_round_trip(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = [TOOL_CALL, "The sum is 5."]
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    messages = [{"role": "system", "content": "Use tools."}, {"role": "user", "content": "2+3?"}]
    first = client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
    call = first.choices[0].message.tool_calls[0]
    assert first.choices[0].finish_reason == "tool_calls"
    assert call.function.name == "add" and json.loads(call.function.arguments) == {"a": 2, "b": 3}
    messages += [first.choices[0].message.model_dump(exclude_none=True),
                 {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    second = client.chat.completions.create(model="m", messages=messages, tools=OPENAI_TOOLS)
    assert second.choices[0].message.content == "The sum is 5."
    bodies = [turn_objects(s3.client, RUN, sid)[k] for k in sorted(turn_objects(s3.client, RUN, sid))]
    assert len(bodies) == 2
    assert bodies[0]["response_message"]["tool_calls"] == [
        {"type": "function", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]
    # The second prompt extends the first prompt + output token for token (a CLEAN turn).
    first_turn = bodies[0]["turn"]
    assert bodies[1]["turn"]["prompt_ids"][: len(first_turn["prompt_ids"]) + len(first_turn["output_ids"])] == (
        first_turn["prompt_ids"] + first_turn["output_ids"])


def test_anthropic_plain_turn(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = ["Bonjour"]
    client = anthropic.Anthropic(base_url=gw.url, api_key=api_key(sid), max_retries=0)
    msg = client.messages.create(model="m", max_tokens=64, system="Be brief.",
                                 messages=[{"role": "user", "content": "hi"}])
    assert [b.type for b in msg.content] == ["text"] and msg.content[0].text == "Bonjour"
    assert msg.stop_reason == "end_turn"
    (body,) = turn_objects(s3.client, RUN, sid).values()
    assert body["prompt_messages"] == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]


def test_anthropic_streaming_turn(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = ["streamed reply"]
    client = anthropic.Anthropic(base_url=gw.url, api_key=api_key(sid), max_retries=0)
    with client.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "hi"}]) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "streamed reply" and final.stop_reason == "end_turn"
    assert len(turn_objects(s3.client, RUN, sid, expect=1)) == 1


def test_anthropic_tool_use_round_trip(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = [TOOL_CALL, "It is 5."]
    client = anthropic.Anthropic(base_url=gw.url, api_key=api_key(sid), max_retries=0)
    messages = [{"role": "user", "content": "2+3?"}]
    first = client.messages.create(model="m", max_tokens=64, messages=messages, tools=ANTHROPIC_TOOLS)
    assert first.stop_reason == "tool_use"
    tool_use = next(b for b in first.content if b.type == "tool_use")
    assert tool_use.name == "add" and tool_use.input == {"a": 2, "b": 3}
    messages += [{"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "5"}]}]
    second = client.messages.create(model="m", max_tokens=64, messages=messages, tools=ANTHROPIC_TOOLS)
    assert second.content[0].text == "It is 5."
    assert len(turn_objects(s3.client, RUN, sid)) == 2


def test_anthropic_streaming_tool_use(stack):
    s3, sampler, gw, tok = stack
    sid, _ = _session(stack)
    sampler.script[:] = [TOOL_CALL]
    client = anthropic.Anthropic(base_url=gw.url, api_key=api_key(sid), max_retries=0)
    with client.messages.stream(model="m", max_tokens=64, messages=[{"role": "user", "content": "2+3?"}],
                                tools=ANTHROPIC_TOOLS) as stream:
        final = stream.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [(b.name, b.input) for b in final.content if b.type == "tool_use"] == [("add", {"a": 2, "b": 3})]


class SlowPuts:
    """An S3 client whose writes take a while (real S3 latency is tens of ms)."""

    def __init__(self, client, delay: float) -> None:
        self._client, self._delay = client, delay

    def put_object(self, **kwargs):
        import time

        time.sleep(self._delay)
        return self._client.put_object(**kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def test_streamed_turn_is_kept_when_the_client_hangs_up_at_the_end_marker(stack):
    """The OpenAI client closes the connection at [DONE]; the turn it received must still land
    even though the server cancels the request on disconnect."""
    import socket

    s3, sampler, gw, tok = stack
    slow = serve_ours(SlowPuts(s3.new_client(), 0.3), fixed_factory(sampler))
    try:
        sid, _ = open_session(s3.client, RUN)
        port = int(slow.url.rsplit(":", 1)[1])
        body = json.dumps({"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}).encode()
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         + f"Authorization: Bearer {api_key(sid)}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body)
            received = b""
            while b"[DONE]" not in received:
                chunk = conn.recv(65536)
                assert chunk, received
                received += chunk
        assert len(turn_objects(s3.client, RUN, sid, expect=1)) == 1
    finally:
        slow.stop()
