"""Rollout liveness: how long a rollout may run, how long its agent may stay silent, and how its end is
named (pure; no AWS, no clock).

A rollout's callback task (the Map child's "Start rollout") times out after ``max_rollout_time``
(``TimeoutSecondsPath``) and, with ``rollout_heartbeat_seconds`` on, after that long without a
heartbeat (``HeartbeatSecondsPath``). The gateway sees every LLM call of the rollout and sends
``SendTaskHeartbeat`` for its task (at most once per `heartbeat_interval`, and while a call is in
flight), so a dead or hung agent frees its place after ``rollout_heartbeat_seconds`` instead of
``max_rollout_time``. Step Functions reports the two ends as ``States.Timeout`` and
``States.HeartbeatTimeout`` (Step Functions developer guide, "Error names"); `timeout_cause` names them.
"""

from __future__ import annotations

import math

#: The error of a task past its ``TimeoutSeconds``.
TASK_TIMEOUT = "States.Timeout"
#: The error of a task without a heartbeat for its ``HeartbeatSeconds``.
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
TIMEOUT_ERRORS = frozenset({TASK_TIMEOUT, HEARTBEAT_TIMEOUT})


def rollout_timeouts(max_rollout_time: float, rollout_heartbeat_seconds: int) -> tuple[int, int]:
    """``(timeout_seconds, heartbeat_seconds)`` of a rollout's callback task, whole seconds >= 1.

    The heartbeat is ``rollout_heartbeat_seconds`` when it is on (> 0) and shorter than the timeout;
    otherwise it is the timeout itself, so the task's overall timeout comes first and heartbeats change
    nothing (``HeartbeatSeconds`` must be a positive integer: "off" cannot be 0 in the state machine)."""
    timeout = max(1, math.ceil(max_rollout_time))
    heartbeat = rollout_heartbeat_seconds if 0 < rollout_heartbeat_seconds < timeout else timeout
    return timeout, heartbeat


def heartbeat_on(timeout_seconds: int, heartbeat_seconds: int) -> bool:
    """Whether the task's heartbeat can end it before its timeout (`rollout_timeouts` sets them equal when off)."""
    return 0 < heartbeat_seconds < timeout_seconds


def heartbeat_interval(heartbeat_seconds: int) -> float:
    """Seconds between two heartbeats the gateway sends for one rollout (at most once per interval): a
    tenth of the heartbeat timeout, at least 1 s and at most 60 s. An agent that calls its LLM at least
    every ``heartbeat_seconds - interval`` (0.9 x, for timeouts up to 600 s) is never stopped."""
    return float(min(60.0, max(1.0, heartbeat_seconds / 10)))


def timeout_cause(error: str, *, timeout_seconds: int, heartbeat_seconds: int) -> str | None:
    """The cause of a rollout that ended with the task error ``error``, in words; None when ``error`` is
    not a task timeout. A heartbeat timeout is ``no LLM call for N s (rollout_heartbeat_seconds)``, the
    task's own ``no result within N s (max_rollout_time)`` (a heartbeat timeout with the heartbeat off,
    i.e. equal to the timeout, is the latter)."""
    if error not in TIMEOUT_ERRORS:
        return None
    if error == HEARTBEAT_TIMEOUT and heartbeat_on(timeout_seconds, heartbeat_seconds):
        return (f"no LLM call for {heartbeat_seconds} s (rollout_heartbeat_seconds): the agent died, hung, or ran "
                f"a tool call longer than that")
    return f"no result within {timeout_seconds} s (max_rollout_time)"
