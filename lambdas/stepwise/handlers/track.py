"""Track: everything a person reads of a run, produced beside the training loop, never in it.

Triggered by the S3 ObjectCreated notification of a summary (prefix ``runs/``, suffix
``summary.json``, `stepwise.layout.SUMMARY_NAME`): a step's (``runs/{run_id}/steps/{step}/summary.json``,
written by Rebind, or ComputeAdvantages for a skipped step), an eval's (RecordEval) or the run's end
(``runs/{run_id}/summary.json``, StopSession and Cleanup). A thin shell over `stepwise.views.publish`:
for a step or eval `publish_step` (its sample table, the report index, the report page, then MLflow and
W&B), for the run's end `publish_end`. Publishing a step costs the same number of S3 requests at step 10
and at step 1,000 (`benchmarks/report_cost.py`).

The trackers (`TRACKERS`: MLflow through `stepwise.aws.tracking`, W&B through
`stepwise.aws.wandb_tracking`) are called by one Track invocation of a run at a time, after the page is
written, each call under a deadline that fits in this function's timeout (`TRACK_SPEC`): a tracking
server that hangs costs a warning on the page, never the page. The training loop never waits for any of
this: the summary is written, the loop goes on, and S3 runs this function asynchronously (Lambda
retries a failed asynchronous invocation twice).

Last, Track adds what it used to the run's cost ledger (`add_to_ledger`): the run is billed for every
Track invocation, and Track writes no record of the loop its measurement could ride in
(`stepwise.metering`), so it writes ``state.json`` itself: one conditional read-modify-write per
notification (a GET and a PUT), retried on a conflict with the loop's writes like any other.
"""

from __future__ import annotations

import time
from typing import Any

from aws_lambda_powertools.metrics import MetricUnit

from stepwise import functions, layout
from stepwise.aws import tracking, wandb_tracking
from stepwise.events import S3Notification
from stepwise.handlers._common import bind, emit, entrypoint, logger, run_config, store
from stepwise.views.publish import Tracker, publish_end, publish_step

#: This function's spec (timeout: what a tracker call's deadline must fit in).
TRACK_SPEC = functions.by_name("Track")

#: The trackers, in the order they are called.
TRACKERS: tuple[Tracker, ...] = (
    Tracker("mlflow", tracking.enabled, tracking.log_summary, tracking.finish_tracking, tracking.CALL_SECONDS,
            lambda cfg: f"MLflow tracking to {cfg.mlflow_tracking_uri}"),
    Tracker("wandb", wandb_tracking.enabled, wandb_tracking.log_step, wandb_tracking.finish_run,
            wandb_tracking.CALL_SECONDS, lambda cfg: f"W&B tracking to project {cfg.wandb_project}"),
)


def track(event: S3Notification) -> dict[str, Any]:
    """Publish every summary the notification names, then add this invocation to each run's cost ledger
    (`add_to_ledger`); other keys are logged and ignored."""
    deadline = time.time() + TRACK_SPEC.timeout_s
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
            cfg = run_config(run_id)
            if kind == "run":
                out = publish_end(store(), run_id, cfg, trackers=TRACKERS, deadline=deadline)
            else:
                out = publish_step(store(), run_id, cfg, kind, int(step or 0), trackers=TRACKERS, deadline=deadline)
            if out.duplicate:
                logger.info("summary already published (a repeated notification)", extra={"kind": kind})
            else:
                emit({"time/report": out.seconds, "report/bytes": float(out.page_bytes)}, run_id=run_id,
                     units={"report/bytes": MetricUnit.Bytes})
            for w in out.warnings:
                logger.warning("tracking failed", extra={"kind": kind, "warning": w})
            published.append({"run_id": run_id, **out.to_json()})
    finally:  # a failed invocation is billed too (and Lambda retries it)
        for run_id in runs:
            add_to_ledger(run_id)
    return {"published": published}


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


handler = entrypoint(S3Notification, track)
