"""Per-turn vs trajectory rewards on the two-turn toy task: steps to learn it, per seed.

The task (``examples/two_turn.json``, ``local/agents/two_turn_agent.py``): the agent's first LLM call
answers a toy question ("What digit comes after N?") and alone decides the reward; its second call
asks the same question in a fresh conversation and is ignored (a free turn). Arms, each on the same
config, rollouts and seeds:

- ``per_turn``: ``advantage_estimator: per_turn_rloo``, ``reward_granularity: per_turn`` (the agent
  returns ``[outcome, 0.0]``): the first turn's tokens get the outcome's leave-one-out advantage, the
  free turn's get 0.
- ``trajectory``: ``advantage_estimator: rloo``, ``reward_granularity: trajectory`` (the agent returns
  ``outcome``): the same advantage on both turns, so the free answer to the question being learned
  is pushed up or down with the first answer's luck.
- ``trajectory-grpo``: the default estimator (``grpo``) with trajectory rewards.

Runs ``stepwise start --local`` per arm and seed (``--seeds``, ``--parallel`` at a time), reads each run's
``metrics.jsonl`` and prints per arm and seed the optimizer steps until the mean train reward
(``sampler/mean_reward``: the first turn's accuracy at temperature 1) of ``--window`` consecutive steps
reaches ``--threshold``, and the train reward at a few steps. Usage:
``python -m benchmarks.credit_two_turn --seeds 0,1,2 --parallel 2``; ``--report FILE`` re-prints a result.
Writes ``runs-bench/credit_two_turn.json``; run folders go to ``runs-bench/credit_two_turn/``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

CONFIG = REPO_ROOT / "examples" / "two_turn.json"
#: arm -> --set overrides of examples/two_turn.json
ARMS: dict[str, list[str]] = {
    "per_turn": [],
    "trajectory": ['advantage_estimator="rloo"', 'reward_granularity="trajectory"'],
    "trajectory-grpo": ['advantage_estimator="grpo"', 'reward_granularity="trajectory"'],
}


def read_rewards(run_dir: Path) -> list[float]:
    """The train reward (``sampler/mean_reward``) of each trained step of a run, in step order."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return [float(r["sampler/mean_reward"]) for r in rows if r.get("kind") == "train" and "sampler/mean_reward" in r]


def steps_to(rewards: list[float], threshold: float, window: int) -> int | None:
    """The first step count n (1-based: after n steps) whose last ``window`` steps' mean train reward
    reaches ``threshold``; None if never."""
    for n in range(window, len(rewards) + 1):
        if statistics.fmean(rewards[n - window:n]) >= threshold:
            return n
    return None


def run_one(arm: str, seed: int, out: Path, timeout: float, extra: list[str]) -> dict[str, Any]:
    run_id = f"{arm}-s{seed}"
    cmd = [sys.executable, "-m", "stepwise_cli", "start", "--local", str(CONFIG), "--no-progress", "--runs-dir", str(out),
           "--run-id", run_id, "--timeout", str(timeout), "--set", f"seed={seed}"]
    for s in ARMS[arm] + extra:
        cmd += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(f"[{arm} s{seed}] exit {proc.returncode}: {proc.stderr[-2000:]}", file=sys.stderr)
    rewards = read_rewards(out / run_id) if (out / run_id / "metrics.jsonl").exists() else []
    print(f"[{arm} s{seed}] {len(rewards)} steps, {wall:.0f} s, rewards " + " ".join(f"{r:.2f}" for r in rewards),
          flush=True)
    return {"arm": arm, "seed": seed, "exit_code": proc.returncode, "wall_seconds": wall, "rewards": rewards}


def summarize(runs: list[dict[str, Any]], threshold: float, window: int, at_steps: list[int]) -> str:
    """The table (markdown): per arm, steps to threshold per seed and their mean, train reward at
    ``at_steps`` (mean over seeds)."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    head = (f"| arm | steps to {threshold} (window {window}), per seed | mean | "
            + " | ".join(f"reward @ step {k}" for k in at_steps) + " |")
    lines = [head, "|" + "---|" * (3 + len(at_steps))]
    for arm in arms:
        mine = sorted((r for r in runs if r["arm"] == arm), key=lambda r: r["seed"])
        reach = [steps_to(r["rewards"], threshold, window) for r in mine]
        # a seed that never reached it counts as its number of steps + 1 in the mean (a lower bound)
        as_num = [n if n is not None else len(r["rewards"]) + 1 for n, r in zip(reach, mine)]
        at = []
        for k in at_steps:
            vals = [r["rewards"][k - 1] for r in mine if len(r["rewards"]) >= k]
            at.append(f"{statistics.fmean(vals):.2f}" if vals else "-")
        per_seed = ", ".join(f"s{r['seed']}: {n if n is not None else 'never (' + str(len(r['rewards'])) + ')'}"
                             for r, n in zip(mine, reach))
        lines.append(f"| {arm} | {per_seed} | {statistics.fmean(as_num):.1f} | " + " | ".join(at) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="per_turn,trajectory", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--threshold", type=float, default=0.8, help="train reward to reach (mean over --window steps)")
    p.add_argument("--window", type=int, default=2, help="consecutive steps averaged for --threshold")
    p.add_argument("--at-steps", default="5,10,15,20")
    p.add_argument("--timeout", type=float, default=5400, help="seconds per run (a loaded 2-core machine needs ~40 min for 20 steps)")
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="FIELD=JSON",
                   help="override a config field in every arm (after the arm's own)")
    p.add_argument("--report", type=Path, help="run nothing: re-print the table of an earlier result file")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    at_steps = [int(k) for k in args.at_steps.split(",") if k]
    if args.report:
        data = json.loads(args.report.read_text())
        print(summarize(data["runs"], data["threshold"], data["window"], at_steps))
        return 0
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs_dir = args.out / "credit_two_turn"
    jobs = [(a, s) for s in seeds for a in arms]
    load_start = load_average()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda j: run_one(j[0], j[1], runs_dir, args.timeout, args.extra), jobs))
    table = summarize(runs, args.threshold, args.window, at_steps)
    print(f"\nload {load_start} -> {load_average()}\n{table}")
    path = write_result(args.out, "credit_two_turn", {"arms": arms, "seeds": seeds, "set": args.extra,
                                                       "threshold": args.threshold, "window": args.window,
                                                       "runs": runs, "table": table})
    print(f"wrote {path}")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
