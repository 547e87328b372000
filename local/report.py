"""What run-local reports: the failure, the timing split, the run folder's S3 mirror and the
closing lines for the terminal (the plot is `stepwise_cli.plot`'s, the one `stepwise watch` draws)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from stepwise import layout
from stepwise.views.summary import best_model, best_text
from stepwise_cli.commands.watch import eval_when


@dataclass
class Failure:
    """Where an execution failed: the state whose error started it, and the final error."""

    state: str | None
    error: str | None
    cause: str | None


def failure_from_history(events: list[dict[str, Any]]) -> Failure:
    """The first failing task/map state (and its error and cause) from an execution history,
    falling back to the ExecutionFailed/Aborted/TimedOut event."""
    current: str | None = None
    for ev in events:
        etype = ev["type"]
        if etype.endswith("StateEntered"):
            current = ev["stateEnteredEventDetails"]["name"]
        details_key = next((k for k in ev if k.endswith("EventDetails") and k != "stateEnteredEventDetails"), None)
        if etype in ("TaskFailed", "LambdaFunctionFailed", "TaskTimedOut", "MapRunFailed", "LambdaFunctionTimedOut",
                     "ExecutionFailed", "ExecutionTimedOut", "ExecutionAborted", "MapStateFailed"):
            det = ev.get(details_key, {}) if details_key else {}
            return Failure(current, det.get("error") or etype, det.get("cause"))
    return Failure(current, None, None)


@dataclass
class RunResult:
    """What ``run_local`` reports."""

    run_id: str
    status: str
    run_dir: Path
    wall_seconds: float
    steps: int
    rewards: list[float]
    evals: list[dict[str, Any]]
    failure: Failure | None
    timing: dict[str, Any]
    simulator_counters: dict[str, Any]
    session_status: str | None
    executions: list[str]
    report: Path | None = None
    #: `local.stack.LocalStack.billing_report` at the run's end: ACR sessions (counters, still active) and
    #: training sessions not stopped.
    billing: dict[str, Any] = field(default_factory=dict)
    #: The simulator process's exit code when it had ended before the run was collected (None: it ran to
    #: the end): its training sessions ended with it, their status and its counters are unknown.
    simulator_exit_code: int | None = None


_TRAIN_STATES = ("Submit training step", "Wait for training step", "Check training step", "Training step done?",
                 "Rebind sampler to new weights", "Sampler rebound?", "Wait for sampler")
_EVAL_CKPT_STATES = ("Record eval accuracy", "Save checkpoint", "Checkpoint saved?", "Wait for checkpoint")


def timing_split(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Seconds per category from one execution history (state entered -> next state entered).

    Categories: rollouts (the train Map), eval_rollouts (Maps followed by eval bookkeeping),
    advantages, training (submit/poll/rebind), eval_checkpoint, orchestration (planning,
    choices, session start and everything else). ``per_step`` divides by ``steps``.
    """
    spans: list[tuple[str, float]] = []
    entered: list[tuple[str, datetime]] = [
        (ev["stateEnteredEventDetails"]["name"], ev["timestamp"]) for ev in events if ev["type"].endswith("StateEntered")
    ]
    end = events[-1]["timestamp"] if events else None
    for i, (name, t0) in enumerate(entered):
        t1 = entered[i + 1][1] if i + 1 < len(entered) else end
        spans.append((name, (t1 - t0).total_seconds()))
    out = {"rollouts": 0.0, "eval_rollouts": 0.0, "advantages": 0.0, "training": 0.0, "eval_checkpoint": 0.0,
           "orchestration": 0.0, "session_start": 0.0}
    for i, (name, secs) in enumerate(spans):
        if name == "Roll out generation batch":
            following = next((n for n, _ in spans[i + 1:] if not n.endswith("?")), "")
            out["eval_rollouts" if following == "Record eval accuracy" else "rollouts"] += secs
        elif name == "Compute advantages and filter groups":
            out["advantages"] += secs
        elif name in _TRAIN_STATES:
            out["training"] += secs
        elif name in _EVAL_CKPT_STATES:
            out["eval_checkpoint"] += secs
        elif name in ("Initialize run", "Is the training session ready?", "Wait for training session",
                      "Check training session"):
            out["session_start"] += secs
        else:
            out["orchestration"] += secs
    total = sum(out.values())
    result: dict[str, Any] = {"total_seconds": round(total, 3), "steps": steps,
                              "seconds": {k: round(v, 3) for k, v in out.items()}}
    if steps:
        train_keys = ("rollouts", "advantages", "training", "orchestration")
        result["per_step"] = {k: round(out[k] / steps, 3) for k in train_keys}
        result["per_step"]["wall"] = round(sum(out[k] for k in train_keys) / steps, 3)
    return result


