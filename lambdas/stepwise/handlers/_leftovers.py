"""The clean-up a run's end leaves, off the path that decides the run's outcome.

A run's end (StopSession, Cleanup) stops the training session and records the end (``state.json``:
stopped, reason, ledger; the run summary) first. What can grow with a run comes after, in the time
the invocation has left, and whatever is left then is handed to the session sweeper, which finishes
it on its next passes:

- the rollouts in flight (`stepwise.handlers._rollout_sessions`: start markers without a record,
  their gateway sessions closed and runtime sessions stopped, in parallel at ACR's request rate),
  with ``admission: group`` those of the group executions the end stopped (`stepwise.handlers._groups.stop_groups`);
- retention ``keep_model_packages: best_and_last`` (`stepwise.core.selection.packages_to_delete`):
  DeleteModelPackage in parallel with one client, each deletion recorded in ``state.json`` as it goes
  (`stepwise.core.selection.mark_deleted`), so a pass cut short is resumed by the next.

The hand-over is ``leftovers/{run_id}.json`` (`stepwise.records.RunLeftovers`), written before the end
is recorded and updated (conditionally on its ETag) as work is done, deleted when nothing is left. An
invocation working on it holds it until its own deadline (``held_until``), so the sweeper never works
on a run's leftovers while its stop path still does; one that dies mid-way loses the hold at its
deadline. Every step is idempotent (closing a closed gateway session, stopping a stopped runtime
session, deleting a deleted package), so work repeated after a crash costs requests, not correctness.
Nothing here raises: a failure is logged and left for the next pass (`MAX_PASSES` at most).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Callable

from botocore.exceptions import ClientError

from stepwise.aws import sagemaker
from stepwise.aws.clients import max_pool_connections
from stepwise.concurrency import run_until
from stepwise.core.selection import mark_deleted, packages_to_delete
from stepwise.handlers._common import logger, now
from stepwise.handlers._rollout_sessions import end_rollouts, rollouts_in_flight
from stepwise.layout import LEFTOVERS_PREFIX, leftovers_key, run_id_of_leftovers
from stepwise.records import PlannedBatch, RunLeftovers

if TYPE_CHECKING:
    from stepwise.aws.runstore import RunStore
    from stepwise.config import RunConfig

#: Seconds an invocation keeps, before its deadline, for its last writes (the leftovers record, its
#: output): the work stops handing out calls this long before the Lambda's timeout.
MARGIN_S = 10.0
#: Passes (stop path, then one per sweep) after which what still fails is given up (logged as an
#: error): at the default 5-minute sweep, about an hour; an abandoned ACR session has ended by its
#: idle timeout long before, and a package that cannot be deleted costs storage only.
MAX_PASSES = 12
#: Seconds between two records of progress (the leftovers record, state.json's deleted packages).
FLUSH_S = 1.0
#: Writers of the leftovers record allowed to conflict before a write gives up (it is redone next pass).
UPDATE_ATTEMPTS = 8


def rollout_workers() -> int:
    """Rollouts ended at once: the S3 and ACR clients' connection pools (``STEPWISE_MAX_POOL_CONNECTIONS``,
    botocore's 10 by default), at most 32; StopRuntimeSession is paced by ``acr_tps_limit`` anyway."""
    return max(1, min(32, max_pool_connections()))


def _wall_deadline(deadline: float) -> float:
    """``time.monotonic`` deadline -> epoch seconds (what ``held_until`` records); 'no deadline' holds
    for a Lambda's longest run (15 min)."""
    left = deadline - time.monotonic()
    return now() + (left if left != float("inf") else 900.0)


def read(rs: RunStore, run_id: str) -> tuple[RunLeftovers, str] | None:
    """The run's leftovers record and its ETag, or None."""
    try:
        body, etag = rs.get_json_etag(leftovers_key(run_id))
    except KeyError:
        return None
    return RunLeftovers.model_validate(body), etag


def update(rs: RunStore, run_id: str, change: Callable[[RunLeftovers], None]) -> RunLeftovers | None:
    """Read-modify-write the run's leftovers record, conditional on its ETag (re-applied on conflict);
    deleted when the change leaves nothing to do. Returns the record written (None: none, or deleted)."""
    for _ in range(UPDATE_ATTEMPTS):
        found = read(rs, run_id)
        if found is None:
            return None
        rec, etag = found
        change(rec)
        if rec.empty():
            rs.delete(leftovers_key(run_id))
            return None
        try:
            rs.put_json(leftovers_key(run_id), rec.model_dump(), if_match=etag)
            return rec
        except ClientError as e:
            if e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") != 412 and \
                    e.response.get("Error", {}).get("Code") not in ("PreconditionFailed", "412"):
                raise
    logger.warning("the leftovers record kept changing: left for the next pass", extra={"run_id": run_id})
    return None


