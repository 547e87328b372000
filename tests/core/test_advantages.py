"""GRPO advantages pinned by hand and equal to the reference train_grpo.compute_grpo_advantages."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.advantages import advantage_metrics, carries_no_signal, compute_grpo_advantages


def test_hand_computed_group():
    # mean 0.5, population std 0.5 -> (r - 0.5) / (0.5 + 1e-8)
    assert compute_grpo_advantages([1, 0, 0, 1]) == pytest.approx([1, -1, -1, 1], abs=1e-7)
    # mean 1, std sqrt(2/3)
    s = (2 / 3) ** 0.5
    assert compute_grpo_advantages([0.0, 1.0, 2.0]) == pytest.approx([-1 / s, 0.0, 1 / s], rel=1e-7)


def test_equal_group_is_centered_only():
    assert compute_grpo_advantages([0.7, 0.7, 0.7, 0.7]) == [0.0, 0.0, 0.0, 0.0]
    # std below eps: centered, not divided
    adv = compute_grpo_advantages([1.0, 1.0 + 1e-9])
    assert adv == pytest.approx([-5e-10, 5e-10], abs=1e-12)


def test_empty_group():
    assert compute_grpo_advantages([]) == []


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(min_value=-100, max_value=100, allow_nan=False), min_size=1, max_size=16))
def test_equals_the_reference(rewards):
    from agentcore_rl_toolkit.backends.experimental.sagemaker.train_grpo import (
        compute_grpo_advantages as reference,
    )

    if carries_no_signal(rewards):
        # The all-equal rule: exact zeros, where the reference leaves the mean's rounding residue.
        assert compute_grpo_advantages(rewards) == [0.0] * len(rewards)
        assert reference(rewards) == pytest.approx([0.0] * len(rewards), abs=1e-12)
    else:
        assert compute_grpo_advantages(rewards) == reference(rewards)


def test_metrics():
    rewards_P = [[1, 0, 0, 1], [1, 1, 1, 1]]
    m = advantage_metrics([compute_grpo_advantages(r) for r in rewards_P], rewards_P)
    assert m["advantages/zero_groups_fraction"] == 0.5
    assert m["advantages/mean"] == pytest.approx(0.0)
    assert m["advantages/max"] == pytest.approx(1.0, abs=1e-7)


def test_zero_groups_fraction_counts_every_all_equal_group_not_only_exact_zeros():
    # [0.1] * 3 centers to ~1.4e-17, not 0.0: the old count (advantages exactly 0.0) missed it.
    rewards_P = [[0.1, 0.1, 0.1], [0.7] * 5, [1.0, 0.0], [1 / 3] * 6]
    advantages_P = [compute_grpo_advantages(r) for r in rewards_P]
    assert advantages_P[0] == [0.0, 0.0, 0.0]  # exact zeros (the reference leaves a ~1e-17 residue)
    assert advantage_metrics(advantages_P, rewards_P)["advantages/zero_groups_fraction"] == 3 / 4
    with pytest.raises(ValueError, match="groups"):
        advantage_metrics(advantages_P, rewards_P[:2])
