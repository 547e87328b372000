"""DAPO pieces that run outside the loss: dynamic sampling and overlong reward shaping.

Sources:
- DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale",
  arXiv:2503.14476. Dynamic sampling: sec. 3.2 (eq. 11's constraint
  ``0 < |{o_i : is_equivalent(a, o_i)}| < G``: keep only groups whose rewards differ, over-sample
  until the batch is full). Overlong reward shaping: sec. 3.4, eq. 13.
- The `train_dapo.py` proposal for this toolkit: each step rolls out
  generation batches of ``batch_size`` prompts and keeps informative groups until
  ``batch_size`` are kept; ``max_num_gen_batches`` caps it, and hitting the cap saves a
  checkpoint and stops.

Clip-Higher is not here: it is the loss's ``clip_low_threshold`` / ``clip_high_threshold``
(`RunConfig.loss_fn_config`), computed by the training service.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Generic, Literal, TypeVar

__all__ = [
    "GenerationBatchDecision",
    "decide_generation_batch",
    "is_informative_group",
    "overlong_penalty",
    "sampling_metrics",
]

G = TypeVar("G")
Status = Literal["ready", "need_more", "cap_reached"]


def is_informative_group(rewards_G: Sequence[Any]) -> bool:
    """True when the group's rewards are not all equal (DAPO eq. 11's constraint).

    The negation of `stepwise.core.advantages.carries_no_signal`, the one test the estimators (exact
    zero advantages) and ``advantages/zero_groups_fraction`` use too: exact equality, as the seed
    (``len(set(rewards)) > 1``); a group of fewer than 2 is never informative. With per-turn rewards
    (one list per member), a group is informative when some turn index's reward-to-go differs
    between members.
    """
    from stepwise.core.advantages import carries_no_signal

    return not carries_no_signal(rewards_G)


def _default_rewards_of(group: Any) -> Sequence[float]:
    if isinstance(group, Mapping):
        return group["rewards"]
    return group


@dataclasses.dataclass(frozen=True)
class GenerationBatchDecision(Generic[G]):
    """What to do after a generation batch.

    Attributes:
        keep: the groups kept so far (informative only), in prompt order; exactly
            ``batch_size`` long when ``status == "ready"``, shorter otherwise.
        status: ``"ready"`` (train on ``keep``), ``"need_more"`` (roll out another generation
            batch) or ``"cap_reached"`` (``max_num_gen_batches`` used without filling the
            batch: save a checkpoint and stop, per the seed).
        dropped_uninformative: groups of the new batch filtered out for equal rewards.
        surplus: informative groups beyond ``batch_size``, cut off by the truncation.
    """

    keep: list[G]
    status: Status
    dropped_uninformative: int
    surplus: int


def decide_generation_batch(
    kept_so_far: Sequence[G],
    new_groups: Sequence[G],
    *,
    batch_size: int,
    gen_batches_used: int,
    max_num_gen_batches: int,
    rewards_of: Callable[[G], Sequence[float]] = _default_rewards_of,
) -> GenerationBatchDecision[G]:
    """DAPO dynamic sampling: decide after one more generation batch of a step.

    Args:
        kept_so_far: informative groups kept from this step's earlier generation batches.
        new_groups: the groups of the generation batch just rolled out, in prompt order.
        batch_size: groups one optimizer step trains on.
        gen_batches_used: generation batches rolled out in this step, including this one (>= 1).
        max_num_gen_batches: the cap (>= 1).
        rewards_of: reads a group's rewards_G (default: ``group["rewards"]`` for mappings,
            else the group itself is the rewards sequence).

    Returns:
        A `GenerationBatchDecision`. Truncation is deterministic: earlier generation batches
        first, then prompt order, as verl's DAPO recipe (``batch[:traj_bsz]``).

    Raises:
        ValueError: ``batch_size``, ``gen_batches_used`` or ``max_num_gen_batches`` < 1.
    """
    for name, value in (("batch_size", batch_size), ("gen_batches_used", gen_batches_used),
                        ("max_num_gen_batches", max_num_gen_batches)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1 (got {value})")
    informative = [g for g in new_groups if is_informative_group(rewards_of(g))]
    kept = [*kept_so_far, *informative]
    dropped = len(new_groups) - len(informative)
    if len(kept) >= batch_size:
        return GenerationBatchDecision(kept[:batch_size], "ready", dropped, len(kept) - batch_size)
    status: Status = "cap_reached" if gen_batches_used >= max_num_gen_batches else "need_more"
    return GenerationBatchDecision(kept, status, dropped, 0)


def overlong_penalty(length: int, *, max_len: int, buffer_len: int, penalty_factor: float = 1.0) -> float:
    """DAPO soft overlong punishment (arXiv:2503.14476 eq. 13), scaled by ``penalty_factor``.

    With L_max = ``max_len`` and L_cache = ``buffer_len``::

        R_length(y) = 0                               if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache   if L_max - L_cache < |y| <= L_max
                    = -1                              if L_max < |y|

    The result (<= 0) is added to the rollout's reward. ``buffer_len == 0`` turns shaping off
    (returns 0.0). In this project ``length`` is the tokens the policy sampled in the rollout
    and ``max_len`` is ``max_tokens_per_rollout``.

    Raises:
        ValueError: negative ``length`` / ``buffer_len`` / ``penalty_factor``, or
            ``buffer_len >= max_len`` when shaping is on.
    """
    if length < 0 or buffer_len < 0 or penalty_factor < 0:
        raise ValueError(
            f"length, buffer_len and penalty_factor must be >= 0 (got {length}, {buffer_len}, {penalty_factor})"
        )
    if buffer_len == 0:
        return 0.0
    if buffer_len >= max_len:
        raise ValueError(f"buffer_len must be < max_len (got buffer_len={buffer_len}, max_len={max_len})")
    expected = max_len - buffer_len
    if length <= expected:
        return 0.0
    if length <= max_len:
        return (expected - length) / buffer_len * penalty_factor
    return -1.0 * penalty_factor


def sampling_metrics(
    *, gen_batches: int, groups_rolled_out: int, groups_kept: int, empty_rollouts: int, surplus_groups: int = 0
) -> dict[str, float]:
    """The per-step ``sampling/`` metrics the seed logs: generation batches, filtered fraction,
    kept groups, and empty rollouts (no captured turn, so no trainable datum).

    ``filtered_fraction`` = groups dropped for equal rewards / groups rolled out, i.e.
    ``(rolled_out - kept - surplus) / rolled_out``: informative groups cut off by the truncation to
    ``batch_size`` (``surplus_groups``, reported on their own) are not "filtered", so the fraction
    estimates the share of all-equal groups in the data the policy sees.
    """
    filtered = (groups_rolled_out - groups_kept - surplus_groups) / groups_rolled_out if groups_rolled_out else 0.0
    return {
        "sampling/generation_batches": float(gen_batches),
        "sampling/filtered_fraction": max(0.0, filtered),
        "sampling/kept_groups": float(groups_kept),
        "sampling/surplus_groups": float(surplus_groups),
        "sampling/empty_rollouts": float(empty_rollouts),
    }