def lambda_stats(invocations: list[Any]) -> dict[str, dict[str, float]]:
    """Per function: invocation count, errors, total and mean seconds (in-process handler time), and
    the largest memory growth one invocation was measured at (``peak_mb``, `local.limits`)."""
    out: dict[str, dict[str, float]] = {}
    for inv in invocations:
        name = inv.function_name.rsplit("-", 1)[-1]
        st = out.setdefault(name, {"count": 0, "errors": 0, "seconds": 0.0, "peak_mb": 0.0})
        st["count"] += 1
        st["errors"] += 1 if inv.error else 0
        st["seconds"] += inv.seconds
        st["peak_mb"] = round(max(st["peak_mb"], getattr(inv, "peak_mb", 0.0)), 1)
    for st in out.values():
        st["mean_seconds"] = round(st["seconds"] / st["count"], 4)
        st["seconds"] = round(st["seconds"], 3)
    return out


def s3_requests_per_rollout(counts: dict[str, int], rollouts: int) -> dict[str, Any]:
    """The run's S3 requests (``{"OP kind": n}`` from `local.engine.S3RequestLog`) with totals per
    operation and, when ``rollouts`` > 0, per rollout (every request of the run divided by the
    rollouts it ran: Init's and the steps' own requests are a few percent of it)."""
    by_op: dict[str, int] = {}
    for name, n in counts.items():
        op = name.split(" ", 1)[0]
        by_op[op] = by_op.get(op, 0) + n
    out: dict[str, Any] = {"rollouts": rollouts, "total": sum(counts.values()), "by_operation": by_op,
                           "by_kind": counts}
    if rollouts:
        out["per_rollout"] = {op: round(n / rollouts, 2) for op, n in sorted(by_op.items())}
        out["per_rollout"]["total"] = round(out["total"] / rollouts, 2)
        out["per_rollout_by_kind"] = {k: round(n / rollouts, 2) for k, n in counts.items()}
    return out


#: The cost model's assumptions for a local run (`stepwise_cli.cost.Assumptions`): the local stack's own
#: timings, measured on a 2-core machine with nothing else running (a toy step of ~5 s), and the functions'
#: ``STEPWISE_POLL_SECONDS`` (10) and ``STEPWISE_INLINE_WAIT_SECONDS`` (30), the stack's. The toy's batch is
#: bound by its paced starts (11 a second at ``acr_tps_limit`` 25: 64 rollouts in 6.6 s, each ACR session
#: 0.5-0.7 s on a quiet machine), so no ``rollouts_per_second``: before the pacing, the machine bound it (6-7 a
#: second at 64 and at 1,024 rollouts a step under a load of 10-20, benchmarks/README.md section 16), and at
#: 1,024 it still may: the run's end prints the estimate again at the Map time the run measured.
#: A judged toy run's members are one-digit replies (about 50 judged characters and 21 answer tokens each,
#: examples/toy_judge.json; the emulator answers at once).
def _local_assumptions() -> Any:
    from stepwise_cli.cost import Assumptions

    return Assumptions(turns_per_rollout=1.0, seconds_per_turn=0.4, rollouts_per_second=None, train_seconds=1.0,
                       rebind_seconds=0.3, orchestration_seconds=1.0, poll_seconds=10.0, inline_wait_seconds=30.0,
                       agent_overhead_seconds=0.5, session_start_seconds=15.0, advantages_seconds_per_rollout=0.01,
                       judge_chars_per_member=50.0, judge_output_tokens_per_member=21.0, judge_attempts_per_group=1.0,
                       judge_seconds_per_group=0.5,
                       handler_seconds={"PlanStep": 0.1, "StartRollout": 0.3, "OnRolloutResult": 0.05,
                                        "FinishRollout": 1.1, "ComputeAdvantages": 0.5, "RecordEval": 0.2})


LOCAL_ASSUMPTIONS = _local_assumptions()


