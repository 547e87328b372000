"""Ending a rollout's two sessions, shared by the rollout handlers and the run's stop paths.

A rollout holds a gateway session (``sessions/{sid}.json``: what lets its agent sample) and an AgentCore
runtime session (``runtimeSessionId = sid``: the agent's microVM, billed and counted against the
account's active-session quota until it ends). FinishRollout ends both when the rollout ends. A run that
stops while rollouts are in flight (StopExecution, a failure, a timeout: the Map's children are
abandoned and their FinishRollout never runs) ends them after its end is recorded: the rollouts in
flight (`rollouts_in_flight`: start markers without a record) are ended in parallel within the time
left (`end_rollouts`), and the rest is handed to the session sweeper (`stepwise.handlers._leftovers`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise.aws import agentcore
from stepwise.concurrency import RateLimiter, run_until
from stepwise.handlers._common import logger, redact
from stepwise.layout import rollouts_prefix, session_key, start_markers_prefix

if TYPE_CHECKING:
    from stepwise.config import RunConfig
    from stepwise.records import PlannedBatch


def close_gateway_session(rs: Any, sid: str, known: Any = None) -> dict[str, Any] | None:
    """Close the gateway session ``sid`` (its agent may sample no more); returns its record (None when
    there is none).

    ``known``: the record OnRolloutResult read (the result's ``session``); when it is session
    ``sid``'s, it is closed without reading the record again (keeping the stored record's fields that
    the task's output leaves out)."""
    if isinstance(known, dict) and known.get("sid") == sid and not known.get("closed"):
        record: dict[str, Any] | None = {**known, "closed": True}
        rs.put_json(session_key(sid), record)
        return record
    record = rs.get_json_or(session_key(sid))
    if record is not None and not record.get("closed"):
        record["closed"] = True
        rs.put_json(session_key(sid), record)
    return record


def started_without_record(rs: Any, run_id: str, batch: PlannedBatch, *, workers: int = 1,
                           deadline: float = float("inf"), group: tuple[int, int] | None = None) -> list[str]:
    """The sids of ``batch``'s rollouts (or, with ``group`` = ``(id, attempt)``, that group's: admission
    group) that were started (a start marker) and have no rollout record: two listings, then the start
    markers without a record read ``workers`` at a time.

    Raises:
        TimeoutError: ``deadline`` (``time.monotonic``) came before every marker was read.
    """
    folder = {"group": group[0], "attempt": group[1]} if group is not None else {}
    markers = rs.list_keys(start_markers_prefix(run_id, batch.step, batch.generation_batch, batch.kind, **folder))
    if not markers:
        return []
    recorded = {k.rsplit("/", 1)[-1].removesuffix(".json")
                for k in rs.list_keys(rollouts_prefix(run_id, batch.step, batch.generation_batch, batch.kind,
                                                      **folder))}
    keys = [k for k in markers if k.endswith(".json")]
    sids: dict[str, str | None] = {}
    for out in run_until(keys, lambda k: (rs.get_json_or(k) or {}).get("sid"), workers=workers, deadline=deadline):
        if out.error is not None:
            raise out.error
        sids[out.item] = out.result
    if len(sids) < len(keys):
        raise TimeoutError(f"read {len(sids)} of {len(keys)} start markers before the deadline")
    return [sid for k in keys if (sid := sids[k]) and sid not in recorded]


def rollouts_in_flight(rs: Any, run_id: str, batches: list[PlannedBatch], *, workers: int,
                       deadline: float, groups: list[tuple[int, int]] | tuple = ()) -> list[str]:
    """The sids of the rollouts in flight in ``batches`` and in the group executions ``groups``
    (``(id, attempt)``, admission group) (`started_without_record` of each), in order, without repeats:
    what a run's stop must end. Raises as `started_without_record`."""
    from stepwise.records import PlannedBatch as _Planned

    sids: list[str] = []
    for batch in batches:
        sids += started_without_record(rs, run_id, batch, workers=workers, deadline=deadline)
    for group in groups:  # a group's folder is named by (id, attempt) alone
        sids += started_without_record(rs, run_id, _Planned(kind="train", step=0), workers=workers,
                                       deadline=deadline, group=(group[0], group[1]))
    return list(dict.fromkeys(sids))


def end_rollout(rs: Any, cfg: RunConfig, sid: str, limiter: RateLimiter | None = None) -> bool:
    """Close rollout ``sid``'s gateway session (its agent may sample no more) and stop its runtime
    session (StopRuntimeSession, at most ``limiter``'s rate: ACR's quota is per runtime and shared
    with InvokeAgentRuntime). True when a runtime session was stopped, False when it had ended.
    Idempotent. Raises what `stepwise.aws.agentcore.stop_session` and S3 raise."""
    close_gateway_session(rs, sid)
    if limiter is not None:
        limiter.acquire()
    return agentcore.stop_session(cfg.agent_runtime_arn, cfg.region, session_id=sid)


#: The share of ``acr_tps_limit`` a stop's StopRuntimeSession calls are paced at: requests paced at the
#: quota itself arrive at the service with jitter and some land in a window past it (throttled, then
#: retried by botocore); 90% leaves room for that.
STOP_PACE = 0.9


@dataclass
class EndedRollouts:
    """What `end_rollouts` did: ``ended`` (sids whose sessions are ended, or were already),
    ``stopped`` (runtime sessions it stopped), ``failed`` (sid -> the error, to retry), ``left``
    (sids not tried before the deadline, to retry)."""

    ended: list[str] = field(default_factory=list)
    stopped: int = 0
    failed: dict[str, str] = field(default_factory=dict)
    left: list[str] = field(default_factory=list)


def end_rollouts(rs: Any, cfg: RunConfig, sids: list[str], *, deadline: float, workers: int,
                 on_ended: Callable[[list[str]], None] | None = None, flush_s: float = 1.0) -> EndedRollouts:
    """End the sessions of the rollouts ``sids`` (`end_rollout`), ``workers`` at a time, StopRuntimeSession
    at most `STOP_PACE` x ``cfg.acr_tps_limit`` per second, until ``deadline`` (``time.monotonic``). ``on_ended(sids)``
    is called in this thread with the sids ended since its last call, at most every ``flush_s`` seconds
    and once at the end, so the caller records each as it goes. Never raises for one rollout: its error
    is in ``failed``.

    The function a stop calls over "the rollouts in flight" (their sids: `rollouts_in_flight`), whatever
    started them (a Map's children, a group execution)."""
    out = EndedRollouts()
    limiter = RateLimiter(max(1, int(cfg.acr_tps_limit * STOP_PACE)))
    fresh: list[str] = []
    last = time.monotonic()
    done: set[str] = set()
    for o in run_until(sids, lambda sid: end_rollout(rs, cfg, sid, limiter), workers=workers, deadline=deadline):
        done.add(o.item)
        if o.error is not None:
            out.failed[o.item] = redact(f"{type(o.error).__name__}: {o.error}", o.item)[:300]
            continue
        out.ended.append(o.item)
        out.stopped += bool(o.result)
        fresh.append(o.item)
        if on_ended is not None and time.monotonic() - last >= flush_s:
            on_ended(fresh)
            fresh, last = [], time.monotonic()
    if on_ended is not None and fresh:
        on_ended(fresh)
    out.left = [sid for sid in sids if sid not in done]
    if out.failed:
        logger.warning("could not end some abandoned rollouts' sessions",
                       extra={"failed": len(out.failed), "first_error": next(iter(out.failed.values()))})
    return out
