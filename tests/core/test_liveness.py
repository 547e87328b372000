"""Rollout liveness: the task's timeout and heartbeat, the gateway's heartbeat interval, and how a timed-out
rollout's cause is named (`stepwise.core.liveness`)."""

from __future__ import annotations

import math

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stepwise.config import RunConfig
from stepwise.core.liveness import (
    HEARTBEAT_TIMEOUT,
    TASK_TIMEOUT,
    RolloutTimeouts,
    heartbeat_interval,
    rollout_timeouts,
    timeout_cause,
)

#: The config space of the two fields, from RunConfig's own bounds.
_FIELDS = RunConfig.model_json_schema()["properties"]
MAX_ROLLOUT_TIME = _FIELDS["max_rollout_time"]["maximum"]
MAX_HEARTBEAT = _FIELDS["rollout_heartbeat_seconds"]["maximum"]
#: The largest TimeoutSeconds / HeartbeatSeconds the States Language takes (its default, 99999999).
ASL_MAX_SECONDS = 99_999_999

max_rollout_times = st.one_of(
    st.floats(min_value=0, max_value=MAX_ROLLOUT_TIME, exclude_min=True, allow_nan=False),
    st.integers(1, MAX_ROLLOUT_TIME).map(float),
    st.sampled_from([1e-9, 0.5, 1.0, 1.000001, 2.0, 299.5, 300.0, 300.0001, MAX_ROLLOUT_TIME - 0.5, MAX_ROLLOUT_TIME]),
)


@st.composite
def configs(draw) -> tuple[float, int]:
    """``(max_rollout_time, rollout_heartbeat_seconds)``: anywhere, and around the boundary ``ceil(max_rollout_time)``."""
    max_rollout_time = draw(max_rollout_times)
    limit = max(1, math.ceil(max_rollout_time))
    near = st.integers(max(0, limit - 2), min(MAX_HEARTBEAT, limit + 2))
    heartbeat = draw(st.one_of(st.just(0), st.integers(0, MAX_HEARTBEAT), near))
    return max_rollout_time, heartbeat


def test_the_heartbeat_is_on_only_below_the_timeout_and_off_ends_the_task_at_the_timeout():
    assert rollout_timeouts(1800.0, 300) == (1800, 300, True)
    assert rollout_timeouts(1799.2, 300) == (1800, 300, True)  # whole seconds, rounded up
    # 0 = off: the heartbeat (which nothing resets) is the rollout's limit, the task's timeout a second longer
    assert rollout_timeouts(1800.0, 0) == (1801, 1800, False)
    assert rollout_timeouts(120.0, 300) == (121, 120, False)  # examples/toy.json: a heartbeat longer than the rollout
    assert rollout_timeouts(120.0, 120) == (121, 120, False)
    assert rollout_timeouts(120.0, 119) == (120, 119, True)
    assert rollout_timeouts(120.0, 0).max_rollout_seconds == rollout_timeouts(120.0, 60).max_rollout_seconds == 120


@settings(max_examples=400, deadline=None)
@given(configs())
@example((120.0, 300)).via("examples/toy.json")
@example((1800.0, 0)).via("the heartbeat off")
@example((MAX_ROLLOUT_TIME, 0)).via("the largest timeout")
def test_the_heartbeat_is_below_the_timeout_in_every_configuration(config):
    """States Language (Step Functions developer guide, "Task workflow state"): HeartbeatSeconds is a positive
    integer smaller than TimeoutSeconds. Off still ends the rollout exactly at ``max_rollout_time``, and every
    end is named for the limit that caused it."""
    max_rollout_time, heartbeat = config
    t = rollout_timeouts(max_rollout_time, heartbeat)
    limit = max(1, math.ceil(max_rollout_time))
    assert all(isinstance(v, int) for v in t[:2])
    assert 1 <= t.heartbeat_seconds < t.timeout_seconds <= ASL_MAX_SECONDS
    assert t.heartbeat_on == (0 < heartbeat < limit)
    # the rollout ends at its own limit, whichever timer fires: with the heartbeat off no heartbeat is sent,
    # so the heartbeat ends the task after heartbeat_seconds, never before max_rollout_time
    first_end_when_silent = min(t.timeout_seconds, t.heartbeat_seconds)
    assert t.max_rollout_seconds == limit
    if t.heartbeat_on:
        assert (t.timeout_seconds, t.heartbeat_seconds) == (limit, heartbeat)
        assert timeout_cause(HEARTBEAT_TIMEOUT, t).startswith(f"no LLM call for {heartbeat} s (rollout_heartbeat_seconds)")
    else:
        assert first_end_when_silent == limit
        assert timeout_cause(HEARTBEAT_TIMEOUT, t) == f"no result within {limit} s (max_rollout_time)"
    assert timeout_cause(TASK_TIMEOUT, t) == f"no result within {limit} s (max_rollout_time)"
    # the batch carries the three values; read back, they are the same timeouts
    assert RolloutTimeouts.of(*t) == t


