"""Every advantage estimator against a direct computation from its paper, against verl's formula
where it is readable, and the one "carries no signal" rule shared by the estimators, the metrics and
DAPO's filter, at every reward scale from 1e-300 to 1e150."""

from __future__ import annotations

import itertools
import math
import sys

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stepwise.core.advantages import (
    ESTIMATORS,
    PER_TURN_ESTIMATORS,
    advantage_metrics,
    carries_no_signal,
    compute_advantages,
    compute_dr_grpo_advantages,
    compute_grpo_advantages,
    compute_per_turn_rloo_advantages,
    compute_reinforce_pp_baseline_advantages,
    compute_rloo_advantages,
    rewards_to_go,
)
from stepwise.core.dapo import is_informative_group

TRAJECTORY_ESTIMATORS = [e for e in ESTIMATORS if e not in PER_TURN_ESTIMATORS]

# ------------------------------------------------------------------------------ strategies


@st.composite
def magnitudes(draw) -> float:
    """A reward magnitude anywhere from 1e-300 to 1e150 (uniform in the exponent), either sign."""
    exponent = draw(st.floats(min_value=-300, max_value=150))
    mantissa = draw(st.floats(min_value=1.0, max_value=9.99))
    return min(1e150, mantissa * 10.0 ** exponent) * draw(st.sampled_from([1.0, -1.0]))


@st.composite
def groups(draw, min_size: int = 2, max_size: int = 12) -> list[float]:
    """A group's rewards: all equal, all equal but one member, or arbitrary, at one scale or mixed."""
    n = draw(st.integers(min_size, max_size))
    x = draw(magnitudes())
    kind = draw(st.sampled_from(["equal", "one_differs", "scaled", "binary"]))
    if kind == "equal":
        return [x] * n
    if kind == "one_differs":
        g = [x] * n
        g[draw(st.integers(0, n - 1))] = draw(magnitudes())
        return g
    if kind == "binary":
        return [draw(st.sampled_from([0.0, 1.0])) for _ in range(n)]
    return [x * draw(st.floats(min_value=-1, max_value=1)) for _ in range(n)]


def close(actual: list[float], expected: list[float], scale: float) -> bool:
    """Equal up to float64 rounding of sums of n terms at ``scale`` (relative 1e-9 of the scale; below the
    smallest normal float, subnormal rounding has no relative precision, so a few of it are tolerated)."""
    tol = 1e-9 * scale + 4 * sys.float_info.min
    return all(abs(a - e) <= tol + 1e-12 * abs(e) for a, e in zip(actual, expected, strict=True))


def spread(rewards_G: list[float]) -> float:
    return max(rewards_G) - min(rewards_G) if rewards_G else 0.0


# ------------------------------------------------------------------------------ no signal (item: all-equal at every scale)


@settings(max_examples=200, deadline=None)
@given(x=magnitudes(), n=st.integers(1, 16))
@example(x=123456789.123, n=3)
@example(x=1e-300, n=16)
@example(x=1e150, n=16)
def test_an_all_equal_group_carries_no_signal_at_every_scale(x, n):
    rewards_G = [x] * n
    assert carries_no_signal(rewards_G)
    for estimator in TRAJECTORY_ESTIMATORS:
        assert compute_advantages(estimator, [rewards_G]) == [[0.0] * n], estimator
    # per turn: the same rewards on the last of 1..3 turns, and the same list on every turn
    for turns in (1, 3):
        per_turn = [[0.0] * (turns - 1) + [x]] * n
        assert compute_advantages("per_turn_rloo", [per_turn]) == [[[0.0] * turns] * n]
        assert carries_no_signal(per_turn) and not is_informative_group(per_turn)
    assert advantage_metrics([[0.0] * n], [rewards_G])["advantages/zero_groups_fraction"] == 1.0
    assert not is_informative_group(rewards_G)


@settings(max_examples=200, deadline=None)
@given(g=groups())
def test_one_rule_for_the_estimators_the_metric_and_dapo(g):
    no_signal = carries_no_signal(g)
    assert no_signal == (len(set(g)) < 2)  # exact equality, as DAPO's seed
    assert is_informative_group(g) == (not no_signal)
    fraction = advantage_metrics([compute_grpo_advantages(g)], [g])["advantages/zero_groups_fraction"]
    assert fraction == (1.0 if no_signal else 0.0)
    for estimator in TRAJECTORY_ESTIMATORS:
        (adv,) = compute_advantages(estimator, [g])
        assert all(math.isfinite(a) for a in adv), (estimator, g, adv)
        if no_signal:
            assert adv == [0.0] * len(g)


def test_the_large_all_equal_group_of_the_issue():
    from agentcore_rl_toolkit.backends.experimental.sagemaker.train_grpo import compute_grpo_advantages as reference

    g = [123456789.123] * 3
    assert max(abs(a) for a in reference(g)) > 0.5  # the reference's answer: rounding, scaled up
    assert compute_grpo_advantages(g) == [0.0, 0.0, 0.0]
    assert advantage_metrics([compute_grpo_advantages(g)], [g])["advantages/zero_groups_fraction"] == 1.0
    assert not is_informative_group(g)


