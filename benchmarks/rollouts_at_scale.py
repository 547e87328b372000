"""1,024 rollouts a step through the whole local stack, against 64: what holds, and what each rollout costs.

For each size (``batch_size x responses_per_prompt``, default 128x8 and 8x8) runs ``stepwise run-local`` on the
toy config (its ``acr_tps_limit`` 25: the Map runs at most 200 children at once) for ``--steps`` steps, no evals,
no checkpoints, and accounts for everything:

* held: the run's status, every Map item of every step has exactly one rollout record (none lost, none twice),
  the statuses of those records;
* time per step (the executions' histories, `local.report.timing_split`): wall, rollouts (the Map),
  advantages (ComputeAdvantages), training (submit, poll, rebind), orchestration; and seconds per rollout;
* requests per function: the cost ledger's against the local engine's own dispatcher (StartRollout counts
  ACR's throttled invokes; OnRolloutResult every S3 notification);
* ACR runtime sessions (the emulator's counters): started, stopped, timed out, left active, peak at once,
  invokes throttled;
* cost: the run's estimate (``datasets/{run}/estimate.json``, written at the start as `stepwise start` does)
  against the ledger at the end, by part.

Usage: ``python -m benchmarks.rollouts_at_scale [--sizes 128x8,8x8] [--steps 2]`` (about 11 minutes for 128x8
on a busy 2-core machine). Results: ``runs-bench/rollouts_at_scale.json``; benchmarks/README.md section 16.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result
from benchmarks.scaling import parse_size

#: Rows of the toy task's train set (local/datasets.py): a batch of 128 prompts fits once per epoch.
TOY_ROWS = 200


def overrides(batch: int, k: int, steps: int) -> dict[str, Any]:
    """The toy config's changes for ``steps`` steps of ``batch x k``: ``steps`` full batches of the 200-row set
    (more than one epoch when a batch is over half of it), no evals, no checkpoints; ``acr_tps_limit`` stays
    the toy config's."""
    per_epoch = max(1, TOY_ROWS // batch)
    epochs = math.ceil(steps / per_epoch)
    return {"batch_size": batch, "responses_per_prompt": k, "epochs": epochs,
            "max_prompts": steps * batch if epochs == 1 else 0, "eval_dataset_path": "", "eval_every": 0,
            "save_every": -1}


def records_held(run_dir: Path, run_id: str, steps: int, per_step: int) -> dict[str, Any]:
    """Every step's Map items against its rollout records (the run folder's copy of the bucket): items,
    records, items without a record, items with more than one, sids seen twice, statuses."""
    root = run_dir / "s3" / "runs" / run_id / "steps"
    out: dict[str, Any] = {"items": 0, "records": 0, "missing": 0, "duplicated": 0, "statuses": {}, "late": 0}
    sids: set[str] = set()
    for step in range(steps):
        for gen in sorted((root / str(step)).glob("gen*")):
            items = json.loads((gen / "items.json").read_text())
            records = [json.loads(p.read_text()) for p in (gen / "rollouts").glob("*.json")]
            by_i: dict[int, int] = {}
            for r in records:
                by_i[r["i"]] = by_i.get(r["i"], 0) + 1
                out["statuses"][r["status"]] = out["statuses"].get(r["status"], 0) + 1
                out["late"] += bool(r.get("late"))
                if r.get("sid"):
                    out["duplicated"] += r["sid"] in sids
                    sids.add(r["sid"])
            out["items"] += len(items)
            out["records"] += len(records)
            out["missing"] += sum(1 for it in items if it["i"] not in by_i)
            out["duplicated"] += sum(1 for n in by_i.values() if n > 1)
    out["expected"] = steps * per_step
    return out


def requests(ledger_check: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per function: the ledger's requests and the engine's (None where the engine has no figure)."""
    return {name: {"ledger": row.get("requests"), "engine": row.get("local_requests")}
            for name, row in (ledger_check.get("lambda_seconds") or {}).items()}


def cost(state: dict[str, Any], estimate: dict[str, Any] | None) -> dict[str, Any]:
    """The ledger's final report by part, and the estimate made at the start for the same steps."""
    final = (state.get("ledger") or {}).get("final") or {}
    out: dict[str, Any] = {"ledger_usd": final.get("usd"), "ledger_total_usd": final.get("total_usd"),
                           "line": final.get("line"), "estimate_line": final.get("estimate_line")}
    cmp = final.get("estimate") or {}
    out["by_part"] = {p: v for p, v in cmp.items() if isinstance(v, dict)}
    if estimate is not None:
        out["estimate_per_step"] = estimate.get("per_step")
    return out


def estimate_with_the_runs_timings(run_dir: Path, timing: dict[str, Any], steps: int) -> dict[str, Any]:
    """The cost model fed what the run measured (the structure's check, whatever the machine's load):
    run-local's assumptions with the run's Map, advantages, training and orchestration seconds per step, its
    handlers' own seconds per invocation and the gateway's per LLM call (the ledger's), and its session
    start-up. Returns the whole run's parts (`stepwise_cli.cost.estimate`'s ``run``) and the batch's flow."""
    from local.report import calibrated_assumptions
    from stepwise.config import load_run_config
    from stepwise_cli.cost import estimate

    cfg = load_run_config(json.loads((run_dir / "run_config.json").read_text()))
    a = calibrated_assumptions(timing, cfg)
    est = estimate(cfg, a, total_steps=steps)
    return {"run": est["run"], "flow": est["flow"]}


def run_size(config: Path, batch: int, k: int, steps: int, out: Path) -> dict[str, Any]:
    """One run of ``batch x k`` for ``steps`` steps; the figures of the module doc."""
    from local.run import run_local

    run_id = f"bench-at-scale-{batch}x{k}-{int(time.time())}"
    load_start = load_average()
    t0 = time.monotonic()
    res = run_local(config, run_id=run_id, out_root=out, progress=False, overrides=overrides(batch, k, steps),
                    quiet=True, mirror_s3=True, timeout=7200)
    wall = time.monotonic() - t0
    timing = res.timing
    state = json.loads((res.run_dir / "state.json").read_text()) if (res.run_dir / "state.json").exists() else {}
    est_path = res.run_dir / "s3" / "datasets" / run_id / "estimate.json"
    estimate = json.loads(est_path.read_text()) if est_path.exists() else None
    per = timing.get("per_step") or {}
    rollouts = batch * k
    acr = timing.get("acr") or {}
    return {
        "size": f"{batch}x{k}", "rollouts_per_step": rollouts, "status": res.status, "steps": res.steps,
        "run_seconds": round(wall, 1), "per_step": per,
        "seconds_per_rollout": round(per["wall"] / rollouts, 4) if per.get("wall") else None,
        "held": records_held(res.run_dir, run_id, res.steps, rollouts),
        "requests": requests(timing.get("ledger_check") or {}),
        "acr": {key: acr.get(key) for key in ("invocations", "forwarded", "throttled", "sessions_started",
                                              "sessions_stopped", "sessions_timed_out", "sessions_active",
                                              "peak_active_sessions")},
        "acr_left": len(res.billing.get("acr_active") or []),
        "session_status": res.session_status,
        "cost": cost(state, estimate),
        "estimate_with_the_runs_timings": estimate_with_the_runs_timings(res.run_dir, timing, res.steps)
        if res.status == "SUCCEEDED" else None,
        "ledger_check": timing.get("ledger_check"),
        "lambdas": timing.get("lambdas"),
        "load_average": f"{load_start} -> {load_average()}",
        "run_dir": str(res.run_dir),
    }


def table(rows: list[dict[str, Any]]) -> str:
    lines = [f"{'size':>6} {'status':>9} {'wall s/step':>11} {'Map s':>7} {'adv s':>6} {'train s':>7} {'orch s':>6} "
             f"{'s/rollout':>9} {'records':>9} {'lost':>4} {'ACR start/stop/left/peak/throttled':>34}  load"]
    for r in rows:
        p, h, a = r["per_step"], r["held"], r["acr"]
        lines.append(
            f"{r['size']:>6} {r['status']:>9} {p.get('wall', 0):>11.1f} {p.get('rollouts', 0):>7.1f} "
            f"{p.get('advantages', 0):>6.2f} {p.get('training', 0):>7.1f} {p.get('orchestration', 0):>6.1f} "
            f"{r['seconds_per_rollout'] or 0:>9.4f} {h['records']:>4}/{h['expected']:<4} {h['missing']:>4} "
            f"{a.get('sessions_started')!s:>8}/{a.get('sessions_stopped')!s}/{r['acr_left']}/"
            f"{a.get('peak_active_sessions')}/{a.get('throttled')}  {r['load_average']}")
    for r in rows:
        req = ", ".join(f"{n} {v['ledger']}/{v['engine']}" for n, v in sorted(r["requests"].items())
                        if v["engine"] is not None)
        lines.append(f"{r['size']} requests (ledger/engine): {req}")
        c = r["cost"]
        parts = ", ".join(f"{p} {v['estimate']:.4f}/{v['ledger']:.4f}" for p, v in c["by_part"].items()
                          if p not in ("session_hours",) and "estimate" in v)
        lines.append(f"{r['size']} cost USD (estimate/ledger): {parts}")
        again = (r.get("estimate_with_the_runs_timings") or {}).get("run") or {}
        if again:
            ledger = c.get("ledger_usd") or {}
            lines.append(f"{r['size']} with the run's own timings (estimate/ledger): " + ", ".join(
                f"{p} {again[p]:.4f}/{ledger.get(p, 0.0):.4f}" for p in ("agent", "lambda", "step_functions", "s3")
                if p in again) + f", total {again['total']:.4f}/{c.get('ledger_total_usd') or 0:.4f}")
    if len(rows) >= 2:
        big, small = max(rows, key=lambda r: r["rollouts_per_step"]), min(rows, key=lambda r: r["rollouts_per_step"])
        if big["per_step"].get("wall") and small["per_step"].get("wall"):
            marginal = ((big["per_step"]["wall"] - small["per_step"]["wall"])
                        / (big["rollouts_per_step"] - small["rollouts_per_step"]))
            lines.append(f"per rollout: {small['seconds_per_rollout']:.4f} s at {small['rollouts_per_step']}, "
                         f"{big['seconds_per_rollout']:.4f} s at {big['rollouts_per_step']}; each rollout past "
                         f"{small['rollouts_per_step']} adds {marginal:.4f} s to the step")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    parser.add_argument("--sizes", default="128x8,8x8")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        b, k = parse_size(size)
        row = run_size(args.config, b, k, args.steps, args.out)
        rows.append(row)
        print(json.dumps({key: v for key, v in row.items() if key not in ("lambdas", "ledger_check")}, default=str),
              flush=True)
    print(table(rows))
    print(f"written: {write_result(args.out, 'rollouts_at_scale', {'rows': rows, 'steps': args.steps})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
