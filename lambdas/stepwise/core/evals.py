"""Group evals, pure: pass@k and the group outcomes of an eval, per eval set and per prompt.

An eval rolls out every prompt of each eval set ``n`` times (``eval_group_size``, at
``eval_temperature``). A rollout *succeeds* when its reward is at least the success threshold
(``eval_success_threshold``; the rewards of a binary task are 0 and 1). For a prompt with ``c``
successes among its ``n`` rollouts, and ``k <= n``:

- ``pass@k``: the probability that at least one of ``k`` rollouts drawn without replacement from
  the ``n`` succeeds. The unbiased estimator of Chen et al. 2021 ("Evaluating Large Language Models
  Trained on Code", arXiv:2107.03374, sec. 2.1 and its Figure 3 numpy code):
  ``1 - C(n - c, k) / C(n, k)``, computed in its numerically stable product form
  ``1 - prod_{i = n-c+1}^{n} (1 - k / i)`` (no binomial coefficient is ever formed, so
  ``n`` in the thousands neither overflows nor loses precision).
- ``all_pass@k``: the probability that all ``k`` succeed, ``C(c, k) / C(n, k)``; ``all_fail@k``:
  that none does, ``C(n - c, k) / C(n, k) = 1 - pass@k``; ``mixed@k``: that the ``k`` disagree,
  ``1 - all_pass@k - all_fail@k``. A group of ``k`` rollouts of a prompt is informative for GRPO
  (non-zero advantages) and kept by DAPO's filter exactly when it is mixed, so ``mixed@k`` at the
  training group size is the share of a batch that carries signal. The same unbiased argument as
  Chen et al.'s: each is the fraction of the ``C(n, k)`` ``k``-subsets of the ``n`` rollouts with
  that outcome (`tests/core/test_evals.py` checks them against that enumeration).

Set-level metrics average the per-prompt estimates over the set's prompts, as Chen et al. do.
``accuracy`` keeps the meaning it had before groups: the mean reward over every rollout of the set
(reference ``run_eval``); ``mean@n`` is the mean over prompts of each prompt's mean reward (verl's
``mean@N``), equal to ``accuracy`` when every prompt has ``n`` rollouts.

Metric keys: the unnamed eval set (``eval_dataset_path``) reports ``eval/{metric}`` (so
``eval/accuracy`` reads as before); a named set ``NAME`` reports ``eval/NAME/{metric}``
(`metric_key`). Pure: no boto3, no environment, no I/O.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from stepwise.records import EvalPrompt, EvalResults, EvalSetRows, RunState, SamplerPolicy

__all__ = [
    "EVAL_PREFIX",
    "EvalPrompt",
    "EvalRollout",
    "group_prompts",
    "all_fail_at_k",
    "all_pass_at_k",
    "eval_batch_rows",
    "eval_metrics",
    "eval_sets_of",
    "metric_key",
    "mixed_at_k",
    "pass_at_k",
    "pass_ks",
    "payload_fingerprint",
    "prompt_preview",
    "set_metrics",
    "set_of_rows",
    "summarize_eval",
    "successes",
]

EVAL_PREFIX = "eval/"


def _check(n: int, c: int, k: int) -> None:
    if not (isinstance(n, int) and isinstance(c, int) and isinstance(k, int)):
        raise TypeError(f"n, c and k must be integers, got {n!r}, {c!r}, {k!r}")
    if n < 1 or not 0 <= c <= n:
        raise ValueError(f"need 0 <= c <= n and n >= 1, got n={n}, c={c}")
    if not 1 <= k <= n:
        raise ValueError(f"k must be between 1 and n={n} (rollouts of the prompt), got k={k}")


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one prompt: ``1 - C(n-c, k) / C(n, k)`` (Chen et al. 2021, arXiv:2107.03374,
    eq. 1 and Figure 3's numerically stable ``1 - prod(1 - k / arange(n - c + 1, n + 1))``).

    Args:
        n: rollouts of the prompt (>= 1).
        c: successful rollouts among them (0..n).
        k: rollouts drawn (1..n).

    Returns:
        A probability in [0, 1]; exactly 1.0 when ``n - c < k`` (every k-subset holds a success)
        and exactly 0.0 when ``c == 0``.

    Raises:
        ValueError: ``c`` outside 0..n or ``k`` outside 1..n. TypeError: a non-integer argument.
    """
    _check(n, c, k)
    if n - c < k:
        return 1.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def all_fail_at_k(n: int, c: int, k: int) -> float:
    """The probability that ``k`` rollouts drawn without replacement from the prompt's ``n`` all
    fail: ``C(n-c, k) / C(n, k) = 1 - pass@k`` (the product of `pass_at_k`). Same arguments and errors."""
    _check(n, c, k)
    if n - c < k:
        return 0.0
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return miss


