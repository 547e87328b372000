"""SweepSessions: every few minutes (an EventBridge schedule; the local stack invokes it), stop each
active training session of this stack that no execution still drives, and finish the clean-up runs'
ends left (rollouts in flight, retention).

EventBridge delivers execution status changes best-effort, so an execution stopped from the console
may never run Cleanup, and its session would bill until someone notices. For each active session
whose name starts ``stepwise-`` (the stack's grant: ``training-session/stepwise-*``; a foreign
``my-stepwise-x`` is never described), this finds its run in this stack's bucket
(`stepwise.core.sweeping.run_of_session`: the session's tags, else its name), reads the run's
``state.json`` and the status of its owner execution and recorded successor, and stops it when
`stepwise.core.sweeping.sweep_verdict` says so, after recording the stop in ``state.json``
(`stepwise.core.sweeping.mark_swept`, conditional on the state it decided on: the session's seconds
join the cost ledger) and the run's end (the run summary, whose notification ends the tracking runs;
the rollouts it had in flight are handed to the clean-up below). No verdict stops anything the run
changed, or whose executions ended, less than ``STEPWISE_SWEEP_GRACE_SECONDS`` ago: DescribeExecution
is eventually consistent, and a continue-as-new hand-over is exactly a new execution. Sessions of
other stacks and sessions it cannot attribute (or may not read) are never touched and never an error.

Then, in the time left, each run's leftovers (``leftovers/{run_id}.json``, `stepwise.handlers._leftovers`)
that no other invocation holds: their rollouts' sessions ended, retention applied, progress recorded.

Each stopped session is logged (``training session swept``, counted by the stack's metric filter),
emitted as the run's ``sessions/swept`` metric, and, when the stack has a notification topic,
published to it in one message per sweep. A session that could not be handled is logged and the
invocation fails at the end (Lambda's error metric), after the others were handled; leftovers that
could not be finished are retried on the next sweep.
"""

from __future__ import annotations

import time
from typing import Any

from botocore.exceptions import ClientError

from stepwise.aws import notify, sagemaker, task_tokens
from stepwise.aws.runstore import RunNotFound
from stepwise.core import ledger
from stepwise.core.sweeping import SweepConflict, mark_swept, run_of_session, sweep_verdict
from stepwise.events import SweepEvent
from stepwise.handlers import _leftovers
from stepwise.handlers._groups import stop_groups
from stepwise.handlers._common import (emit, entrypoint, invocation_deadline, logger, now, run_config, settings,
                                       sfn_client, store)
from stepwise.handlers._run_end import write_run_summary

#: The log message of each stopped session (the stack's metric filter counts it: keep it stable).
SWEPT_MESSAGE = "training session swept"
#: Errors that mean "not this function's to read": a session outside the stack's grant.
ACCESS_DENIED = frozenset({"AccessDenied", "AccessDeniedException"})


class SweepIncomplete(RuntimeError):
    """Some active sessions could not be handled (each is logged with its error)."""


def _execution(arn: str | None) -> tuple[str | None, float | None]:
    return task_tokens.execution_status(sfn_client(), arn) if arn else (None, None)


