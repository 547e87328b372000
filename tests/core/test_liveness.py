"""Rollout liveness: the task's timeout and heartbeat, the gateway's heartbeat interval, and how a timed-out
rollout's cause is named (`stepwise.core.liveness`)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.liveness import heartbeat_interval, heartbeat_on, rollout_timeouts, timeout_cause


def test_the_heartbeat_is_on_only_below_the_timeout_and_off_means_the_timeout_itself():
    assert rollout_timeouts(1800.0, 300) == (1800, 300)
    assert rollout_timeouts(1799.2, 300) == (1800, 300)  # whole seconds, rounded up
    assert rollout_timeouts(1800.0, 0) == (1800, 1800)  # 0 = off: Step Functions needs a positive heartbeat
    assert rollout_timeouts(30.0, 300) == (30, 30)  # a heartbeat longer than the rollout is off too
    assert heartbeat_on(1800, 300) and not heartbeat_on(30, 30) and not heartbeat_on(1800, 0)


def test_a_silent_agent_and_a_slow_one_are_told_apart():
    silent = timeout_cause("States.HeartbeatTimeout", timeout_seconds=1800, heartbeat_seconds=300)
    assert silent.startswith("no LLM call for 300 s (rollout_heartbeat_seconds)")
    slow = timeout_cause("States.Timeout", timeout_seconds=1800, heartbeat_seconds=300)
    assert slow == "no result within 1800 s (max_rollout_time)"
    # the heartbeat off (equal to the timeout): whichever fires, it is the overall timeout
    assert timeout_cause("States.HeartbeatTimeout", timeout_seconds=30, heartbeat_seconds=30) == \
        "no result within 30 s (max_rollout_time)"
    assert timeout_cause("AgentRuntimeThrottled", timeout_seconds=30, heartbeat_seconds=10) is None


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 99_999_999))
def test_the_gateway_beats_often_enough_and_rarely_enough(heartbeat_seconds: int):
    interval = heartbeat_interval(heartbeat_seconds)
    assert 1.0 <= interval <= 60.0
    if heartbeat_seconds >= 10:  # an agent calling its LLM every 0.9 x heartbeat (up to 10 min) is never stopped
        assert interval <= max(heartbeat_seconds / 10, 1.0)
        assert heartbeat_seconds - interval >= min(0.9 * heartbeat_seconds, heartbeat_seconds - 60)
