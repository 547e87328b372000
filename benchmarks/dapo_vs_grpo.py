"""DAPO vs GRPO on the toy task at the same rollout budget: learning curves by rollouts consumed.

Runs ``stepwise start --local`` once per arm and repeat (``--repeats``; ``--parallel`` at a time),
reads each run's ``metrics.jsonl`` and prints, per arm, the mean train reward (every rollout of
the step, all generation batches: ``sampler/mean_reward``) as a function of the rollouts consumed,
averaged over repeats, plus the rollouts each repeat needed to reach a reward threshold.

On the toy task the training prompts are the eval prompts (the ten "what digit comes after N?"
questions), so a step's train reward is a sampled (temperature 1) evaluation of the policy that
step started from; the greedy eval (``eval/accuracy``) saturates at 1.0 early and separates little.

Arms (``--arms``, comma-separated; each is a config plus overrides, see ``ARMS``):

- ``grpo``: ``examples/toy.json`` as shipped (importance_sampling).
- ``dapo``: ``examples/toy_dapo.json`` as shipped (ppo, Clip-Higher 0.8 / 1.28, dynamic sampling).
- ``grpo-clip``: GRPO with DAPO's loss (ppo, 0.8 / 1.28): isolates dynamic sampling.
- ``dapo-cap8``: DAPO with ``max_num_gen_batches`` 8 instead of 4, so the cap (which ends the run)
  fires later as the task gets solved and most groups are all-correct.
- ``dapo-is``: DAPO with GRPO's loss (importance_sampling, no Clip-Higher).
- ``*-k4``: the same arm with 4 responses per prompt and 2 epochs of the 160 prompts (the same 1,280 rollouts):
  more all-equal groups (p(correct) ~0.2 gives P(all equal) ~0.41 instead of ~0.17 at K=8).

``--task mix`` runs the same arms on ``examples/mix.json`` (the difficulty mix, about 70% of groups
all-equal at the start: ``prepare_datasets/prepare_mix.py``): the toy configs' fields become
mix.json's, and a DAPO arm gets the fields in which ``toy_dapo.json`` differs from ``toy.json``.
Its reward tops out at 2/3 (the hard third is never solved): pass ``--threshold 0.6``.

Usage: ``python -m benchmarks.dapo_vs_grpo --arms grpo,dapo --repeats 2 --parallel 2``.
Writes ``runs-bench/dapo_vs_grpo.json``; run folders go to ``runs-bench/dapo_vs_grpo/``.
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

_K4 = ["responses_per_prompt=4", "epochs=2"]
_CLIP = ["loss=\"ppo\"", "clip_low_threshold=0.8", "clip_high_threshold=1.28"]

#: arm name -> (config path relative to the repo, --set overrides)
ARMS: dict[str, tuple[str, list[str]]] = {
    "grpo": ("examples/toy.json", []),
    "dapo": ("examples/toy_dapo.json", []),
    "grpo-clip": ("examples/toy.json", _CLIP),
    "dapo-cap8": ("examples/toy_dapo.json", ["max_num_gen_batches=8"]),
    "dapo-is": ("examples/toy_dapo.json", ["loss=\"importance_sampling\"", "clip_low_threshold=null",
                                           "clip_high_threshold=null"]),
    "grpo-k4": ("examples/toy.json", _K4),
    "dapo-k4": ("examples/toy_dapo.json", _K4),
    "grpo-clip-k4": ("examples/toy.json", _CLIP + _K4),
}


#: --task -> the config that replaces examples/toy.json (a DAPO arm adds toy_dapo.json's own fields).
TASKS: dict[str, str] = {"toy": "examples/toy.json", "mix": "examples/mix.json"}


def task_arm(arm: str, task: str) -> tuple[Path, list[str]]:
    """(config file, --set overrides) of ``arm`` on ``task``: the toy arm itself, or for another
    task its config plus, for an arm on ``toy_dapo.json``, the DAPO fields of toy_dapo.json
    that differ from toy.json (``exp_id`` aside), then the arm's own overrides."""
    config, sets = ARMS[arm]
    if task == "toy":
        return REPO_ROOT / config, sets
    dapo_fields: list[str] = []
    if config == "examples/toy_dapo.json":
        toy = json.loads((REPO_ROOT / "examples/toy.json").read_text())
        dapo = json.loads((REPO_ROOT / config).read_text())
        dapo_fields = [f"{k}={json.dumps(v)}" for k, v in dapo.items() if k != "exp_id" and toy.get(k) != v]
    return REPO_ROOT / TASKS[task], dapo_fields + sets


