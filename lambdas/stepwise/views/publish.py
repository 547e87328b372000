"""Publishing a step for a person: its sample table, the report page and the trackers, at a constant cost.

What the Track function (`stepwise.handlers.track`) does with a summary's notification, through a run
store with conditional writes (`stepwise.aws.runstore.RunStore`). Publishing step N costs the same at
step 10 and at step 1,000: it reads the step's own objects (its rollout records, the captured turns of
the groups it samples) and the run's `stepwise.records.ReportIndex`, never an earlier step's summary or
table (`benchmarks/report_cost.py` measures it).

`publish_step` (a step's or an eval's summary):

1. makes the step's sample table (`stepwise.views.tables.sample_table` of
   `stepwise.views.steps.step_view`: groups, shaping, advantages and marks from the core function
   ComputeAdvantages trains with) and writes it, and the table as a page of its own; the table's presence
   marks the step published (a repeated notification stops at it, after checking that the index has
   the step: an invocation that ended between the two writes is completed by its retry);
2. adds the step to the index (curve points, failures, the newest steps, an item for the trackers),
   conditional on the index's ETag; a step already in it is not added twice;
3. writes the report page (`render`);
4. lets the trackers log what waits (`drain`), then re-renders the page when one of them failed (its
   warning shows there, and with the step's table, where `stepwise watch` reads it).

The page never waits for a tracker: it is written before any tracker is called, and each tracker call
runs under a deadline that fits in the invocation (`Tracker.seconds`: its own timeouts; a call still
running at its deadline is a warning and is left behind).

**One writer per tracking run.** Only the holder of the index's lease calls a run's trackers
(`stepwise.views.index.take_lease`); an invocation that finds the lease held leaves its item in the
index's outbox, and the holder logs every waiting item before it lets the lease go (the release is
conditional on the index not having changed, so nothing is left behind a lease let go). A lease lapses
at its holder's own deadline. Each tracker's outcome is written to the item as soon as the call
returns, so a retried invocation does not log it again.

`publish_end` (the run's end): the sample table of the step or eval the run ended at when it has
rollout records and no table (a run that failed at ComputeAdvantages or RecordEval wrote no summary for
it: its failures belong on the page), then the run's end for the trackers, then the page.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, TypeVar

from botocore.exceptions import ClientError

from stepwise import layout
from stepwise.records import ReportIndex
from stepwise.views import index as ix
from stepwise.views.page import PageInputs, curve_keys, render_page, render_step_page
from stepwise.views.store import Tokenizer, load_tokenizer, read_json, read_state, read_view, rollout_turns, step_folder
from stepwise.views.tables import sample_table

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = ["MAX_RERENDERS", "Published", "Tracker", "drain", "publish_end", "publish_step", "render",
           "update_index"]

T = TypeVar("T")

#: Renders after the first when the index changed while rendering (concurrent invocations of one run:
#: the last page written holds everything published before it).
MAX_RERENDERS = 2
#: Seconds kept free at the end of an invocation (the index's last write, the page).
MARGIN_SECONDS = 15.0
#: Conditional writes of the index before giving up (each conflict is another invocation's write).
INDEX_ATTEMPTS = 12


@dataclass(frozen=True)
class Tracker:
    """One tracking service (MLflow, W&B), as publishing calls it.

    Attributes:
        name: its name in the index's outbox (``mlflow``, ``wandb``).
        enabled: whether a run's config turns it on.
        log: logs a summary (``cfg, run_id, kind, step, summary, table``); raises on failure.
        finish: ends the tracking run (``cfg, run_id, status, ended``); raises on failure.
        seconds: the most one call may take under the tracker's own timeouts; the call is abandoned
            (a warning) at this deadline.
        target: what a warning names it by (``MLflow tracking to URI``).
    """

    name: str
    enabled: Callable[[Any], bool]
    log: Callable[..., Any]
    finish: Callable[..., Any]
    seconds: float
    target: Callable[[Any], str] = lambda cfg: "tracking"


@dataclass
class Published:
    """What one publish did: for the Track function's result and its metrics."""

    kind: str
    step: int | None
    duplicate: bool = False
    page_bytes: int = 0
    warnings: list[str] = field(default_factory=list)
    tracked: int = 0
    seconds: float = 0.0
    status: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = {"kind": self.kind, "step": self.step, "duplicate": self.duplicate, "report_bytes": self.page_bytes,
               "warnings": len(self.warnings), "tracked": self.tracked, "seconds": round(self.seconds, 3)}
        return out | ({"status": self.status} if self.status is not None else {})