def _epoch(value: Any) -> float | None:
    if value is None:
        return None
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def sweep(event: SweepEvent) -> dict[str, Any]:
    """Stop the active sessions of this stack that no execution still drives, then work off runs'
    leftovers; returns ``{"stopped": [{session, run_id, reason}], "left": [{session, run_id, reason}],
    "errors": [...], "leftovers": [report of `stepwise.handlers._leftovers.work_off`]}``.

    Raises:
        SweepIncomplete: some sessions could not be handled (after handling the rest and the leftovers).
    """
    s = settings()
    rs = store()
    deadline = invocation_deadline(_leftovers.MARGIN_S)
    cp = sagemaker.control_plane(s.region)
    grace = s.sweep_grace_seconds if event.grace_seconds is None else event.grace_seconds
    run_ids: list[str] | None = None

    def bucket_run_ids() -> list[str]:
        nonlocal run_ids
        if run_ids is None:
            run_ids = rs.list_run_ids()
        return run_ids

    stopped: list[dict[str, str]] = []
    left: list[dict[str, str]] = []
    errors: list[dict[str, str]] = []
    for name in sagemaker.list_active_sessions(cp):
        run_id: str | None = None
        try:
            try:
                detail = sagemaker.session_detail(cp, name)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ACCESS_DENIED:
                    raise
                left.append({"session": name, "run_id": "", "reason": "not this stack's to read (access denied)"})
                continue
            if detail.get("TrainingSessionStatus") not in sagemaker.ACTIVE_SESSION_STATUSES:
                continue  # ended since the listing
            tags = {t["Key"]: t["Value"] for t in detail.get("Tags") or []}
            run_id = run_of_session(name, tags, rs.bucket, bucket_run_ids)
            if run_id is None:
                left.append({"session": name, "run_id": "", "reason": "not a session of this stack"})
                continue
            state, _, changed_at = rs.read_state_at(run_id)
            owner, successor = state.owner_execution_arn, state.successor_execution_arn
            owner_status, owner_stopped = _execution(owner)
            successor_status, successor_stopped = _execution(successor)
            verdict = sweep_verdict(name, state, owner_status, successor_status, state_changed_at=changed_at,
                                    owner_stopped_at=owner_stopped, successor_stopped_at=successor_stopped,
                                    now=now(), grace=grace)
            if not verdict.stop or event.dry_run:
                left.append({"session": name, "run_id": run_id, "reason": verdict.reason})
                continue
            cfg = run_config(run_id)
            if verdict.mark:
                stopped_at, created = now(), _epoch(detail.get("CreationTime"))

                def mark(st: Any) -> None:
                    mark_swept(st, name, owner, successor, verdict.reason, stopped_at=stopped_at, created_at=created)
                    st.ledger.final = ledger.final_report(st, cfg, stopped_at, None)

                state = rs.update_state(run_id, mark, execution_arn=None)
            sagemaker.stop_session(cfg, name)
            if verdict.mark:
                record_swept_end(rs, state, cfg, deadline)
        except (RunNotFound, SweepConflict) as e:
            left.append({"session": name, "run_id": run_id or "", "reason": str(e)})
            continue
        except Exception as e:  # handle the other sessions; fail at the end
            logger.exception("could not sweep a training session", extra={"training_session_name": name, "run_id": run_id})
            errors.append({"session": name, "run_id": run_id or "", "error": sagemaker.describe_error(e)})
            continue
        stopped.append({"session": name, "run_id": run_id, "reason": verdict.reason})
        logger.warning(SWEPT_MESSAGE, extra={"training_session_name": name, "run_id": run_id, "reason": verdict.reason})
        emit({"sessions/swept": 1}, run_id=run_id)
    if stopped and not event.dry_run:  # to the stack's topic, when it has one (best effort: never fails the sweep)
        lines = [f"- {x['session']} (run {x['run_id']}): {x['reason']}" for x in stopped]
        notify.publish(
            s.notification_topic_arn, subject=f"Stepwise stopped {len(stopped)} training session(s) no execution was driving",
            message="The session sweeper stopped these training sessions (their executions ended without stopping "
                    "them; `stepwise resume RUN` continues a run from its newest checkpoint):\n" + "\n".join(lines))
    leftovers = [] if event.dry_run else work_off_leftovers(rs, deadline)
    out = {"stopped": stopped, "left": left, "errors": errors, "leftovers": leftovers}
    logger.info("sessions swept", extra={"stopped": len(stopped), "left": len(left), "errors": len(errors),
                                         "leftovers": len(leftovers)})
    if errors:
        raise SweepIncomplete(f"{len(errors)} active session(s) could not be swept: {errors}")
    return out


def record_swept_end(rs: Any, state: Any, cfg: Any, deadline: float) -> None:
    """A swept run's end, as its stop path would have recorded it: its rollouts in flight handed to the
    leftovers (worked off below), and the run summary (Track ends its tracking runs). Best effort:
    the session is stopped and the stop recorded already."""
    try:
        groups = stop_groups(rs, state.run_id, reason=state.stop_reason or "swept") if cfg.admission == "group" else []
        _leftovers.hand_over(rs, state.run_id, batches=[state.current_batch, state.ahead_batch], retention=False,
                             reason=state.stop_reason or "", deadline=time.monotonic(), groups=groups)  # held by nobody
        write_run_summary(rs, state, cfg, reason=state.stop_reason or "execution ended",
                          execution_arn=state.owner_execution_arn, cost=state.ledger.final or {})
    except Exception:  # noqa: BLE001 - see above
        logger.exception("could not record a swept run's end", extra={"run_id": state.run_id})


def work_off_leftovers(rs: Any, deadline: float) -> list[dict[str, Any]]:
    """Each run's leftovers nobody holds (`stepwise.handlers._leftovers.take`), worked off in turn until
    ``deadline`` (``time.monotonic``); returns their reports."""
    reports: list[dict[str, Any]] = []
    try:
        run_ids = _leftovers.pending(rs)
    except Exception:  # noqa: BLE001 - the next sweep lists them again
        logger.exception("could not list the runs' leftovers")
        return reports
    for run_id in run_ids:
        if time.monotonic() >= deadline:
            break
        try:
            if _leftovers.take(rs, run_id, deadline) is None:
                continue
            cfg = run_config(run_id)
        except Exception:  # noqa: BLE001 - retried on the next sweep
            logger.exception("could not take a run's leftovers", extra={"run_id": run_id})
            continue
        reports.append(_leftovers.work_off(rs, cfg, run_id, deadline=deadline))
    return reports


handler = entrypoint(SweepEvent, sweep)