# ------------------------------------------------------------------------------ each estimator vs its paper


@settings(max_examples=150, deadline=None)
@given(g=groups())
def test_grpo_is_the_papers_group_normalised_advantage(g):
    """GRPO (arXiv:2402.03300 sec. 4.1.2): (r - mean) / std, std over the group (ddof 0), eps 1e-8."""
    n = len(g)
    mean = math.fsum(g) / n
    std = math.sqrt(math.fsum((r - mean) ** 2 for r in g) / n)
    expected = [0.0] * n if len(set(g)) < 2 else [(r - mean) / (std + 1e-8) if std > 1e-8 else r - mean for r in g]
    assert close(compute_grpo_advantages(g), expected, max(1.0, spread(g)) if std > 1e-8 else spread(g))


@settings(max_examples=150, deadline=None)
@given(g=groups())
def test_dr_grpo_is_the_papers_centred_reward(g):
    """Dr. GRPO (arXiv:2503.20783 sec. 3.2): r - mean, no std; verl's norm_adv_by_std_in_grpo=False."""
    mean = math.fsum(g) / len(g)
    expected = [0.0] * len(g) if len(set(g)) < 2 else [r - mean for r in g]
    assert close(compute_dr_grpo_advantages(g), expected, max(abs(r) for r in g))


@settings(max_examples=150, deadline=None)
@given(g=groups())
def test_rloo_is_the_papers_leave_one_out_baseline_and_verls_formula(g):
    """RLOO (arXiv:2402.14740 eq. 6): r_i - mean of the others, computed directly; and verl's
    ``compute_rloo_outcome_advantage``: r * n/(n-1) - mean * n/(n-1) (verl/trainer/ppo/core_algos.py)."""
    n = len(g)
    direct = [g[i] - math.fsum(g[:i] + g[i + 1:]) / (n - 1) for i in range(n)]
    mean = float(np.mean(np.asarray(g)))
    verl = [r * n / (n - 1) - mean * n / (n - 1) for r in g]
    ours = compute_rloo_advantages(g)
    if len(set(g)) < 2:
        assert ours == [0.0] * n
    else:
        scale = max(abs(r) for r in g)
        assert close(ours, direct, scale) and close(ours, verl, scale)


@settings(max_examples=100, deadline=None)
@given(P=st.lists(groups(max_size=6), min_size=1, max_size=5))
def test_reinforce_pp_baseline_is_the_papers_whitened_group_baseline_and_verls_formula(P):
    """REINFORCE++-baseline (arXiv:2501.03262 sec. 3): a = r - group mean; A = (a - mean_B) / std_B over
    the batch. verl: ``compute_reinforce_plus_plus_baseline_outcome_advantage`` then
    ``verl.utils.torch_functional.masked_whiten`` (one token per rollout here): mean = sum / (n + 1e-8),
    var = mean of squares (same denominator) * n / (n - 1), A = (a - mean) * rsqrt(var + 1e-8)."""
    centred = [[r - math.fsum(g) / len(g) for r in g] if len(set(g)) > 1 else [0.0] * len(g) for g in P]
    flat = [a for g in centred for a in g]
    n = len(flat)
    mean = math.fsum(flat) / (n + 1e-8)
    var = math.fsum((a - mean) ** 2 for a in flat) / (n + 1e-8) * n / (n - 1)
    verl = [[(a - mean) / math.sqrt(var + 1e-8) for a in g] for g in centred]
    ours = compute_reinforce_pp_baseline_advantages(P)
    for g, o, v in zip(P, ours, verl, strict=True):
        if len(set(g)) < 2:
            assert o == [0.0] * len(g)
        elif any(flat):
            # the batch mean's rounding (relative to the batch's largest value) over its std
            tol = 1e-9 * max(abs(a) for a in flat) / math.sqrt(var + 1e-8)
            assert o == pytest.approx(v, rel=1e-6, abs=tol)


# ------------------------------------------------------------------------------ per turn


@st.composite
def per_turn_groups(draw) -> list[list[float]]:
    """Per-turn rewards of a group: members with 0..4 turns, rewards 0/1/0.5 or at any scale."""
    n = draw(st.integers(2, 6))
    value = st.one_of(st.sampled_from([0.0, 0.5, 1.0]), magnitudes())
    return [draw(st.lists(value, min_size=0, max_size=4)) for _ in range(n)]