def test_a_batch_planned_before_the_flag_reads_as_it_did():
    """A batch planned before BatchRef carried ``heartbeat_on`` (off = a heartbeat equal to the timeout)."""
    assert RolloutTimeouts.of(30, 30, None) == (30, 30, False)
    assert RolloutTimeouts.of(1800, 300, None) == (1800, 300, True)
    assert timeout_cause(HEARTBEAT_TIMEOUT, RolloutTimeouts.of(30, 30, None)) == "no result within 30 s (max_rollout_time)"


def test_a_silent_agent_and_a_slow_one_are_told_apart():
    on = rollout_timeouts(1800.0, 300)
    assert timeout_cause("States.HeartbeatTimeout", on).startswith("no LLM call for 300 s (rollout_heartbeat_seconds)")
    assert timeout_cause("States.Timeout", on) == "no result within 1800 s (max_rollout_time)"
    # the heartbeat off: whichever fires, it is the rollout's own limit
    off = rollout_timeouts(30.0, 0)
    assert timeout_cause("States.HeartbeatTimeout", off) == timeout_cause("States.Timeout", off) == \
        "no result within 30 s (max_rollout_time)"
    assert timeout_cause("AgentRuntimeThrottled", off) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 99_999_999))
def test_the_gateway_beats_often_enough_and_rarely_enough(heartbeat_seconds: int):
    interval = heartbeat_interval(heartbeat_seconds)
    assert 1.0 <= interval <= 60.0
    if heartbeat_seconds >= 10:  # an agent calling its LLM every 0.9 x heartbeat (up to 10 min) is never stopped
        assert interval <= max(heartbeat_seconds / 10, 1.0)
        assert heartbeat_seconds - interval >= min(0.9 * heartbeat_seconds, heartbeat_seconds - 60)


@settings(max_examples=300, deadline=None)
@given(configs(), st.integers(1, 3600))
@example((120.0, 300), 60).via("examples/toy.json and the default re-check")
@example((1800.0, 300), 60).via("the defaults")
@example((20.0, 0), 60).via("a re-check longer than the rollout")
def test_with_a_recheck_the_heartbeat_is_at_most_the_interval_and_still_below_the_timeout(config, recheck):
    """PlanStep's batches (``rollout_recheck_seconds``): the task's heartbeat is the shortest of the re-check
    interval and the silence limit when on, so a silence ends in a re-check of the result (an S3 notification
    lost costs the interval, not the timeout); it stays below the timeout, and when even the interval does not
    fit below it the rollout is as without a re-check (the heartbeat off ends it at max_rollout_time)."""
    max_rollout_time, heartbeat = config
    t = rollout_timeouts(max_rollout_time, heartbeat, recheck)
    limit = max(1, math.ceil(max_rollout_time))
    assert 1 <= t.heartbeat_seconds < t.timeout_seconds and t.max_rollout_seconds == limit
    wanted = min(recheck, heartbeat if 0 < heartbeat < limit else limit)
    if wanted < limit:
        assert t == (limit, wanted, True)
    else:
        assert t == rollout_timeouts(max_rollout_time, heartbeat) == (limit + 1, limit, False)


def test_the_task_s_heartbeat_is_the_recheck_interval_at_most():
    assert rollout_timeouts(1800.0, 300, 60) == (1800, 60, True)
    assert rollout_timeouts(1800.0, 10, 60) == (1800, 10, True)  # a silence limit below the interval: its own check
    assert rollout_timeouts(120.0, 300, 60) == (120, 60, True)  # silence off (toy config): re-checks all the same
    assert rollout_timeouts(20.0, 0, 60) == (21, 20, False)  # the interval does not fit: the heartbeat off's end


def test_a_recheck_waits_while_the_agent_is_within_its_silence_and_the_rollout_within_its_timeout():
    from stepwise.core.liveness import recheck_verdict, task_error

    def verdict(now: float, last_call: float | None, silence: int = 300) -> str:
        return recheck_verdict(now, started_at=1000.0, last_call_at=last_call, timeout_seconds=1800, silence_seconds=silence)

    assert verdict(1030.0, None) == "wait"  # a result not there yet, the agent working (a tool call, thinking)
    assert verdict(1300.0, None) == "silent"  # no LLM call since its start for rollout_heartbeat_seconds
    assert verdict(1500.0, 1250.0) == "wait" and verdict(1550.0, 1250.0) == "silent"  # since its last call
    assert verdict(2800.0, 2790.0) == "overdue"  # max_rollout_time passed, whatever the agent does
    assert verdict(2700.0, None, silence=0) == "wait" and verdict(2700.0, None, silence=1800) == "wait"  # silence off
    # the re-check's ends are named as the task's own timeouts were, with their causes
    t = rollout_timeouts(1800.0, 300, 60)
    assert task_error("RolloutSilent") == HEARTBEAT_TIMEOUT and task_error("RolloutOverdue") == TASK_TIMEOUT
    assert task_error("AgentRuntimeThrottled") == "AgentRuntimeThrottled"
    assert timeout_cause(HEARTBEAT_TIMEOUT, t, silence_seconds=300).startswith("no LLM call for 300 s (rollout_heartbeat_seconds)")
    assert timeout_cause(TASK_TIMEOUT, t) == "no result within 1800 s (max_rollout_time)"
