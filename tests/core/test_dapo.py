"""DAPO dynamic-sampling decision and overlong shaping (arXiv:2503.14476 eq. 11 and 13)."""

from __future__ import annotations

import pytest

from stepwise.core.dapo import decide_generation_batch, is_informative_group, overlong_penalty, sampling_metrics


def test_informative_groups():
    assert is_informative_group([0, 1, 0, 0])
    assert not is_informative_group([1, 1, 1, 1])
    assert not is_informative_group([0.0, 0.0])
    assert not is_informative_group([1.0])
    assert not is_informative_group([])


def group(name, rewards):
    return {"prompt": name, "rewards": rewards}


def test_ready_truncates_in_prompt_order():
    kept = [group("a", [0, 1])]
    new = [group("b", [1, 1]), group("c", [0, 1]), group("d", [1, 0]), group("e", [0.5, 0])]
    d = decide_generation_batch(kept, new, batch_size=3, gen_batches_used=2, max_num_gen_batches=2)
    assert d.status == "ready"
    assert [g["prompt"] for g in d.keep] == ["a", "c", "d"]
    assert (d.dropped_uninformative, d.surplus) == (1, 1)


def test_need_more_then_cap_reached():
    new = [group("a", [1, 1]), group("b", [0, 1]), group("c", [0, 0])]
    d1 = decide_generation_batch([], new, batch_size=2, gen_batches_used=1, max_num_gen_batches=2)
    assert d1.status == "need_more" and [g["prompt"] for g in d1.keep] == ["b"] and d1.dropped_uninformative == 2
    d2 = decide_generation_batch(d1.keep, [group("d", [2, 2])], batch_size=2, gen_batches_used=2, max_num_gen_batches=2)
    assert d2.status == "cap_reached" and [g["prompt"] for g in d2.keep] == ["b"]


def test_exactly_full_on_the_last_allowed_batch_is_ready():
    d = decide_generation_batch([[0, 1]], [[1, 0]], batch_size=2, gen_batches_used=3, max_num_gen_batches=3)
    assert d.status == "ready" and d.keep == [[0, 1], [1, 0]] and d.surplus == 0


def test_custom_rewards_reader_and_argument_errors():
    d = decide_generation_batch([], [("x", [0, 1])], batch_size=1, gen_batches_used=1, max_num_gen_batches=1,
                                rewards_of=lambda g: g[1])
    assert d.keep == [("x", [0, 1])]
    with pytest.raises(ValueError, match=r"batch_size must be >= 1 \(got 0\)"):
        decide_generation_batch([], [], batch_size=0, gen_batches_used=1, max_num_gen_batches=1)
    with pytest.raises(ValueError, match="gen_batches_used"):
        decide_generation_batch([], [], batch_size=1, gen_batches_used=0, max_num_gen_batches=1)


@pytest.mark.parametrize(
    ("length", "expected"),
    [(0, 0.0), (12, 0.0), (13, -0.25), (14, -0.5), (16, -1.0), (17, -1.0), (1000, -1.0)],
)
def test_overlong_penalty_eq13(length, expected):
    # L_max = 16, L_cache = 4: no penalty up to 12, linear to -1 at 16, -1 beyond.
    assert overlong_penalty(length, max_len=16, buffer_len=4) == pytest.approx(expected)
    assert overlong_penalty(length, max_len=16, buffer_len=4, penalty_factor=0.5) == pytest.approx(expected * 0.5)


def test_overlong_penalty_off_and_errors():
    assert overlong_penalty(10**6, max_len=16, buffer_len=0) == 0.0
    with pytest.raises(ValueError, match="buffer_len must be < max_len"):
        overlong_penalty(1, max_len=4, buffer_len=4)
    with pytest.raises(ValueError, match="must be >= 0"):
        overlong_penalty(-1, max_len=16, buffer_len=4)


def test_sampling_metrics():
    m = sampling_metrics(gen_batches=3, groups_rolled_out=96, groups_kept=32, empty_rollouts=2)
    assert m == {
        "sampling/generation_batches": 3.0,
        "sampling/filtered_fraction": pytest.approx(64 / 96),
        "sampling/kept_groups": 32.0,
        "sampling/surplus_groups": 0.0,
        "sampling/empty_rollouts": 2.0,
    }
