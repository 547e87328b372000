"""A local run's end: what run-local collects once the execution has ended (or on any error) into the run folder.

`finish` runs Cleanup on an abnormal end (moto's EventBridge does not deliver to Lambda), the session sweeper,
reads the executions' histories (the failure, the timing split), compares the cost ledger with the stack's own
counts, copies the run's objects out of moto (`local.report.mirror_run_objects`), rebuilds the report page
(`write_local_report`) and writes ``timing.json`` and ``result.json``. The orchestration before it (starting the
stack, following the execution) is `local.run`; the figures and the closing lines are `local.report`.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from local.report import (RunResult, failure_from_history, lambda_stats, mirror_run_objects, s3_requests_per_rollout,
                          timing_split)
from local.stack import LocalStack, run_cleanup, run_sweeper, simulator_exit_code, training_session_status
from stepwise import layout
from stepwise.executions import ABNORMAL_END_STATUSES
from stepwise_cli.plot import curves, plot_run

log = logging.getLogger("stepwise.run_local")

#: Seconds the end of a run waits for asynchronous invocations still running (Track's last pages) without one
#: ending; each one that ends gives as much again, up to DRAIN_WHILE_PROGRESSING_SECONDS in all.
DRAIN_SECONDS = 60.0
DRAIN_WHILE_PROGRESSING_SECONDS = 300.0
#: The same after a Ctrl-C (or SIGTERM): a person is waiting for the prompt.
INTERRUPTED_DRAIN_SECONDS = 3.0
#: The report page in the run folder (the Track function's page, copied as the run goes).
REPORT_FILE = "report.html"


def history(sfn: Any, arn: str) -> list[dict[str, Any]]:
    """Every event of an execution's history, oldest first (all pages)."""
    events, token = [], None
    while True:
        kw = {"executionArn": arn, "maxResults": 1000}
        if token:
            kw["nextToken"] = token
        page = sfn.get_execution_history(**kw)
        events.extend(page["events"])
        token = page.get("nextToken")
        if not token:
            return events


