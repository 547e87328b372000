"""Screened vs unscreened dataset on the mix task: GRPO train reward by rollouts consumed, 3 seeds.

The mix task (``prepare_datasets/prepare_mix.py``) has three buckets of ten prompts: easy (the base
model always solves them), middle (~20%, learnable) and hard (never solved). GRPO learns only from
groups whose rewards differ, so at the start about 70% of a batch's groups carry no signal.
``stepwise screen --k 8`` (an eval-only run of the base model: 8 rollouts of each of the 30 distinct
prompts, 240 rollouts) removes the always- and never-solved prompts.

Per seed (``--seeds``), three local runs of ``examples/mix.json`` with ``seed`` set:

1. ``unscreened``: the config as shipped (160 rows, 20 steps of 8 prompts x 8 responses);
2. ``screen``: ``stepwise screen examples/mix.json --k 8`` -> a screened dataset;
3. ``screened``: the config on the screened dataset, with ``epochs`` raised and ``max_steps`` 20 so
   it trains as many steps (1,280 rollouts) as the unscreened run.

What is compared. A train batch's reward depends on which prompts it holds: an unscreened batch
scores ~1 on its easy third and 0 on its hard third whatever the policy does. So the learning both
runs share is measured on the prompts both train on, the middle bucket: per step, the mean reward of
the step's middle-bucket rollouts (read from the mirrored rollout records and the batch's payloads).
The target is the unscreened run's middle-bucket reward at its end (mean of its last 3 steps); each
run's "rollouts to target" is the training rollouts consumed until its 3-step moving average of that
reward first reaches the target (the screened run's with and without the screen's own rollouts). The
runs' greedy eval accuracy on the mix eval set (30 prompts, at steps 10 and 20) is printed beside.

Usage: ``python -m benchmarks.screening --seeds 0,1,2``. Writes ``runs-bench/screening.json``; run
folders go to ``runs-bench/screening/``. Takes about 3 x 3 local runs (~15-40 min on 2 shared cores).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

CONFIG = REPO_ROOT / "examples" / "mix.json"
BUCKET = "middle"
SMOOTH = 3


def _stepwise(*args: str, log: Path) -> None:
    """``stepwise ARGS`` in a child process (its own simulator and moto), output to ``log``."""
    with log.open("w") as fh:
        code = subprocess.call([sys.executable, "-m", "stepwise_cli", *args], stdout=fh, stderr=subprocess.STDOUT,
                               cwd=str(REPO_ROOT))
    if code != 0:
        raise RuntimeError(f"stepwise {' '.join(args)} exited {code}; see {log}")


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def step_curve(run_dir: Path, run_id: str) -> list[dict[str, float]]:
    """Per train step: rollouts so far, ``sampler/mean_reward`` and the middle bucket's mean reward
    (from the mirrored rollout records and the batch's ``prompts.json``)."""
    s3 = run_dir / "s3" / "runs" / run_id / "steps"
    rows, total = [], 0
    for step in sorted(int(p.name) for p in s3.iterdir() if p.name.isdigit()):
        summary_path = run_dir / "steps" / str(step) / "summary.json"
        if not summary_path.exists():
            continue
        summary = _json(summary_path)
        total += int(summary.get("sampler/num_rollouts", 0))
        middle = []
        for gen in sorted((s3 / str(step)).glob("gen*")):
            payloads = _json(gen / "prompts.json")
            for record in (gen / "rollouts").glob("*.json"):
                r = _json(record)
                if payloads[r["input_id"]].get("difficulty") == BUCKET:
                    middle.append(float(r["reward"]))
        rows.append({"step": step, "rollouts": total, "reward": summary.get("sampler/mean_reward"),
                     "middle_reward": statistics.fmean(middle) if middle else None})
    return rows


def rollouts_to(curve: list[dict[str, float]], target: float) -> int | None:
    """Training rollouts consumed when the ``SMOOTH``-step moving average of the middle bucket's reward
    first reaches ``target`` (None: never)."""
    values = [r["middle_reward"] for r in curve]
    for i in range(len(curve)):
        window = [v for v in values[max(0, i - SMOOTH + 1):i + 1] if v is not None]
        if len(window) == min(SMOOTH, i + 1) and statistics.fmean(window) >= target:
            return int(curve[i]["rollouts"])
    return None


def evals(run_dir: Path) -> dict[int, float]:
    out = {}
    for p in sorted((run_dir / "evals").glob("*/summary.json")):
        out[int(p.parent.name)] = _json(p).get("eval/accuracy")
    return out


def run_seed(seed: int, out: Path, k: int) -> dict[str, Any]:
    runs = out / "screening"
    runs.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    unscreened_id, screened_id, screen_id = f"mix-unscreened-s{seed}", f"mix-screened-s{seed}", f"mix-screen-s{seed}"
    common = ["--runs-dir", str(runs), "--no-progress", "--mirror-s3", "--set", f"seed={seed}"]
    _stepwise("start", "--local", str(CONFIG), "--run-id", unscreened_id, *common, log=runs / f"{unscreened_id}.log")
    screened = runs / f"mix_screened_s{seed}.jsonl"
    _stepwise("screen", str(CONFIG), "--k", str(k), "--out", str(screened), "--local", "--runs-dir", str(runs),
              "--run-id", screen_id, "--no-progress", "--set", f"seed={seed}", log=runs / f"{screen_id}.log")
    report = _json(screened.with_suffix(".screen.json"))
    kept = max(1, report["kept_rows"])
    epochs = -(-160 // kept) + 1
    _stepwise("start", "--local", str(CONFIG), "--run-id", screened_id, *common, "--set", f"dataset_path=\"{screened}\"",
              "--set", "max_prompts=0", "--set", f"epochs={epochs}", "--set", "max_steps=20",
              log=runs / f"{screened_id}.log")
    base = step_curve(runs / unscreened_id, unscreened_id)
    scr = step_curve(runs / screened_id, screened_id)
    tail = [r["middle_reward"] for r in base[-SMOOTH:] if r["middle_reward"] is not None]
    target = statistics.fmean(tail)
    screen_rollouts = int(report.get("rollouts") or report["prompts"] * k)
    to_base, to_scr = rollouts_to(base, target), rollouts_to(scr, target)
    return {
        "seed": seed, "target_middle_reward": target, "screen_rollouts": screen_rollouts,
        "screen": {k_: report[k_] for k_ in ("rows", "kept_rows", "removed_too_easy_rows", "removed_too_hard_rows",
                                              "prompts", "kept_prompts", f"mixed@{k}_before", f"mixed@{k}_after")},
        "unscreened": {"rollouts_to_target": to_base, "rollouts": base[-1]["rollouts"] if base else 0,
                       "final_reward": base[-1]["reward"] if base else None, "evals": evals(runs / unscreened_id),
                       "curve": base},
        "screened": {"rollouts_to_target": to_scr,
                     "rollouts_to_target_with_screen": None if to_scr is None else to_scr + screen_rollouts,
                     "rollouts": scr[-1]["rollouts"] if scr else 0, "final_reward": scr[-1]["reward"] if scr else None,
                     "evals": evals(runs / screened_id), "curve": scr},
        "wall_seconds": round(time.monotonic() - t0, 1), "load_average": load_average(),
    }


def table(results: list[dict[str, Any]]) -> str:
    lines = ["| seed | target (middle reward) | unscreened: rollouts to target | screened: rollouts to target | "
             "+ screen's rollouts | final eval accuracy unscreened / screened | kept rows (prompts) |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        u, s = r["unscreened"], r["screened"]
        last = lambda e: e[max(e, key=int)] if e else None  # noqa: E731
        lines.append(f"| {r['seed']} | {r['target_middle_reward']:.3f} | {u['rollouts_to_target']} | "
                     f"{s['rollouts_to_target']} | {s['rollouts_to_target_with_screen']} | "
                     f"{last(u['evals'])} / {last(s['evals'])} | {r['screen']['kept_rows']} "
                     f"({r['screen']['kept_prompts']}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2", help="comma-separated seeds (default 0,1,2)")
    parser.add_argument("--k", type=int, default=8, help="screening group size (default 8, mix.json's)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        print(f"seed {seed} ...", file=sys.stderr, flush=True)
        results.append(run_seed(seed, args.out, args.k))
        print(table(results[-1:]), flush=True)
    path = write_result(args.out, "screening", {"k": args.k, "results": results})
    print(table(results))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
