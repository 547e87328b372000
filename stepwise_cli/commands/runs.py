"""`stepwise runs [--limit N] [--json]`: recent runs with their status and last metrics.

Reads the state machine's newest executions (continuations are folded into their run), then
per run ``state.json`` (steps done, epoch, stop reason, checkpoints) and the newest step and eval
summaries (found by listing step folders with a delimiter, so the cost does not grow with rollouts).
Below the table: every run's checkpoints, final weights and best model (step, kind, reason, model
package ARN; the best model is the eval that scored best, `stepwise.core.selection`), ending with the newest run's final weights and how to sample or deploy them.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepwise import layout
from stepwise.executions import run_id_of_execution
from stepwise_cli.commands._runs import (
    EXIT_OK,
    Deployment,
    add_stack_arguments,
    best_model,
    best_text,
    checkpoint_lines,
    deployment,
    eval_accuracy,
    fmt,
    get_json,
    list_executions,
    mean_reward,
    run_config,
    run_state,
    run_weights,
    step_folders,
)


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--limit", type=int, default=20, help="runs to show (default 20)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    add_stack_arguments(parser)


def last_summary(dep: Deployment, run_id: str, kind: str) -> tuple[int | None, dict[str, Any] | None]:
    """``(step, summary)`` of the newest written ``{kind}/{step}/summary.json`` (kind: steps | evals)."""
    for step in reversed(step_folders(dep.s3, dep.bucket, layout.summaries_prefix(run_id, kind))):
        body = get_json(dep.s3, dep.bucket, layout.step_summary_key(run_id, kind, step))
        if body is not None:
            return step, body
    return None, None


def recent_runs(dep: Deployment, limit: int) -> list[dict[str, Any]]:
    """One row per run, newest first: run_id, status, started, executions, step, epoch,
    last_reward (and its step), last_eval_accuracy (and its step), stop_reason."""
    rows: dict[str, dict[str, Any]] = {}
    for e in list_executions(dep.sfn, dep.state_machine_arn, limit=max(limit * 4, limit)):
        run_id = run_id_of_execution(e["name"])
        row = rows.get(run_id)
        if row is None:
            if len(rows) >= limit:
                continue
            rows[run_id] = {"run_id": run_id, "status": e["status"], "execution": e["name"],
                            "started": e["startDate"], "executions": 1}
        else:
            row["executions"] += 1
            row["started"] = min(row["started"], e["startDate"])
    for run_id, row in rows.items():
        state = run_state(dep, run_id) or {}
        if state.get("owner_execution_arn", "").rsplit(":", 1)[-1] != row["execution"] and state:
            # the newest execution listed is not the owner (e.g. a refused duplicate); say so
            row["note"] = f"owner {state['owner_execution_arn'].rsplit(':', 1)[-1]}"
        step_no, summary = last_summary(dep, run_id, "steps")
        eval_no, ev = last_summary(dep, run_id, "evals")
        checkpoints, final = run_weights(state)
        row.update(steps_done=state.get("step"), epoch=state.get("epoch"), stop_reason=state.get("stop_reason"),
                   last_step=step_no, last_reward=mean_reward(summary),
                   last_eval_step=eval_no, last_eval_accuracy=eval_accuracy(ev),
                   checkpoints=checkpoints, final_weights=final, best_model=best_model(state),
                   region=region_of(dep, run_id))
    return sorted(rows.values(), key=lambda r: r["started"], reverse=True)


def region_of(dep: Deployment, run_id: str) -> str:
    """The run's region: its config's ``region``, else the deployment's."""
    return (run_config(dep, run_id) or {}).get("region") or dep.info.region


def format_weights(rows: list[dict[str, Any]]) -> list[str]:
    """Below the table: each run's checkpoints and final weights, then how to sample or deploy the
    newest run's final weights (the output ends with that model package ARN)."""
    from stepwise.core.operations import weights_usage

    lines: list[str] = []
    for r in rows:
        if not r.get("checkpoints") and not r.get("final_weights") and not r.get("best_model"):
            continue
        lines.append(f"{r['run_id']}:")
        lines += checkpoint_lines(r.get("checkpoints") or [], r.get("final_weights") or None)
        if r.get("best_model"):
            lines.append(f"  best model: {best_text(r['best_model'])}")
    newest = next((r for r in rows if r.get("final_weights")), None)
    if newest is not None:
        arn = newest["final_weights"]["model_package_arn"]
        lines.append(f"final weights of {newest['run_id']}: {arn}")
        lines += [f"  {line}" for line in weights_usage(arn, newest.get("region") or "").splitlines()]
    return lines


def format_rows(rows: list[dict[str, Any]]) -> str:
    head = f"{'run':<36} {'status':<10} {'started (UTC)':<16} {'steps':>5} {'reward':>7} {'eval':>7}  note"
    lines = [head]
    for r in rows:
        started = r["started"].strftime("%Y-%m-%d %H:%M") if hasattr(r["started"], "strftime") else str(r["started"])
        note = r.get("stop_reason") or r.get("note") or ""
        if r["executions"] > 1:
            note = f"{r['executions']} executions" + (f"; {note}" if note else "")
        steps = "-" if r.get("steps_done") is None else str(r["steps_done"])
        lines.append(f"{r['run_id'][:36]:<36} {r['status']:<10} {started:<16} {steps:>5} "
                     f"{fmt(r.get('last_reward')):>7} {fmt(r.get('last_eval_accuracy')):>7}  {note}")
    weights = format_weights(rows)
    return "\n".join(lines + ([""] + weights if weights else []))


def run(args: argparse.Namespace) -> int:
    rows = recent_runs(deployment(args), args.limit)
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
    elif not rows:
        print("no runs yet: start one with `stepwise start CONFIG.json`")
    else:
        print(format_rows(rows))
    return EXIT_OK
