"""Deep asynchrony on the local stack: step time, the session's busy fraction, staleness and reward per arm.

One invocation runs every arm on every seed, the arms interleaved (seed after seed, each seed running
every arm in turn) so that load drift on this shared machine cancels. Each run is ``stepwise start --local``
of the toy task with ``local/agents/sleepy_agent.py``, an agent that **sleeps** a heavy-tailed (lognormal)
time after each of its LLM turns, the durations a function of the prompt and the rollout's place (every
arm sees the same ones: the CPU of this machine does not decide them), and with a training latency
injected in the simulator (``--simulator-latency optim_step=S``).

Arms (``--arms``): ``sync`` (``max_staleness`` 0), ``overlap`` (today's overlap, ``max_staleness`` 1),
``d0k0`` (the group engine at d=0, k=0: it must reproduce ``sync``'s rewards), and ``d{d}k{k}-{loss}``
(the group engine with ``sampling_steps_ahead`` d and ``max_staleness`` k, loss ``ppo`` or ``cispo`` with
clip thresholds 0 and 2; d1k2 and d2k3 by default, any d <= k by name). Configs (``--configs``): ``rollout`` (rollouts dominate, heavy tail) and
``training`` (training takes longer than the slowest rollout).

Per arm: median and mean seconds per step (the first step, a cold start, left out), the **ratio to sync
in the same invocation**, the session's busy fraction (training + rebind over wall time, summed over the
steps), the staleness histogram of the trained rollouts, the largest staleness seen, the trainer's wait,
rollouts discarded, the duration quantiles of the rollouts trained beside those completed, the mean
reward of the last steps over the seeds (each step trains batch_size x responses_per_prompt rollouts: the
arms are compared at equal rollouts) and the discrete-event model's predicted ratio
(`stepwise_cli.asyncmodel`, fed the agent's very durations and the sync arm's measured step parts).

Usage: ``python -m benchmarks.async_depth [--quick] [--json PATH] [--seeds 0,1,2] [--steps N]``.
``--quick``: one seed, 4 steps, the rollout-dominated config, arms sync, overlap and d2k3-cispo (at most
10 minutes on a 2-core machine with nothing else running). Writes ``runs-bench/async_depth.json`` (and ``--json PATH``: one
object per arm and config with ``arm``, ``s_per_step``, ``ratio_to_sync``, ``session_busy``,
``max_staleness_seen``, ``discarded``, ``mean_reward_last``); run folders go to ``runs-bench/async_depth/``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

SLEEPY_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/sleepy_agent-local"
BASE_CONFIG = REPO_ROOT / "examples" / "toy.json"


@dataclass(frozen=True)
class Setting:
    """A benchmark config: the agent's sleeps, the injected training latency and the run's shape."""

    name: str
    turn_seconds: float  # mean sleep after each LLM turn
    sigma: float  # its log-sd (the tail)
    turns: int
    train_latency: float  # seconds the simulator adds to each optim_step
    batch_size: int = 4
    responses_per_prompt: int = 4
    steps: int = 8
    arms: tuple[str, ...] = ()  # the arms run by default (all when empty)
    final_eval_prompts: int = 0  # > 0: the final policy's greedy eval on that many toy eval prompts


SETTINGS = {
    # rollouts dominate with a heavy tail: a batch waits for its slowest of 16 rollouts (~4x the mean);
    # training (8 s) several times the local stack's own overhead per step, as it is on AWS
    "rollout": Setting("rollout", turn_seconds=4.0, sigma=1.0, turns=2, train_latency=8.0),
    # training longer than the slowest rollout
    "training": Setting("training", turn_seconds=0.5, sigma=0.3, turns=2, train_latency=12.0,
                        arms=("sync", "overlap", "d1k2-cispo", "d2k3-cispo")),
    # learning at equal rollouts, cheap enough for more steps: the rollout config's tail at an eighth of its
    # sleeps, short training, 20 steps, and the final policy's greedy eval (a deep arm's last trained rollouts
    # were sampled k versions back; its final policy is what a user keeps)
    "learning": Setting("learning", turn_seconds=0.5, sigma=1.0, turns=2, train_latency=2.0, steps=20,
                        arms=("sync", "d2k3-cispo"), final_eval_prompts=20),
}

#: arm -> --set overrides (the loss of sync, overlap and d0k0 is the toy config's)
ARMS: dict[str, list[str]] = {
    "sync": ["max_staleness=0"],
    "overlap": ["max_staleness=1"],
    "d0k0": ['admission="group"', "max_staleness=0", "sampling_steps_ahead=0"],
}
#: A deep arm's name: ``d{d}k{k}-{loss}`` (any d <= k; the issue's are d1k2 and d2k3, in the default set).
DEEP_ARM = re.compile(r"d(\d+)k(\d+)-(ppo|cispo)")


def deep_arm(d: int, k: int, loss: str) -> list[str]:
    """The ``--set`` overrides of the group engine at ``sampling_steps_ahead`` d, ``max_staleness`` k, ``loss``
    (cispo with clip thresholds 0 and 2: truncated importance sampling)."""
    sets = ['admission="group"', f"max_staleness={k}", f"sampling_steps_ahead={d}", f'loss="{loss}"']
    return sets + (["clip_low_threshold=0.0", "clip_high_threshold=2.0"] if loss == "cispo" else [])


for _d, _k in ((1, 2), (2, 3)):
    ARMS[f"d{_d}k{_k}-ppo"] = deep_arm(_d, _k, "ppo")
    ARMS[f"d{_d}k{_k}-cispo"] = deep_arm(_d, _k, "cispo")


def arm_sets(arm: str) -> list[str]:
    """An arm's overrides: one of `ARMS`, or any ``d{d}k{k}-{loss}`` (`DEEP_ARM`). Raises KeyError."""
    if arm in ARMS:
        return ARMS[arm]
    m = DEEP_ARM.fullmatch(arm)
    if m is None or int(m.group(1)) > int(m.group(2)):
        raise KeyError(arm)
    return deep_arm(int(m.group(1)), int(m.group(2)), m.group(3))
