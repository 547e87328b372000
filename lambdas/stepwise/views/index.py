"""The report index: what the report page is drawn from, kept as the run goes, of bounded size.

Pure (no I/O): functions that change a `stepwise.records.ReportIndex` (``runs/{run_id}/report/index.json``,
which the Track function reads and writes with conditional requests, `stepwise.views.publish`). With it,
publishing step N reads one object instead of N summaries and N sample tables, and every part of it is
bounded whatever the number of steps:

- curves (`add_step`): per summary key of `stepwise.views.page.CURVE_PANELS`, points ``[first step,
  last step, sum, count]``; the newest `TAIL` are single steps, and when a curve holds more than
  `MAX_POINTS` the older ones are merged into aligned bins of a power-of-two width (a bin is drawn at
  its mean, at its middle step): the resolution of the run's beginning halves as the run doubles, the
  size never grows. TensorBoard keeps a
  bounded reservoir of each scalar for the same reason (its default: 1,000 points per tag);
- failures by cause (`MAX_CAUSES`, the rest counted as one ``other causes`` entry), the newest
  tracking warnings (`MAX_WARNINGS`), the newest published steps (`RECENT` shown inline, `LINKED`
  more linked), the steps published lately (`PUBLISHED`: a retried invocation adds nothing twice);
- the trackers' outbox (`pending`, a `TrackItem` per summary until every tracker logged it) and its
  lease (one Track invocation calls a run's trackers at a time: `take_lease`, `release`).

A curve added to `CURVE_PANELS` is indexed from the next step on (one line: the page's panel).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from stepwise.records import ReportIndex, TrackItem, TrackLease

__all__ = ["LINKED", "MAX_ATTEMPTS", "MAX_CAUSES", "MAX_POINTS", "MAX_WARNINGS", "PUBLISHED", "RECENT", "TAIL",
           "add_failures", "add_point", "add_step", "add_warning", "enqueue", "has_work", "is_published",
           "next_item", "record_outcome", "release", "series", "start_item", "take_lease"]

#: The newest points of a curve kept one per step.
TAIL = 32
#: The most points a curve holds before its older ones are merged (into half as many).
MAX_POINTS = 128
#: Failure causes kept (the rest are counted together).
MAX_CAUSES = 40
#: Tracking warnings kept (the newest).
MAX_WARNINGS = 20
#: Sample tables shown inline on the page (the newest steps and evals).
RECENT = 5
#: Older tables linked from the page (each is a page of its own beside it).
LINKED = 50
#: Published steps remembered (a retried invocation of any of them adds nothing).
PUBLISHED = 512
#: Invocations that may start on one tracker item before it is given up (each tracker logs it once).
MAX_ATTEMPTS = 3
#: A few figures of the newest summary of each kind, for the page's header.
LATEST_KEYS = ("sampler/mean_reward", "cost/total_usd", "cost/session_hours", "policy_version", "eval/accuracy",
               "decision")
OTHER_CAUSES = "other causes"
#: The largest magnitude a curve keeps (larger finite values are kept at it): matplotlib's axis range of
#: values near the float limit (+-1.7e308) overflows (``ValueError: arange: cannot compute length``), and
#: a merged bucket's sum must stay finite.
PLOT_LIMIT = 1e300


def number(v: Any) -> float | None:
    """``v`` as a finite float, or None (not a number, a bool, too large for a float, NaN or infinite)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:
        return None
    return f if math.isfinite(f) else None


def curve_values(summary: Mapping[str, Any], keys: Iterable[str]) -> dict[str, float]:
    """The summary's finite values of ``keys`` (within +-`PLOT_LIMIT`); ``rollouts/failed_fraction``
    derived as (error + timeout) / rollouts."""
    out: dict[str, float] = {}
    for key in keys:
        if key == "rollouts/failed_fraction":
            n, e, t = (number(summary.get(k)) for k in ("sampler/num_rollouts", "rollouts/num_error",
                                                         "rollouts/num_timeout"))
            if n and e is not None and t is not None:
                out[key] = (e + t) / n
        else:
            v = number(summary.get(key))
            if v is not None:
                out[key] = max(-PLOT_LIMIT, min(PLOT_LIMIT, v))
    return out