def hand_over(rs: RunStore, run_id: str, *, batches: list[PlannedBatch | None], retention: bool, reason: str,
              deadline: float, sids: list[str] | tuple[str, ...] = (),
              groups: list[tuple[int, int]] | tuple = ()) -> RunLeftovers | None:
    """Record what the run's end leaves (the batches whose rollouts may be in flight, the group executions
    ``(id, attempt)`` it stopped (admission group), rollouts known by their sids, retention still to apply),
    held by this invocation until ``deadline`` (``time.monotonic``). Merges with a record an earlier end
    left (a catch-all after a failed stop, Cleanup after StopSession). None when there is nothing to leave.
    A batch of the group engine (``group_engine``) has no rollouts of its own: its groups' are in theirs."""
    fresh = RunLeftovers(run_id=run_id, since=now(), reason=reason,
                         batches=[b for b in batches if b is not None and not b.group_engine],
                         groups=[[int(g), int(a)] for g, a in dict.fromkeys((g, a) for g, a in groups)],
                         sids=list(dict.fromkeys(sids)), retention=retention, held_until=_wall_deadline(deadline))
    if fresh.empty():
        return None
    found = read(rs, run_id)
    if found is not None:
        old = found[0]
        known = {b.model_dump_json() for b in old.batches}
        fresh.batches = old.batches + [b for b in fresh.batches if b.model_dump_json() not in known]
        fresh.groups = old.groups + [g for g in fresh.groups if g not in old.groups]
        fresh.sids = list(dict.fromkeys(old.sids + fresh.sids))
        fresh.retention = old.retention or fresh.retention
        fresh.failed_packages = old.failed_packages
        fresh.since = old.since
    rs.put_json(leftovers_key(run_id), fresh.model_dump())
    return fresh


def pending(rs: RunStore) -> list[str]:
    """The run ids with leftovers (one listing of ``leftovers/``)."""
    return [r for k in rs.list_keys(LEFTOVERS_PREFIX) if (r := run_id_of_leftovers(k))]


def take(rs: RunStore, run_id: str, deadline: float) -> RunLeftovers | None:
    """Hold the run's leftovers until ``deadline`` (``time.monotonic``) if nobody holds them (their
    ``held_until`` passed); None when they are held, gone, or another sweeper took them first."""
    found = read(rs, run_id)
    if found is None:
        return None
    rec, etag = found
    if rec.held_until > now():
        return None
    rec.held_until = _wall_deadline(deadline)
    try:
        rs.put_json(leftovers_key(run_id), rec.model_dump(), if_match=etag)
    except ClientError:
        return None
    return rec


def work_off(rs: RunStore, cfg: RunConfig, run_id: str, *, deadline: float) -> dict[str, Any]:
    """Do the run's leftovers (held by the caller: `hand_over` or `take`) until ``deadline``
    (``time.monotonic``): resolve the batches to the rollouts in flight, end them, apply retention;
    record progress as it goes; release the hold (or delete the record when nothing is left).
    Returns a report: ``rollouts_ended``, ``runtime_sessions_stopped``, ``packages_deleted``,
    ``left`` (None when done: ``{"sids", "batches", "retention"}`` otherwise), ``seconds``. Never raises."""
    started = time.monotonic()
    report: dict[str, Any] = {"run_id": run_id, "rollouts_ended": 0, "runtime_sessions_stopped": 0,
                              "packages_deleted": 0}
    try:
        _work(rs, cfg, run_id, deadline, report)
    except Exception as e:  # noqa: BLE001 - the run's end is recorded; the next pass retries
        logger.exception("could not finish a run's leftovers: left for the next pass", extra={"run_id": run_id})
        report["error"] = f"{type(e).__name__}: {e}"[:500]

    def release(rec: RunLeftovers) -> None:
        rec.passes += 1
        rec.held_until = 0.0
        if rec.passes >= MAX_PASSES and not rec.empty():
            logger.error("giving up a run's leftovers", extra={"run_id": run_id, "sids": len(rec.sids),
                                                               "batches": len(rec.batches), "retention": rec.retention,
                                                               "failed_packages": rec.failed_packages})
            rec.sids, rec.batches, rec.groups, rec.retention = [], [], [], False

    rec: RunLeftovers | None
    try:
        rec = update(rs, run_id, release)
    except Exception:  # noqa: BLE001 - the hold ends at its deadline anyway
        logger.exception("could not release a run's leftovers", extra={"run_id": run_id})
        rec = RunLeftovers(run_id=run_id, since=0.0, retention=True)  # reported as left
    report["left"] = None if rec is None else {"sids": len(rec.sids), "batches": len(rec.batches),
                                               "groups": len(rec.groups), "retention": rec.retention}
    report["seconds"] = round(time.monotonic() - started, 3)
    logger.info("run leftovers worked off" if rec is None else "run leftovers left for the sweeper", extra=report)
    return report


