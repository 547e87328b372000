"""Identity, limits and bad input: each refused with its status and a reason, and none
of them reaches the sampler."""

from __future__ import annotations

import json
import logging
import time

import httpx
import openai
import pytest

from tests.support.gateway import api_key, fixed_factory, open_session, scripted_gateway, serve_ours, turn_objects

from stepwise.layout import session_key

RUN = "run-refusals"
MAX_BODY = 64 * 1024
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture(scope="module")
def stack():
    yield from scripted_gateway(RUN, max_body_bytes=MAX_BODY)


def post(gw, path, *, sid=None, body=None, raw=None, header="bearer"):
    headers = {"content-type": "application/json"}
    if sid is not None:
        headers.update({"authorization": f"Bearer {api_key(sid)}"} if header == "bearer" else {"x-api-key": api_key(sid)})
    content = raw if raw is not None else json.dumps(body if body is not None else CHAT).encode()
    return httpx.post(gw.url + path, headers=headers, content=content, timeout=30)


def assert_refused(stack, response, status, *fragments):
    s3, sampler, gw = stack
    assert response.status_code == status, response.text
    text = response.text
    for fragment in fragments:
        assert fragment in text, text
    return response


@pytest.fixture
def calls(stack):
    """Sampler calls made during the test (must stay 0 for refusals)."""
    sampler = stack[1]
    before = len(sampler.calls)
    return lambda: len(sampler.calls) - before


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages"])
def test_missing_and_unknown_keys_get_401(stack, calls, path):
    gw = stack[2]
    assert_refused(stack, post(gw, path), 401, "api key")
    assert_refused(stack, post(gw, path, sid="no-such-session"), 401, "unknown session")
    assert_refused(stack, post(gw, path, sid="../../etc"), 401, "malformed")
    assert calls() == 0


def test_closed_and_expired_sessions_get_401(stack, calls):
    s3, sampler, gw = stack
    closed, _ = open_session(s3.client, RUN, closed=True)
    expired, _ = open_session(s3.client, RUN, deadline=time.time() - 1)
    assert_refused(stack, post(gw, "/v1/chat/completions", sid=closed), 401, "closed")
    r = assert_refused(stack, post(gw, "/v1/messages", sid=expired, header="x-api-key",
                                   body={"max_tokens": 8, **CHAT}), 401, "expired")
    assert r.json()["type"] == "error" and r.json()["error"]["type"] == "authentication_error"
    assert calls() == 0


def test_the_sid_alone_or_another_secret_is_refused_and_the_key_is_checked_in_constant_time(stack, calls, monkeypatch):
    """The sid shows in S3 keys, logs and the execution history, so it opens nothing: only the rollout's
    api key ``{sid}.{secret}`` does, its secret checked against the record's SHA-256 digest with
    ``hmac.compare_digest``. A record without a digest (an older StartRollout's) opens nothing either."""
    import hmac

    from stepwise.gateway import session as gateway_session

    s3, sampler, gw = stack
    sid, record = open_session(s3.client, RUN)
    assert api_key(sid).startswith(f"{sid}.") and len(api_key(sid)) > len(sid) + 40
    assert api_key(sid).split(".", 1)[1] not in json.dumps(record)  # the record keeps the digest only

    def send(key, header="bearer"):
        headers = {"content-type": "application/json"}
        headers.update({"authorization": f"Bearer {key}"} if header == "bearer" else {"x-api-key": key})
        return httpx.post(gw.url + "/v1/chat/completions", headers=headers, content=json.dumps(CHAT).encode(), timeout=30)

    compared, real = [], hmac.compare_digest
    monkeypatch.setattr(gateway_session.hmac, "compare_digest", lambda a, b: compared.append(1) or real(a, b))
    for key, header in [(sid, "bearer"), (sid, "x-api-key"), (f"{sid}.", "bearer"),
                        (f"{sid}.{'A' * 43}", "bearer"), (f"{sid}.{api_key(sid).split('.', 1)[1][:-1]}x", "x-api-key")]:
        assert_refused(stack, send(key, header), 401, "invalid api key")
    assert calls() == 0 and len(compared) == 2  # the empty and the missing secret fail before comparing
    assert send(api_key(sid)).status_code == 200 and calls() == 1 and len(compared) == 3

    old, old_record = open_session(s3.client, RUN)
    old_record.pop("api_key_sha256")
    s3.client.put_object(Bucket="stepwise-gateway-test", Key=session_key(old), Body=json.dumps(old_record).encode())
    assert_refused(stack, send(api_key(old)), 401, "invalid api key")
    assert calls() == 1


@pytest.mark.parametrize("tail", [b".\xff\xfe", b".\xc3\xa9", b"..x", b"." + b"A" * 6000, b".a.b.c"])
def test_malformed_secrets_of_a_live_session_get_401_not_500(stack, calls, tail):
    """A live sid with a secret of non-UTF-8 bytes (aiohttp: lone surrogates), non-ASCII, many dots or
    thousands of characters: 401, never the 500 that encoding ``\\xff`` raised."""
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    for header in ("authorization", "x-api-key"):
        value = (b"Bearer " if header == "authorization" else b"") + sid.encode() + tail
        r = httpx.post(gw.url + "/v1/chat/completions", headers={header: value, "content-type": "application/json"},
                       content=json.dumps(CHAT).encode(), timeout=30)
        assert_refused(stack, r, 401, "invalid api key")
    assert calls() == 0


def test_a_record_under_another_sid_does_not_authenticate(stack, calls):
    s3, sampler, gw = stack
    sid, record = open_session(s3.client, RUN)
    s3.client.put_object(Bucket="stepwise-gateway-test", Key=session_key("copied"), Body=json.dumps(record).encode())
    assert_refused(stack, post(gw, "/v1/chat/completions", sid="copied"), 401)
    assert calls() == 0


