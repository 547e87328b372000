"""Orchestration overhead per step at 8x4, 32x4 and 128x4 rollouts per step on the local stack.

For each size (``batch_size x responses_per_prompt``) runs ``stepwise run-local`` on the toy config
for ``--steps`` steps (no evals, no checkpoints) and reports, per trained step:

* wall: the execution's time per step (``timing.json``: rollouts + advantages + training + orchestration);
* rollouts: time in the Distributed Map state ("Roll out generation batch"), training: submit/poll/rebind;
* overhead = wall - rollouts - training (planning, advantages, choices: the state machine's own cost);
* map overhead = rollouts - the reference loop's ``time/rollout`` at the same size (``--reference``),
  i.e. what the Map, its child executions, the Lambdas and the S3 hand-offs add to the same rollouts;
* history events per step in the parent execution, and steps that fit before the 25,000-event
  limit (continue-as-new must come earlier; ``steps_per_execution``);
* S3 objects and bytes written per step (from the run's mirrored objects).

Usage: ``python -m benchmarks.scaling [--sizes 8x4,32x4,128x4] [--steps 2] [--reference]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

HISTORY_LIMIT = 25_000


def tps_limit(rollouts: int) -> int:
    """ACR invokes per second for a size: one per rollout, at least 64, at most the config's cap
    (RunConfig.acr_tps_limit <= 125: above it the Map's concurrency cap binds instead)."""
    from stepwise.config import RunConfig

    cap = next((m.le for m in RunConfig.model_fields["acr_tps_limit"].metadata if getattr(m, "le", None)), 125)
    return int(min(cap, max(64, rollouts)))


def parse_size(text: str) -> tuple[int, int]:
    """``"32x4"`` -> (32, 4). Raises ValueError naming the accepted form."""
    try:
        b, k = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise ValueError(f"size {text!r} must be BATCHxRESPONSES, e.g. 32x4") from None
    return b, k


def events_per_step(histories: list[list[dict[str, Any]]], steps: int) -> dict[str, float]:
    """Parent-execution history events per trained step: total minus the run's fixed part
    (everything before the first "Plan next action" and after the last step), divided by steps."""
    events = [ev for h in histories for ev in h]
    plan_idx = [i for i, ev in enumerate(events) if ev["type"].endswith("StateEntered")
                and ev["stateEnteredEventDetails"]["name"] == "Plan next action"]
    if not plan_idx or steps == 0:
        return {"total": len(events), "per_step": float("nan")}
    # steps + 1 plans (the last one decides "finish"): the span between the first and the last plan is the steps.
    per_step = (plan_idx[-1] - plan_idx[0]) / max(1, len(plan_idx) - 1)
    return {"total": len(events), "per_step": per_step, "steps_before_limit": int(HISTORY_LIMIT // per_step)}


def run_size(config_path: Path, batch: int, k: int, steps: int, out: Path) -> dict[str, Any]:
    """One ``run_local`` at ``batch x k`` for ``steps`` steps; the figures described above."""
    import local.run as run_mod

    captured: list[list[dict[str, Any]]] = []
    original = run_mod._history

    def capture(sfn: Any, arn: str) -> list[dict[str, Any]]:
        events = original(sfn, arn)
        captured.append(events)
        return events

    overrides = {"batch_size": batch, "responses_per_prompt": k, "max_prompts": steps * batch,
                 "eval_dataset_path": "", "eval_every": 0, "save_every": 10_000,
                 "acr_tps_limit": tps_limit(batch * k)}
    load_start = load_average()
    run_mod._history = capture
    try:
        res = run_mod.run_local(config_path, run_id=f"bench-scale-{batch}x{k}-{int(time.time())}", out_root=out,
                                progress=False, overrides=overrides, quiet=True, mirror_s3=True)
    finally:
        run_mod._history = original
    per = res.timing.get("per_step", {})
    s3_dir = res.run_dir / "s3"
    files = [p for p in s3_dir.rglob("*") if p.is_file() and "/tokenizer/" not in str(p)
             and p.name not in ("config.json", "state.json")] if s3_dir.exists() else []
    return {
        "size": f"{batch}x{k}", "rollouts_per_step": batch * k, "status": res.status, "steps": res.steps,
        "wall_per_step": per.get("wall"), "rollouts_per_step_s": per.get("rollouts"),
        "training_per_step_s": per.get("training"),
        "overhead_per_step_s": (per["wall"] - per["rollouts"] - per["training"]) if per else None,
        "history": events_per_step(captured, res.steps),
        "s3_objects_per_step": len(files) / max(1, res.steps),
        "s3_bytes_per_step": sum(p.stat().st_size for p in files) / max(1, res.steps),
        "lambdas": res.timing.get("lambdas"), "rewards": res.rewards,
        "load_average": f"{load_start} -> {load_average()}",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    parser.add_argument("--sizes", default="8x4,32x4,128x4")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--reference", action="store_true", help="also run the reference loop at each size")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = []
    for size in args.sizes.split(","):
        b, k = parse_size(size)
        row = run_size(args.config, b, k, args.steps, args.out)
        if args.reference:
            from benchmarks.reference_vs_pipeline import run_reference

            cfg = {**json.loads(args.config.read_text()), "batch_size": b, "responses_per_prompt": k,
                   "acr_tps_limit": tps_limit(b * k)}
            ref = run_reference(cfg, steps=args.steps, out=args.out / f"ref-{size}")
            row["reference_step_s"] = ref["step_seconds"]
            row["reference_rollout_s"] = ref.get("rollout_seconds")
            if row["rollouts_per_step_s"] is not None and ref.get("rollout_seconds"):
                row["map_overhead_per_step_s"] = row["rollouts_per_step_s"] - min(ref["rollout_seconds"])
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "lambdas"}, default=str), flush=True)
    print(f"{'size':>7} {'wall s':>7} {'rollout s':>9} {'train s':>7} {'overhead s':>10} {'map ovh s':>9} "
          f"{'events/step':>11} {'steps<25k':>9} {'S3 KB/step':>10}  load")
    for r in rows:
        h = r["history"]
        print(f"{r['size']:>7} {r['wall_per_step'] or 0:>7.2f} {r['rollouts_per_step_s'] or 0:>9.2f} "
              f"{r['training_per_step_s'] or 0:>7.2f} {r['overhead_per_step_s'] or 0:>10.2f} "
              f"{r.get('map_overhead_per_step_s', float('nan')):>9.2f} {h.get('per_step', 0):>11.1f} "
              f"{h.get('steps_before_limit', 0):>9} {r['s3_bytes_per_step'] / 1024:>10.1f}  {r['load_average']}")
    print(f"written: {write_result(args.out, 'scaling', {'rows': rows, 'steps': args.steps})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
