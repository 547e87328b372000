"""FinishRollout's outcome classification (`stepwise.core.rewards.task_end`, `rollout_outcome`,
`per_turn_outcome`), property-tested over arbitrary task ends, timings, result reads and rewards.

Two kinds of property: the rules a rollout record must obey whatever happened (a reward only for an ``ok``
rollout, a reason for every zero, ``timeout`` only for a task timeout whose result never turned up, ``late``
only for a result found after its task timed out or by the re-check), and the classification FinishRollout
made inline before it moved to `stepwise.core.rewards` (`_inline`, kept here verbatim but for its reads,
which are inputs): the move changed no outcome.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.liveness import (AGENT_SILENT, HEARTBEAT_TIMEOUT, ROLLOUT_OVERDUE, TASK_TIMEOUT, TIMEOUT_ERRORS,
                                    RolloutTimeouts, rollout_timeouts, task_error, timeout_cause)
from stepwise.core.rewards import (NO_SESSION_TURNS, ResultRead, agent_failure, extract_reward, extract_turn_rewards,
                                   per_turn_outcome, preview, result_too_large, rollout_outcome, task_end)

KEY = "rollout-results/r/p0/sid.json"

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
                    max_leaves=12)
REWARD = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**200, 10**200), st.text(max_size=4),
                   st.none(), st.lists(st.floats(-5, 5), max_size=5),
                   st.dictionaries(st.sampled_from(["0", "1", "-1", "2", "x"]), st.floats(-5, 5), max_size=3))
#: An agent's result object: mostly the toolkit's shape (rewards, reward, status_code, an exception), else any JSON.
RESULT = st.one_of(
    st.fixed_dictionaries({}, optional={"rewards": REWARD, "reward": REWARD,
                                        "status_code": st.sampled_from([200, 500, None, "200"]),
                                        "exception": st.text(max_size=10), "error": st.text(max_size=10)}),
    JSON)
#: What reading the result object found: its JSON, or one of the read failures.
READ = st.one_of(RESULT.map(lambda v: ("value", v)), st.just(("missing", None)),
                 st.integers(16 * 2**20 + 1, 2**40).map(lambda n: ("too_large", n)),
                 st.text(max_size=40).map(lambda t: ("malformed", t)))
TASK_ERROR = st.none() | st.fixed_dictionaries(
    {}, optional={"Error": st.sampled_from([TASK_TIMEOUT, HEARTBEAT_TIMEOUT, AGENT_SILENT, ROLLOUT_OVERDUE,
                                            "States.TaskFailed", "AgentRuntimeThrottled", "x"]),
                  "Cause": st.text(max_size=1200)})
TASK_RESULT = st.none() | st.fixed_dictionaries(
    {"sid": st.just("sid")}, optional={"result_key": st.sampled_from([KEY, "rollout-results/r/p0/other.json", ""]),
                                       "rechecked": st.booleans()})


@st.composite
def timeouts(draw) -> RolloutTimeouts:
    return rollout_timeouts(draw(st.floats(0.01, 90_000)), draw(st.integers(0, 100_000)),
                            draw(st.none() | st.integers(0, 100_000)))


def _read(kind: str, value: Any) -> ResultRead:
    return {"value": lambda: ResultRead(value=value), "missing": lambda: ResultRead(missing=True),
            "too_large": lambda: ResultRead(too_large=value), "malformed": lambda: ResultRead(malformed=value)}[kind]()


def _inline(error_in, result_in, timeouts_, silence, sid, exists, read, per_turn, num_turns):
    """FinishRollout's classification as it was inline in the handler (its reads given as inputs)."""
    status, error, result_obj, late = "ok", None, None, False
    key = None
    if error_in is not None:
        err = task_error(str(error_in.get("Error", "error")))
        cause = timeout_cause(err, timeouts_, silence_seconds=silence)
        status = "timeout" if cause is not None else "error"
        error = {"error": err, "cause": cause or str(error_in.get("Cause", ""))[:1000]}
        if status == "timeout" and sid is not None:
            key = KEY
            if exists:
                status, error, late = "ok", None, True
            else:
                key = None
    elif result_in is not None:
        key = result_in.get("result_key") or KEY
        late = bool(result_in.get("rechecked"))
    if key is not None:
        kind, value = read
        if kind == "missing":
            status, error = "error", {"error": "ResultMissing", "cause": "the result object was not found",
                                      "result_key": key}
        elif kind == "too_large":
            status, error = "error", {**result_too_large(value), "result_key": key}
        elif kind == "malformed":
            status, error = "error", {"error": "MalformedResult", "cause": preview(value, 1000), "result_key": key}
        else:
            result_obj = value
            if not isinstance(result_obj, dict):
                status, error = "error", {"error": "MalformedResult", "result_key": key,
                                          "cause": f"not a JSON object (got {type(result_obj).__name__})"}
                result_obj = None
            elif (failure := agent_failure(result_obj)) is not None:
                status, error = "error", failure
    reward, reason = extract_reward(result_obj if status == "ok" else None)
    if per_turn and status == "ok":
        reason = None
    if status != "ok":
        reason = f"{status}: {error['error']}: {preview(error['cause'], 200)}" if error else status
    turn_rewards = None
    if sid is not None:
        if per_turn:
            turn_rewards, why = extract_turn_rewards(result_obj if status == "ok" else None, num_turns)
            if status == "ok":
                reward, reason = math.fsum(turn_rewards), why
    elif per_turn and status == "ok":
        reward, reason = 0.0, NO_SESSION_TURNS
    return status, error, late, reward, reason, turn_rewards