def now_text() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


# ---------------------------------------------------------------------------- the index


def _precondition_failed(e: ClientError) -> bool:
    err = e.response.get("Error", {})
    return err.get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict") or (
        e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412)


def read_index(store: Any, run_id: str) -> tuple[ReportIndex, str | None]:
    """The run's report index and its ETag (an empty index and None before the first step; no ETag from a
    store without one, a local run folder)."""
    key = layout.report_index_key(run_id)
    if not hasattr(store, "get_json_etag"):
        body = store.get_json_or(key)
        return (ReportIndex.model_validate(body), None) if isinstance(body, dict) else (ReportIndex(), None)
    try:
        body, etag = store.get_json_etag(key)
    except KeyError:
        return ReportIndex(), None
    return ReportIndex.model_validate(body), etag


def update_index(store: Any, run_id: str, change: Callable[[ReportIndex], tuple[T, bool]]) -> tuple[T, ReportIndex]:
    """Read-modify-write the index, conditional on its ETag (S3 ``IfMatch``; ``IfNoneMatch`` for the first).
    ``change`` returns ``(result, changed)`` and is re-applied to a fresh read after a conflict; nothing
    is written when it changed nothing. Raises RuntimeError after `INDEX_ATTEMPTS` conflicts."""
    for _ in range(INDEX_ATTEMPTS):
        index, etag = read_index(store, run_id)
        result, changed = change(index)
        if not changed:
            return result, index
        try:
            store.put_json(layout.report_index_key(run_id), index.model_dump(mode="json"),
                           if_match=etag, if_none_match=etag is None)
            return result, index
        except ClientError as e:
            if not _precondition_failed(e):
                raise
    raise RuntimeError(f"the report index of run {run_id!r} kept changing under us ({INDEX_ATTEMPTS} attempts)")


# ---------------------------------------------------------------------------- the page


#: Renders in this process, one at a time, and when the last one of each run started and the size it
#: wrote (monotonic seconds, bytes). A Lambda environment runs one invocation at a time; the local stack
#: runs several Track invocations of a run on threads of one worker process.
_RENDERING = threading.Lock()
_LAST_RENDER: dict[str, tuple[float, int]] = {}


def render(store: Any, run_id: str, cfg: RunConfig | None, *, link_prefix: str = "") -> int:
    """Render and write the run's report page from the index; returns its size in bytes. A render of
    the run that this process started after this call and finished meanwhile already wrote a page
    holding what the caller published: then nothing is rendered again. Re-renders (up to
    `MAX_RERENDERS` times) when the index changed while rendering."""
    asked = time.monotonic()
    with _RENDERING:
        last = _LAST_RENDER.get(run_id)
        if last is not None and last[0] >= asked:
            return last[1]
        started = time.monotonic()
        size = _render(store, run_id, cfg, link_prefix)
        _LAST_RENDER[run_id] = (started, size)
        return size


def _render(store: Any, run_id: str, cfg: RunConfig | None, link_prefix: str) -> int:
    size = 0
    for _ in range(1 + MAX_RERENDERS):
        index, etag = read_index(store, run_id)
        page = render_page(page_inputs(store, run_id, cfg, index, link_prefix=link_prefix)).encode()
        store.put_bytes(layout.report_key(run_id), page, content_type="text/html; charset=utf-8")
        size = len(page)
        if read_index(store, run_id)[1] == etag:
            break
    return size


