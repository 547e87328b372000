"""Replay captured gateway turns into the `TraceRecord`s the in-process gateway would produce.

Contract (docs/internals.md, "Captured turn"): the serverless gateway persists each turn as its
own S3 object holding exactly the arguments of the toolkit's
``TrajectoryManager.record_turn(sid, turn=, prompt_messages=, response_message=, metadata=)``.
`replay_turns` feeds them, in key order, into a fresh `TrajectoryManager` and then does what the
toolkit's ``BaseAdapter.finish_session`` does (`rollout_gateway/adapters/common.py`, tree mode):
``get_trajectory(sid, base_sample=BaseTrace(rollout_id=sid), reward=reward,
max_sample_tokens=<session max_context_tokens>)``, then decodes each record's trained tail into
``.response`` with the tokenizer (``skip_special_tokens=False``) when one is given.

`replay_session` also says which LLM turn each trained span of each record came from (per-turn
rewards need it: a record of a trajectory-tree leaf holds several turns, a turn shared by sibling
leaves is trained in one of them, a sub-agent's or a rewound history's turns sit in leaves of their
own). Also here: the JSON form of a `TraceRecord` for rollout records in S3 (one home for it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from agentcore_rl_toolkit.rollout_gateway import BaseTrace, Status, TraceRecord, TrajectoryManager, TurnRecord

__all__ = ["Replay", "ReplayError", "replay_session", "replay_turns", "turn_record_from_json", "record_to_json",
           "record_from_json"]

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


class _SpanManager(TrajectoryManager):
    """The toolkit's `TrajectoryManager`, unchanged, that also notes per emitted record the span of
    each LLM turn's response in it. The toolkit's linearization decides everything; this only reads
    its builders afterwards: a turn appended CLEAN or opening a FORK ends up with its builder's tokens
    equal to ``prompt_ids + output_ids`` at its position, so its response sits at
    ``[len(prompt_ids), len(prompt_ids) + len(output_ids))``, in the first builder (walking in chain
    order) whose tokens hold exactly that prefix."""

    def __init__(self) -> None:
        super().__init__()
        self.spans: list[list[list[int]]] = []
        self._builders: list[Any] = []

    def _split_chain_into_builders(self, chain: list[Any]) -> list[Any]:
        builders = super()._split_chain_into_builders(chain)
        b = 0
        for node in (n for n in chain if n.role == "assistant" and n.turn is not None):
            p, o = node.turn.prompt_ids, node.turn.output_ids
            while b < len(builders) and not (builders[b].tokens[:len(p)] == p
                                             and builders[b].tokens[len(p):len(p) + len(o)] == o):
                b += 1
            if b == len(builders):  # the toolkit's linearization changed: fail loudly, never misattribute
                raise ReplayError(f"turn {node.turn_index} is in none of its leaf's samples")
            builders[b].__dict__.setdefault("stepwise_turns", []).append(
                (int(node.turn_index) - 1, len(p), len(p) + len(o)))
        self._builders = builders
        return builders

    def _chain_to_samples(self, chain: list[Any], **kwargs: Any) -> list[TraceRecord]:
        records = super()._chain_to_samples(chain, **kwargs)
        kept = [b for b in self._builders if b.has_trained_response()]
        if len(kept) != len(records):
            raise ReplayError(f"{len(records)} samples from {len(kept)} trained builders")
        for builder, record in zip(kept, records, strict=True):
            start, n = builder.leading_prompt_len, len(record.loss_mask)
            spans = []
            for turn, s, e in builder.__dict__.get("stepwise_turns", []):
                lo, hi = max(0, s - start), min(n, e - start)
                if hi > lo:
                    spans.append([turn, lo, hi])
            self.spans.append(spans)
        return records


@dataclasses.dataclass
class Replay:
    """A replayed session: its TraceRecords, per record the ``[turn, start, end]`` spans of its
    response region (loss-mask positions) each LLM turn produced (turn = 0-based index in the order
    the turns were recorded), and how many LLM turns were recorded."""

    records: list[TraceRecord]
    turn_spans: list[list[list[int]]]
    num_turns: int


def replay_session(
    sid: str,
    turns: Mapping[str, Mapping[str, Any]] | Sequence[Mapping[str, Any]],
    reward: float,
    tokenizer: Any | None = None,
    *,
    max_context_tokens: int = 0,
    extra_metadata: dict[str, Any] | None = None,
) -> Replay:
    """`replay_turns`, plus the turn spans of every record and the number of LLM turns (`Replay`).

    Same arguments, records and errors as `replay_turns`.
    """
    manager = _SpanManager()
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
    num_turns = manager.turn_count(sid)
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
    return Replay(records, manager.spans, num_turns)


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
    return replay_session(sid, turns, reward, tokenizer, max_context_tokens=max_context_tokens,
                          extra_metadata=extra_metadata).records


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
