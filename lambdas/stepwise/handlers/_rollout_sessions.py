"""Ending a rollout's two sessions, shared by the rollout handlers and the run's stop paths.

A rollout holds a gateway session (``sessions/{sid}.json``: what lets its agent sample) and an AgentCore
runtime session (``runtimeSessionId = sid``: the agent's microVM, billed and counted against the
account's active-session quota until it ends). FinishRollout ends both when the rollout ends. A run that
stops while rollouts are in flight (StopExecution, a failure, a timeout: the Map's children are
abandoned and their FinishRollout never runs) ends them in StopSession and Cleanup
(`end_abandoned_rollouts`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepwise.aws import agentcore
from stepwise.handlers._common import logger, redact
from stepwise.layout import rollouts_prefix, session_key, start_markers_prefix

if TYPE_CHECKING:
    from stepwise.config import RunConfig
    from stepwise.records import PlannedBatch, RunState


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


def started_without_record(rs: Any, run_id: str, batch: PlannedBatch) -> list[str]:
    """The sids of ``batch``'s rollouts that were started (a start marker) and have no rollout record."""
    markers = rs.list_keys(start_markers_prefix(run_id, batch.step, batch.generation_batch, batch.kind))
    if not markers:
        return []
    recorded = {k.rsplit("/", 1)[-1].removesuffix(".json")
                for k in rs.list_keys(rollouts_prefix(run_id, batch.step, batch.generation_batch, batch.kind))}
    sids = [(rs.get_json_or(k) or {}).get("sid") for k in markers if k.endswith(".json")]
    return [sid for sid in sids if sid and sid not in recorded]


def end_abandoned_rollouts(rs: Any, cfg: RunConfig, state: RunState) -> int:
    """Close and stop the sessions of the rollouts in flight when the run stops: those of the planned
    batch and of a batch rolled out ahead (`RunState.current_batch`, ``ahead_batch``) that were started
    and have no record. Returns how many runtime sessions it stopped. Never raises (each failure is
    logged): it runs on the way out of a run, where stopping the training session matters most."""
    stopped = 0
    for batch in (state.current_batch, state.ahead_batch):
        if batch is None:
            continue
        try:
            sids = started_without_record(rs, state.run_id, batch)
        except Exception as exc:
            logger.warning("could not list the rollouts in flight", extra={"error": type(exc).__name__})
            continue
        for sid in sids:
            try:
                close_gateway_session(rs, sid)
                stopped += agentcore.stop_session(cfg.agent_runtime_arn, cfg.region, session_id=sid)
            except Exception as exc:
                logger.warning("could not end an abandoned rollout's sessions",
                               extra={"error": type(exc).__name__, "detail": redact(str(exc), sid)[:300]})
    if stopped:
        logger.info("runtime sessions of abandoned rollouts stopped", extra={"stopped": stopped})
    return stopped