def ledger_check(ledger: dict[str, Any], *, invocations: list[Any], memory_mb: dict[str, int],
                 sim_sessions: dict[str, dict[str, Any]], session_names: list[str],
                 acr: dict[str, Any] | None) -> dict[str, Any]:
    """The run's cost ledger (``state.json``'s ``ledger``) beside what the local stack counted itself:
    Lambda seconds per function (the engine's dispatcher: each invocation's own handler time,
    ``InvocationRecord.handler_seconds``; ``memory_mb`` turns the ledger's GB-seconds back into seconds), the training sessions' seconds (the simulator's
    own: creation to stop request, `local.simulator.SimulatorHandle.session_seconds`) and the ACR
    sessions' (the emulator's ``session_counters``, when it keeps them). Each figure
    ``{"ledger", "local", "difference"}``; the gateway (another process) has no local figure."""
    usage = ledger.get("usage") or {}
    out: dict[str, Any] = {"lambda_seconds": {}}
    local_seconds: dict[str, float] = {}
    local_count: dict[str, int] = {}
    for inv in invocations:
        name = inv.function_name.rsplit("-", 1)[-1]
        # the handler's own time where the dispatcher has it (workers), else the dispatch's
        local_seconds[name] = local_seconds.get(name, 0.0) + (getattr(inv, "handler_seconds", 0.0) or inv.seconds)
        local_count[name] = local_count.get(name, 0) + 1
    for name in sorted(set(usage.get("lambda_gb_seconds", {})) | set(local_seconds)):
        gb_s = usage.get("lambda_gb_seconds", {}).get(name, 0.0)
        mb = memory_mb.get(name) or 1
        got = gb_s * 1024 / mb
        row: dict[str, Any] = {"ledger": round(got, 3), "requests": usage.get("lambda_requests", {}).get(name, 0)}
        if name in local_seconds:
            row.update(local=round(local_seconds[name], 3), local_requests=local_count[name],
                       difference=round(got - local_seconds[name], 3))
        out["lambda_seconds"][name] = row
    sessions = [sim_sessions[n] for n in session_names if n in sim_sessions]
    mark_closed = float(ledger.get("sessions_closed_seconds") or 0.0)
    served = sum(float(s.get("seconds") or 0.0) for s in sessions)
    out["training_session_seconds"] = {"ledger": round(mark_closed, 3), "local": round(served, 3),
                                       "difference": round(mark_closed - served, 3), "sessions": len(sessions)}
    if acr is not None and "session_seconds" in acr:
        got = float(usage.get("acr_session_seconds") or 0.0)
        out["acr_session_seconds"] = {"ledger": round(got, 3), "local": round(float(acr["session_seconds"]), 3),
                                      "difference": round(got - float(acr["session_seconds"]), 3),
                                      "ledger_sessions": usage.get("acr_sessions"),
                                      "local_sessions": acr.get("sessions_started")}
    return out


def mirror_run_objects(s3: Any, bucket: str, run_id: str, target: Path, *, results: bool = True,
                       objects: Callable[[str, str], Iterable[tuple[str, bytes]]] | None = None) -> int:
    """Copy ``runs/{run_id}/`` (config, state, summaries, rollout records, captured turns, datums, the
    tokenizer, the report) and, with ``results``, the agents' ``rollout-results/{run_id}/`` to ``target``
    (laid out as the bucket); returns the object count. ``objects(bucket, prefix)``: (key, body) of every
    object under a prefix read without a request (`local.engine.MotoServer.objects`, the local stack's
    moto in this process: a toy run's ~4,000 objects took 19 s of GETs under load); None = ListObjectsV2
    and a GetObject each through ``s3``."""
    count = 0
    for prefix in (layout.run_prefix(run_id), *((layout.results_prefix(run_id),) if results else ())):
        for key, body in (objects(bucket, prefix) if objects is not None else _listed_objects(s3, bucket, prefix)):
            path = target / key
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
            count += 1
    return count


def _listed_objects(s3: Any, bucket: str, prefix: str) -> Iterator[tuple[str, bytes]]:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix):
        for obj in page.get("Contents", []):
            yield obj["Key"], s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read()


def simulator_gone_line(exit_code: int) -> str:
    """What a run's end says when the simulator process had ended first (``exit_code``: its code)."""
    return (f"the simulator process had stopped answering before the run was collected (exit code {exit_code}): "
            "its training sessions ended with it")


