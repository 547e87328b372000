"""Advantage estimators: a batch of groups' rewards in, one advantage per member (or per turn) out.

One pure function per estimator, chosen by one dispatcher, `compute_advantages(estimator,
rewards_P)`; each takes the whole batch (``rewards_P``: one ``rewards_G`` per group, a group = the
responses to one prompt), so an estimator that normalizes over the batch fits the same shape.

Trajectory estimators (one reward per rollout; every token of every turn of a rollout gets its
rollout's advantage):

- ``grpo`` (the default): ``(r - mean_G) / (std_G + eps)``, scaled only when ``std_G > eps``.
  The reference loop's ``compute_grpo_advantages``, unchanged but for the no-signal rule below.
- ``dr_grpo``: ``r - mean_G`` (Dr. GRPO: no division by the group's std).
- ``rloo``: ``r_i - mean_{j != i} r_j`` (leave-one-out baseline).
- ``reinforce_pp_baseline``: ``r - mean_G``, then whitened over the whole batch (REINFORCE++ with
  baseline).

Per-turn estimator (one reward per LLM turn; each turn's tokens get their own advantage):

- ``per_turn_rloo``: reward-to-go minus a leave-one-out, turn-indexed baseline that does not depend
  on the rollout's own stopping turn (`compute_per_turn_rloo_advantages`).

**No signal** (`carries_no_signal`): a group whose rewards are all exactly equal (or that has fewer
than two members) carries no learning signal. Every estimator gives such a group exactly 0.0 for
every member and turn, whatever the rewards' scale; ``advantages/zero_groups_fraction`` counts these
groups and DAPO's filter drops them (`stepwise.core.dapo.is_informative_group`): one rule for the
three. Computing ``r - mean`` in floating point does not give it: the mean of three equal rewards
``123456789.123`` is off by one unit in the last place, and GRPO's division by a std of ~1.5e-8
(above its eps) turned that rounding into advantages of about +-0.7.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, get_args

import numpy as np

__all__ = [
    "ESTIMATORS",
    "EPS",
    "Estimator",
    "PER_TURN_ESTIMATORS",
    "advantage_metrics",
    "carries_no_signal",
    "compute_advantages",
    "compute_dr_grpo_advantages",
    "compute_grpo_advantages",
    "compute_per_turn_rloo_advantages",
    "compute_reinforce_pp_baseline_advantages",
    "compute_rloo_advantages",
    "rewards_to_go",
]

EPS = 1e-8

Estimator = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "per_turn_rloo"]
#: Every estimator name `compute_advantages` accepts (the config's ``advantage_estimator`` values).
ESTIMATORS: tuple[str, ...] = get_args(Estimator)
#: The estimators that read one reward per LLM turn (``reward_granularity: per_turn``).
PER_TURN_ESTIMATORS: frozenset[str] = frozenset({"per_turn_rloo"})

#: A member's reward: one float (trajectory), or one float per LLM turn (per turn).
MemberReward = float | Sequence[float]


# ------------------------------------------------------------------------------ no signal


def rewards_to_go(rewards_T: Sequence[float], length: int | None = None) -> list[float]:
    """Undiscounted reward-to-go ``G_t = sum_{s >= t} r_s`` of one rollout's per-turn rewards, padded
    with 0.0 to ``length`` turns (a rollout that stopped earlier collects no more reward).

    Example: ``[1, 0, 2]`` -> ``[3, 2, 2]``; with ``length=4`` -> ``[3, 2, 2, 0]``.

    Raises:
        ValueError: ``length`` shorter than ``rewards_T``.
    """
    n = len(rewards_T) if length is None else length
    if n < len(rewards_T):
        raise ValueError(f"length {n} is shorter than the rollout's {len(rewards_T)} turns")
    out = [0.0] * n
    acc = 0.0
    for t in range(len(rewards_T) - 1, -1, -1):
        acc += float(rewards_T[t])
        out[t] = acc
    return out


def _to_go_matrix(rewards_G: Sequence[Sequence[float]]) -> np.ndarray:
    """[G, T_max] reward-to-go of a group's per-turn rewards, zero-padded."""
    t_max = max((len(r) for r in rewards_G), default=0)
    return np.asarray([rewards_to_go(r, t_max) for r in rewards_G], dtype=np.float64).reshape(len(rewards_G), t_max)


