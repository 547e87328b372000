"""Drill: agent results of any shape never raise (hypothesis, bounded examples).

The agent writes its result object itself, so it can be any JSON value, or not JSON at all.
Hypothesis' recursive JSON strategy (nesting, every JSON type where a number is expected, ints far
beyond float's range, subnormal and huge floats, NaN and infinities, unicode) drives

- `extract_reward` directly: always a finite float and, when the reward was not zeroed, the very
  number the toolkit's ``rewards`` rule reads;
- the real FinishRollout handler against moto S3 (the object the agent would have written, as
  bytes): never raises, writes one rollout record, ``status`` is ``ok`` only for a dict reporting
  success, and a non-200 ``status_code`` is an ``error`` whose cause is the agent's ``stop_reason``.

Before this drill, a reward given as an int beyond float's range (``{"rewards": 10**400}``)
raised OverflowError out of FinishRollout, and a result nested deeper than the JSON decoder's
recursion limit raised RecursionError; both now score 0.0 with the reason.
"""

from __future__ import annotations

import json
import math
import uuid

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.support.pipeline import Stack, init_run, new_run_id, run_ref

from stepwise.core.rewards import agent_failure, extract_reward
from stepwise.events import FinishEvent
from stepwise.handlers.rollout import finish
from stepwise.layout import result_key, rollout_key

NUMBERS = st.one_of(
    st.integers(min_value=-(10**400), max_value=10**400),  # beyond float's range: float() overflows
    st.floats(allow_nan=True, allow_infinity=True),  # subnormals, +-1.8e308, NaN, inf
    st.sampled_from([0, -0.0, 5e-324, 1e308, 2**53 + 1, True, False]),
)
SCALARS = st.one_of(st.none(), st.booleans(), NUMBERS, st.text(max_size=40))
JSON = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                    max_leaves=25)
STATUS_CODES = st.one_of(st.just(200), st.just(500), JSON)
# Results shaped like the toolkit's: the keys we read, each holding any JSON value.
RESULTS = st.one_of(
    JSON,
    st.fixed_dictionaries({}, optional={"rewards": JSON, "reward": JSON, "status_code": STATUS_CODES,
                                        "stop_reason": JSON, "payload": JSON}),
)


def _deep(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@settings(max_examples=400, deadline=None)
@given(RESULTS)
@example({"rewards": 10**400})
@example({"reward": -(10**400)})
@example({"rewards": [1.0, 10**309]})
@example({"rewards": 5e-324})
@example({"status_code": 200.0, "rewards": "1e308"})
def test_extract_reward_never_raises_and_returns_a_finite_float(result):
    reward, reason = extract_reward(result)
    assert isinstance(reward, float) and math.isfinite(reward)
    if reason is not None:
        assert reward == 0.0
        return
    assert isinstance(result, dict) and agent_failure(result) is None
    rewards = result.get("rewards")
    source = (rewards[-1] if isinstance(rewards, list) else rewards) if rewards not in (None, []) else result["reward"]
    assert reward == float(source)


def test_a_reward_nested_too_deep_to_print_is_zeroed_with_a_placeholder():
    reward, reason = extract_reward({"rewards": _deep(5000)})  # str() of it recurses too deep
    assert reward == 0.0 and reason.startswith("non-numeric rewards: '<list too deep")


BATCH = {"kind": "train", "step": 0, "generation_batch": 0, "timeout_seconds": 30}


@pytest.fixture(scope="module")
def run():
    stack = Stack(bucket="stepwise-result-fuzz")
    run_id = new_run_id("fuzz")
    init_run(stack, run_id, stack.config())
    yield stack, run_id
    stack.stop()


def _finish(stack: Stack, run_id: str, body: bytes) -> tuple[dict, dict]:
    sid = str(uuid.uuid4())
    key = result_key(run_id, "s0g0p0", sid)
    stack.s3.put_object(Bucket=stack.bucket, Key=key, Body=body)
    item = {"i": 0, "input_id": "s0g0p0", "row": 0, "member": 0}
    out = finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": BATCH, "item": item,
                                             "result": {"sid": sid, "result_key": key}, "error": None}))
    record = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=rollout_key(run_id, 0, 0, sid))["Body"].read())
    return out, record


def _encode(value) -> bytes:
    # allow_nan: the agent's json.dumps writes NaN / Infinity, which Python's json reads back
    return json.dumps(value, ensure_ascii=False, allow_nan=True).encode()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(st.one_of(RESULTS.map(lambda v: ("json", v)), st.binary(max_size=64).map(lambda b: ("bytes", b))))
@example(("bytes", b"[" * 100_000 + b"]" * 100_000))  # deeper than the JSON decoder's recursion limit
@example(("bytes", b"\xff\xfe not utf-8"))
@example(("bytes", b"{\"rewards\": " + b"9" * 5000 + b"}"))  # an int longer than Python's int parser allows
@example(("json", {"rewards": 10**400, "status_code": 200}))
@example(("json", {"status_code": 500, "stop_reason": "Error code: 401 - unknown session", "rewards": 1.0}))
@example(("json", {"status_code": "200", "rewards": 1.0}))
def test_finish_rollout_never_raises_on_any_result_object(run, case):
    stack, run_id = run
    kind, value = case
    out, record = _finish(stack, run_id, _encode(value) if kind == "json" else value)
    assert out["status"] == record["status"] in ("ok", "error")
    assert isinstance(record["reward"], float) and math.isfinite(record["reward"]) and out["reward"] == record["reward"]
    if kind == "json" and isinstance(value, dict) and agent_failure(value) is not None:
        assert record["status"] == "error" and record["reward"] == 0.0
        assert record["error"]["error"] == "AgentError"
        assert record["error"]["cause"] == agent_failure(value)["cause"]
    elif kind == "json" and isinstance(value, dict):
        assert record["status"] == "ok"
        assert (record["reward"], record["reward_reason"]) == extract_reward(value)
    elif kind == "json":
        assert record["status"] == "error" and record["error"]["error"] == "MalformedResult" and record["reward"] == 0.0
    if record["status"] == "error":
        assert record["reward"] == 0.0 and record["reward_reason"].startswith("error: ")