def page_inputs(store: Any, run_id: str, cfg: RunConfig | None, index: ReportIndex, *,
                link_prefix: str = "", updated_at: str = "") -> PageInputs:
    """What the page shows, read in a constant number of requests: the state, the run's end and the
    newest `stepwise.views.index.RECENT` sample tables (the rest comes from the index)."""
    recent = [tuple(e) for e in index.recent[-ix.RECENT:]]
    keys = [layout.report_table_key(run_id, k, s) for k, s in recent]
    with ThreadPoolExecutor(max_workers=2 + len(keys)) as pool:
        state = pool.submit(read_state, store, run_id)
        ended = pool.submit(store.get_json_or, layout.run_summary_key(run_id))
        tables = list(pool.map(lambda k: store.get_json_or(k), keys))
        return PageInputs(run_id=run_id, config=cfg, state=state.result(), index=index,
                          tables=[t for t in tables if isinstance(t, dict)], ended=ended.result(),
                          updated_at=updated_at or now_text(), link_prefix=link_prefix)


# ---------------------------------------------------------------------------- a step


def make_table(store: Any, run_id: str, cfg: RunConfig, kind: str, step: int, summary: Mapping[str, Any] | None,
               tokenizer: Tokenizer | None) -> dict[str, Any]:
    """The step's sample table from its rollout records (one LIST and a GET per record; with a group judge, one
    more LIST and a GET per group for the judge's records; a group-engine step: one LIST per group it consumed
    instead, `stepwise.views.store.read_view`) and the captured turns of the groups it samples."""
    view = read_view(store, run_id, cfg, kind, step, summary)
    return sample_table(view, lambda sid: rollout_turns(store, run_id, sid),
                        tokenizer.decode if tokenizer is not None else None, summary)


def _exists(store: Any, key: str) -> bool:
    exists = getattr(store, "exists", None)
    return bool(exists(key)) if exists is not None else store.get_json_or(key) is not None


def _write_table(store: Any, run_id: str, kind: str, step: int, table: Mapping[str, Any]) -> None:
    store.put_bytes(layout.report_step_page_key(run_id, kind, step),
                    render_step_page(run_id, table, updated_at=now_text()).encode(),
                    content_type="text/html; charset=utf-8")
    store.put_json(layout.report_table_key(run_id, kind, step), table)


def publish_step(store: Any, run_id: str, cfg: RunConfig, kind: str, step: int, *,
                 trackers: Sequence[Tracker] = (), deadline: float | None = None) -> Published:
    """Publish a step's (``kind="train"``) or eval's summary (the module docstring's steps 1-4).

    The table is written before the index names the step (a tracker reading the outbox always finds
    it); a notification that finds the table checks that the index has the step too (an invocation that
    ended between the two writes is completed by its retry) and otherwise stops there."""
    t0 = time.monotonic()
    out = Published(kind, step)
    active = [t.name for t in trackers if t.enabled(cfg)]
    table_key = layout.report_table_key(run_id, kind, step)
    summary_key = layout.step_summary_key(run_id, step_folder(kind), step)
    keys = curve_keys(kind)
    if _exists(store, table_key):
        out.duplicate = True
        index, _ = read_index(store, run_id)
        if not ix.is_published(index, kind, step):
            summary, table = read_json(store, summary_key), store.get_json_or(table_key)
            update_index(store, run_id, lambda i: (None, ix.add_step(i, kind, step, summary, table, curve_keys=keys,
                                                                     track=bool(active))))
            out.page_bytes = render(store, run_id, cfg)
    else:
        summary = read_json(store, summary_key)
        table = make_table(store, run_id, cfg, kind, step, summary, load_tokenizer(store, run_id))
        _write_table(store, run_id, kind, step, table)
        update_index(store, run_id, lambda i: (None, ix.add_step(i, kind, step, summary, table, curve_keys=keys,
                                                                 track=bool(active))))
        out.page_bytes = render(store, run_id, cfg)
    out.warnings, out.tracked = drain(store, run_id, cfg, trackers, deadline=deadline)
    if out.warnings:
        out.page_bytes = render(store, run_id, cfg)
    out.seconds = time.monotonic() - t0
    return out


