"""Replay captured gateway turns into the `TraceRecord`s the in-process gateway would produce.

Contract (docs/internals.md, "Captured turn"): the serverless gateway persists each turn as its
own S3 object holding exactly the arguments of the toolkit's
``TrajectoryManager.record_turn(sid, turn=, prompt_messages=, response_message=, metadata=)``.
`replay_turns` feeds them, in key order, into a fresh `TrajectoryManager` and then does what the
toolkit's ``BaseAdapter.finish_session`` does (`rollout_gateway/adapters/common.py`, tree mode):
``get_trajectory(sid, base_sample=BaseTrace(rollout_id=sid), reward=reward,
max_sample_tokens=<session max_context_tokens>)``, then decodes each record's trained tail into
``.response`` with the tokenizer (``skip_special_tokens=False``) when one is given.

Also here: the JSON form of a `TraceRecord` for rollout records in S3 (one home for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentcore_rl_toolkit.rollout_gateway import BaseTrace, Status, TraceRecord, TrajectoryManager, TurnRecord

__all__ = ["ReplayError", "replay_turns", "turn_record_from_json", "record_to_json", "record_from_json"]

_TURN_FIELDS = {f.name for f in dataclasses.fields(TurnRecord)}
_RECORD_FIELDS = {f.name for f in dataclasses.fields(TraceRecord)}


class ReplayError(ValueError):
    """A captured turn does not have the contract's shape; names the turn's key or index."""


def turn_record_from_json(turn: Mapping[str, Any]) -> TurnRecord:
    """Build a `TurnRecord` from its JSON form (``prompt_ids``, ``output_ids``, ``finish_reason``,
    optional ``output_log_probs`` and ``ill_formed``).

    Raises:
        ReplayError: missing or unknown fields.
    """
    unknown = set(turn) - _TURN_FIELDS
    missing = {"prompt_ids", "output_ids", "finish_reason"} - set(turn)
    if unknown or missing:
        raise ReplayError(f"turn fields: missing {sorted(missing)}, unknown {sorted(unknown)}")
    return TurnRecord(
        prompt_ids=[int(t) for t in turn["prompt_ids"]],
        output_ids=[int(t) for t in turn["output_ids"]],
        finish_reason=str(turn["finish_reason"]),
        output_log_probs=[float(x) for x in turn.get("output_log_probs") or []],
        ill_formed=bool(turn.get("ill_formed", False)),
    )


def _ordered(turns: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]]) -> Iterable[tuple[str, Mapping]]:
    if isinstance(turns, Mapping):
        return ((key, turns[key]) for key in sorted(turns))
    return ((f"#{i}", body) for i, body in enumerate(turns))


def replay_turns(
    sid: str,
    turns: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    reward: float,
    tokenizer: Any | None = None,
    *,
    max_context_tokens: int = 0,
    extra_metadata: dict[str, Any] | None = None,
) -> list[TraceRecord]:
    """The session's TraceRecords, as the in-process ``RolloutGateway.finish_session`` yields them.

    Args:
        sid: the session id; becomes every record's ``rollout_id``.
        turns: captured turn bodies, either ``{key: body}`` (replayed in sorted key order; keys
            are ``{completed_at_ns:020d}-{uuid}``) or a list already in key order. Each body has
            ``turn``, ``prompt_messages``, ``response_message`` and ``metadata``; other keys
            (provenance) are ignored.
        reward: the rollout's reward, set on every record (toolkit ``get_trajectory``).
        tokenizer: anything with ``decode(ids, skip_special_tokens=)``; fills ``.response``.
        max_context_tokens: the session's ``max_context_tokens`` (the gateway passes it as
            ``max_sample_tokens``, truncating longer records); 0 = no truncation.
        extra_metadata: merged into every record's metadata (the gateway passes none in tree mode).

    Returns:
        One TraceRecord per trained sample of each trajectory-tree leaf, in leaf order.

    Raises:
        ReplayError: a turn body without the contract's fields (names its key).
    """
    manager = TrajectoryManager()
    for key, body in _ordered(turns):
        try:
            turn = turn_record_from_json(body["turn"])
            prompt_messages = body["prompt_messages"]
            response_message = body.get("response_message")
            metadata = body.get("metadata")
        except (KeyError, TypeError, ValueError) as e:
            raise ReplayError(f"sid {sid} turn {key}: not a captured turn ({type(e).__name__}: {e})") from e
        manager.record_turn(
            sid, turn=turn, prompt_messages=prompt_messages, response_message=response_message, metadata=metadata
        )
    records = manager.get_trajectory(
        sid,
        base_sample=BaseTrace(rollout_id=sid),
        reward=reward,
        extra_metadata=extra_metadata,
        max_sample_tokens=int(max_context_tokens or 0),
    )
    if tokenizer is not None:
        for r in records:
            rlen = int(r.response_length or 0)
            r.response = tokenizer.decode(r.token_ids[-rlen:], skip_special_tokens=False) if rlen and r.token_ids else ""
    return records


def record_to_json(record: TraceRecord) -> dict[str, Any]:
    """A TraceRecord as JSON-ready dict (``status`` as its string value)."""
    out = dataclasses.asdict(record)
    out["status"] = record.status.value
    return out


def record_from_json(data: Mapping[str, Any]) -> TraceRecord:
    """Inverse of `record_to_json`; unknown keys are rejected (ValueError naming them)."""
    unknown = set(data) - _RECORD_FIELDS
    if unknown:
        raise ValueError(f"unknown TraceRecord fields {sorted(unknown)}; accepted: {sorted(_RECORD_FIELDS)}")
    fields = dict(data)
    if "status" in fields:
        fields["status"] = Status(fields["status"])
    return TraceRecord(**fields)
