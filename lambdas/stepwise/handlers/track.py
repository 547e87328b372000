"""Track: everything a person reads of a run, produced beside the training loop, never in it.

Triggered by the S3 ObjectCreated notification of a summary (prefix ``runs/``, suffix
``summary.json``, `stepwise.layout.SUMMARY_NAME`): a step's (``runs/{run_id}/steps/{step}/summary.json``,
written by Rebind, or ComputeAdvantages for a skipped step), an eval's (RecordEval) or the run's end
(``runs/{run_id}/summary.json``, StopSession and Cleanup). For a step or eval it

1. makes the step's sample table (`stepwise.runview.step_table`: its best, worst and a mixed group,
   conversations with the trained tokens, failures by cause);
2. logs the summary to MLflow (`stepwise.aws.tracking`) and the summary and the sample table to
   Weights & Biases (`stepwise.aws.wandb_tracking`), when the run config asks for them; a failure
   is a warning, kept with the table and shown on the page, never a failed step;
3. writes the table once (`stepwise.layout.report_table_key`; a second delivery of the same
   notification finds it and logs nothing twice: S3 notifications are at-least-once);
4. re-renders the run's report page (`stepwise.core.report.render_page`) to
   `stepwise.layout.report_key`.

For the run's end it ends the MLflow and W&B runs with the run's status and re-renders the page.
The training loop never waits for any of this: the summary is written, the loop goes on, and S3
runs this function asynchronously (Lambda retries a failed asynchronous invocation twice).

Last, Track adds what it used to the run's cost ledger (`add_to_ledger`): the run is billed for every
Track invocation, and Track writes no record of the loop its measurement could ride in
(`stepwise.metering`), so it writes ``state.json`` itself: one conditional read-modify-write per
notification (a GET and a PUT), retried on a conflict with the loop's writes like any other.
"""

from __future__ import annotations

import threading
import time
from datetime import datetime, timezone
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stepwise import layout, runview
from stepwise.aws import tracking
from stepwise.events import S3Notification
from stepwise.handlers._common import bind, emit, entrypoint, logger, run_config, store

#: Renders after the first when tables or the run's end appeared while rendering (concurrent
#: Track invocations of one run: the last page written holds everything written before it).
MAX_RERENDERS = 2


def _now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


#: Renders in this process, one at a time, and when the last one of each run started and the size it
#: wrote (monotonic seconds, bytes). A Lambda environment runs one invocation at a time; the local stack
#: runs several Track invocations of a run on threads of one worker process, where a 20-step run's
#: invocations took up to 254 s (``time/report``; Track's timeout is 300 s) with every one rendering the
#: whole page, up to 1 + `MAX_RERENDERS` times, beside the others doing the same.
_RENDERING = threading.Lock()
_LAST_RENDER: dict[str, tuple[float, int]] = {}


def render(run_id: str) -> int:
    """Render and write the run's report page; returns its size in bytes. Re-renders when a table
    or the run's end appeared meanwhile (up to `MAX_RERENDERS` times). A render of the run that this
    process started after this call (so after the caller wrote its table or read the run's end) and
    finished meanwhile already wrote a page holding them: then nothing is rendered again."""
    asked = time.monotonic()
    with _RENDERING:
        last = _LAST_RENDER.get(run_id)
        if last is not None and last[0] >= asked:
            return last[1]
        started = time.monotonic()
        size = _render(run_id)
        _LAST_RENDER[run_id] = (started, size)
        return size


def _render(run_id: str) -> int:
    from stepwise.core.report import render_page

    rs = store()
    size = 0
    for _ in range(1 + MAX_RERENDERS):
        inputs = runview.report_inputs(rs, run_id, updated_at=_now_iso())
        page = render_page(inputs).encode()
        rs.put_bytes(layout.report_key(run_id), page, content_type="text/html; charset=utf-8")
        size = len(page)
        seen = (set(inputs.tables), inputs.ended is not None)
        if (set(runview.sample_tables(rs, run_id)), rs.get_json_or(layout.run_summary_key(run_id)) is not None) == seen:
            break
    return size