def finish(stack: LocalStack, follower: Any, desc: dict[str, Any] | None, run_id: str, run_dir: Path,
            t_start: float, mirror_s3: bool = False, *, degraded: bool = False,
            marks: dict[str, float] | None = None) -> RunResult:
    """After the execution ends (or on any error): cleanup on abnormal ends, collect, write the run folder.

    The simulator may be gone by then (a terminal's Ctrl-C and ``timeout``'s signal reach the whole
    process group, and the simulator ends first; or it crashed): what needs it is skipped, saying so
    once (its training sessions ended with it), and the result carries its exit code. ``degraded``
    (interrupted) or the simulator gone: a step that cannot run is one warning line, not a traceback.
    """
    status = desc["status"] if desc else "NOT_STARTED"
    failure = None
    timing: dict[str, Any] = {}
    session_status = None
    report_path = None
    billing: dict[str, Any] = {}
    counters: dict[str, Any] = {}
    interrupted = degraded  # a person is waiting for the prompt: what can be done later is left for later
    simulator_gone = simulator_exit_code(stack, settle=5.0 if degraded else 0.0)
    if simulator_gone is not None:
        log.warning("the simulator process had stopped answering before run-local collected the run (exit code %s): "
                    "its training sessions ended with it; the session's status and the simulator's counters are not "
                    "known", simulator_gone)
    degraded = degraded or simulator_gone is not None

    def failed(what: str) -> None:  # in an except block: the step's error, with its traceback only if unexpected
        if degraded:  # one line (a refused Lambda invoke's message carries moto's HTML page)
            log.warning("%s could not run: %s", what, (str(sys.exc_info()[1]).splitlines() or [""])[0][:300])
        else:
            log.exception(what)

    laps: dict[str, float] = {}  # the end's parts, seconds (timing.json "end_seconds")
    t_lap = time.monotonic()

    def lap(name: str) -> None:
        nonlocal t_lap
        now = time.monotonic()
        laps[name] = round(laps.get(name, 0.0) + now - t_lap, 2)
        t_lap = now

    if stack.moto is not None and stack.resources is not None and follower is not None:
        sfn = stack.moto.client("stepfunctions")
        if desc is not None and status in ABNORMAL_END_STATUSES and simulator_gone is None:  # else it has
            try:  # nothing to stop: it stops the session first, then the abandoned rollouts' ACR sessions
                run_cleanup(stack, desc)
            except Exception:
                failed("Cleanup")
        try:  # the schedule's sweep, once the run ended: a session it stops is one the run leaked
            if simulator_gone is None:  # else no session is left to sweep
                run_sweeper(stack)
        except Exception:
            failed("SweepSessions")
        lap("cleanup_and_sweep")
        # The asynchronous invocations still running: the last results; Track publishing the last summaries
        # and the run's end only when it calls a tracker (MLflow, W&B): otherwise its process is stopped (no
        # invocation ends while the ledger and the invocations are compared) and the page and every step's
        # page are rebuilt from the run's objects below (`write_local_report`): nothing a person reads holds the
        # end. Interrupted, a person is waiting: a few seconds, then what is left is one line.
        dispatcher = stack.moto.dispatcher
        if not _tracking(run_dir):
            dispatcher.abandon_beside_loop()
        if degraded:
            dispatcher.drain(timeout=INTERRUPTED_DRAIN_SECONDS)
        else:  # as long as Track's queue moves (its invocations take ~10 s idle, about a minute under load)
            dispatcher.drain(timeout=DRAIN_SECONDS, while_progressing=DRAIN_WHILE_PROGRESSING_SECONDS)
        left = [t.name.rsplit("-", 1)[-1] for t in getattr(dispatcher, "_async_threads", []) if t.is_alive()
                and not (dispatcher.beside_loop_abandoned and t in dispatcher._beside_loop_threads)]
        if left:
            logging.getLogger("local.dispatch").setLevel(logging.ERROR)  # each one's "dropped" warning as it ends
            log.warning("%d asynchronous invocation(s) still running were left (%s)", len(left),
                        ", ".join(f"{n} x{left.count(n)}" for n in sorted(set(left))))
        lap("drain")
        try:
            follower.record_new(full=True)
        except Exception:
            failed("reading summaries")
        lap("summaries")
        histories = [(_arn, history(sfn, _arn)) for _arn in follower.executions]
        all_events = [ev for _, h in histories for ev in h]
        if status != "SUCCEEDED" and histories:
            failure = failure_from_history(histories[-1][1])
            if desc is not None and desc.get("error"):
                failure.error = failure.error or desc.get("error")
                if failure.cause is None:
                    failure.cause = desc.get("cause")
        timing = timing_split(all_events, len(follower.summaries))
        timing["lambdas"] = lambda_stats(stack.moto.dispatcher.invocations)
        if stack.moto.s3_requests is not None:
            timing["s3_requests"] = s3_requests_per_rollout(stack.moto.s3_requests.snapshot(),
                                                            timing["lambdas"].get("FinishRollout", {}).get("count", 0))
        if stack.acr is not None:
            c = stack.acr.counters
            timing["acr"] = {"invocations": c.invocations, "forwarded": c.forwarded, "throttled": c.throttled,
                             "mean_forward_seconds": round(c.forward_seconds / max(1, c.forwarded), 4),
                             "max_forward_seconds": round(c.max_forward_seconds, 4), **stack.acr.session_counters()}
        lap("histories")
        session_status = training_session_status(stack, run_id) if simulator_gone is None else None
        billing = stack.billing_report()
        s3 = stack.moto.client("s3")
        for key in (layout.state_key(run_id), layout.config_key(run_id)):
            try:
                body = s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
                (run_dir / ("state.json" if key.endswith("state.json") else "run_config.json")).write_bytes(body)
            except Exception:
                pass
        try:
            if simulator_gone is None:  # it compares with the simulator's counts
                timing["ledger_check"] = _ledger_check(stack, run_dir)
        except Exception:
            failed("comparing the cost ledger with the local stack's counts")
        lap("ledger_check_and_state")
        # The run's objects outlive the stack in the run folder (`stepwise rollouts runs-local/RUN_ID`
        # and `stepwise report` read them there); the agents' raw results only with --mirror-s3.
        t0 = time.monotonic()
        timing["mirror"] = {"objects": mirror_run_objects(s3, stack.bucket, run_id, run_dir / "s3", results=mirror_s3,
                                                              objects=stack.moto.objects),
                            "seconds": 0.0}
        timing["mirror"]["seconds"] = round(time.monotonic() - t0, 2)
        lap("mirror")
        # interrupted: the page is rebuilt on demand (`stepwise report RUN_FOLDER`, from the mirrored objects);
        # it took 5-15 s of a Ctrl-C's wait on this machine
        report_path = None if interrupted else write_local_report(run_dir, run_id)
        lap("report_page")
    if stack.simulator is not None and simulator_gone is None:
        try:
            counters = dict(getattr(stack.simulator, "counters", {}) or {})
        except OSError as exc:  # it ended just now
            log.warning("the simulator's counters could not be read: %s", exc)
    summaries, eval_summaries = (follower.summaries, follower.evals) if follower else ({}, {})
    steps = sorted(summaries)
    rewards, evals = curves(summaries, eval_summaries)
    if rewards or evals:
        plot_run(run_dir / "reward.png", summaries, eval_summaries, run_dir.name)
    lap("plot")
    result = RunResult(
        run_id=run_id, status=status, run_dir=run_dir, wall_seconds=round(time.monotonic() - t_start, 1),
        steps=len(steps), rewards=[r for _, r in rewards],
        evals=[{"step": s, "accuracy": a} for s, a in evals], failure=failure, timing=timing,
        simulator_counters=_jsonable(counters), session_status=session_status, simulator_exit_code=simulator_gone,
        executions=follower.executions if follower else [], report=report_path,
        billing=_jsonable(billing),
    )
    if marks and "started" in marks:  # where the run's wall time went: `local.report.time_lines`
        timing["phases"] = {"start_up": round(marks["started"] - t_start, 1),
                            "execution": round(marks["ended"] - marks["started"], 1),
                            "end": round(time.monotonic() - marks["ended"], 1)}
        timing["end_seconds"] = laps
        result.timing = timing
    (run_dir / "timing.json").write_text(json.dumps(timing, indent=2))
    (run_dir / "result.json").write_text(json.dumps(asdict(result), indent=2, default=str))
    return result