QUICK_ARMS = ("sync", "overlap", "d2k3-cispo")
#: Batches of prompts beyond a run's steps (at least the deepest arm's d + 1): no arm drains the dataset.
DRAIN_MARGIN_BATCHES = 4
#: The last steps whose mean train reward is an arm's final reward.
LAST_STEPS = 3


def run_arm(arm: str, setting: Setting, seed: int, steps: int, out: Path, timeout: float) -> dict[str, Any]:
    """One ``stepwise start --local`` of ``arm`` on ``setting`` with ``seed``; returns what `measure` reads."""
    run_id = f"{setting.name}-{arm}-s{seed}"
    sets = [f'agent_runtime_arn="{SLEEPY_ARN}"', f"batch_size={setting.batch_size}",
            f"responses_per_prompt={setting.responses_per_prompt}",
            # prompts beyond the steps trained: a deep arm's last steps train from a full buffer, as in a long run,
            # instead of waiting for the dataset's last (and slowest) groups to drain
            f"max_prompts={(steps + DRAIN_MARGIN_BATCHES) * setting.batch_size}", f"max_steps={steps}",
            *(['eval_dataset_path="examples/data/toy_eval.jsonl"', f"eval_max_prompts={setting.final_eval_prompts}"]
              if setting.final_eval_prompts else ['eval_dataset_path=""']),
            "eval_every=0", "save_every=0", f"seed={seed}", "max_rollout_time=600",
            "steps_per_execution=100", *arm_sets(arm)]
    cmd = [sys.executable, "-m", "stepwise_cli", "start", str(BASE_CONFIG), "--local", "--no-progress", "--runs-dir", str(out),
           "--run-id", run_id, "--timeout", str(timeout), "--simulator-latency", f"optim_step={setting.train_latency}"]
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "STEPWISE_SLEEPY_TURN_SECONDS": str(setting.turn_seconds),
           "STEPWISE_SLEEPY_SIGMA": str(setting.sigma), "STEPWISE_SLEEPY_TURNS": str(setting.turns),
           "STEPWISE_SLEEPY_SEED": str(seed)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO_ROOT, capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        print(f"[{run_id}] exit {proc.returncode}: {proc.stderr[-1500:]}", file=sys.stderr)
    row = measure(out / run_id)
    row.update(arm=arm, config=setting.name, seed=seed, exit_code=proc.returncode, wall_seconds=wall)
    print(f"[{run_id}] {row.get('s_per_step', float('nan')):.1f} s/step, busy {row.get('session_busy', 0):.0%}, "
          f"max staleness {row.get('max_staleness_seen')}, reward last {row.get('mean_reward_last')}, "
          f"run {wall:.0f} s, load {load_average()}", flush=True)
    return row


