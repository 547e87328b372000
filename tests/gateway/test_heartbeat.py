"""The gateway heartbeats a rollout's task on its agent's LLM calls (`stepwise.gateway.heartbeat`): at most
once per interval per session, every interval while a call is in flight, beside the request and never on
its path, and never again for a task that is over.

The Step Functions side is a recording client here (the scheduling is under test); the drill
``tests/drills/test_rollout_liveness.py`` runs the real SendTaskHeartbeat against moto's engine.
"""

from __future__ import annotations

import threading
import time

import openai
import pytest
from botocore.exceptions import ClientError

from stepwise.gateway import start_gateway
from stepwise.gateway.app import GatewaySettings, build_app
from stepwise.gateway.heartbeat import TaskHeartbeats
from tests.support.gateway import (
    BUCKET,
    MotoS3,
    ScriptedSampler,
    api_key,
    cache_tokenizer,
    fixed_factory,
    load_tokenizer,
    open_session,
)

RUN = "run-heartbeat"


class RecordingStepFunctions:
    """SendTaskHeartbeat that records its tokens, takes ``delay`` s, and answers TaskTimedOut for ``ended`` tokens."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.beats: list[tuple[str, float]] = []
        self.ended: set[str] = set()
        self.attempts: list[str] = []
        self.lock = threading.Lock()

    def send_task_heartbeat(self, taskToken: str) -> dict:
        with self.lock:
            self.attempts.append(taskToken)
        time.sleep(self.delay)
        if taskToken in self.ended:
            raise ClientError({"Error": {"Code": "TaskTimedOut", "Message": "Task Timed Out"}}, "SendTaskHeartbeat")
        with self.lock:
            self.beats.append((taskToken, time.monotonic()))
        return {}

    def count(self, token: str) -> int:
        with self.lock:
            return sum(1 for t, _ in self.beats if t == token)


@pytest.fixture(scope="module")
def stack():
    s3 = MotoS3()
    cache_tokenizer(s3.client, RUN)
    sampler = ScriptedSampler(load_tokenizer())
    sfn = RecordingStepFunctions(delay=3.0)
    app = build_app(GatewaySettings(bucket=BUCKET), s3=s3.new_client(), sampler_factory=fixed_factory(sampler),
                    heartbeats=TaskHeartbeats(client_factory=lambda region: sfn))
    gw = start_gateway(app=app)
    yield s3, sampler, sfn, gw
    gw.stop()
    s3.stop()


def _call(gw, sid: str) -> float:
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    t0 = time.monotonic()
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=8)
    return time.monotonic() - t0


def _wait(predicate, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not predicate():
        time.sleep(0.05)
    return predicate()


def test_calls_beat_at_most_once_per_interval_and_never_wait_for_the_beat(stack):
    s3, sampler, sfn, gw = stack
    sampler.delay = 0.0
    _call(gw, open_session(s3.client, RUN)[0])  # warm: the run's tokenizer loaded
    sid, _ = open_session(s3.client, RUN, task_token="token-a", heartbeat_seconds=30)  # interval 3 s
    latencies = [_call(gw, sid) for _ in range(3)]
    assert max(latencies) < sfn.delay, latencies  # SendTaskHeartbeat takes 3 s; no call waited for it
    assert _wait(lambda: sfn.count("token-a") == 1)
    time.sleep(0.5)  # the interval (3 s, from the first beat) passed: the next call beats again
    _call(gw, sid)
    assert _wait(lambda: sfn.count("token-a") == 2)
    assert sfn.count("token-a") == 2


def test_a_long_call_beats_while_in_flight_and_sessions_without_a_heartbeat_never_beat(stack):
    s3, sampler, sfn, gw = stack
    sid, _ = open_session(s3.client, RUN, task_token="token-b", heartbeat_seconds=10)  # interval 1 s
    sampler.delay, sfn.delay = 3.5, 0.05
    try:
        _call(gw, sid)
    finally:
        sampler.delay, sfn.delay = 0.0, 3.0
    assert _wait(lambda: sfn.count("token-b") >= 3)  # at admission, then every second of the 3.5 s sample
    off, _ = open_session(s3.client, RUN, task_token="token-c", heartbeat_seconds=0)
    no_token, _ = open_session(s3.client, RUN, heartbeat_seconds=10)
    _call(gw, off)
    _call(gw, no_token)
    time.sleep(sfn.delay + 0.5)
    assert sfn.count("token-c") == 0 and len({t for t, _ in sfn.beats}) == 2


def test_a_task_that_is_over_is_not_beaten_again(stack):
    s3, sampler, sfn, gw = stack
    sampler.delay = 0.0
    sid, _ = open_session(s3.client, RUN, task_token="token-d", heartbeat_seconds=10)
    sfn.ended.add("token-d")
    _call(gw, sid)
    time.sleep(sfn.delay + 1.2)
    _call(gw, sid)  # a heartbeat would be due again; the task answered TaskTimedOut before
    time.sleep(sfn.delay + 0.5)
    assert sfn.attempts.count("token-d") == 1 and sfn.count("token-d") == 0