def all_pass_at_k(n: int, c: int, k: int) -> float:
    """The probability that ``k`` rollouts drawn without replacement from the prompt's ``n`` all
    succeed: ``C(c, k) / C(n, k) = prod_{i=0}^{k-1} (c - i) / (n - i)`` (a product of ratios in
    [0, 1], stable like `pass_at_k`'s). Same arguments and errors."""
    _check(n, c, k)
    if c < k:
        return 0.0
    p = 1.0
    for i in range(k):
        p *= (c - i) / (n - i)
    return p


def mixed_at_k(n: int, c: int, k: int) -> float:
    """The probability that ``k`` rollouts drawn without replacement from the prompt's ``n`` hold
    both a success and a failure: ``1 - all_pass@k - all_fail@k`` (never below 0). With ``k`` the
    training group size, the chance that the prompt's group has non-zero GRPO advantages."""
    return max(0.0, 1.0 - all_pass_at_k(n, c, k) - all_fail_at_k(n, c, k))


def successes(rewards_G: Iterable[float], threshold: float) -> int:
    """Rollouts of a group whose reward is at least ``threshold`` (a NaN reward never succeeds)."""
    return sum(1 for r in rewards_G if r >= threshold)


def pass_ks(group_size: int, configured: Sequence[int] | None) -> list[int]:
    """The k of the pass@k metrics: ``configured`` (each 1..group_size), or when None, 1 and the
    group size; sorted, without repeats.

    Raises:
        ValueError: a k outside 1..group_size.
    """
    ks = [1, group_size] if configured is None else list(configured)
    bad = [k for k in ks if not 1 <= k <= group_size]
    if bad:
        raise ValueError(f"pass@k needs 1 <= k <= the eval group size {group_size}, got {bad}")
    return sorted(set(ks))