def measure(run_dir: Path) -> dict[str, Any]:
    """What one run's ``metrics.jsonl`` says, its first step (a cold start for every arm) left out of the times."""
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return {"steps": 0}
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    steps = [r for r in rows if r.get("kind") == "train" and r.get("decision", "train") == "train"]
    timed = [r for r in steps[1:] if r.get("time/step_wall")] or [r for r in steps if r.get("time/step_wall")]
    walls = [float(r["time/step_wall"]) for r in timed]
    busy = sum(float(r.get("time/session_busy", 0.0)) for r in timed)
    hist: dict[str, float] = {}
    for r in steps:
        for key, value in r.items():
            if key.startswith("staleness/hist/"):
                hist[key.rsplit("/", 1)[-1]] = hist.get(key.rsplit("/", 1)[-1], 0.0) + float(value)
    if not hist:  # the batch engine reports its max and mean only
        for r in steps:
            lag = str(int(r.get("staleness/max", 0)))
            hist[lag] = hist.get(lag, 0.0) + float(r.get("sampler/num_rollouts", 0))
    rewards = [float(r["sampler/mean_reward"]) for r in steps if r.get("sampler/mean_reward") is not None]
    evals = [float(r["eval/accuracy"]) for r in rows if r.get("kind") == "eval" and r.get("eval/accuracy") is not None]
    out: dict[str, Any] = {
        "steps": len(steps), "step_walls": walls,
        "s_per_step": statistics.median(walls) if walls else None,
        "s_per_step_mean": statistics.fmean(walls) if walls else None,
        "session_busy": busy / sum(walls) if walls and sum(walls) > 0 else None,
        "staleness_hist": {k: hist[k] for k in sorted(hist, key=int)},
        "max_staleness_seen": max((int(r.get("staleness/max", 0)) for r in steps), default=0),
        "past_k": sum(float(r.get("staleness/past_k", 0.0)) for r in steps),
        "trainer_wait": statistics.fmean([float(r.get("time/trainer_wait", 0.0)) for r in timed]) if timed else None,
        "trainer_wait_stale": statistics.fmean([float(r.get("time/trainer_wait_stale", 0.0)) for r in timed]) if timed else None,
        "discarded": max((float(r.get("rollouts/discarded", 0.0)) for r in steps), default=0.0),
        "rewards": rewards,
        "mean_reward_last": statistics.fmean(rewards[-LAST_STEPS:]) if rewards else None,
        "final_eval": evals[-1] if evals else None,
        "rollouts_per_step": float(steps[0].get("sampler/num_rollouts", 0)) if steps else 0.0,
        "duration_trained_p90": _median_of(steps, "rollouts/duration_trained_p90"),
        "duration_complete_p90": _median_of(steps, "rollouts/duration_complete_p90"),
        "rollout_wait": _median_of(timed, "time/rollout"),
        "session_busy_step": _median_of(timed, "time/session_busy"),
    }
    return out


