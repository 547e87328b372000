"""Rollout liveness: how long a rollout may run, how long its agent may stay silent, and how its end is
named (pure; no AWS, no clock).

A rollout's callback task (the Map child's "Start rollout") times out after ``max_rollout_time``
(``TimeoutSecondsPath``) and, with ``rollout_heartbeat_seconds`` on, after that long without a
heartbeat (``HeartbeatSecondsPath``; `rollout_timeouts` keeps it below the timeout in every configuration,
and "off" never ends a rollout before its timeout would). The gateway sees every LLM call of the rollout and sends
``SendTaskHeartbeat`` for its task (at most once per `heartbeat_interval`, and while a call is in
flight), so a dead or hung agent frees its place after ``rollout_heartbeat_seconds`` instead of
``max_rollout_time``. Step Functions reports the two ends as ``States.Timeout`` and
``States.HeartbeatTimeout`` (Step Functions developer guide, "Error names"); `timeout_cause` names them.
"""

from __future__ import annotations

import math
from typing import NamedTuple

#: The error of a task past its ``TimeoutSeconds``.
TASK_TIMEOUT = "States.Timeout"
#: The error of a task without a heartbeat for its ``HeartbeatSeconds``.
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
TIMEOUT_ERRORS = frozenset({TASK_TIMEOUT, HEARTBEAT_TIMEOUT})


class RolloutTimeouts(NamedTuple):
    """The two limits of a rollout's callback task, whole seconds: ``TimeoutSecondsPath``
    (``timeout_seconds``) and ``HeartbeatSecondsPath`` (``heartbeat_seconds``), always
    ``1 <= heartbeat_seconds < timeout_seconds``: the States Language requires the heartbeat to be
    smaller than the timeout (Step Functions developer guide, "Task workflow state": HeartbeatSeconds
    "must be a positive, non-zero integer less than the number of seconds specified in the
    TimeoutSeconds field"). ``heartbeat_on``: whether the gateway heartbeats the task (see `rollout_timeouts`).
    """

    timeout_seconds: int
    heartbeat_seconds: int
    heartbeat_on: bool

    @property
    def max_rollout_seconds(self) -> int:
        """The rollout's own limit (``max_rollout_time``, rounded up): the task's timeout with the heartbeat on;
        with it off, the heartbeat, which no heartbeat resets, so it ends the task then (or the timeout, in a
        batch planned before the heartbeat was kept below it)."""
        return self.timeout_seconds if self.heartbeat_on else min(self.heartbeat_seconds, self.timeout_seconds)

    @classmethod
    def of(cls, timeout_seconds: int, heartbeat_seconds: int, heartbeat_on: bool | None) -> "RolloutTimeouts":
        """The timeouts a batch carries (`stepwise.records.BatchRef`). ``heartbeat_on`` None: a batch planned
        before the batch carried it, when "off" was a heartbeat equal to the timeout, so on iff below it."""
        if heartbeat_on is None:
            heartbeat_on = 0 < heartbeat_seconds < timeout_seconds
        return cls(timeout_seconds, heartbeat_seconds, heartbeat_on)


def rollout_timeouts(max_rollout_time: float, rollout_heartbeat_seconds: int) -> RolloutTimeouts:
    """The callback task's timeouts for a run's ``max_rollout_time`` (seconds, > 0) and
    ``rollout_heartbeat_seconds`` (>= 0), with ``T = ceil(max_rollout_time)`` (at least 1):

    - heartbeat on (``0 < rollout_heartbeat_seconds < T``): timeout ``T``, heartbeat
      ``rollout_heartbeat_seconds``; the gateway heartbeats the task on the agent's LLM calls;
    - off (``0``, or not below ``T``): heartbeat ``T`` and timeout ``T + 1``. The gateway sends no heartbeat,
      so the heartbeat's clock runs from the task's start and ends it at ``T``, exactly when
      ``max_rollout_time`` says (never earlier), while staying below the timeout as Step Functions requires;
      `timeout_cause` names that end ``no result within T s (max_rollout_time)``.
    """
    limit = max(1, math.ceil(max_rollout_time))
    if 0 < rollout_heartbeat_seconds < limit:
        return RolloutTimeouts(limit, rollout_heartbeat_seconds, True)
    return RolloutTimeouts(limit + 1, limit, False)


def heartbeat_interval(heartbeat_seconds: int) -> float:
    """Seconds between two heartbeats the gateway sends for one rollout (at most once per interval): a
    tenth of the heartbeat timeout, at least 1 s and at most 60 s. An agent that calls its LLM at least
    every ``heartbeat_seconds - interval`` (0.9 x, for timeouts up to 600 s) is never stopped."""
    return float(min(60.0, max(1.0, heartbeat_seconds / 10)))


def timeout_cause(error: str, timeouts: RolloutTimeouts) -> str | None:
    """The cause of a rollout that ended with the task error ``error``, in words; None when ``error`` is
    not a task timeout. A heartbeat timeout with the heartbeat on is ``no LLM call for N s
    (rollout_heartbeat_seconds)``; every other timeout is the rollout's own ``no result within N s
    (max_rollout_time)`` (with the heartbeat off, the heartbeat is what ends the task at that limit)."""
    if error not in TIMEOUT_ERRORS:
        return None
    if error == HEARTBEAT_TIMEOUT and timeouts.heartbeat_on:
        return (f"no LLM call for {timeouts.heartbeat_seconds} s (rollout_heartbeat_seconds): the agent died, hung, "
                f"or ran a tool call longer than that")
    return f"no result within {timeouts.max_rollout_seconds} s (max_rollout_time)"