def _is_per_turn(rewards_G: Sequence[MemberReward]) -> bool:
    return any(not isinstance(r, (int, float)) for r in rewards_G)


def carries_no_signal(rewards_G: Sequence[MemberReward]) -> bool:
    """True when a group carries no learning signal: fewer than two members, or all rewards exactly
    equal. With per-turn rewards (one list per member), when every turn index's reward-to-go
    (`rewards_to_go`, zero past a rollout's last turn) is exactly equal across the members.

    The one test the estimators (exact-zero advantages), ``advantages/zero_groups_fraction`` and
    DAPO's filter share. Exact equality, as DAPO's seed (``len(set(rewards)) > 1``): it holds at every
    scale (1e-300 as 1e150), and the mean's rounding error cannot turn an all-equal group into one
    with advantages.
    """
    if len(rewards_G) < 2:
        return True
    if _is_per_turn(rewards_G):
        to_go = _to_go_matrix([r if not isinstance(r, (int, float)) else [r] for r in rewards_G])
        return bool(np.all(to_go == to_go[:1]))
    first = float(rewards_G[0])
    return all(float(r) == first for r in rewards_G[1:])


# ------------------------------------------------------------------------------ trajectory estimators


def _group(rewards_G: Sequence[float]) -> np.ndarray:
    return np.asarray([float(r) for r in rewards_G], dtype=np.float64)


def compute_grpo_advantages(rewards_G: Sequence[float], eps: float = EPS) -> list[float]:
    """GRPO: center a group's rewards, and scale by 1 / (std + eps) when std > eps.

    ``A_i = (r_i - mean(r)) / (std(r) + eps)`` if ``std(r) > eps`` else ``r_i - mean(r)``; ``std`` is the
    population std (numpy's ddof=0). A group that carries no signal (`carries_no_signal`) gets exact
    zeros. Source: GRPO (Shao et al. 2024, "DeepSeekMath", arXiv:2402.03300, sec. 4.1.2, outcome
    supervision); the reference loop's ``compute_grpo_advantages``
    (`agentcore_rl_toolkit/backends/experimental/sagemaker/train_grpo.py`), whose output this equals
    on every group that carries a signal. verl's ``compute_grpo_outcome_advantage`` uses the
    Bessel-corrected std and eps 1e-6 instead.

    Args:
        rewards_G: one reward per group member (the K responses to one prompt).
        eps: numerical floor, as the reference (1e-8).

    Returns:
        advantages_G, same length and order as ``rewards_G``. ``[]`` for an empty group.

    Example: ``[1, 0, 0, 1]`` -> ``[1, -1, -1, 1]`` (mean 0.5, std 0.5, up to eps).
    """
    if carries_no_signal(rewards_G):
        return [0.0] * len(rewards_G)
    arr = _group(rewards_G)
    centered = arr - arr.mean()
    std = arr.std()
    if std > eps:
        centered = centered / (std + eps)
    return centered.tolist()


def compute_dr_grpo_advantages(rewards_G: Sequence[float]) -> list[float]:
    """Dr. GRPO: ``A_i = r_i - mean(r)``, no division by the group's std.

    Source: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective",
    arXiv:2503.20783, sec. 3.2 (eq. 3): dividing by std weights prompts by their difficulty
    (low-variance groups, too easy or too hard, get the largest updates). Their second fix, no
    division by each response's length in the loss, holds already: the training service's losses
    are sums over tokens. verl: ``compute_grpo_outcome_advantage(norm_adv_by_std_in_grpo=False)``.

    Args:
        rewards_G: one reward per group member.

    Returns:
        advantages_G (exact zeros for a group that carries no signal); ``[]`` for an empty group.
    """
    if carries_no_signal(rewards_G):
        return [0.0] * len(rewards_G)
    arr = _group(rewards_G)
    return (arr - arr.mean()).tolist()


def compute_rloo_advantages(rewards_G: Sequence[float]) -> list[float]:
    """RLOO: ``A_i = r_i - (1 / (K - 1)) sum_{j != i} r_j`` (leave-one-out baseline, K members).

    Equal to ``K / (K - 1) * (r_i - mean(r))``, which is how it is computed (verl's
    ``compute_rloo_outcome_advantage``). Source: Kool et al. 2019, "Buy 4 REINFORCE Samples, Get a
    Baseline for Free!"; Ahmadian et al. 2024, "Back to Basics: Revisiting REINFORCE Style
    Optimization for Learning from Human Feedback in LLMs", arXiv:2402.14740, sec. 3.2 (eq. 6).

    Args:
        rewards_G: one reward per group member.

    Returns:
        advantages_G (exact zeros for a group that carries no signal, including a group of one,
        which verl leaves at its raw reward); ``[]`` for an empty group.
    """
    if carries_no_signal(rewards_G):
        return [0.0] * len(rewards_G)
    arr = _group(rewards_G)
    k = len(arr)
    return (arr * k / (k - 1) - arr.mean() * k / (k - 1)).tolist()


