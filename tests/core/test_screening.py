"""Dataset screening: rows kept are exactly those whose (pooled) prompt has mixed outcomes, against a
direct count over hypothesis-generated datasets with repeated prompts."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.evals import mixed_at_k
from stepwise.core.screening import screen
from stepwise.records import EvalPrompt

K = 4


@st.composite
def datasets(draw):
    """Rows (each a prompt id in a..e) with K binary outcomes each."""
    rows = draw(st.lists(st.tuples(st.sampled_from("abcde"), st.lists(st.booleans(), min_size=K, max_size=K)),
                         min_size=1, max_size=20))
    return [EvalPrompt(row=i, input_id=f"e0p{i}", fingerprint=f, rewards_G=[float(x) for x in outcomes],
                       successes=sum(outcomes)) for i, (f, outcomes) in enumerate(rows)]


@settings(max_examples=200, deadline=None)
@given(datasets(), st.sampled_from(["dataset", "easy_first", "hard_first"]))
def test_kept_rows_are_the_rows_of_prompts_with_mixed_pooled_outcomes(rows, order):
    s = screen(rows, K, order=order)
    pooled: dict[str, list[int]] = {}
    for r in rows:
        pooled.setdefault(r.fingerprint, [0, 0])
        pooled[r.fingerprint][0] += r.n
        pooled[r.fingerprint][1] += r.successes
    mixed = {f for f, (n, c) in pooled.items() if 0 < c < n}
    assert sorted(s.kept_rows) == [r.row for r in rows if r.fingerprint in mixed]
    assert s.removed.get("too_easy", 0) == sum(1 for r in rows if pooled[r.fingerprint][1] == pooled[r.fingerprint][0])
    assert s.removed.get("too_hard", 0) == sum(1 for r in rows if pooled[r.fingerprint][1] == 0)
    assert len(s.kept_rows) + sum(s.removed.values()) == s.rows == len(rows)
    rate = {f: c / n for f, (n, c) in pooled.items()}
    if order != "dataset":
        rates = [rate[rows[i].fingerprint] for i in s.kept_rows]
        assert rates == sorted(rates, reverse=order == "easy_first")
    before = sum(mixed_at_k(*pooled[r.fingerprint], K) for r in rows) / len(rows)
    assert s.mixed_at_k_before == pytest.approx(before)
    assert s.mixed_at_k_after >= s.mixed_at_k_before - 1e-12  # removing never-mixed rows only raises it


def test_pass_rate_bounds_remove_nearly_always_solved_prompts_too():
    rows = [EvalPrompt(row=0, input_id="a", fingerprint="easy", rewards_G=[1.0] * 15 + [0.0], successes=15),
            EvalPrompt(row=1, input_id="b", fingerprint="mid", rewards_G=[1.0] * 4 + [0.0] * 12, successes=4)]
    assert screen(rows, K).kept_rows == [0, 1]
    s = screen(rows, K, max_pass_rate=0.9)
    assert s.kept_rows == [1] and s.removed == {"too_easy": 1}
    with pytest.raises(ValueError, match="min_pass_rate < max_pass_rate"):
        screen(rows, K, min_pass_rate=0.5, max_pass_rate=0.5)
    with pytest.raises(ValueError, match="fewer than k=32"):
        screen(rows, 32)


def test_a_screen_of_the_distinct_prompts_decides_every_row_holding_each():
    from stepwise.core.screening import distinct_rows

    payloads = [{"p": "a"}, {"p": "b"}, {"p": "a"}, {"p": "c"}, {"p": "b"}, {"p": "a"}]
    first, rows_of = distinct_rows(payloads)
    assert first == [0, 1, 3] and sorted(len(r) for r in rows_of.values()) == [1, 2, 3]
    from stepwise.core.evals import payload_fingerprint

    outcomes = {"a": [1.0, 1.0], "b": [1.0, 0.0], "c": [0.0, 0.0]}
    prompts = [EvalPrompt(row=i, input_id=f"e0p{i}", fingerprint=payload_fingerprint(payloads[r]),
                          rewards_G=outcomes[payloads[r]["p"]], successes=int(sum(outcomes[payloads[r]["p"]])))
               for i, r in enumerate(first)]
    s = screen(prompts, 2, rows_of=rows_of)
    assert s.kept_rows == [1, 4] and s.rows == 6 and s.removed == {"too_easy": 3, "too_hard": 1}
    with pytest.raises(ValueError, match="no eval result"):
        screen(prompts[:2], 2, rows_of=rows_of)