def payload_fingerprint(payload: Any) -> str:
    """A prompt's identity across runs and datasets: the first 16 hex digits of the sha256 of its
    payload as canonical JSON (sorted keys, no spaces). Two runs' evals are matched prompt by prompt
    on it (`stepwise compare`), and duplicate rows of a dataset pool their rollouts (screening)."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def metric_key(eval_set: str, metric: str) -> str:
    """The summary key of ``metric`` of eval set ``eval_set``: ``eval/{metric}`` for the unnamed set
    (``""``), ``eval/{eval_set}/{metric}`` for a named one."""
    return f"{EVAL_PREFIX}{eval_set}/{metric}" if eval_set else f"{EVAL_PREFIX}{metric}"


def set_metrics(prompts: Sequence[EvalPrompt], ks: Sequence[int]) -> dict[str, float]:
    """Metrics of one eval set from its prompts' results (keys without the ``eval/`` prefix):
    ``accuracy`` (mean reward over all rollouts), ``mean@n``, and per k ``pass@k``, and for k > 1
    ``all_pass@k``, ``all_fail@k``, ``mixed@k`` (means over prompts), plus ``n`` (rollouts, as before groups),
    ``prompts``, ``rollouts``, ``failed_rollouts`` (status not ok) and ``group_size``.

    ``n`` in ``mean@n`` is the group size (the largest group; every group has it unless rollout
    records were lost, which RecordEval refuses). A k larger than a prompt's group raises ValueError.
    An empty set gives zeros for the counts and no rates.
    """
    rollouts = sum(p.n for p in prompts)
    failed = sum(1 for p in prompts for s in p.statuses_G if s != "ok")
    out: dict[str, float] = {"n": rollouts, "prompts": len(prompts), "rollouts": rollouts, "failed_rollouts": failed}
    if not prompts or rollouts == 0:
        return out
    size = max(p.n for p in prompts)
    out["group_size"] = size
    out["accuracy"] = sum(r for p in prompts for r in p.rewards_G) / rollouts
    out[f"mean@{size}"] = sum(p.mean_reward for p in prompts) / len(prompts)
    for k in ks:
        out[f"pass@{k}"] = sum(pass_at_k(p.n, p.successes, k) for p in prompts) / len(prompts)
        if k == 1:  # a group of one is never mixed; all_pass@1 is pass@1 and all_fail@1 its complement
            continue
        out[f"all_pass@{k}"] = sum(all_pass_at_k(p.n, p.successes, k) for p in prompts) / len(prompts)
        out[f"all_fail@{k}"] = sum(all_fail_at_k(p.n, p.successes, k) for p in prompts) / len(prompts)
        out[f"mixed@{k}"] = sum(mixed_at_k(p.n, p.successes, k) for p in prompts) / len(prompts)
    return out


@dataclass(frozen=True)
class EvalRollout:
    """What the eval needs of one rollout record: its prompt (``input_id``, dataset ``row``), its
    member index, reward and status."""

    input_id: str
    row: int
    member: int
    reward: float
    status: str


def prompt_preview(payload: Any, limit: int = 80) -> str:
    """What a person recognises a prompt by: its payload's ``prompt`` (or ``question``) text when it has
    one, else the payload as JSON; at most ``limit`` characters."""
    if isinstance(payload, Mapping):
        for key in ("prompt", "question"):
            if isinstance(payload.get(key), str):
                return payload[key][:limit]
    return json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)[:limit]


def group_prompts(rollouts: Iterable[EvalRollout], *, set_of_row: Mapping[int, tuple[str, int]],
                  payloads: Mapping[str, Any], threshold: float) -> list[EvalPrompt]:
    """Rollouts -> one `EvalPrompt` per prompt, in (set order of first appearance, row) order,
    members in member order.

    Args:
        rollouts: the eval batch's rollouts (one record per Map item).
        set_of_row: ``{global row: (eval set name, row within the set)}``.
        payloads: ``{input_id: payload}`` (its `payload_fingerprint` and `prompt_preview`).
        threshold: the success threshold.

    Raises:
        KeyError: a rollout's row or input_id is not in the maps (a batch that is not this eval's).
    """
    by_prompt: dict[str, tuple[int, list[EvalRollout]]] = {}
    for r in rollouts:
        by_prompt.setdefault(r.input_id, (r.row, []))[1].append(r)
    out: list[EvalPrompt] = []
    for input_id, (row, members) in by_prompt.items():
        members.sort(key=lambda m: m.member)
        eval_set, set_row = set_of_row[row]
        rewards_G = [float(m.reward) for m in members]
        payload = payloads[input_id]
        out.append(EvalPrompt(eval_set=eval_set, row=set_row, input_id=input_id, fingerprint=payload_fingerprint(payload),
                              preview=prompt_preview(payload), rewards_G=rewards_G,
                              statuses_G=[m.status for m in members], successes=successes(rewards_G, threshold)))
    order = {name: i for i, name in enumerate(dict.fromkeys(s for s, _ in set_of_row.values()))}
    return sorted(out, key=lambda p: (order[p.eval_set], p.row))


def eval_metrics(prompts: Sequence[EvalPrompt], eval_sets: Sequence[str], ks: Sequence[int]) -> dict[str, float]:
    """The summary's metrics of an eval: `set_metrics` of each set in ``eval_sets`` under its
    `metric_key` (``eval/accuracy`` for the unnamed set, ``eval/NAME/accuracy`` for a named one)."""
    out: dict[str, float] = {}
    for name in eval_sets:
        for metric, value in set_metrics([p for p in prompts if p.eval_set == name], ks).items():
            out[metric_key(name, metric)] = value
    return out


# ---------------------------------------------------------------------------- the eval's rows


def eval_sets_of(state: RunState) -> list[EvalSetRows]:
    """The run's eval sets (`stepwise.records.RunState.eval_sets`); a state written before named sets
    has only the unnamed set, of ``eval_rows`` rows."""
    if state.eval_sets:
        return list(state.eval_sets)
    return [EvalSetRows(name="", kind="eval", rows=state.eval_rows, offset=0)] if state.eval_rows else []


def eval_batch_rows(sets: Sequence[EvalSetRows], max_prompts: int) -> list[int]:
    """The rows of one eval: the first ``max_prompts`` rows of each set (0 = all), in set order, in
    the sets' shared row space (set row ``r`` is row ``offset + r``)."""
    rows: list[int] = []
    for s in sets:
        used = min(s.rows, max_prompts) if max_prompts > 0 else s.rows
        rows.extend(range(s.offset, s.offset + used))
    return rows


def set_of_rows(sets: Sequence[EvalSetRows], rows: Iterable[int]) -> dict[int, tuple[str, int]]:
    """``{row: (eval set name, row within the set)}`` for rows of the sets' shared row space.

    Raises:
        KeyError: a row of no set.
    """
    out: dict[int, tuple[str, int]] = {}
    for row in rows:
        s = next((s for s in sets if s.offset <= row < s.offset + s.rows), None)
        if s is None:
            raise KeyError(f"row {row} is in no eval set ({[(x.name, x.offset, x.rows) for x in sets]})")
        out[row] = (s.name, row - s.offset)
    return out


