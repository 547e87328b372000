"""Group evals: pass@k and the group outcomes against the combinatorial definition (every k-subset
of the n rollouts counted), exact binomials, and a direct count of prompts."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.evals import (
    EvalRollout,
    EvalPrompt,
    all_fail_at_k,
    compare_prompts,
    all_pass_at_k,
    eval_metrics,
    group_prompts,
    metric_key,
    mixed_at_k,
    pass_at_k,
    pass_ks,
    payload_fingerprint,
    set_metrics,
    successes,
)


@st.composite
def n_c_k(draw, max_n: int = 12):
    n = draw(st.integers(1, max_n))
    return n, draw(st.integers(0, n)), draw(st.integers(1, n))


def _subset_fractions(n: int, c: int, k: int) -> tuple[Fraction, Fraction, Fraction]:
    """(any success, all succeed, none succeeds) over every k-subset of n rollouts, c of them successes."""
    outcomes = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    hits = [sum(outcomes[i] for i in s) for s in subsets]
    total = len(subsets)
    return (Fraction(sum(h > 0 for h in hits), total), Fraction(sum(h == k for h in hits), total),
            Fraction(sum(h == 0 for h in hits), total))


@settings(max_examples=300, deadline=None)
@given(n_c_k())
def test_each_estimate_is_the_fraction_of_k_subsets_with_that_outcome(args):
    n, c, k = args
    any_success, all_success, no_success = _subset_fractions(n, c, k)
    assert pass_at_k(n, c, k) == pytest.approx(float(any_success), abs=1e-12)
    assert all_pass_at_k(n, c, k) == pytest.approx(float(all_success), abs=1e-12)
    assert all_fail_at_k(n, c, k) == pytest.approx(float(no_success), abs=1e-12)
    assert mixed_at_k(n, c, k) == pytest.approx(float(1 - all_success - no_success), abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(n_c_k(max_n=3000))
def test_the_stable_product_equals_the_exact_binomial_ratio_for_large_n(args):
    n, c, k = args
    exact_fail = Fraction(math.comb(n - c, k), math.comb(n, k))
    exact_all = Fraction(math.comb(c, k), math.comb(n, k))
    assert pass_at_k(n, c, k) == pytest.approx(float(1 - exact_fail), abs=1e-9)
    assert all_fail_at_k(n, c, k) == pytest.approx(float(exact_fail), abs=1e-9)
    assert all_pass_at_k(n, c, k) == pytest.approx(float(exact_all), abs=1e-9)
    for value in (pass_at_k(n, c, k), all_pass_at_k(n, c, k), all_fail_at_k(n, c, k), mixed_at_k(n, c, k)):
        assert 0.0 <= value <= 1.0 and math.isfinite(value)


def test_hand_computed_values():
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)
    assert pass_at_k(4, 1, 4) == 1.0 and pass_at_k(4, 0, 4) == 0.0
    assert pass_at_k(4, 2, 2) == pytest.approx(1 - 1 / 6)  # C(2,2)/C(4,2) = 1/6 of pairs miss
    assert all_pass_at_k(4, 2, 2) == pytest.approx(1 / 6)
    assert mixed_at_k(4, 2, 2) == pytest.approx(4 / 6)
    assert mixed_at_k(4, 4, 4) == 0.0 and mixed_at_k(4, 0, 4) == 0.0 and mixed_at_k(4, 3, 4) == 1.0


@pytest.mark.parametrize("n,c,k", [(0, 0, 1), (4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_impossible_arguments_are_refused(n, c, k):
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)
    with pytest.raises(ValueError):
        all_pass_at_k(n, c, k)


def test_pass_ks_defaults_to_1_and_the_group_size_and_refuses_a_k_above_it():
    assert pass_ks(4, None) == [1, 4]
    assert pass_ks(1, None) == [1]
    assert pass_ks(8, [8, 2, 2]) == [2, 8]
    with pytest.raises(ValueError, match="1 <= k <= the eval group size 4"):
        pass_ks(4, [5])


def test_successes_count_rewards_at_or_above_the_threshold():
    assert successes([0.0, 0.5, 1.0, float("nan")], 0.5) == 2
    assert successes([1.0, 1.0], 1.0) == 2


def test_metric_keys_of_the_unnamed_and_named_sets():
    assert metric_key("", "accuracy") == "eval/accuracy"
    assert metric_key("hard", "pass@4") == "eval/hard/pass@4"


def test_a_fingerprint_ignores_key_order_and_tells_payloads_apart():
    assert payload_fingerprint({"a": 1, "b": [1, 2]}) == payload_fingerprint({"b": [1, 2], "a": 1})
    assert payload_fingerprint({"a": 1}) != payload_fingerprint({"a": 2})


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 6).flatmap(lambda n: st.tuples(
    st.just(n), st.lists(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=n, max_size=n), min_size=1, max_size=8))))
def test_set_metrics_equal_a_direct_count_of_prompts(args):
    n, rewards_P = args
    prompts = [EvalPrompt(row=i, input_id=f"e0p{i}", fingerprint=str(i), rewards_G=r, statuses_G=["ok"] * n, successes=successes(r, 1.0))
               for i, r in enumerate(rewards_P)]
    m = set_metrics(prompts, [1, n])
    flat = [r for g in rewards_P for r in g]
    assert m["accuracy"] == pytest.approx(sum(flat) / len(flat))
    assert m[f"mean@{n}"] == pytest.approx(m["accuracy"])  # complete groups
    solved = [sum(r >= 1.0 for r in g) for g in rewards_P]
    # at k = n the estimators are plain counts of prompts
    assert m[f"pass@{n}"] == pytest.approx(sum(c > 0 for c in solved) / len(solved))
    if n > 1:
        assert m[f"all_pass@{n}"] == pytest.approx(sum(c == n for c in solved) / len(solved))
        assert m[f"all_fail@{n}"] == pytest.approx(sum(c == 0 for c in solved) / len(solved))
        assert m[f"mixed@{n}"] == pytest.approx(sum(0 < c < n for c in solved) / len(solved))
    assert "mixed@1" not in m and "all_pass@1" not in m
    assert m["pass@1"] == pytest.approx(sum(c / n for c in solved) / len(solved))
    assert m["prompts"] == len(rewards_P) and m["rollouts"] == m["n"] == len(flat)


def test_rollouts_group_into_prompts_by_set_and_row_and_every_set_reports_under_its_name():
    set_of_row = {0: ("", 0), 1: ("", 1), 2: ("hard", 0)}
    payloads = {"e0p0": {"prompt": "zero"}, "e0p1": {"prompt": "one"}, "e0p2": {"q": 2}}
    rollouts = [EvalRollout("e0p2", 2, 1, 0.0, "ok"), EvalRollout("e0p0", 0, 1, 1.0, "ok"),
                EvalRollout("e0p0", 0, 0, 0.0, "error"), EvalRollout("e0p1", 1, 0, 1.0, "ok"),
                EvalRollout("e0p1", 1, 1, 1.0, "ok"), EvalRollout("e0p2", 2, 0, 1.0, "ok")]
    prompts = group_prompts(rollouts, set_of_row=set_of_row, payloads=payloads, threshold=1.0)
    assert [(p.eval_set, p.row, p.rewards_G, p.successes) for p in prompts] == [
        ("", 0, [0.0, 1.0], 1), ("", 1, [1.0, 1.0], 2), ("hard", 0, [1.0, 0.0], 1)]
    assert prompts[0].statuses_G == ["error", "ok"]
    assert [p.preview for p in prompts] == ["zero", "one", '{"q": 2}']
    assert prompts[0].fingerprint == payload_fingerprint({"prompt": "zero"})
    m = eval_metrics(prompts, ["", "hard"], [1, 2])
    assert m["eval/accuracy"] == pytest.approx(0.75) and m["eval/failed_rollouts"] == 1
    assert m["eval/pass@2"] == 1.0 and m["eval/all_pass@2"] == 0.5 and m["eval/mixed@2"] == 0.5
    assert m["eval/hard/accuracy"] == 0.5 and m["eval/hard/prompts"] == 1 and m["eval/hard/mixed@2"] == 1.0


def _prompts(scores: dict[str, list[float]], eval_set: str = "") -> list[EvalPrompt]:
    return [EvalPrompt(eval_set=eval_set, row=i, input_id=f"e0p{i}", fingerprint=f, rewards_G=r)
            for i, (f, r) in enumerate(scores.items())]


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=4)),
       st.dictionaries(st.sampled_from("abcdefgh"), st.lists(st.sampled_from([0.0, 0.5, 1.0]), min_size=1, max_size=4)))
def test_comparing_counts_every_matched_prompt_once_and_swapping_swaps_wins_and_losses(sa, sb):
    a, b = _prompts(sa), _prompts(sb)
    ab, ba = compare_prompts(a, b, ""), compare_prompts(b, a, "")
    matched = sa.keys() & sb.keys()
    assert ab.wins + ab.losses + ab.ties == len(matched) == len(ab.deltas)
    assert (ab.wins, ab.losses, ab.ties) == (ba.losses, ba.wins, ba.ties)
    assert (ab.only_a, ab.only_b) == (len(sa.keys() - sb.keys()), len(sb.keys() - sa.keys()))
    direct_wins = sum(sum(sb[f]) / len(sb[f]) > sum(sa[f]) / len(sa[f]) + 1e-9 for f in matched)
    assert ab.wins == direct_wins


def test_comparing_pools_duplicate_rows_and_keeps_sets_apart():
    a = _prompts({"x": [0.0, 0.0]}) + [EvalPrompt(row=9, input_id="e0p9", fingerprint="x", rewards_G=[1.0, 1.0])]
    b = _prompts({"x": [0.5, 1.0]}) + _prompts({"x": [0.0]}, eval_set="hard")
    c = compare_prompts(a, b, "")
    assert (c.wins, c.losses, c.ties) == (1, 0, 0) and c.deltas == [("x", "", 0.5, 0.75)]
    assert compare_prompts(a, b, "hard").only_b == 1