def interrupted_lines(result: RunResult | None) -> str:
    """What ``run-local`` prints when interrupted (Ctrl-C, SIGTERM): what happened to the execution and the
    training session, that the local services are stopped, and where the run folder is."""
    if result is None:
        return "interrupted: local services shut down"
    execution = ("the execution had not started" if result.status == "NOT_STARTED"
                 else f"execution {result.status}")
    lines = [f"interrupted: {execution}, local services shut down"]
    if result.simulator_exit_code is not None:
        lines.append(simulator_gone_line(result.simulator_exit_code))
    elif result.session_status:
        lines.append(f"training session: {result.session_status}")
    if result.report is None and (Path(result.run_dir) / "s3").is_dir():
        lines.append(f"report page: stepwise report {result.run_dir} rebuilds it from the run folder")
    lines.append(f"run folder: {result.run_dir}")
    return "\n".join(lines)


def report(result: RunResult) -> str:
    """A few lines for the terminal."""
    lines = [f"run {result.run_id}: {result.status} in {result.wall_seconds:.0f}s, {result.steps} steps -> {result.run_dir}"]
    if result.rewards:
        r = result.rewards
        head, tail = r[:3], r[-3:]
        lines.append(f"mean reward: first 3 steps {sum(head) / len(head):.3f}, last 3 steps {sum(tail) / len(tail):.3f}")
    for e in result.evals:
        lines.append(f"{eval_when(e['step'])}: accuracy {e['accuracy']:.3f}")
    state = _state(result.run_dir)
    gone = set(state.get("deleted_packages") or [])
    for ckpt in _checkpoints(result.run_dir):
        deleted = " [deleted by keep_model_packages best_and_last]" if ckpt.get("deleted") or \
            ckpt.get("model_package_arn") in gone else ""
        lines.append(f"checkpoint at step {ckpt.get('step')} ({ckpt.get('reason')}): {ckpt.get('model_package_arn')}{deleted}")
    best = best_model(state)
    if best is not None:
        lines.append(f"best model: {best_text(best)}")
    if state.get("deleted_packages"):
        lines.append(f"deleted (keep_model_packages best_and_last): {len(state['deleted_packages'])} model package(s)")
    if state.get("stop_reason"):
        lines.append(f"stop reason: {state['stop_reason']}")
    if result.session_status:
        lines.append(f"training session: {result.session_status}")
    if result.simulator_exit_code is not None:
        lines.append(simulator_gone_line(result.simulator_exit_code))
    acr = result.billing.get("acr") or {}
    if acr:
        left = len(result.billing.get("acr_active") or [])
        lines.append(f"ACR runtime sessions: {acr.get('sessions_started', 0)} started, {acr.get('sessions_stopped', 0)} "
                     f"stopped, {acr.get('sessions_timed_out', 0)} timed out, {left} left active (peak "
                     f"{acr.get('peak_active_sessions', 0)} at once)" + (" <- still billing" if left else ""))
    final = _ledger_final(result.run_dir)
    if final.get("line"):
        lines.append(final["line"])
    if final.get("estimate_line"):
        lines.extend(calibrated_estimate_lines(result, final))
    if result.report:
        lines.append(f"report: {result.report}  (rollouts: stepwise rollouts {result.run_dir})")
    lines += time_lines(result)
    if result.failure:
        lines.append(f"FAILED in state {result.failure.state!r}: {result.failure.error}")
        if result.failure.cause:
            lines.append(f"cause: {result.failure.cause[:2000]}")
    return "\n".join(lines)


def calibrated_assumptions(timing: dict[str, Any], cfg: Any) -> Any:
    """`LOCAL_ASSUMPTIONS` fed what a run measured (``timing.json``'s form: `timing_split`'s ``per_step`` and
    ``seconds``, and ``ledger_check``'s handler and gateway seconds): the Map's, advantages', training's and
    orchestration's seconds per step, each handler's own seconds per invocation, the gateway's per LLM call
    and the session's start-up. ``cfg``: the run's `stepwise.config.RunConfig` (its batch's rollouts).

    The one home of this mapping: run-local's closing cost line (`calibrated_estimate_lines`) and
    ``benchmarks/rollouts_at_scale.py`` use it."""
    from dataclasses import replace

    per = timing.get("per_step") or {}
    seconds = (timing.get("ledger_check") or {}).get("lambda_seconds") or {}
    handler = {name: row["local"] / row["local_requests"] for name, row in seconds.items()
               if row.get("local_requests") and row.get("local") is not None}
    gateway = seconds.get("Gateway") or {}
    n = max(1, cfg.batch_size * cfg.responses_per_prompt)
    return replace(LOCAL_ASSUMPTIONS, rollout_seconds=float(per.get("rollouts", 0.0)),
                   train_seconds=float(per.get("training", 0.0)), rebind_seconds=0.0,
                   orchestration_seconds=float(per.get("orchestration", 0.0)),
                   advantages_seconds_per_rollout=float(per.get("advantages", 0.0)) / n,
                   seconds_per_turn=(gateway["ledger"] / gateway["requests"]) if gateway.get("requests") else
                   LOCAL_ASSUMPTIONS.seconds_per_turn,
                   session_start_seconds=float((timing.get("seconds") or {}).get("session_start", 0.0)),
                   handler_seconds={**LOCAL_ASSUMPTIONS.handler_seconds,
                                    **{k: v for k, v in handler.items() if k in LOCAL_ASSUMPTIONS.handler_seconds}})