@settings(max_examples=200, deadline=None)
@given(G=per_turn_groups())
def test_per_turn_rloo_is_reward_to_go_minus_the_others_reward_to_go(G):
    k, t_max = len(G), max(len(r) for r in G)

    def to_go(r, t):  # direct from the definition: the rewards from turn t on, 0 past the last turn
        return math.fsum(r[t:])

    expected = [[to_go(G[i], t) - math.fsum(to_go(G[j], t) for j in range(k) if j != i) / (k - 1)
                 for t in range(len(G[i]))] for i in range(k)]
    ours = compute_per_turn_rloo_advantages(G)
    assert [len(a) for a in ours] == [len(r) for r in G]
    scale = max([abs(x) for r in G for x in r] + [1e-300]) * (t_max + 1)
    for o, e in zip(ours, expected, strict=True):
        assert close(o, e, scale)
    # turn 0 is RLOO on the returns (sum of the per-turn rewards)
    returns = [math.fsum(r) for r in G]
    rloo = compute_rloo_advantages(returns)
    for i, r in enumerate(G):
        if r and len(set(returns)) > 1:
            assert ours[i][0] == pytest.approx(rloo[i], rel=1e-9, abs=1e-9 * scale)


def test_rewards_to_go_by_hand():
    assert rewards_to_go([1, 0, 2]) == [3.0, 2.0, 2.0]
    assert rewards_to_go([1, 0, 2], 4) == [3.0, 2.0, 2.0, 0.0]
    with pytest.raises(ValueError, match="shorter"):
        rewards_to_go([1, 2], 1)


def test_per_turn_credit_goes_to_the_turn_that_earned_it():
    # two-turn task: the first turn decides, the second is free (always 0)
    G = [[1.0, 0.0], [0.0, 0.0], [0.0, 0.0], [1.0, 0.0]]
    adv = compute_per_turn_rloo_advantages(G)
    assert [a[1] for a in adv] == [0.0] * 4  # the free turn: exactly no credit
    assert [a[0] for a in adv] == pytest.approx([2 / 3, -2 / 3, -2 / 3, 2 / 3])


def _policy_gradient_bias(estimator) -> float:
    """Exact expected estimator gradient minus the true gradient, on a 2-turn MDP where the policy
    decides when to stop. Turn 0: stop (reward 1.0, the episode ends) or continue (intermediate
    reward 0.5) with probability p = sigmoid(theta); turn 1 (after continue): reward 1.0 w.p. 0.5,
    else 0.0 (not controlled). J = (1 - p) * 1 + p * (0.5 + 0.5); dJ/dtheta = 0 at every p... so
    shift: continuing is worth 1.2 in expectation (turn 1 pays 1.4 or 0.0 at 0.5 each) -> dJ/dtheta =
    0.2 p (1 - p). Expectation over every joint outcome of a group of K = 3 rollouts (27 cases)."""
    p = 0.3
    outcomes = [  # (probability, per-turn rewards, d log pi / d theta of turn 0)
        (1 - p, [1.0], -p),                      # stop
        (p * 0.5, [0.5, 1.4], 1 - p),            # continue, lucky
        (p * 0.5, [0.5, 0.0], 1 - p),            # continue, unlucky
    ]
    true_gradient = 0.2 * p * (1 - p)
    expected = 0.0
    for combo in itertools.product(outcomes, repeat=3):
        prob = math.prod(c[0] for c in combo)
        adv = estimator([c[1] for c in combo])
        # only turn 0 depends on theta; turn 1's action is not the policy's
        expected += prob * sum(a[0] * c[2] for a, c in zip(adv, combo, strict=True)) / 3
    return expected - true_gradient


def test_per_turn_rloo_is_unbiased_when_the_policy_decides_when_to_stop():
    assert abs(_policy_gradient_bias(compute_per_turn_rloo_advantages)) < 1e-12


def test_the_turn_index_normalisation_the_rfc_warns_about_is_biased():
    """The check above can fail: MT-GRPO-style per-turn-index baselines summed over a trajectory's own
    remaining turns (the verl per-turn RFC's "natural" construction) are biased on the same MDP."""

    def turn_index_sum(G):
        t_max = max(len(r) for r in G)
        means = [np.mean([r[t] for r in G if len(r) > t]) for t in range(t_max)]
        return [[sum(r[s] - means[s] for s in range(t, len(r))) for t in range(len(r))] for r in G]

    assert abs(_policy_gradient_bias(turn_index_sum)) > 1e-3


# ------------------------------------------------------------------------------ dispatcher


def test_the_dispatcher_names_what_it_accepts():
    with pytest.raises(ValueError, match="unknown advantage estimator 'ppo'; accepted: grpo, dr_grpo"):
        compute_advantages("ppo", [[1.0, 0.0]])
    with pytest.raises(ValueError, match="'per_turn_rloo' takes a list of per-turn rewards per member"):
        compute_advantages("per_turn_rloo", [[1.0, 0.0]])
    with pytest.raises(ValueError, match="'grpo' takes one number per member"):
        compute_advantages("grpo", [[[1.0], [0.0]]])
    assert compute_advantages("rloo", [[1.0, 0.0], [2.0, 2.0]]) == [[1.0, -1.0], [0.0, 0.0]]
    assert compute_advantages("per_turn_rloo", [[[1.0], [0.0]]]) == [[[1.0], [-1.0]]]