def summarize_eval(rollouts: Iterable[EvalRollout], *, sets: Sequence[EvalSetRows], payloads: Mapping[str, Any],
                   threshold: float, ks: Sequence[int], step: int, final: bool = False, eval_only: bool = False,
                   policy: SamplerPolicy | None = None) -> tuple[dict[str, Any], EvalResults]:
    """An eval batch's rollouts -> ``(summary, results)``: what RecordEval writes.

    Args:
        rollouts: one per Map item of the eval batch.
        sets: the run's eval sets (`eval_sets_of`), in their order.
        payloads: ``{input_id: payload}`` of the batch (its ``prompts.json``), for `payload_fingerprint`.
        threshold: the success threshold (``eval_success_threshold``).
        ks: the k of pass@k (``RunConfig.pass_ks``).
        step, final, eval_only: where the eval sits in the run.
        policy: the sampler the batch rolled out on (what was evaluated; None = not recorded).

    Returns:
        The summary (``step``, ``final``, `eval_metrics` of every set, ``eval_sets`` = the set names
        and ``evaluated_model_package_arn`` = the evaluated weights, ``""`` = the base model) and the
        per-prompt `stepwise.records.EvalResults`.
    """
    rollouts = list(rollouts)
    rows = {r.row for r in rollouts}
    prompts = group_prompts(rollouts, set_of_row=set_of_rows(sets, rows), payloads=payloads, threshold=threshold)
    names = [s.name for s in sets if any(p.eval_set == s.name for p in prompts)]
    arn = policy.sampler_model_package_arn if policy is not None else ""
    summary: dict[str, Any] = {"step": step, "final": final}
    summary.update(eval_metrics(prompts, names, ks))
    summary.update({"eval_sets": names, "evaluated_model_package_arn": arn})
    if eval_only:
        summary["eval_only"] = True
    group_size = max((p.n for p in prompts), default=0)
    results = EvalResults(step=step, final=final, eval_only=eval_only, model_package_arn=arn,
                          policy_version=policy.policy_version if policy is not None else 0, group_size=group_size,
                          success_threshold=threshold, pass_k=list(ks), eval_sets=names, prompts=prompts)
    return summary, results


# ---------------------------------------------------------------------------- comparing two evals


@dataclass
class PromptComparison:
    """One eval set's prompts in two evals, matched by `payload_fingerprint` (duplicate rows pooled):
    ``wins`` = prompts whose mean reward is higher in B than in A, ``losses`` lower, ``ties`` equal
    (within ``tolerance``), ``only_a`` / ``only_b`` = prompts one eval has and the other does not;
    ``deltas`` = ``[(fingerprint, preview, mean reward in A, mean reward in B)]`` of the matched prompts,
    most changed first."""

    eval_set: str
    wins: int = 0
    losses: int = 0
    ties: int = 0
    only_a: int = 0
    only_b: int = 0
    deltas: list[tuple[str, str, float, float]] | None = None


def _pooled_means(prompts: Iterable[EvalPrompt], eval_set: str) -> tuple[dict[str, float], dict[str, str]]:
    sums: dict[str, list[float]] = {}
    previews: dict[str, str] = {}
    for p in prompts:
        if p.eval_set == eval_set:
            sums.setdefault(p.fingerprint, []).extend(p.rewards_G)
            previews.setdefault(p.fingerprint, p.preview)
    return {f: sum(r) / len(r) for f, r in sums.items() if r}, previews


def compare_prompts(a: Sequence[EvalPrompt], b: Sequence[EvalPrompt], eval_set: str, *,
                    tolerance: float = 1e-9) -> PromptComparison:
    """Per prompt, B against A on eval set ``eval_set`` (see `PromptComparison`). A prompt's score is
    its mean reward over its rollouts (rows with the same payload pooled), the per-prompt form of
    ``eval/accuracy``; a difference of at most ``tolerance`` is a tie."""
    (ma, previews), (mb, _) = _pooled_means(a, eval_set), _pooled_means(b, eval_set)
    out = PromptComparison(eval_set, deltas=[])
    for f in ma.keys() & mb.keys():
        d = mb[f] - ma[f]
        if d > tolerance:
            out.wins += 1
        elif d < -tolerance:
            out.losses += 1
        else:
            out.ties += 1
        out.deltas.append((f, previews.get(f, ""), ma[f], mb[f]))
    out.only_a, out.only_b = len(ma.keys() - mb.keys()), len(mb.keys() - ma.keys())
    out.deltas.sort(key=lambda x: (-abs(x[3] - x[2]), x[0]))
    return out