def read_curve(run_dir: Path) -> dict[str, Any]:
    """Per-step (cumulative rollouts, mean train reward) and evals from ``run_dir/metrics.jsonl``.

    Returns ``{"steps": [{"step", "rollouts", "cum_rollouts", "useful_rollouts", "reward",
    "generation_batches", "filtered_fraction"}], "evals": [{"step", "cum_rollouts", "accuracy"}]}``;
    ``useful_rollouts`` are the step's rollouts in groups it trained on with a non-zero advantage
    (DAPO: kept groups x K; GRPO: all but the all-equal groups). Raises
    FileNotFoundError when the run wrote no metrics."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    config_file = run_dir / "run_config.json"
    run_config = json.loads(config_file.read_text()) if config_file.exists() else {}
    k = run_config.get("responses_per_prompt", 1)
    # GRPO steps report sampling/* too (one generation batch, nothing filtered): the algorithm decides.
    dapo = run_config.get("algorithm") == "dapo" if run_config else None
    steps, evals, cum = [], [], 0
    for row in rows:
        if row.get("kind") == "train":
            n = int(row.get("sampler/num_rollouts", 0))
            cum += n
            if row.get("decision", "train") != "train":  # skipped or capped: nothing trained
                useful = 0
            elif (dapo if dapo is not None else "sampling/kept_groups" in row):  # DAPO: every kept group is informative
                useful = int(row["sampling/kept_groups"]) * k
            else:  # GRPO: every group but the all-equal ones
                useful = round(n * (1 - float(row.get("advantages/zero_groups_fraction") or 0.0)))
            steps.append({"step": row["step"], "rollouts": n, "cum_rollouts": cum, "useful_rollouts": useful,
                          "reward": row.get("sampler/mean_reward"),
                          "generation_batches": row.get("sampling/generation_batches", 1),
                          "filtered_fraction": row.get("sampling/filtered_fraction") if dapo is not False
                          else row.get("advantages/zero_groups_fraction")})
        elif row.get("kind") == "eval":
            evals.append({"step": row["step"], "cum_rollouts": cum, "accuracy": row.get("eval/accuracy")})
    return {"steps": steps, "evals": evals}


def reward_at(curve: list[dict[str, Any]], budget: int, window: int = 256) -> float | None:
    """Mean train reward of the rollouts consumed in (budget - window, budget]: each step weighted
    by its rollouts in the window. None when the curve does not reach ``budget``."""
    if not curve or curve[-1]["cum_rollouts"] < budget:
        return None
    lo, total, weight = budget - window, 0.0, 0
    for s in curve:
        start, end = s["cum_rollouts"] - s["rollouts"], s["cum_rollouts"]
        overlap = max(0, min(end, budget) - max(start, lo))
        if overlap and s["reward"] is not None:
            total += s["reward"] * overlap
            weight += overlap
    return total / weight if weight else None


def rollouts_to(curve: list[dict[str, Any]], threshold: float, window: int = 256) -> int | None:
    """The rollouts consumed at the first step end where the mean train reward of the last
    ``window`` rollouts (``reward_at``) reaches ``threshold``; None if never. A window in rollouts,
    not in steps, so arms with different rollouts per step are measured alike."""
    for s in curve:
        if s["cum_rollouts"] >= window:
            value = reward_at(curve, s["cum_rollouts"], window)
            if value is not None and value >= threshold:
                return s["cum_rollouts"]
    return None


def run_arm(arm: str, repeat: int, out: Path, timeout: float, extra: list[str], tag: str,
            task: str = "toy", reuse: bool = False) -> dict[str, Any]:
    """Run one arm's repeat ``repeat`` with ``seed`` = ``repeat`` (a run's samples are a function of
    its config and seed, so repeats need their own seeds; a ``--set seed=`` in ``extra`` wins).
    ``reuse``: a run folder whose ``result.json`` says SUCCEEDED is read, not run again."""
    config, sets = task_arm(arm, task)
    sets = [f"seed={repeat}"] + sets + extra
    run_id = f"{arm}{tag}-r{repeat}"
    done = out / run_id / "result.json"
    if reuse and done.exists() and json.loads(done.read_text()).get("status") == "SUCCEEDED":
        curve = read_curve(out / run_id)
        print(f"[{arm} r{repeat}] reused {out / run_id}", flush=True)
        return {"arm": arm, "repeat": repeat, "exit_code": 0, "wall_seconds": json.loads(done.read_text()).get("wall_seconds"), **curve}
    cmd = [sys.executable, "-m", "stepwise_cli", "start", "--local", str(config), "--no-progress",
           "--runs-dir", str(out), "--run-id", run_id, "--timeout", str(timeout)]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(f"[{arm} r{repeat}] exit {proc.returncode}: {proc.stderr[-2000:]}", file=sys.stderr)
    curve = read_curve(out / run_id)
    print(f"[{arm} r{repeat}] {len(curve['steps'])} steps, {curve['steps'][-1]['cum_rollouts'] if curve['steps'] else 0}"
          f" rollouts, {wall:.0f} s, rewards " + " ".join(f"{s['reward']:.2f}" for s in curve["steps"]), flush=True)
    return {"arm": arm, "repeat": repeat, "exit_code": proc.returncode, "wall_seconds": wall, **curve}


def summarize(runs: list[dict[str, Any]], budgets: list[int], threshold: float,
              at_steps: list[int]) -> dict[str, Any]:
    """Print and return, per arm (in first-seen order): mean train reward in the 256 rollouts up to
    each budget, rollouts to ``threshold`` per repeat, train reward at optimizer steps ``at_steps``,
    steps, generation batches per step and the useful share of rollouts (``useful_rollouts`` /
    rollouts), all averaged over the arm's repeats."""
    arms = list(dict.fromkeys(r["arm"] for r in runs))
    print(f"{'arm':<20}" + "".join(f"{b:>7}" for b in budgets) + f"{'to ' + str(threshold):>16}"
          + "".join(f"{'@s' + str(k):>7}" for k in at_steps) + f"{'steps':>7}{'gen/st':>7}{'useful':>7}{'n':>3}")
    table = {}
    for arm in arms:
        mine = [r for r in runs if r["arm"] == arm]

        def mean(values: list[float | None]) -> float | None:
            vals = [v for v in values if v is not None]
            return statistics.fmean(vals) if vals else None

        cells = [mean([reward_at(r["steps"], b) for r in mine]) for b in budgets]
        per_step = [mean([r["steps"][k]["reward"] if k < len(r["steps"]) else None for r in mine]) for k in at_steps]
        reach = [rollouts_to(r["steps"], threshold) for r in mine]
        steps = statistics.fmean(len(r["steps"]) for r in mine)
        gen = mean([s["generation_batches"] for r in mine for s in r["steps"]]) or 0.0
        useful = sum(s.get("useful_rollouts", 0) for r in mine for s in r["steps"]) / max(
            1, sum(s["rollouts"] for r in mine for s in r["steps"]))
        table[arm] = {"reward_at": dict(zip(budgets, cells)), "rollouts_to_threshold": reach,
                      "reward_at_step": dict(zip(at_steps, per_step)), "steps": steps,
                      "generation_batches_per_step": gen, "useful_share": useful,
                      "repeats": len(mine)}
        fmt = lambda c: f"{c:>7.3f}" if c is not None else f"{'-':>7}"  # noqa: E731
        print(f"{arm:<20}" + "".join(fmt(c) for c in cells) + f"{'/'.join(str(x) if x else '-' for x in reach):>16}"
              + "".join(fmt(c) for c in per_step) + f"{steps:>7.1f}{gen:>7.2f}{useful:>7.2f}{len(mine):>3}")
    return table


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arms", default="grpo,dapo", help=f"comma-separated, of {', '.join(ARMS)}")
    p.add_argument("--task", choices=sorted(TASKS), default="toy", help="toy (default) or mix (examples/mix.json)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--parallel", type=int, default=2)
    p.add_argument("--budgets", default="256,512,768,1024,1280", help="rollout budgets to report at")
    p.add_argument("--threshold", type=float, default=0.8, help="reward for the rollouts-to-threshold column")
    p.add_argument("--at-steps", default="2,4,8", help="optimizer steps to report the train reward at")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--set", dest="extra", action="append", default=[], metavar="FIELD=JSON",
                   help="override a config field in every arm (after the arm's own), e.g. learning_rate=4e-4")
    p.add_argument("--tag", default="", help="suffix for run folders and the result file, e.g. --tag=-lr4e-4")
    p.add_argument("--report", nargs="+", type=Path, metavar="RESULT_JSON",
                   help="run nothing: summarize earlier result files (arms are suffixed with their tag)")
    p.add_argument("--merge", action="store_true",
                   help="with --report: pool an arm's runs across the files (for files of the same settings)")
    p.add_argument("--reuse", action="store_true", help="read runs whose folder already holds a SUCCEEDED result.json")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    budgets = [int(b) for b in args.budgets.split(",")]
    at_steps = [int(k) for k in args.at_steps.split(",") if k]
    if args.report:
        runs = []
        for path in args.report:
            data = json.loads(path.read_text())
            tag = data.get("tag", path.stem.removeprefix("dapo_vs_grpo"))
            for r in data["runs"]:
                run_dir = path.parent / "dapo_vs_grpo" / f"{r['arm']}{tag}-r{r['repeat']}"
                curve = read_curve(run_dir) if (run_dir / "metrics.jsonl").exists() else {}
                runs.append({**r, **curve, "arm": r["arm"] + ("" if args.merge else tag)})
        print("mean train reward in the 256 rollouts up to each budget")
        summarize(runs, budgets, args.threshold, at_steps)
        return 0
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        p.error(f"unknown arm(s) {unknown}; choose from {list(ARMS)}")
    runs_dir = args.out / "dapo_vs_grpo"
    jobs = [(a, r) for r in range(args.repeats) for a in arms]
    load_start = load_average()
    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        runs = list(pool.map(lambda j: run_arm(j[0], j[1], runs_dir, args.timeout, args.extra, args.tag, args.task, args.reuse), jobs))
    print(f"\nmean train reward in the 256 rollouts up to each budget (mean over {args.repeats} repeat(s)); "
          f"load {load_start} -> {load_average()}")
    table = summarize(runs, budgets, args.threshold, at_steps)
    path = write_result(args.out, f"dapo_vs_grpo{args.tag}", {
        "arms": arms, "task": args.task, "set": args.extra, "tag": args.tag, "repeats": args.repeats, "budgets": budgets,
        "threshold": args.threshold, "table": table, "runs": runs})
    print(f"wrote {path}")
    return 0 if all(r["exit_code"] == 0 for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