def publish_step(run_id: str, kind: str, step: int) -> dict[str, Any]:
    """Steps 1-4 of the module docstring for one step or eval summary."""
    from stepwise.aws import wandb_tracking

    rs = store()
    t0 = time.monotonic()
    table_key = layout.report_table_key(run_id, kind, step)
    if rs.get_json_or(table_key) is not None:
        logger.info("summary already published (a repeated notification)", extra={"kind": kind})
        return {"run_id": run_id, "kind": kind, "step": step, "duplicate": True}
    cfg = run_config(run_id)
    summary = rs.get_json(layout.step_summary_key(run_id, "steps" if kind == "train" else "evals", step))
    table = runview.step_table(rs, run_id, kind, step, cfg=cfg.model_dump(mode="json"),
                               tokenizer=runview.load_tokenizer(rs, run_id), summary=summary)
    warnings = [w for w in (tracking.summary_warning(cfg, run_id, step, summary, kind=kind),
                            wandb_tracking.step_warning(cfg, run_id, kind, step, summary, table)) if w]
    table.update(warnings=warnings, published_at=_now_iso())
    rs.put_json(table_key, table)
    size = render(run_id)
    seconds = time.monotonic() - t0
    emit({"time/report": seconds, "report/bytes": float(size)}, run_id=run_id,
         units={"report/bytes": MetricUnit.Bytes})
    for w in warnings:
        logger.warning("tracking failed", extra={"kind": kind, "warning": w})
    return {"run_id": run_id, "kind": kind, "step": step, "report_bytes": size, "seconds": round(seconds, 3),
            "warnings": len(warnings)}


def publish_end(run_id: str) -> dict[str, Any]:
    """The run ended: end its MLflow and W&B runs with its status, then re-render the page."""
    from stepwise.aws import wandb_tracking

    rs = store()
    ended = rs.get_json(layout.run_summary_key(run_id))
    cfg = run_config(run_id)
    status = str(ended.get("status") or "FINISHED")
    tracking.finish_run(cfg, run_id, status if status in ("FINISHED", "FAILED", "KILLED") else "FAILED")
    wandb_tracking.finish(cfg, run_id, status, ended)
    return {"run_id": run_id, "kind": "run", "status": status, "report_bytes": render(run_id)}


def add_to_ledger(run_id: str) -> bool:
    """Carry this invocation's measurement (and this process's earlier tails for the run) into the run's
    cost ledger: a no-op change of ``state.json`` through `stepwise.aws.runstore.RunStore.update_state`,
    whose write carries them. Best effort, never the invocation's failure: a run whose state is gone,
    that kept changing or could not be written is logged, and the measurement waits in this process
    for its next write (as any invocation's tail). Returns whether it was written."""
    try:
        store().update_state(run_id, lambda _state: None, execution_arn=None)
        return True
    except Exception as e:  # RunNotFound, StateConflict, an S3 error: bookkeeping must not fail Track
        logger.warning("Track's usage not added to the cost ledger",
                       extra={"error": f"{type(e).__name__}: {str(e)[:300]}"})
        return False


def track(event: S3Notification) -> dict[str, Any]:
    """Publish every summary the notification names, then add this invocation to each run's cost ledger
    (`add_to_ledger`); other keys are logged and ignored."""
    published: list[dict[str, Any]] = []
    runs: dict[str, None] = {}
    try:
        for _bucket, key in event.objects():
            parsed = layout.parse_summary_key(key)
            if parsed is None:
                logger.warning("not a summary key; ignored", extra={"key": key[:300]})
                continue
            run_id, kind, step = parsed
            runs[run_id] = None
            bind(run_id=run_id, step=step)
            published.append(publish_end(run_id) if kind == "run" else publish_step(run_id, kind, int(step or 0)))
    finally:  # a failed invocation is billed too (and Lambda retries it)
        for run_id in runs:
            add_to_ledger(run_id)
    return {"published": published}


handler = entrypoint(S3Notification, track)