def publish_end(store: Any, run_id: str, cfg: RunConfig, *, trackers: Sequence[Tracker] = (),
                deadline: float | None = None) -> Published:
    """The run ended: the table of the batch it ended at (when it has records and none), the trackers'
    run end, the page."""
    t0 = time.monotonic()
    out = Published("run", None)
    ended = store.get_json_or(layout.run_summary_key(run_id)) or {}
    out.status = str(ended.get("status") or "FINISHED") if isinstance(ended, dict) else None
    state = read_state(store, run_id)
    tokenizer: Tokenizer | None = None
    for kind, step in _ended_at(state):
        if _exists(store, layout.report_table_key(run_id, kind, step)):
            continue
        summary = read_json(store, layout.step_summary_key(run_id, step_folder(kind), step))
        if summary is not None:  # its own notification publishes it (with its curve points and trackers)
            continue
        tokenizer = tokenizer or load_tokenizer(store, run_id)
        table = make_table(store, run_id, cfg, kind, step, None, tokenizer)
        if not table["groups"]:
            continue
        _write_table(store, run_id, kind, step, table)
        update_index(store, run_id, lambda index, k=kind, s=step, t=table: (None, ix.add_step(
            index, k, s, None, t, curve_keys=(), track=False)))
    if any(t.enabled(cfg) for t in trackers):
        update_index(store, run_id, lambda index: (None, _enqueue_end(index)))
    out.page_bytes = render(store, run_id, cfg)
    out.warnings, out.tracked = drain(store, run_id, cfg, trackers, deadline=deadline)
    if out.warnings:
        out.page_bytes = render(store, run_id, cfg)
    out.seconds = time.monotonic() - t0
    return out


def _enqueue_end(index: ReportIndex) -> bool:
    before = len(index.pending)
    ix.enqueue(index, "run", None)
    return len(index.pending) != before


def _ended_at(state: Any) -> list[tuple[str, int]]:
    """The batches a run can have ended at without a summary: the planned (or ahead) batch, and the
    step its state points at."""
    if state is None:
        return []
    out: list[tuple[str, int]] = []
    for batch in (state.current_batch, state.ahead_batch):
        if batch is not None and (batch.kind, batch.step) not in out:
            out.append((batch.kind, batch.step))
    if ("train", state.step) not in out:
        out.append(("train", state.step))
    return out


# ---------------------------------------------------------------------------- the trackers


def call_with_deadline(fn: Callable[[], Any], seconds: float) -> str | None:
    """Run ``fn`` on a thread for at most ``seconds``: None when it returned, else the failure's text
    (its exception, or that it was still running at the deadline: the thread is left to the tracker's
    own timeouts, never waited for)."""
    box: dict[str, BaseException | None] = {}

    def run() -> None:
        try:
            fn()
            box["error"] = None
        except BaseException as e:  # noqa: BLE001 - reported as the tracker's warning
            box["error"] = e

    thread = threading.Thread(target=run, name="stepwise-tracker", daemon=True)
    thread.start()
    thread.join(max(0.0, seconds))
    if thread.is_alive():
        return f"no answer within {seconds:.0f} s (left behind; the page does not wait for it)"
    error = box.get("error")
    return None if error is None else f"{type(error).__name__}: {str(error)[:800]}"