@pytest.mark.parametrize("raw, fragment", [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"model": "m"}).encode(), "messages"),
    (json.dumps({**CHAT, "messages": "hi"}).encode(), "messages"),
    (json.dumps({**CHAT, "max_tokens": "many"}).encode(), "max_tokens"),
    (json.dumps({**CHAT, "max_tokens": 0}).encode(), "max_tokens"),
    (json.dumps({**CHAT, "temperature": "hot"}).encode(), "temperature"),
    (json.dumps({**CHAT, "stream": "yes"}).encode(), "stream"),
    (json.dumps({**CHAT, "tools": {"name": "x"}}).encode(), "tools"),
    (json.dumps({**CHAT, "stop": [1]}).encode(), "stop"),
])
def test_bad_openai_input_gets_400_with_reason(stack, calls, raw, fragment):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    r = assert_refused(stack, post(gw, "/v1/chat/completions", sid=sid, raw=raw), 400, fragment)
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert calls() == 0 and turn_objects(s3.client, RUN, sid) == {}


@pytest.mark.parametrize("body, fragment", [
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "robot", "content": "x"}]}, "role"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": 7}]}, "content"),
    ({"model": "m", "max_tokens": 8.5, "messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}], "stop_sequences": "x"},
     "stop_sequences"),
])
def test_bad_anthropic_input_gets_400_with_reason(stack, calls, body, fragment):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    r = assert_refused(stack, post(gw, "/v1/messages", sid=sid, header="x-api-key", body=body), 400, fragment)
    assert r.json()["error"]["type"] == "invalid_request_error"
    assert calls() == 0


def test_oversize_body_gets_413(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}
    assert_refused(stack, post(gw, "/v1/chat/completions", sid=sid, body=big), 413, str(MAX_BODY))
    assert calls() == 0


def test_oversize_chunked_body_gets_413(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN)
    payload = json.dumps({**CHAT, "messages": [{"role": "user", "content": "x" * (MAX_BODY + 1)}]}).encode()

    def chunks():  # no Content-Length: the limit is enforced while reading
        for i in range(0, len(payload), 8192):
            yield payload[i:i + 8192]

    r = httpx.post(gw.url + "/v1/chat/completions", headers={"authorization": f"Bearer {api_key(sid)}"}, content=chunks())
    assert r.status_code == 413, r.text
    assert calls() == 0


def test_turn_cap_counts_persisted_turns(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_turns=2)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    for _ in range(2):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert calls() == 2
    with pytest.raises(openai.RateLimitError, match="max_turns=2"):
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    assert calls() == 2 and len(turn_objects(s3.client, RUN, sid)) == 2


def test_turn_cap_holds_across_containers(stack, calls):
    """A second gateway (another Lambda container) sees the first one's turns."""
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_turns=1)
    other = serve_ours(s3.new_client(), fixed_factory(sampler))
    try:
        openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0).chat.completions.create(**CHAT)
        with pytest.raises(openai.RateLimitError):
            openai.OpenAI(base_url=other.base_url, api_key=api_key(sid), max_retries=0).chat.completions.create(**CHAT)
    finally:
        other.stop()
    assert calls() == 1


def test_sampled_token_budget(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_total_tokens=3)
    sampler.script[:] = ["a few tokens"]
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    client.chat.completions.create(**CHAT)
    with pytest.raises(openai.RateLimitError, match="max_total_tokens=3"):
        client.chat.completions.create(**CHAT)
    assert calls() == 1


def test_context_limit_is_the_toolkits_400_and_not_sampled(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_context_tokens=16)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a long question " * 4}])
    assert e.value.code == "context_length_exceeded"
    assert calls() == 0


def test_api_keys_never_reach_the_logs(stack, calls):
    """Toolkit log lines that name the sid (the public half of the api key) get a digest instead; the key's
    secret appears in no line either."""
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, max_context_tokens=16)
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record))

    handler = Collect()
    targets = [logging.getLogger(n) for n in ("stepwise", "agentcore_rl_toolkit.rollout_gateway.adapters.common",
                                              "agentcore_rl_toolkit.rollout_gateway.adapters.openai")]
    for t in targets:
        t.addHandler(handler)
    try:
        with pytest.raises(openai.BadRequestError):
            openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a long question " * 4}])
    finally:
        for t in targets:
            t.removeHandler(handler)
    assert any("sid#" in line for line in seen), seen  # the toolkit's context-limit warning, redacted
    assert not any(sid in line or api_key(sid).split(".", 1)[1] in line for line in seen)


def test_missing_tokenizer_is_a_503_naming_it_and_not_sampled(stack, calls):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, "run-without-tokenizer")
    r = assert_refused(stack, post(gw, "/v1/chat/completions", sid=sid), 503, "tokenizer",
                       "runs/run-without-tokenizer/tokenizer/")
    assert r.json()["error"]["type"] == "api_error"
    assert calls() == 0


def test_unreadable_session_record_is_a_503_and_the_sid_stays_out_of_the_logs(stack, calls):
    s3, sampler, gw = stack
    sid = "3f1c2a9e-0000-4000-8000-00000000beef"
    s3.client.put_object(Bucket="stepwise-gateway-test", Key=session_key(sid), Body=b'{"sid": "' + sid.encode())
    seen: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            seen.append(self.format(record) + str(getattr(record, "detail", "")))

    handler = Collect()
    logging.getLogger("stepwise").addHandler(handler)
    try:
        assert_refused(stack, post(gw, "/v1/chat/completions", sid=sid), 503, "retry")
    finally:
        logging.getLogger("stepwise").removeHandler(handler)
    assert any("session lookup failed" in line for line in seen)
    assert not any(sid in line for line in seen)
    assert calls() == 0