def calibrated_estimate_lines(result: RunResult, final: dict[str, Any]) -> list[str]:
    """The run's cost estimate against its ledger, for the terminal, each figure saying what it stands on: the
    estimate the run started with, which assumes `LOCAL_ASSUMPTIONS`' timings (a quiet machine's, not this
    one's: before, that line alone printed "+226%" on a loaded machine), and, when a step was measured, the
    estimate again at this machine's measured timings (`calibrated_assumptions`: seconds per step of
    rollouts, training, advantages and orchestration, the session's start-up, each handler's and the
    gateway's own seconds), against the same ledger. ``final``: the ledger's final report (``ledger.final``).

    Source: `stepwise_cli.cost.estimate`'s ``run`` (what `stepwise cost` prints), fed `calibrated_assumptions`."""
    lines = [f"{final['estimate_line']} [the estimate at the start: the local stack's nominal timings, "
             f"not calibrated to this machine]"]
    per = (result.timing or {}).get("per_step") or {}
    ledger_usd = final.get("total_usd")
    steps = int(final.get("steps") or result.steps or 0)
    try:
        from stepwise.config import load_run_config
        from stepwise_cli.cost import estimate

        config = load_run_config(json.loads((result.run_dir / "config.json").read_text()))
    except Exception:
        config = None
    if not per or not steps or ledger_usd is None or config is None:
        return [*lines, "  no step of this machine measured: no estimate calibrated to it"]
    from stepwise.core.ledger import usd

    a = calibrated_assumptions(result.timing, config)
    est = float(estimate(config, a, total_steps=steps)["run"]["total"])
    got = float(ledger_usd)
    pct = f" ({100.0 * (got - est) / est:+.0f}%)" if est else ""
    return [*lines, f"  at this machine's measured timings ({per.get('wall', 0.0):.1f} s a step, start-up "
                    f"{a.session_start_seconds:.0f} s): estimated {usd(est)}; the ledger says {usd(got)}: "
                    f"{'+' if got >= est else '-'}{usd(abs(got - est))}{pct}"]


def time_lines(result: RunResult) -> list[str]:
    """Where the run's wall time went, the closing lines of a run: the start-up (services, datasets), the
    execution (the training session's start, the steps, the evals and checkpoints) and the end (collecting
    the run folder), then a step's mean time by part (`timing_split`: the execution histories' states)."""
    t = result.timing
    lines = []
    phases, secs = t.get("phases"), t.get("seconds") or {}
    if phases:
        steps = sum(secs.get(k, 0.0) for k in ("rollouts", "advantages", "training", "orchestration"))
        evals = secs.get("eval_rollouts", 0.0) + secs.get("eval_checkpoint", 0.0)
        lines.append(f"time (s): {result.wall_seconds:.0f} = start-up {phases['start_up']:.0f} + execution "
                     f"{phases['execution']:.0f} (session start {secs.get('session_start', 0.0):.0f}, {t.get('steps', 0)} "
                     f"steps {steps:.0f}, evals and checkpoints {evals:.0f}) + end {phases['end']:.0f}")
    if per := t.get("per_step"):
        lines.append("per step (s): " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
    return lines


def _state(run_dir: Path) -> dict[str, Any]:
    """The run folder's ``state.json`` ({} if absent)."""
    try:
        return dict(json.loads((run_dir / "state.json").read_text()))
    except (OSError, ValueError):
        return {}


def _ledger_final(run_dir: Path) -> dict[str, Any]:
    """The cost ledger's final report (``state.json`` ``ledger.final``; {} when absent)."""
    return dict((_state(run_dir).get("ledger") or {}).get("final") or {})


def _checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """The run's saved checkpoints, as recorded in the run folder's ``state.json`` (none if absent)."""
    return list(_state(run_dir).get("checkpoints") or [])