def _ledger_check(stack: LocalStack, run_dir: Path) -> dict[str, Any]:
    """`local.report.ledger_check` of the run's ledger against this stack's dispatcher, simulator and
    ACR emulator."""
    from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION

    from local.report import ledger_check

    state = json.loads((run_dir / "state.json").read_text())
    sim = stack.simulator
    sim_sessions = sim.state().get("session_seconds", {}) if hasattr(sim, "state") else sim.session_seconds()
    names = sorted(sim_sessions)  # run-local's simulator serves this run only (a resume adds sessions)
    acr = stack.acr.session_counters() if stack.acr is not None and hasattr(stack.acr, "session_counters") else None
    return ledger_check(state.get("ledger") or {}, invocations=stack.moto.dispatcher.invocations,
                        memory_mb={f.name: f.memory_mb for f in (*FUNCTIONS, GATEWAY_FUNCTION)},
                        sim_sessions=sim_sessions, session_names=names, acr=acr)
def _tracking(run_dir: Path) -> bool:
    """Whether the run's config (the run folder's ``config.json``) names a tracker Track calls (MLflow, W&B)."""
    try:
        cfg = json.loads((run_dir / "config.json").read_text())
    except (OSError, ValueError):
        return True  # unknown: wait for Track, as before
    return bool(cfg.get("mlflow_tracking_uri") or cfg.get("wandb_project"))


def write_local_report(run_dir: Path, run_id: str) -> Path | None:
    """``{run_dir}/report.html``: the run's page rebuilt from the run's objects in the folder's copy of the
    bucket (`stepwise.views.run.rebuild_page`, what `stepwise report RUN_FOLDER` does), so it holds the
    table of the step a failed run ended at even when the run's last Track invocation had not finished;
    its links to older steps lead into ``s3/runs/RUN_ID/report/``, where the page of every step the Track function
    had not written (it runs beside the loop, and run-local does not wait for it: `_tracking`) is written here.
    None when it cannot be made (logged)."""
    target = run_dir / REPORT_FILE
    try:
        from stepwise.views.page import render_step_page
        from stepwise.views.run import fold, rebuild_page
        from stepwise.views.store import read_config
        from stepwise_cli.sources import DirStore

        store = DirStore(run_dir / "s3")
        folded = fold(store, run_id, read_config(store, run_id))
        for (kind, step), table in folded[1].items():
            page = run_dir / "s3" / layout.report_step_page_key(run_id, kind, step)
            if not page.exists():
                page.parent.mkdir(parents=True, exist_ok=True)
                page.write_text(render_step_page(run_id, table, updated_at="end of run-local"), encoding="utf-8")
        target.write_text(rebuild_page(store, run_id, updated_at="end of run-local", folded=folded,
                                       link_prefix=f"s3/{layout.report_prefix(run_id)}"), encoding="utf-8")
        return target
    except Exception:
        log.exception("writing the report page")
        return None


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))
