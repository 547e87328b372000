"""GRPO group-relative advantages.

Source: `agentcore_rl_toolkit/backends/experimental/sagemaker/train_grpo.py`
``compute_grpo_advantages`` (GRPO, Shao et al. 2024, arXiv:2402.03300, sec. 4.1.2 outcome
supervision): advantage = (r - mean) / (std + eps), where std is the population std
(numpy's default ddof=0), and the division is skipped when std <= eps, so an all-equal group
gets all-zero advantages instead of dividing by ~0.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["advantage_metrics", "compute_grpo_advantages", "is_all_equal_group"]

EPS = 1e-8


def compute_grpo_advantages(rewards_G: Sequence[float], eps: float = EPS) -> list[float]:
    """Center a group's rewards, and scale by 1 / (std + eps) when std > eps.

    Args:
        rewards_G: one reward per group member (the K responses to one prompt).
        eps: numerical floor, as the reference (1e-8).

    Returns:
        advantages_G, same length and order as ``rewards_G``. ``[]`` for an empty group.

    Example: ``[1, 0, 0, 1]`` -> ``[1, -1, -1, 1]`` (mean 0.5, std 0.5, up to eps).
    """
    if len(rewards_G) == 0:
        return []
    arr = np.asarray(rewards_G, dtype=np.float64)
    centered = arr - arr.mean()
    std = arr.std()
    if std > eps:
        centered = centered / (std + eps)
    return centered.tolist()


def is_all_equal_group(rewards_G: Sequence[float], eps: float = EPS) -> bool:
    """True when the group carries no learning signal: its rewards' population std is <= ``eps``,
    the same test `compute_grpo_advantages` uses to skip the scaling. Such a group's advantages are
    ~0 but not always exactly 0.0 in floating point (``[0.1, 0.1, 0.1]`` centers to ~1e-17)."""
    return len(rewards_G) == 0 or float(np.asarray(rewards_G, dtype=np.float64).std()) <= eps


def advantage_metrics(advantages_P: Sequence[Sequence[float]], rewards_P: Sequence[Sequence[float]]) -> dict[str, float]:
    """Slash-namespaced summary of a step's advantages: mean, std, min, max and
    ``advantages/zero_groups_fraction``, the fraction of groups with no learning signal
    (`is_all_equal_group` of ``rewards_P``, one rewards_G per group, aligned with ``advantages_P``)."""
    if len(advantages_P) != len(rewards_P):
        raise ValueError(f"advantages_P has {len(advantages_P)} groups, rewards_P {len(rewards_P)}")
    flat = np.asarray([a for group in advantages_P for a in group], dtype=np.float64)
    zero_groups = sum(1 for rewards_G in rewards_P if is_all_equal_group(rewards_G))
    if flat.size == 0:
        return {"advantages/zero_groups_fraction": 0.0}
    return {
        "advantages/mean": float(flat.mean()),
        "advantages/std": float(flat.std()),
        "advantages/min": float(flat.min()),
        "advantages/max": float(flat.max()),
        "advantages/zero_groups_fraction": zero_groups / len(advantages_P),
    }