def compute_reinforce_pp_baseline_advantages(rewards_P: Sequence[Sequence[float]], eps: float = EPS
                                             ) -> list[list[float]]:
    """REINFORCE++ with baseline: subtract each group's mean, then whiten over the whole batch.

    ``a_i = r_i - mean_G(r)``; ``A_i = (a_i - mean_B(a)) / sqrt(var_B(a) + eps)``, where ``mean_B`` and
    ``var_B`` (Bessel-corrected) run over every rollout of the batch, each rollout counted once.
    Source: Hu et al. 2025, "REINFORCE++: A Simple and Efficient Approach for Aligning Large Language
    Models", arXiv:2501.03262, sec. 3 ("REINFORCE++-Baseline"); verl's
    ``compute_reinforce_plus_plus_baseline_outcome_advantage`` + ``masked_whiten``, which weighs each
    rollout by its response tokens (a per-token whitening) where this weighs rollouts equally.
    Groups that carry no signal get exact zeros (they still count in the batch's statistics, as 0).

    Args:
        rewards_P: one rewards_G per group.
        eps: added to the variance, as verl's ``masked_whiten`` (1e-8).

    Returns:
        advantages_P, aligned with ``rewards_P``; all zeros when fewer than two rollouts.
    """
    centered_P = [compute_dr_grpo_advantages(g) for g in rewards_P]
    flat = np.asarray([a for g in centered_P for a in g], dtype=np.float64)
    if flat.size < 2 or not np.any(flat):
        return [[0.0] * len(g) for g in rewards_P]
    mean, var = flat.mean(), flat.var(ddof=1)
    scale = 1.0 / np.sqrt(var + eps)
    return [[0.0] * len(g) if carries_no_signal(g) else ((np.asarray(a) - mean) * scale).tolist()
            for g, a in zip(rewards_P, centered_P, strict=True)]


# ------------------------------------------------------------------------------ per-turn estimator


def compute_per_turn_rloo_advantages(rewards_G: Sequence[Sequence[float]]) -> list[list[float]]:
    """Per-turn advantages: each turn's reward-to-go minus a leave-one-out, turn-indexed baseline.

    With member i's per-turn rewards ``r_{i,0..T_i-1}`` and K members::

        G_{i,t} = sum_{s=t}^{T_i-1} r_{i,s}         (reward-to-go; G_{j,t} = 0 for t >= T_j)
        b_{i,t} = (1 / (K - 1)) sum_{j != i} G_{j,t}  (every other member, stopped ones as 0)
        A_{i,t} = G_{i,t} - b_{i,t}                 for t < T_i

    Why this construction: verl's RFC "Per-turn reward support for multi-turn RL: a turn-level
    baseline that stays unbiased under variable turn counts" (a request for comments posted to the
    verl project, verl-project/verl) shows that normalizing rewards per turn index and summing the
    normalized terms over a trajectory's remaining turns (MT-GRPO style, Wei et al. 2025) subtracts a
    baseline with one term per remaining turn of the trajectory's *own* length: an action-dependent
    baseline, biased whenever the policy decides when to stop (a hidden ``-E[R_intermediate]`` per extra turn). Here the
    baseline of turn t is one term, built only from the *other* members of the group (independent
    samples of the same prompt), so it depends neither on member i's actions nor on when it stopped:
    ``E[grad log pi(a_{i,t}) b_{i,t}] = 0`` and the estimator is unbiased. Turn 0 is RLOO on the
    rollouts' returns (`compute_rloo_advantages` of ``sum_t r_{i,t}``); no std scaling, for the same
    reason as Dr. GRPO. Source of the leave-one-out baseline: Kool et al. 2019; Ahmadian et al. 2024
    (arXiv:2402.14740).

    Args:
        rewards_G: per member, its per-turn rewards (``rewards_GT``), turns in the order the gateway
            recorded them; members may have different numbers of turns.

    Returns:
        advantages_GT: per member, one advantage per turn (same shape as ``rewards_G``). A group that
        carries no signal (`carries_no_signal`: every turn index's reward-to-go equal across
        members) gets exact zeros.
    """
    if carries_no_signal(rewards_G):
        return [[0.0] * len(r) for r in rewards_G]
    to_go = _to_go_matrix(rewards_G)
    k = len(rewards_G)
    totals = to_go.sum(axis=0)
    out: list[list[float]] = []
    for i, r in enumerate(rewards_G):
        baseline = (totals - to_go[i]) / (k - 1)
        column_equal = np.all(to_go == to_go[:1], axis=0)
        adv = np.where(column_equal, 0.0, to_go[i] - baseline)
        out.append(adv[: len(r)].tolist())
    return out


