"""What enforcing Lambda's limits costs a local run, per memory measure (`local/limits.py`).

Runs ``stepwise start --local`` on the toy config (``--steps`` steps of 8 x 8 rollouts, no evals, no
checkpoints) once per measure (``off``: the timeout only; ``rss``; ``tracemalloc``), ``--repeats``
times in turn, and prints the wall seconds per step and, per function, the largest memory growth one
invocation was measured at against its ``memory_mb`` (the margin before a local run would fail).

Usage: ``python -m benchmarks.limits_overhead [--steps 3] [--repeats 2] [--measures off,rss,tracemalloc]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result


def run_once(config: Path, measure: str, steps: int, out: Path) -> dict[str, Any]:
    import local.run as run_mod

    os.environ["STEPWISE_LOCAL_MEMORY_MEASURE"] = measure
    overrides = {"max_prompts": steps * 8, "batch_size": 8, "responses_per_prompt": 8, "eval_dataset_path": "",
                 "eval_every": 0, "save_every": 10_000}
    load = load_average()
    t0 = time.monotonic()
    res = run_mod.run_local(config, run_id=f"bench-limits-{measure}-{int(time.time())}", out_root=out,
                            progress=False, overrides=overrides, quiet=True)
    return {"measure": measure, "status": res.status, "steps": res.steps, "seconds": time.monotonic() - t0,
            "wall_per_step": (res.timing.get("per_step") or {}).get("wall"), "lambdas": res.timing.get("lambdas"),
            "load_average": f"{load} -> {load_average()}"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--measures", default="off,rss,tracemalloc")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    from stepwise.functions import FUNCTIONS

    limits = {f.name: f.memory_mb for f in FUNCTIONS}
    saved = os.environ.get("STEPWISE_LOCAL_MEMORY_MEASURE")
    runs: list[dict[str, Any]] = []
    try:
        for _ in range(args.repeats):
            for measure in args.measures.split(","):
                r = run_once(args.config, measure, args.steps, args.out)
                runs.append(r)
                print(f"{measure:>11} {r['status']:<10} steps {r['steps']}  wall/step {r['wall_per_step'] or 0:6.2f} s"
                      f"  load {r['load_average']}", flush=True)
    finally:
        if saved is None:
            os.environ.pop("STEPWISE_LOCAL_MEMORY_MEASURE", None)
        else:
            os.environ["STEPWISE_LOCAL_MEMORY_MEASURE"] = saved
    print(f"{'measure':>11} {'median wall s/step':>18}  largest invocation growth, MB (limit)")
    for measure in args.measures.split(","):
        mine = [r for r in runs if r["measure"] == measure]
        walls = [r["wall_per_step"] for r in mine if r["wall_per_step"]]
        peaks: dict[str, float] = {}
        for r in mine:
            for name, st in (r["lambdas"] or {}).items():
                peaks[name] = max(peaks.get(name, 0.0), st.get("peak_mb", 0.0))
        top = sorted(peaks.items(), key=lambda kv: -kv[1])[:4]
        print(f"{measure:>11} {statistics.median(walls) if walls else float('nan'):>18.2f}  "
              + ", ".join(f"{n} {v:.0f} ({limits.get(n, '?')})" for n, v in top))
    print(f"written: {write_result(args.out, 'limits_overhead', {'runs': runs, 'steps': args.steps})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
