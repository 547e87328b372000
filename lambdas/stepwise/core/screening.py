"""Dataset screening, pure: which training prompts can give GRPO a learning signal at group size K.

A group of K rollouts of one prompt trains only when its rewards differ (GRPO's advantages of an
all-equal group are zero; DAPO's filter drops it: Yu et al. 2025, arXiv:2503.14476, sec. 3.2).
A prompt the policy always solves or never solves gives all-equal groups and costs rollouts for
nothing. Screening rolls every training prompt out K times with the policy about to be trained (an
eval-only run at ``eval_group_size`` K and the training temperature), then keeps the prompts whose
outcomes are mixed: the filter of upstream's SWE recipe, which screened its tasks by mixed outcomes
at k before training.

Rows with the same payload (`stepwise.core.evals.payload_fingerprint`) are one prompt: `stepwise
screen` rolls out each distinct prompt once (`distinct_rows`) and its verdict applies to every row
holding it, so a dataset that repeats its prompts (the toy and mix tasks cycle theirs) pays K
rollouts per prompt, not per row; rollouts of copies that were rolled out are pooled. A prompt is *too easy* when its pass rate is at
least ``max_pass_rate`` (default 1.0: every rollout succeeded, all-pass), *too hard* when it is at
most ``min_pass_rate`` (default 0.0: none did, all-fail); every other prompt is kept, with all its
rows. ``mixed@K`` (`stepwise.core.evals.mixed_at_k`) is the chance that a group of K rollouts of the
prompt holds both outcomes: its mean over the dataset's rows is the share of a GRPO batch that would
carry signal, before and after screening.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from stepwise.core.evals import mixed_at_k
from stepwise.records import EvalPrompt

__all__ = ["ORDERS", "ScreenedPrompt", "Screening", "distinct_rows", "screen"]

Verdict = Literal["too_easy", "too_hard", "kept"]
#: How the screened dataset's rows are ordered: as in the dataset, or by the prompt's pass rate.
ORDERS = ("dataset", "easy_first", "hard_first")


@dataclass
class ScreenedPrompt:
    """One distinct prompt: its dataset ``rows`` (ascending), rollouts ``n`` and ``successes`` pooled
    over them, ``pass_rate`` = successes / n, ``mixed_at_k`` and the ``verdict``."""

    fingerprint: str
    rows: list[int]
    n: int
    successes: int
    pass_rate: float
    mixed_at_k: float
    verdict: Verdict


@dataclass
class Screening:
    """The outcome: every prompt, the rows kept in the screened dataset's order, and its figures
    (``rows`` screened, rows removed per verdict, ``mixed_at_k_before`` / ``after`` = the mean
    mixed@K over the rows before and after)."""

    k: int
    prompts: list[ScreenedPrompt] = field(default_factory=list)
    kept_rows: list[int] = field(default_factory=list)
    rows: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    mixed_at_k_before: float = 0.0
    mixed_at_k_after: float = 0.0

    def figures(self) -> dict[str, float | int]:
        """The one-line summary: rows screened and kept, rows removed as too easy / too hard, the
        fraction of prompts kept, mixed@K before and after."""
        kept = sum(1 for p in self.prompts if p.verdict == "kept")
        return {"k": self.k, "rows": self.rows, "kept_rows": len(self.kept_rows),
                "removed_too_easy_rows": self.removed.get("too_easy", 0),
                "removed_too_hard_rows": self.removed.get("too_hard", 0),
                "prompts": len(self.prompts), "kept_prompts": kept,
                f"mixed@{self.k}_before": self.mixed_at_k_before, f"mixed@{self.k}_after": self.mixed_at_k_after}


def screen(prompts: Sequence[EvalPrompt], k: int, *, rows_of: Mapping[str, Sequence[int]] | None = None,
           min_pass_rate: float = 0.0, max_pass_rate: float = 1.0, order: str = "dataset") -> Screening:
    """Screen a dataset from its eval results (see the module doc).

    Args:
        prompts: the eval's `stepwise.records.EvalPrompt` s, each with at least ``k`` rollouts.
        k: the group size the screen is for (its eval group size, the training ``responses_per_prompt``).
        rows_of: ``{payload fingerprint: the dataset rows holding that payload}`` when the eval rolled
            out each distinct prompt once (`distinct_rows`); None when it rolled out every row (each
            prompt's ``row`` is then its dataset row).
        min_pass_rate, max_pass_rate: a prompt is too hard at or below the first, too easy at or above
            the second (0 <= min < max <= 1).
        order: `ORDERS`: ``dataset`` (row order), ``easy_first`` (pass rate descending, a curriculum),
            ``hard_first``; ties keep row order.

    Raises:
        ValueError: bounds out of order, an unknown order, or a prompt with fewer than ``k`` rollouts.
    """
    if not 0.0 <= min_pass_rate < max_pass_rate <= 1.0:
        raise ValueError(f"need 0 <= min_pass_rate < max_pass_rate <= 1, got {min_pass_rate} and {max_pass_rate}")
    if order not in ORDERS:
        raise ValueError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
    pooled: dict[str, list[EvalPrompt]] = {}
    for p in prompts:
        pooled.setdefault(p.fingerprint, []).append(p)
    if rows_of is not None:
        missing = [f for f in rows_of if f not in pooled]
        if missing:
            raise ValueError(f"{len(missing)} dataset prompt(s) have no eval result, e.g. {missing[0]}")
    out = Screening(k=k, rows=len(prompts) if rows_of is None else sum(len(r) for r in rows_of.values()))
    for fingerprint, copies in pooled.items():
        n = sum(c.n for c in copies)
        c = sum(c.successes for c in copies)
        if n < k:
            raise ValueError(f"prompt {fingerprint} has {n} rollouts, fewer than k={k}")
        rate = c / n
        verdict: Verdict = "too_hard" if rate <= min_pass_rate else "too_easy" if rate >= max_pass_rate else "kept"
        rows = sorted(x.row for x in copies) if rows_of is None else sorted(rows_of.get(fingerprint, ()))
        if rows:
            out.prompts.append(ScreenedPrompt(fingerprint, rows, n, c, rate, mixed_at_k(n, c, k), verdict))
    out.prompts.sort(key=lambda p: p.rows[0])
    kept = [p for p in out.prompts if p.verdict == "kept"]
    if order != "dataset":
        kept.sort(key=lambda p: -p.pass_rate if order == "easy_first" else p.pass_rate)  # stable: row order in ties
    out.kept_rows = [row for p in kept for row in p.rows] if order != "dataset" else sorted(r for p in kept for r in p.rows)
    for p in out.prompts:
        if p.verdict != "kept":
            out.removed[p.verdict] = out.removed.get(p.verdict, 0) + len(p.rows)
    weighted = [(p.mixed_at_k, len(p.rows)) for p in out.prompts]
    out.mixed_at_k_before = sum(m * w for m, w in weighted) / max(1, sum(w for _, w in weighted))
    out.mixed_at_k_after = sum(p.mixed_at_k * len(p.rows) for p in kept) / max(1, sum(len(p.rows) for p in kept))
    return out


def distinct_rows(payloads: Iterable[object]) -> tuple[list[int], dict[str, list[int]]]:
    """``(the first row of each distinct payload, {fingerprint: every row holding it})`` of a dataset's
    payloads in row order: the screen rolls out each distinct prompt once (K rollouts), not each copy."""
    from stepwise.core.evals import payload_fingerprint

    rows_of: dict[str, list[int]] = {}
    for row, payload in enumerate(payloads):
        rows_of.setdefault(payload_fingerprint(payload), []).append(row)
    return [rows[0] for rows in rows_of.values()], rows_of
