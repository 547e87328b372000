"""Rollout liveness: how long a rollout may run, how long its agent may stay silent, when its task looks for a
result whose notification never came, and how its end is named (pure; no AWS, no clock).

A rollout's callback task (the Map child's "Start rollout") times out after ``max_rollout_time``
(``TimeoutSecondsPath``) and, with ``rollout_heartbeat_seconds`` on, after that long without a
heartbeat (``HeartbeatSecondsPath``; `rollout_timeouts` keeps it below the timeout in every configuration,
and "off" never ends a rollout before its timeout would). The gateway sees every LLM call of the rollout and sends
``SendTaskHeartbeat`` for its task (at most once per `heartbeat_interval`, and while a call is in
flight), so a dead or hung agent frees its place after ``rollout_heartbeat_seconds`` instead of
``max_rollout_time``. Step Functions reports the two ends as ``States.Timeout`` and
``States.HeartbeatTimeout`` (Step Functions developer guide, "Error names"); `timeout_cause` names them.

The result re-check: an S3 notification can come late (a minute or more) or, rarely, never (S3 user guide,
"Event notifications": at-least-once). PlanStep's batches therefore have a heartbeat of at most
``rollout_recheck_seconds`` (`rollout_timeouts`): after that long without an LLM call or a result, the heartbeat
timeout hands the rollout to "Wait for rollout result", whose OnRolloutResult call looks for the result object;
found, the task ends with it at once; not found, `recheck_verdict` says whether the agent is still within
``rollout_heartbeat_seconds`` of its last LLM call and the rollout within ``max_rollout_time`` (then the same
state waits again, with a fresh task token), or not (``RolloutSilent`` / ``RolloutOverdue``, named as the task's
own timeouts by `task_error` and `timeout_cause`). No polling: a check runs only after a silence.
"""

from __future__ import annotations

import math
from typing import NamedTuple

#: The error of a task past its ``TimeoutSeconds``.
TASK_TIMEOUT = "States.Timeout"
#: The error of a task without a heartbeat for its ``HeartbeatSeconds``.
HEARTBEAT_TIMEOUT = "States.HeartbeatTimeout"
#: The result re-check's ends (OnRolloutResult raises them; "Wait for rollout result" hands them to FinishRollout):
#: the agent made no LLM call for ``rollout_heartbeat_seconds``, or the rollout passed ``max_rollout_time``.
AGENT_SILENT = "RolloutSilent"
ROLLOUT_OVERDUE = "RolloutOverdue"
TIMEOUT_ERRORS = frozenset({TASK_TIMEOUT, HEARTBEAT_TIMEOUT, AGENT_SILENT, ROLLOUT_OVERDUE})


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


def rollout_timeouts(max_rollout_time: float, rollout_heartbeat_seconds: int,
                     rollout_recheck_seconds: int | None = None) -> RolloutTimeouts:
    """The callback task's timeouts for a run's ``max_rollout_time`` (seconds, > 0) and
    ``rollout_heartbeat_seconds`` (>= 0), with ``T = ceil(max_rollout_time)`` (at least 1):

    - heartbeat on (``0 < rollout_heartbeat_seconds < T``): timeout ``T``, heartbeat
      ``rollout_heartbeat_seconds``; the gateway heartbeats the task on the agent's LLM calls;
    - off (``0``, or not below ``T``): heartbeat ``T`` and timeout ``T + 1``. The gateway sends no heartbeat,
      so the heartbeat's clock runs from the task's start and ends it at ``T``, exactly when
      ``max_rollout_time`` says (never earlier), while staying below the timeout as Step Functions requires;
      `timeout_cause` names that end ``no result within T s (max_rollout_time)``.

    With ``rollout_recheck_seconds`` (PlanStep's batches) the heartbeat is at most that, so a silence always
    ends in a re-check of the result (module doc) rather than the rollout: ``(T, min(recheck, the heartbeat
    when on), True)`` while that is below ``T`` (the gateway heartbeats the task; the re-check judges the
    silence against ``rollout_heartbeat_seconds``); else as without it.
    """
    limit = max(1, math.ceil(max_rollout_time))
    heartbeat = rollout_heartbeat_seconds if 0 < rollout_heartbeat_seconds < limit else limit
    if rollout_recheck_seconds is not None:
        heartbeat = min(heartbeat, max(1, int(rollout_recheck_seconds)))
    if heartbeat < limit:
        return RolloutTimeouts(limit, heartbeat, True)
    return RolloutTimeouts(limit + 1, limit, False)


def recheck_verdict(now: float, *, started_at: float, last_call_at: float | None, timeout_seconds: float,
                    silence_seconds: int) -> str:
    """What a rollout whose task heard nothing for a while, and whose result is not in S3, does next:
    ``"overdue"`` when ``timeout_seconds`` (``max_rollout_time``: `RolloutTimeouts.max_rollout_seconds`) have
    passed since ``started_at``; ``"silent"`` when ``silence_seconds`` (``rollout_heartbeat_seconds``; 0 or not
    below the timeout = off) have passed since its last LLM call (``last_call_at``; None = none yet: since
    ``started_at``); else ``"wait"`` (for its result, or its next heartbeat). Times in epoch seconds."""
    if now - started_at >= timeout_seconds:
        return "overdue"
    if 0 < silence_seconds < timeout_seconds and now - max(started_at, last_call_at or started_at) >= silence_seconds:
        return "silent"
    return "wait"


def heartbeat_interval(heartbeat_seconds: int) -> float:
    """Seconds between two heartbeats the gateway sends for one rollout (at most once per interval): a
    tenth of the heartbeat timeout, at least 1 s and at most 60 s. An agent that calls its LLM at least
    every ``heartbeat_seconds - interval`` (0.9 x, for timeouts up to 600 s) is never stopped."""
    return float(min(60.0, max(1.0, heartbeat_seconds / 10)))


def task_error(error: str) -> str:
    """The Step Functions name of a rollout's end as the re-check reports it (``RolloutSilent`` ->
    ``States.HeartbeatTimeout``, ``RolloutOverdue`` -> ``States.Timeout``): a rollout record names a timeout the
    same way whichever noticed it, the task's own timer or the re-check; other errors unchanged."""
    return {AGENT_SILENT: HEARTBEAT_TIMEOUT, ROLLOUT_OVERDUE: TASK_TIMEOUT}.get(error, error)


def timeout_cause(error: str, timeouts: RolloutTimeouts, *, silence_seconds: int | None = None) -> str | None:
    """The cause of a rollout that ended with the task error ``error``, in words; None when ``error`` is
    not a task timeout. A heartbeat timeout with the heartbeat on, or the re-check's ``RolloutSilent``, is
    ``no LLM call for N s (rollout_heartbeat_seconds)`` (N: ``silence_seconds`` when given, else the task's
    heartbeat); every other timeout is the rollout's own ``no result within N s (max_rollout_time)`` (with the
    heartbeat off, the heartbeat is what ends the task at that limit)."""
    if error not in TIMEOUT_ERRORS:
        return None
    if error == AGENT_SILENT or (error == HEARTBEAT_TIMEOUT and timeouts.heartbeat_on):
        return (f"no LLM call for {silence_seconds or timeouts.heartbeat_seconds} s (rollout_heartbeat_seconds): the "
                f"agent died, hung, or ran a tool call longer than that")
    return f"no result within {timeouts.max_rollout_seconds} s (max_rollout_time)"
