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

__all__ = ["trace_record_to_datum", "group_to_datums"]


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