def _median_of(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [float(r[key]) for r in rows if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def predicted_ratios(setting: Setting, arms: list[str], sync_rows: list[dict[str, Any]], steps: int) -> dict[str, float]:
    """The discrete-event model's s/step ratio to sync per arm, fed the agent's very durations
    (`local.agents.sleepy_agent.turn_seconds` of each rollout's prompt and place, plus a second of start and
    finish) and the step parts the sync arm measured (its session busy time, and the rest of its step
    beyond the slowest rollout as orchestration)."""
    from local.agents.sleepy_agent import turn_seconds
    from stepwise.core.groups import seed_place
    from stepwise_cli.asyncmodel import Timing, simulate

    prompts = [json.loads(x)["payload"]["prompt"] for x in (REPO_ROOT / "examples/data/toy_train.jsonl").read_text().splitlines()]
    bs, size = setting.batch_size, setting.responses_per_prompt
    busy = statistics.fmean([r["session_busy_step"] for r in sync_rows if r.get("session_busy_step")] or [setting.train_latency])
    walls = [r["s_per_step"] for r in sync_rows if r.get("s_per_step")]
    seed = sync_rows[0]["seed"] if sync_rows else 0

    def durations(g: int) -> list[float]:
        step, position = seed_place(g, bs)
        prompt = prompts[g % max(1, steps * bs)]
        return [1.0 + sum(turn_seconds(prompt, f"s{step}g0p{position}", m, t, mean_s=setting.turn_seconds,
                                       sigma=setting.sigma, seed=str(seed)) for t in range(setting.turns))
                for m in range(size)]

    sync_model = simulate("sync", steps=steps, batch_size=bs, group_size=size, durations=durations,
                          timing=Timing(train_s=busy, rebind_s=0.0, orchestration_s=0.0))
    orchestration = max(0.0, (statistics.median(walls) if walls else sync_model.s_per_step) - sync_model.s_per_step)
    timing = Timing(train_s=busy, rebind_s=0.0, orchestration_s=orchestration)
    out = {}
    base = simulate("sync", steps=steps, batch_size=bs, group_size=size, durations=durations, timing=timing).s_per_step
    for arm in arms:
        if arm in ("sync", "d0k0"):
            kind, d, k = "sync", 0, 0
        elif arm == "overlap":
            kind, d, k = "overlap", 0, 1
        else:
            m = DEEP_ARM.fullmatch(arm)
            kind, d, k = "group", int(m.group(1)), int(m.group(2))
        r = simulate(kind, steps=steps, batch_size=bs, group_size=size, durations=durations, timing=timing,
                     steps_ahead=d, max_staleness=k)
        out[arm] = r.s_per_step / base if base else 0.0
    return out


def summarize(rows: list[dict[str, Any]], setting: Setting, arms: list[str], steps: int) -> list[dict[str, Any]]:
    """One object per arm (its seeds pooled): the table's row and the ``--json`` entry."""
    sync = [r for r in rows if r["arm"] == "sync"]
    predicted = predicted_ratios(setting, arms, sync, steps)
    sync_s = statistics.fmean([r["s_per_step"] for r in sync if r.get("s_per_step")] or [float("nan")])
    sync_rewards = [r["mean_reward_last"] for r in sync if r.get("mean_reward_last") is not None]
    sync_evals = [r["final_eval"] for r in sync if r.get("final_eval") is not None]
    overlap = [r["s_per_step"] for r in rows if r["arm"] == "overlap" and r.get("s_per_step")]
    table = []
    for arm in arms:
        mine = [r for r in rows if r["arm"] == arm]
        walls = [w for r in mine for w in r.get("step_walls", [])]
        s = statistics.fmean([r["s_per_step"] for r in mine if r.get("s_per_step")] or [float("nan")])
        hist: dict[str, float] = {}
        for r in mine:
            for k, v in r.get("staleness_hist", {}).items():
                hist[k] = hist.get(k, 0.0) + v
        rewards = [r["mean_reward_last"] for r in mine if r.get("mean_reward_last") is not None]
        evals = [r["final_eval"] for r in mine if r.get("final_eval") is not None]
        table.append({
            "arm": arm, "config": setting.name, "seeds": len(mine),
            "s_per_step": s, "s_per_step_median": statistics.median(walls) if walls else None,
            "s_per_step_mean": statistics.fmean(walls) if walls else None,
            "ratio_to_sync": s / sync_s if sync_s else None,
            "ratio_to_overlap": s / statistics.fmean(overlap) if overlap else None,
            "predicted_ratio_to_sync": predicted.get(arm),
            "session_busy": _mean([r.get("session_busy") for r in mine]),
            "staleness_hist": {k: hist[k] for k in sorted(hist, key=int)},
            "max_staleness_seen": max((r.get("max_staleness_seen", 0) for r in mine), default=0),
            "past_k": sum(r.get("past_k", 0.0) for r in mine),
            "trainer_wait": _mean([r.get("trainer_wait") for r in mine]),
            "trainer_wait_stale": _mean([r.get("trainer_wait_stale") for r in mine]),
            "discarded": max((r.get("discarded", 0.0) for r in mine), default=0.0),
            "duration_trained_p90": _mean([r.get("duration_trained_p90") for r in mine]),
            "duration_complete_p90": _mean([r.get("duration_complete_p90") for r in mine]),
            "mean_reward_last": _mean(rewards), "reward_seeds": rewards,
            "reward_within_sync_spread": (min(sync_rewards) <= _mean(rewards) <= max(sync_rewards))
            if rewards and sync_rewards else None,
            "final_eval": _mean(evals), "final_eval_seeds": evals,
            "final_eval_within_sync_spread": (min(sync_evals) <= _mean(evals) <= max(sync_evals))
            if evals and sync_evals else None,
            "rollouts_per_step": _mean([r.get("rollouts_per_step") for r in mine]),
            "exit_codes": [r.get("exit_code") for r in mine],
        })
    return table


def _mean(values: list[Any]) -> float | None:
    xs = [float(v) for v in values if isinstance(v, (int, float))]
    return statistics.fmean(xs) if xs else None


def format_table(table: list[dict[str, Any]]) -> str:
    def f(v: Any, spec: str = ".1f") -> str:
        return "-" if v is None else format(v, spec)

    lines = [f"{'arm':<12} {'s/step':>7} {'median':>7} {'x sync':>7} {'model':>6} {'x ovl':>6} {'busy':>5} "
             f"{'stale max':>9} {'hist':<20} {'wait':>5} {'disc':>4} {'p90 tr/all':>11} {'reward':>7} {'seeds'}"]
    for r in table:
        hist = "/".join(f"{int(v)}" for v in r["staleness_hist"].values())
        spread = "" if r["reward_within_sync_spread"] is None else (" in" if r["reward_within_sync_spread"] else " out")
        lines.append(f"{r['arm']:<12} {f(r['s_per_step'])!s:>7} {f(r['s_per_step_median'])!s:>7} "
                     f"{f(r['ratio_to_sync'], '.2f')!s:>7} {f(r['predicted_ratio_to_sync'], '.2f')!s:>6} "
                     f"{f(r['ratio_to_overlap'], '.2f')!s:>6} {f(r['session_busy'] and 100 * r['session_busy'], '.0f')!s:>4}% "
                     f"{r['max_staleness_seen']:>9} {hist:<20} {f(r['trainer_wait'])!s:>5} {int(r['discarded']):>4} "
                     f"{f(r['duration_trained_p90'])!s:>5}/{f(r['duration_complete_p90'])!s:<5} "
                     f"{f(r['mean_reward_last'], '.3f')!s:>7}{spread} {r['seeds']}"
                     + ("" if r.get("final_eval") is None else
                        f"  final eval {r['final_eval']:.3f} ({', '.join(f'{x:.2f}' for x in r['final_eval_seeds'])})"
                        + ("" if r["final_eval_within_sync_spread"] is None else
                           " in" if r["final_eval_within_sync_spread"] else " out")))
    return "\n".join(lines)


def _known(arm: str) -> bool:
    try:
        arm_sets(arm)
        return True
    except KeyError:
        return False


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="one seed, fewer steps, the rollout config, 3 arms (<= 10 min)")
    p.add_argument("--arms", help=f"comma-separated, of {', '.join(ARMS)} (default: all; --quick: {','.join(QUICK_ARMS)})")
    p.add_argument("--configs", default="rollout,training", help="comma-separated, of rollout, training, learning")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--no-sync", action="store_true", help="do not add the sync arm (no ratio to sync is printed)")
    p.add_argument("--steps", type=int, help="steps per run (default: the config's; --quick: 4)")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    p.add_argument("--json", type=Path, help="also write the per-arm objects to this file")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    chosen = [a for a in (args.arms.split(",") if args.arms else QUICK_ARMS if args.quick else []) if a]
    unknown = [a for a in chosen if not _known(a)]
    if unknown:
        p.error(f"unknown arm(s) {unknown}; choose from {list(ARMS)} or any d{{d}}k{{k}}-ppo|cispo with d <= k")
    configs = ["rollout"] if args.quick else [c for c in args.configs.split(",") if c]
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",") if s]
    runs_dir = args.out / "async_depth"
    load_start, t0 = load_average(), time.monotonic()
    results: list[dict[str, Any]] = []
    tables: dict[str, list[dict[str, Any]]] = {}
    arms: list[str] = []
    for name in configs:
        setting = SETTINGS[name]
        arms = chosen or list(setting.arms or ARMS)
        if "sync" not in arms and not args.no_sync:
            arms = ["sync", *arms]  # every ratio is to sync in the same invocation
        steps = args.steps or (4 if args.quick else setting.steps)
        rows = [run_arm(arm, setting, seed, steps, runs_dir, args.timeout) for seed in seeds for arm in arms]
        table = summarize(rows, setting, arms, steps)
        tables[name] = table
        results.extend(rows)
        print(f"\nconfig {name}: sleeps {setting.turns} x lognormal(mean {setting.turn_seconds:g} s, log-sd "
              f"{setting.sigma:g}) per rollout, training latency {setting.train_latency:g} s, "
              f"{setting.batch_size} x {setting.responses_per_prompt} rollouts, {steps} steps, seeds {seeds}")
        print(format_table(table))
    print(f"\nload {load_start} -> {load_average()}; {time.monotonic() - t0:.0f} s")
    entries = [row for name in configs for row in tables[name]]
    path = write_result(args.out, "async_depth", {"quick": args.quick, "arms": chosen or "default", "configs": configs,
                                                  "seeds": seeds,
                                                  "load_average_start": load_start, "tables": tables, "runs": results})
    if args.json:
        args.json.write_text(json.dumps(entries, indent=2, default=str))
    print(f"wrote {path}" + (f" and {args.json}" if args.json else ""))
    return 0 if all(r.get("exit_code") == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