def _classify(error_in, result_in, timeouts_, silence, sid, exists, read, per_turn, num_turns):
    """FinishRollout's classification as the handler now makes it, over `stepwise.core.rewards`."""
    end = task_end(error_in, result_in, timeouts_, silence_seconds=silence, started=sid is not None)
    key = None
    if end.read == "if_present":
        if exists:
            end, key = end.found_late(), KEY
    elif end.read == "result":
        key = (result_in or {}).get("result_key") or KEY
    outcome = rollout_outcome(end, _read(*read) if key is not None else None, result_key=key, per_turn=per_turn)
    if per_turn:
        outcome = per_turn_outcome(outcome, num_turns if sid is not None else None)
    return outcome


@settings(max_examples=600, deadline=None)
@given(error_in=TASK_ERROR, result_in=TASK_RESULT, timeouts_=timeouts(), silence=st.none() | st.integers(1, 10**6),
       sid=st.sampled_from([None, "sid"]), exists=st.booleans(), read=READ, per_turn=st.booleans(),
       num_turns=st.integers(0, 4))
def test_the_outcome_obeys_the_records_rules_and_is_the_one_finish_rollout_made_inline(
        error_in, result_in, timeouts_, silence, sid, exists, read, per_turn, num_turns):
    o = _classify(error_in, result_in, timeouts_, silence, sid, exists, read, per_turn, num_turns)
    # the rules of a rollout record
    assert o.status in ("ok", "error", "timeout")
    assert math.isfinite(o.reward)
    if o.status != "ok":
        assert o.reward == 0.0 and o.reason is not None and o.reason.startswith(o.status) and o.error is not None
        assert o.result is None
    else:
        assert o.error is None
    if o.status == "timeout":
        assert error_in is not None and task_error(str(error_in.get("Error", "error"))) in TIMEOUT_ERRORS
        assert not (sid is not None and exists)  # a result that turned up is scored, never a timeout
    if o.late:
        assert (error_in is not None and sid is not None and exists) or (
            error_in is None and result_in is not None and result_in.get("rechecked"))
    if per_turn and sid is not None:
        assert o.turn_rewards is not None and len(o.turn_rewards) == num_turns
        if o.status == "ok":
            assert o.reward == math.fsum(o.turn_rewards)
    else:
        assert o.turn_rewards is None
    # the classification the handler made inline before the move
    assert (o.status, o.error, o.late, o.reward, o.reason, o.turn_rewards) == _inline(
        error_in, result_in, timeouts_, silence, sid, exists, read, per_turn, num_turns)


@settings(max_examples=300, deadline=None)
@given(max_rollout_time=st.floats(0.01, 90_000), heartbeat=st.integers(0, 100_000),
       recheck=st.none() | st.integers(0, 100_000), error=st.sampled_from(sorted(TIMEOUT_ERRORS)),
       silence=st.none() | st.integers(1, 10**6))
def test_a_task_timeout_is_a_timeout_whatever_the_timings_and_names_its_limit(
        max_rollout_time, heartbeat, recheck, error, silence):
    t = rollout_timeouts(max_rollout_time, heartbeat, recheck)
    end = task_end({"Error": error, "Cause": "c"}, None, t, silence_seconds=silence)
    assert end.status == "timeout" and end.read == "if_present" and not end.late
    assert end.error["error"] in (TASK_TIMEOUT, HEARTBEAT_TIMEOUT)  # the re-check's names as the task's own
    assert ("(rollout_heartbeat_seconds)" in end.error["cause"]) != ("(max_rollout_time)" in end.error["cause"])
    assert task_end({"Error": error}, None, t, started=False).read == "none"  # never started: no result to look for
    late = rollout_outcome(end.found_late(), ResultRead(value={"reward": 1.0}), result_key=KEY)
    assert (late.status, late.late, late.reward, late.reason) == ("ok", True, 1.0, None)


@settings(max_examples=200, deadline=None)
@given(result=RESULT, num_turns=st.integers(0, 4))
def test_per_turn_rewards_read_once_are_read_again_unchanged(result, num_turns):
    """FinishRollout applies `per_turn_outcome` once; applied to its own output it gives the same rewards."""
    o = rollout_outcome(task_end(None, {"sid": "sid"}, rollout_timeouts(60, 0)), ResultRead(value=result),
                        result_key=KEY, per_turn=True)
    once = per_turn_outcome(o, num_turns)
    assert per_turn_outcome(once, num_turns) == once