def drain(store: Any, run_id: str, cfg: RunConfig, trackers: Sequence[Tracker], *,
          deadline: float | None = None, holder: str | None = None) -> tuple[list[str], int]:
    """Log every summary waiting in the index's outbox to the run's trackers, if this invocation gets the
    lease (the module docstring); returns ``(warnings, items logged)``. Stops with ``MARGIN_SECONDS``
    and a tracker's ``seconds`` left before ``deadline`` (epoch seconds); what is left waits for the
    next invocation."""
    active = [t for t in trackers if t.enabled(cfg)]
    if not active:
        return [], 0
    names = [t.name for t in active]
    holder = holder or uuid.uuid4().hex
    deadline = deadline if deadline is not None else time.time() + 900.0

    def left() -> float:
        return deadline - time.time() - MARGIN_SECONDS

    def take(index: ReportIndex) -> tuple[bool, bool]:
        if not ix.has_work(index, names):
            return False, False
        ok = ix.take_lease(index, holder, time.time(), deadline)
        return ok, ok

    got, _ = update_index(store, run_id, take)
    if not got:
        return [], 0
    warnings: list[str] = []
    logged = 0
    while True:
        index, _ = read_index(store, run_id)
        item = ix.next_item(index, names)
        todo = [t for t in active if item is not None and t.name not in item.done]
        if item is None or not todo or left() < max(t.seconds for t in todo):
            force = item is not None and bool(todo)
            released, _ = update_index(store, run_id, lambda i, f=force: _release(i, holder, names, f))
            if released:
                break
            continue
        kind, step = item.kind, item.step
        started, _ = update_index(store, run_id, lambda i: _start(i, kind, step, holder))
        if not started:
            break  # the lease lapsed and another invocation took it
        payload = _payload(store, run_id, kind, step)
        for t in todo:
            if left() < t.seconds:
                break
            warning = call_with_deadline(lambda t=t: _call(t, cfg, run_id, kind, step, payload), t.seconds)
            where = "the run's end" if step is None else f"{kind} step {step}"
            text = None if warning is None else f"{t.target(cfg)} failed at {where}: {warning}"
            update_index(store, run_id, lambda i, tn=t.name, w=text: (None, _record(i, kind, step, tn, w)))
            if text:
                warnings.append(text)
                if step is not None:
                    _table_warning(store, run_id, kind, step, text)
        logged += 1
    return warnings, logged


def _release(index: ReportIndex, holder: str, names: list[str], force: bool) -> tuple[bool, bool]:
    before = index.lease
    released = ix.release(index, holder, names, force=force)
    return released, index.lease != before


def _table_warning(store: Any, run_id: str, kind: str, step: int, text: str) -> None:
    """Keep a tracker's warning with the step's table too (`stepwise watch` prints it from there)."""
    key = layout.report_table_key(run_id, kind, step)
    table = store.get_json_or(key)
    if isinstance(table, dict) and text not in (table.get("warnings") or []):
        table["warnings"] = [*(table.get("warnings") or []), text]
        store.put_json(key, table)


def _start(index: ReportIndex, kind: str, step: int | None, holder: str) -> tuple[bool, bool]:
    ok = ix.start_item(index, kind, step, holder)
    return ok, ok


def _record(index: ReportIndex, kind: str, step: int | None, tracker: str, warning: str | None) -> bool:
    ix.record_outcome(index, kind, step, tracker, warning)
    return True


def _payload(store: Any, run_id: str, kind: str, step: int | None) -> dict[str, Any]:
    if kind == "run":
        return {"ended": store.get_json_or(layout.run_summary_key(run_id)) or {}}
    assert step is not None
    return {"summary": store.get_json_or(layout.step_summary_key(run_id, step_folder(kind), step)) or {},
            "table": store.get_json_or(layout.report_table_key(run_id, kind, step))}


def _call(tracker: Tracker, cfg: RunConfig, run_id: str, kind: str, step: int | None, payload: Mapping[str, Any]) -> None:
    if kind == "run":
        ended = payload["ended"]
        tracker.finish(cfg, run_id, str(ended.get("status") or "FINISHED"), ended)
    else:
        tracker.log(cfg, run_id, kind, int(step or 0), payload["summary"], payload["table"])
