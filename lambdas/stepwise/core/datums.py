"""TraceRecord + advantage -> SageMaker Training Sessions datum.

Source: `agentcore_rl_toolkit/backends/experimental/sagemaker/datum.py` ``trace_record_to_datum``,
used as is (it imports only the torch-free `rollout_gateway` package), so our datums are the
reference's byte for byte: input tokens = ``token_ids[:-1]``, targets = ``token_ids[1:]``,
``weights`` / ``logprobs`` / ``advantages`` zero-padded over the prompt (``prompt_length - 1``
positions), advantages multiplied by the loss mask; records with an empty or all-zero loss
mask, or no prompt token, give ``None``.

The datum is the wire shape of botocore's ``sagemakertrainingsessionruntime`` ``Datum``
(``modelInput.chunks``, ``lossFnInputs`` tensors with data/dtype/shape), which the SDK's
``forward_backward`` accepts as "raw datum dicts".
"""

from __future__ import annotations

from collections.abc import Sequence

from agentcore_rl_toolkit.backends.experimental.sagemaker.datum import trace_record_to_datum
from agentcore_rl_toolkit.rollout_gateway import TraceRecord

__all__ = ["trace_record_to_datum", "trace_record_to_turn_datum", "group_to_datums", "group_to_turn_datums"]


def group_to_datums(records_G: Sequence[Sequence[TraceRecord]], advantages_G: Sequence[float]) -> list[dict]:
    """All datums of one group, in member order, dropping ``None`` (reference train_grpo.py loop).

    Args:
        records_G: per group member (rollout), its TraceRecords (one per trajectory-tree leaf).
        advantages_G: per group member, its advantage; every record of a rollout gets it.

    Raises:
        ValueError: the two sequences differ in length.
    """
    if len(records_G) != len(advantages_G):
        raise ValueError(f"records_G has {len(records_G)} members but advantages_G has {len(advantages_G)}")
    datums: list[dict] = []
    for records, advantage in zip(records_G, advantages_G, strict=True):
        for record in records:
            datum = trace_record_to_datum(record, advantage)
            if datum is not None:
                datums.append(datum)
    return datums


def trace_record_to_turn_datum(record: TraceRecord, turn_spans: Sequence[Sequence[int]],
                               advantages_T: Sequence[float]) -> dict | None:
    """The reference datum of ``record``, with each LLM turn's tokens carrying that turn's advantage.

    Built by the reference's ``trace_record_to_datum`` (advantage 1.0, so its ``advantages`` are the
    loss mask), whose ``advantages`` then become, per response position j, ``loss_mask[j] *
    advantages_T[turn(j)]`` (zero-padded over the prompt like every other tensor). With every turn's
    advantage equal to ``a`` the datum equals ``trace_record_to_datum(record, a)``.

    Args:
        record: one TraceRecord (a trajectory-tree leaf's sample; it may hold several turns).
        turn_spans: ``[turn, start, end]`` of the record's response region (loss-mask positions)
            each turn produced (`stepwise.core.replay.replay_session`).
        advantages_T: the rollout's advantage per LLM turn; a span whose turn has none gets 0.0.

    Returns:
        The datum, or ``None`` where the reference gives none (no loss-mask token, no prompt token).
    """
    datum = trace_record_to_datum(record, 1.0)
    if datum is None:
        return None
    per_position = [0.0] * len(record.loss_mask)
    for turn, start, end in turn_spans:
        advantage = float(advantages_T[turn]) if 0 <= turn < len(advantages_T) else 0.0
        per_position[start:end] = [advantage] * (end - start)
    pad = len(record.token_ids) - len(record.loss_mask) - 1
    datum["lossFnInputs"]["advantages"]["data"] = [0.0] * pad + [
        float(m) * a for m, a in zip(record.loss_mask, per_position, strict=True)]
    return datum


def group_to_turn_datums(records_G: Sequence[Sequence[TraceRecord]], turn_spans_G: Sequence[Sequence[Sequence]],
                         advantages_GT: Sequence[Sequence[float]]) -> list[dict]:
    """All datums of one group with per-turn advantages, in member order, dropping ``None``.

    Args:
        records_G: per member, its TraceRecords.
        turn_spans_G: per member, per record, its ``[turn, start, end]`` spans.
        advantages_GT: per member, one advantage per LLM turn.

    Raises:
        ValueError: the three differ in members, or a member's spans do not match its records.
    """
    if not len(records_G) == len(turn_spans_G) == len(advantages_GT):
        raise ValueError(f"records_G has {len(records_G)} members, turn_spans_G {len(turn_spans_G)}, "
                         f"advantages_GT {len(advantages_GT)}")
    datums: list[dict] = []
    for records, spans, advantages_T in zip(records_G, turn_spans_G, advantages_GT, strict=True):
        if len(spans) != len(records):
            raise ValueError(f"a member has {len(records)} records but spans for {len(spans)}")
        for record, record_spans in zip(records, spans, strict=True):
            datum = trace_record_to_turn_datum(record, record_spans, advantages_T)
            if datum is not None:
                datums.append(datum)
    return datums