# ------------------------------------------------------------------------------ dispatcher

_PER_GROUP: dict[str, Callable[[Sequence[float]], list[float]]] = {
    "grpo": compute_grpo_advantages,
    "dr_grpo": compute_dr_grpo_advantages,
    "rloo": compute_rloo_advantages,
}


def compute_advantages(estimator: str, rewards_P: Sequence[Sequence[MemberReward]]) -> list[list]:
    """The advantages of a batch of groups under ``estimator`` (one of `ESTIMATORS`).

    Args:
        estimator: ``grpo`` | ``dr_grpo`` | ``rloo`` | ``reinforce_pp_baseline`` (one float per
            member) | ``per_turn_rloo`` (one list of per-turn rewards per member).
        rewards_P: one rewards_G per group (the responses to one prompt).

    Returns:
        advantages_P aligned with ``rewards_P``: per group, one advantage per member (trajectory
        estimators) or one list of per-turn advantages per member (``per_turn_rloo``).

    Raises:
        ValueError: an unknown estimator (names the accepted ones), or rewards of the wrong shape
            for it (per-turn lists to a trajectory estimator, or floats to ``per_turn_rloo``).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"unknown advantage estimator {estimator!r}; accepted: {', '.join(ESTIMATORS)}")
    per_turn = estimator in PER_TURN_ESTIMATORS
    for p, rewards_G in enumerate(rewards_P):
        shapes = {isinstance(r, (int, float)) for r in rewards_G}
        if per_turn and True in shapes or not per_turn and False in shapes:
            want = "a list of per-turn rewards" if per_turn else "one number"
            raise ValueError(f"estimator {estimator!r} takes {want} per member; group {p} has {list(rewards_G)[:4]!r}")
    if estimator == "per_turn_rloo":
        return [compute_per_turn_rloo_advantages(g) for g in rewards_P]  # type: ignore[arg-type]
    if estimator == "reinforce_pp_baseline":
        return compute_reinforce_pp_baseline_advantages(rewards_P)  # type: ignore[arg-type]
    fn = _PER_GROUP[estimator]
    return [fn(g) for g in rewards_P]  # type: ignore[arg-type]


def advantage_metrics(advantages_P: Sequence[Sequence], rewards_P: Sequence[Sequence[MemberReward]]) -> dict[str, float]:
    """Slash-namespaced summary of a step's advantages: mean, std, min, max (over members, or over
    turns for per-turn advantages) and ``advantages/zero_groups_fraction``, the fraction of groups
    that carry no learning signal (`carries_no_signal` of ``rewards_P``, one rewards_G per group,
    aligned with ``advantages_P``)."""
    if len(advantages_P) != len(rewards_P):
        raise ValueError(f"advantages_P has {len(advantages_P)} groups, rewards_P {len(rewards_P)}")
    flat_list: list[float] = []
    for group in advantages_P:
        for a in group:
            if isinstance(a, (int, float)):
                flat_list.append(float(a))
            else:
                flat_list.extend(float(x) for x in a)
    flat = np.asarray(flat_list, dtype=np.float64)
    zero_groups = sum(1 for rewards_G in rewards_P if carries_no_signal(rewards_G))
    if flat.size == 0:
        return {"advantages/zero_groups_fraction": 0.0}
    return {
        "advantages/mean": float(flat.mean()),
        "advantages/std": float(flat.std()),
        "advantages/min": float(flat.min()),
        "advantages/max": float(flat.max()),
        "advantages/zero_groups_fraction": zero_groups / len(advantages_P),
    }