def _short(value: float) -> float:
    """A curve value kept to 6 significant digits (a point of a drawn curve; the index stays small)."""
    return float(f"{value:.6g}")


def add_point(points: list[list[float]], step: int, value: float) -> None:
    """Add ``(step, value)`` to a curve in place (sorted by step). A single-step point of the same step is
    replaced (a retry); a step inside a merged bucket is added to it; then merged when too many. Values
    are kept to 6 significant digits."""
    value = _short(value)
    lo, hi = 0, len(points)
    while lo < hi:
        mid = (lo + hi) // 2
        if points[mid][0] < step:
            lo = mid + 1
        else:
            hi = mid
    if lo < len(points) and points[lo][0] == step and points[lo][1] == step and points[lo][3] == 1:
        points[lo] = [step, step, value, 1]
        return
    if lo > 0 and points[lo - 1][0] <= step <= points[lo - 1][1]:
        b = points[lo - 1]
        b[2] = _short(b[2] + value)
        b[3] += 1
        return
    points.insert(lo, [step, step, value, 1])
    if len(points) > MAX_POINTS:
        _compact(points)


def _compact(points: list[list[float]]) -> None:
    """Merge the points older than the newest `TAIL` into aligned bins of a power-of-two width (doubled
    until the curve holds at most half of `MAX_POINTS`): the resolution of the run's beginning is the same
    all along, and halves as the run doubles."""
    head, tail = points[:-TAIL], points[-TAIL:]
    width = 1
    while width < max((int(b[1]) - int(b[0]) + 1 for b in head), default=1):
        width *= 2
    while True:
        bins: dict[int, list[float]] = {}
        for first, last, total, count in head:
            b = bins.get(int(first) // width)
            if b is None:
                bins[int(first) // width] = [first, last, total, count]
            else:
                b[1], b[2], b[3] = max(b[1], last), _short(b[2] + total), b[3] + count
        head = [bins[k] for k in sorted(bins)]
        if len(head) + len(tail) <= MAX_POINTS // 2:
            break
        width *= 2
    points[:] = head + tail


def series(index: ReportIndex, kind: str, key: str) -> list[tuple[float, float]]:
    """A curve's ``[(step, value)]``: each point at its bucket's middle step and mean value."""
    out = []
    for first, last, total, count in index.series.get(kind, {}).get(key, []):
        mean = total / count if count else math.nan
        if math.isfinite(mean):
            out.append(((first + last) / 2, max(-PLOT_LIMIT, min(PLOT_LIMIT, mean))))
    return out


def is_published(index: ReportIndex, kind: str, step: int) -> bool:
    return [kind, step] in index.published


def add_step(index: ReportIndex, kind: str, step: int, summary: Mapping[str, Any] | None,
             table: Mapping[str, Any] | None, *, curve_keys: Iterable[str], track: bool) -> bool:
    """Add a published step or eval: its curve points, failures, place among the newest, and (``track``)
    an item for the trackers. Returns False (and changes nothing) when it was published already."""
    if is_published(index, kind, step):
        return False
    for key, value in curve_values(summary or {}, curve_keys).items():
        add_point(index.series.setdefault(kind, {}).setdefault(key, []), step, value)
    add_failures(index, (table or {}).get("failures") or [])
    index.recent = sorted([*index.recent, [kind, step]], key=lambda e: (e[1], e[0] == "train"))[-(RECENT + LINKED):]
    index.published = [*index.published, [kind, step]][-PUBLISHED:]
    index.counts[kind] = index.counts.get(kind, 0) + 1
    index.last[kind] = max(step, index.last.get(kind, step))
    if summary and step >= index.last.get(kind, step):
        index.latest[kind] = {"step": step, **{k: summary[k] for k in LATEST_KEYS if k in summary}}
    if track:
        enqueue(index, kind, step)
    return True


def add_failures(index: ReportIndex, failures: Sequence[Mapping[str, Any]]) -> None:
    """Merge a table's failures by cause (`stepwise.views.rollout.failure_groups` entries) into the run's,
    most common first; beyond `MAX_CAUSES` causes the least common are counted as `OTHER_CAUSES`."""
    merged = {(f["status"], f["cause"]): dict(f) for f in index.failures}
    for f in failures:
        entry = merged.setdefault((f["status"], f["cause"]), {"cause": f["cause"], "status": f["status"],
                                                              "count": 0, "examples": []})
        entry["count"] += int(f.get("count") or 0)
        entry["examples"] = (list(entry.get("examples") or []) + list(f.get("examples") or []))[:3]
    ordered = sorted(merged.values(), key=lambda e: (e["cause"] == OTHER_CAUSES, -e["count"], e["status"], e["cause"]))
    if len(ordered) > MAX_CAUSES:
        keep, rest = ordered[:MAX_CAUSES - 1], ordered[MAX_CAUSES - 1:]
        other = {"cause": OTHER_CAUSES, "status": "mixed", "count": sum(e["count"] for e in rest), "examples": []}
        ordered = [*keep, other]
    index.failures = ordered


def add_warning(index: ReportIndex, kind: str, step: int | None, text: str) -> None:
    index.warnings = [*index.warnings, [kind, step, text]][-MAX_WARNINGS:]


# ---------------------------------------------------------------------------- the trackers' outbox


def enqueue(index: ReportIndex, kind: str, step: int | None) -> None:
    """Add a `TrackItem` unless one for ``(kind, step)`` waits already."""
    if not any(i.kind == kind and i.step == step for i in index.pending):
        index.pending.append(TrackItem(kind=kind, step=step))


def _order(item: TrackItem) -> tuple[int, int, int]:
    return (item.kind == "run", item.step if item.step is not None else 0, item.kind == "train")


def has_work(index: ReportIndex, trackers: Sequence[str]) -> bool:
    return next_item(index, trackers) is not None


def next_item(index: ReportIndex, trackers: Sequence[str]) -> TrackItem | None:
    """The first waiting item (steps and evals by step, the run's end last) some tracker still has to
    log; items every tracker logged (or that were tried `MAX_ATTEMPTS` times) are dropped first."""
    index.pending = [i for i in index.pending
                     if any(t not in i.done for t in trackers) and i.attempts < MAX_ATTEMPTS]
    index.pending.sort(key=_order)
    return index.pending[0] if index.pending else None


def _find(index: ReportIndex, kind: str, step: int | None) -> TrackItem | None:
    return next((i for i in index.pending if i.kind == kind and i.step == step), None)


def start_item(index: ReportIndex, kind: str, step: int | None, holder: str) -> bool:
    """Count an attempt at an item (False when it is gone or the lease is not ``holder``'s)."""
    item = _find(index, kind, step)
    if item is None or index.lease is None or index.lease.holder != holder:
        return False
    item.attempts += 1
    if item.attempts >= MAX_ATTEMPTS:
        add_warning(index, kind, step, f"tracking gave up after {item.attempts} attempts (each Track invocation "
                                       "that tried it ended before it could log it)")
    return True


def record_outcome(index: ReportIndex, kind: str, step: int | None, tracker: str, warning: str | None) -> None:
    """A tracker logged the item (``warning`` None) or failed (its warning kept, on the page too): either
    way it is done for that tracker."""
    item = _find(index, kind, step)
    if item is not None and tracker not in item.done:
        item.done.append(tracker)
        if warning:
            item.warnings.append(warning)
    if warning:
        add_warning(index, kind, step, warning)


def take_lease(index: ReportIndex, holder: str, now: float, until: float) -> bool:
    """Take (or renew) the lease for ``holder`` until ``until`` unless another invocation holds one that has
    not lapsed."""
    lease = index.lease
    if lease is not None and lease.holder != holder and lease.expires_at > now:
        return False
    index.lease = TrackLease(holder=holder, expires_at=until)
    return True


def release(index: ReportIndex, holder: str, trackers: Sequence[str], *, force: bool = False) -> bool:
    """Give the lease up when no item waits (``force``: whatever waits, for a holder out of time): True
    when released. Written conditionally, so an item added meanwhile makes the write fail and the holder
    look again: no item is left waiting behind a lease let go."""
    if index.lease is None or index.lease.holder != holder:
        return True
    if has_work(index, trackers) and not force:
        return False
    index.lease = None
    return True
