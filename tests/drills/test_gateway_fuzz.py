"""Drill: hostile input at the gateway's public URL (hypothesis, bounded examples).

Properties: no request is ever answered with a 5xx; a request without a live session id is
refused and never sampled; a request with a live session id but a fuzzed body is either served
or refused without being sampled; concurrent turns of one session (sub-agents) are all captured.
The sampler is the gateway's injected backend (the same seam the SageMaker sampler sits behind),
so its call count is the number of samples taken.
"""

from __future__ import annotations

import json
import string
import threading
import time
import uuid

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.gateway import api_key, open_session, scripted_gateway, turn_objects

RUN = "run-fuzz"
MAX_BODY = 16 * 1024
PATHS = ["/v1/chat/completions", "/v1/messages", "/chat/completions", "/v1/models", "/", "/v1/completions"]
FUZZ = settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                         HealthCheck.too_slow])


@pytest.fixture(scope="module")
def gw():
    for s3, sampler, server in scripted_gateway(RUN, max_body_bytes=MAX_BODY):  # one pass; its end stops both
        live, _ = open_session(s3.client, RUN, max_turns=100_000, max_context_tokens=512)
        closed, _ = open_session(s3.client, RUN, closed=True)
        expired, _ = open_session(s3.client, RUN, deadline=time.time() - 1)
        client = httpx.Client(base_url=server.url, timeout=30)
        yield {"s3": s3, "sampler": sampler, "url": server.url, "client": client, "live": live,
               "live_key": api_key(live), "closed": api_key(closed), "expired": api_key(expired), "live_statuses": []}
        client.close()


header_text = st.text(alphabet=string.ascii_letters + string.digits + " -_.:/=+", max_size=60)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**40, 2**40) | st.floats(allow_nan=False) | st.text(max_size=40),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4),
    max_leaves=20,
)
messages = st.lists(st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "assistant", "system", "tool", "developer", "", "robot"]) | st.integers(),
     "content": st.text(max_size=80) | json_values}), max_size=4)
chat_bodies = st.fixed_dictionaries(
    {"model": st.text(max_size=10) | st.integers(), "messages": messages | json_values},
    optional={"max_tokens": st.integers(-5, 10_000) | st.text(max_size=5), "stream": st.booleans() | st.text(max_size=3),
              "temperature": st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=3),
              "tools": json_values, "tool_choice": json_values, "n": st.integers(-1, 4), "logprobs": json_values,
              "max_completion_tokens": st.integers(-5, 10_000)})
anthropic_bodies = st.fixed_dictionaries(
    {"model": st.text(max_size=10), "max_tokens": st.integers(-5, 5000) | st.text(max_size=4), "messages": messages | json_values},
    optional={"system": json_values, "stream": st.booleans(), "tools": json_values, "temperature": st.floats()})
raw_bodies = st.binary(max_size=2048) | st.builds(lambda v: json.dumps(v).encode(), json_values)


def _send(gw, path: str, body: bytes, headers: dict[str, str]) -> httpx.Response:
    return gw["client"].post(path, content=body, headers={"content-type": "application/json", **headers})


@st.composite
def hostile_auth(draw, gw) -> dict[str, str]:
    """Headers that never carry a live session's api key: none, a closed or expired session's key, an
    unknown sid, garbage, the live session's sid alone (it appears in S3 keys and logs), or its sid with
    another secret."""
    key = draw(st.sampled_from(["none", "closed", "expired", "unknown", "garbage", "sid_alone", "wrong_secret"]))
    value = {"none": None, "closed": gw["closed"], "expired": gw["expired"], "unknown": str(uuid.uuid4()),
             "garbage": draw(header_text), "sid_alone": gw["live"],
             "wrong_secret": f"{gw['live']}.{draw(header_text)}".strip()}[key]
    headers = draw(st.dictionaries(st.sampled_from(["x-request-id", "x-forwarded-for", "anthropic-version", "user-agent"]),
                                   header_text, max_size=2))
    if value is not None:
        scheme = draw(st.sampled_from(["authorization", "x-api-key", "api-key"]))
        headers[scheme] = f"{draw(st.sampled_from(['Bearer ', 'bearer ', 'Basic ', '']))}{value}" if scheme == "authorization" else value
    # HTTP clients cannot send leading/trailing whitespace in a header value (h11 refuses it).
    return {k: v.strip() for k, v in headers.items()}


@FUZZ
@given(data=st.data())
def test_without_a_live_session_nothing_is_sampled_and_nothing_is_a_5xx(gw, data):
    path = data.draw(st.sampled_from(PATHS))
    body = data.draw(raw_bodies | chat_bodies.map(lambda b: json.dumps(b).encode()))
    headers = data.draw(hostile_auth(gw))
    before = len(gw["sampler"].calls)
    r = _send(gw, path, body, headers)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert len(gw["sampler"].calls) == before


@FUZZ
@given(data=st.data())
def test_a_live_session_with_fuzzed_bodies_is_served_or_refused_unsampled_never_a_5xx(gw, data):
    path = data.draw(st.sampled_from(["/v1/chat/completions", "/v1/messages"]))
    strategy = chat_bodies if path == "/v1/chat/completions" else anthropic_bodies
    valid = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    if path == "/v1/messages":
        valid["max_tokens"] = 16
    body = data.draw(st.just(json.dumps(valid).encode()) | raw_bodies | strategy.map(lambda b: json.dumps(b).encode())
                     | st.just(b"x" * (MAX_BODY + 1)))
    header = data.draw(st.sampled_from(["authorization", "x-api-key"]))
    value = f"Bearer {gw['live_key']}" if header == "authorization" else gw["live_key"]
    before = len(gw["sampler"].calls)
    r = _send(gw, path, body, {header: value})
    gw["live_statuses"].append(r.status_code)
    assert r.status_code < 500, (r.status_code, r.text[:300])
    if r.status_code >= 400:
        assert len(gw["sampler"].calls) == before, (r.status_code, r.text[:300])
    if len(body) > MAX_BODY:
        assert r.status_code == 413


def test_the_fuzz_reached_both_the_sampler_and_the_refusals(gw):
    """Runs after the fuzz above (file order): its bodies were neither all valid nor all refused."""
    codes = gw["live_statuses"]
    assert 200 in codes and any(400 <= c < 500 for c in codes), sorted(set(codes))


def test_concurrent_sub_agent_turns_of_one_session_are_all_captured(gw):
    sid, _ = open_session(gw["s3"].client, RUN)
    before = len(gw["sampler"].calls)
    statuses: list[int] = []

    def turn(i: int) -> None:
        body = {"model": "m", "messages": [{"role": "user", "content": f"sub-agent {i}: what is {i} + {i}?"}]}
        r = httpx.post(gw["url"] + "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {api_key(sid)}"}, timeout=30)
        statuses.append(r.status_code)

    threads = [threading.Thread(target=turn, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert statuses == [200] * 8
    turns = turn_objects(gw["s3"].client, RUN, sid, expect=8)
    assert len(turns) == 8 and len(gw["sampler"].calls) - before == 8
    prompts = sorted(t["prompt_messages"][0]["content"] for t in turns.values())
    assert prompts == sorted(f"sub-agent {i}: what is {i} + {i}?" for i in range(8))