def _work(rs: RunStore, cfg: RunConfig, run_id: str, deadline: float, report: dict[str, Any]) -> None:
    found = read(rs, run_id)
    if found is None:
        return
    rec = found[0]
    workers = rollout_workers()
    if (rec.batches or rec.groups) and time.monotonic() < deadline:
        try:
            sids = rollouts_in_flight(rs, run_id, rec.batches, workers=workers, deadline=deadline,
                                      groups=[(g, a) for g, a in rec.groups])
        except TimeoutError:
            return  # resolved next pass
        resolved = [b.model_dump_json() for b in rec.batches]
        resolved_groups = list(rec.groups)

        def resolve(r: RunLeftovers) -> None:
            r.batches = [b for b in r.batches if b.model_dump_json() not in resolved]
            r.groups = [g for g in r.groups if g not in resolved_groups]
            r.sids = list(dict.fromkeys(r.sids + sids))

        rec = update(rs, run_id, resolve) or RunLeftovers(run_id=run_id, since=rec.since)
    if rec.sids and time.monotonic() < deadline:
        def record(ended: list[str]) -> None:
            gone = set(ended)
            update(rs, run_id, lambda r: setattr(r, "sids", [s for s in r.sids if s not in gone]))

        ended = end_rollouts(rs, cfg, rec.sids, deadline=deadline, workers=workers, on_ended=record, flush_s=FLUSH_S)
        report["rollouts_ended"] = len(ended.ended)
        report["runtime_sessions_stopped"] = ended.stopped
        if ended.left or ended.failed:
            report["rollouts_left"] = len(ended.left) + len(ended.failed)
    if rec.retention and time.monotonic() < deadline:
        done, deleted, failed = apply_retention(rs, cfg, run_id, set(rec.failed_packages), deadline=deadline)
        report["packages_deleted"] = deleted

        def retained(r: RunLeftovers) -> None:
            r.failed_packages.update(failed)
            if done:
                r.retention = False

        update(rs, run_id, retained)


def apply_retention(rs: RunStore, cfg: RunConfig, run_id: str, skip: set[str], *,
                    deadline: float) -> tuple[bool, int, dict[str, str]]:
    """Delete the packages ``keep_model_packages: best_and_last`` deletes (`packages_to_delete` of the
    run's state, less ``skip``: deletions refused for good before), `stepwise.aws.sagemaker.RETENTION_WORKERS`
    at a time with one client, until ``deadline``, recording each deletion in ``state.json`` (at most
    every `FLUSH_S`; a package found already gone counts as deleted). Returns ``(done, deleted,
    refused)``: done = nothing left to try; refused = ARN -> a refusal that is not transient (not
    retried: the package is kept, and costs storage, not a session)."""
    state, _ = rs.read_state(run_id)
    delete, kept = packages_to_delete(state)
    delete = [a for a in delete if a not in skip]
    cp = sagemaker.control_plane(cfg.region)
    fresh: list[str] = []
    refused: dict[str, str] = {}
    transient = 0
    count = 0
    last = time.monotonic()

    def flush() -> None:
        nonlocal fresh, last
        if fresh:
            batch = fresh
            rs.update_state(run_id, lambda s: mark_deleted(s, batch), execution_arn=None)
            fresh = []
        last = time.monotonic()

    handled = 0
    for o in run_until(delete, lambda arn: sagemaker.delete_model_package(cp, arn),
                       workers=sagemaker.RETENTION_WORKERS, deadline=deadline):
        handled += 1
        if o.error is None:
            fresh.append(o.item)
            count += 1
        elif sagemaker.is_transient(o.error):
            transient += 1
        else:
            refused[o.item] = sagemaker.describe_error(o.error)[:300]
            logger.error("could not delete a model package: kept", extra={"model_package_arn": o.item,
                                                                         "error": refused[o.item]})
        if time.monotonic() - last >= FLUSH_S:
            flush()
    flush()
    done = handled == len(delete) and transient == 0
    logger.info("retention best_and_last", extra={"deleted": count, "kept": kept, "left": len(delete) - count - len(refused),
                                                  "refused": len(refused)})
    return done, count, refused
