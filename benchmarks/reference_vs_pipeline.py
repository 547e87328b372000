"""Per-step wall time and reward curve: the toolkit's reference GRPO loop vs ``stepwise run-local``.

Both run the same toy config (``examples/toy.json`` unless ``--config``), on this machine, against
the same SageMaker simulator (its own process, as ``run-local`` starts it) and the same ACR
emulator (``local/acr.py``), with the same agent logic (``local/agents/toy_task``):

* reference: ``agentcore_rl_toolkit.backends.experimental.sagemaker.train_grpo.train(config)``,
  unmodified; its SDK reaches the simulator through the simulator's environment, its
  ``AgentCoreHttpClient`` reaches the ACR emulator through ``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``,
  and the emulator serves ``benchmarks/ref_agent.py`` (the reference sends ``_config`` and reads
  the reward from the HTTP answer). Its in-process gateway listens on ``local_ip()``.
  Per-step wall time = time between its "=== Epoch e | Step s" log lines (the last step ends at
  its "Epoch ... complete" line); rewards from its "step=.. reward=.." lines.
* pipeline: ``local.run.run_local`` (the state machine in moto, handlers in-process, gateway and
  agent processes); per-step wall time = time between step summaries, as its progress bar shows,
  and ``timing.json``'s split.

Both loops run the pipeline at each ``--max-staleness`` (default ``0,1``: today's on-policy loop and
the overlapped steps, max_staleness 1) in the same invocation, side by side. ``--latency KIND=SECONDS``
(repeatable) is the simulator's own latency injection (``stepwise simulator --latency``), given
alike to the reference's and to the pipeline's simulator: ``--latency forward_backward=3 --latency
optim_step=2`` makes a step's training last about as long as a generation batch's rollouts, as a
20B LoRA's does on AWS, where the toy model trains in well under a second.

Usage: ``python -m benchmarks.reference_vs_pipeline --steps 8 [--which ref|pipeline|both]
[--max-staleness 0,1] [--latency forward_backward=3 --latency optim_step=2]``.
Prints a table (median s/step and the ratio to the reference) and writes
``runs-bench/reference_vs_pipeline.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import re
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, CpuMonitor, load_average, summary, write_result

REF_AGENT_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/ref_agent-bench"
#: RunConfig fields that the reference ``Config`` shares under the same name.
SHARED_FIELDS = ("region", "base_model_arn", "lora_rank", "lora_alpha", "max_rollout_time", "acr_tps_limit",
                 "batch_size", "responses_per_prompt", "learning_rate", "max_context_tokens", "max_new_tokens",
                 "temperature", "epochs", "loss", "max_prompts", "eval_every", "eval_max_prompts",
                 "eval_temperature", "save_every")


class _StepClock(logging.Handler):
    """Collects the reference loop's step starts, rewards and epoch ends from its log records."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.starts: list[float] = []
        self.rewards: list[float] = []
        self.rollout_s: list[float] = []  # step start -> "Training on N datums" (rollouts + advantages)
        self.end: float | None = None

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if msg.startswith("=== Epoch"):
            self.starts.append(record.created)
        elif msg.lstrip().startswith("Training on") and self.starts:
            self.rollout_s.append(record.created - self.starts[-1])
        elif m := re.match(r"\s*step=\d+\s+reward=([0-9.]+)", msg):
            self.rewards.append(float(m.group(1)))
        elif re.match(r"Epoch \d+ complete", msg):
            self.end = record.created

    def step_seconds(self) -> list[float]:
        marks = self.starts + ([self.end] if self.end is not None else [])
        return [b - a for a, b in zip(marks, marks[1:])]


def reference_config(cfg: dict[str, Any], *, steps: int, evals: bool) -> Any:
    """The toolkit ``Config`` equivalent to RunConfig ``cfg`` (``steps`` x batch_size prompts)."""
    from agentcore_rl_toolkit.backends.experimental.sagemaker.config import Config
    from local.datasets import resolve_dataset

    kw = {k: cfg[k] for k in SHARED_FIELDS if k in cfg}
    kw["max_prompts"] = steps * int(cfg["batch_size"])
    kw["dataset_path"] = str(resolve_dataset(cfg["dataset_path"], REPO_ROOT / "examples"))
    if evals and cfg.get("eval_dataset_path"):
        kw["eval_dataset_path"] = str(resolve_dataset(cfg["eval_dataset_path"], REPO_ROOT / "examples"))
    else:
        kw["eval_every"] = 0
    kw["save_every"] = -1 if not evals else kw.get("save_every", -1)
    account = str(cfg["role_arn"]).split(":")[4]
    return Config(role_arn=cfg["role_arn"],
                  model_package_group_arn=f"arn:aws:sagemaker:{kw['region']}:{account}:model-package-group/stepwise-local",
                  s3_output_path="s3://stepwise-simulator/output", agent_runtime_arn=REF_AGENT_ARN, **kw)


def cpu_per_step(cpu: CpuMonitor | None, marks: list[float]) -> dict[str, float]:
    """CPU seconds per step by process role between the first and the last of ``marks`` (step
    boundaries, ``time.time()``), divided by the steps between them; ``{}`` without a monitor."""
    if cpu is None or len(marks) < 2:
        return {}
    return {k: round(v / (len(marks) - 1), 2) for k, v in cpu.window(marks[0], marks[-1]).items()}


def run_reference(cfg: dict[str, Any], *, steps: int, out: Path, evals: bool = False,
                  latency: dict[str, float] | None = None, cpu: CpuMonitor | None = None) -> dict[str, Any]:
    """Run ``train_grpo.train`` (unmodified) against the simulator + ACR emulator; per-step figures.

    ``latency``: simulator latency per operation kind or API, seconds (``{"optim_step": 2.0}``).
    ``cpu``: a `CpuMonitor` of this process; the result's ``cpu_per_step`` is CPU seconds per step by process."""
    from agentcore_rl_toolkit.backends.experimental.sagemaker import train_grpo
    from local.acr import AcrEmulator
    from local.stack import SimulatorProcess

    saved = dict(os.environ)
    clock = _StepClock()
    logging.getLogger(train_grpo.__name__).setLevel(logging.INFO)
    logging.getLogger(train_grpo.__name__).addHandler(clock)
    region = str(cfg.get("region", "us-east-1"))
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", region)
    # The simulator in its own process, exactly as run-local starts it.
    sim = SimulatorProcess(region=region, options={"latency": latency} if latency else None)
    out.mkdir(parents=True, exist_ok=True)
    acr = AcrEmulator({REF_AGENT_ARN: "benchmarks.ref_agent:app"}, tps_limit=cfg.get("acr_tps_limit"),
                      log_dir=str(out))
    try:
        os.environ.update(sim.env)
        acr.agent_env = dict(sim.env)
        acr.start()
        os.environ.update(acr.env)
        config = reference_config(cfg, steps=steps, evals=evals)
        t0 = time.monotonic()
        asyncio.run(train_grpo.train(config))
        wall = time.monotonic() - t0
        counters = sim.counters
        acr_counters = {k: v for k, v in vars(acr.counters).items() if k != "by_session"}
    finally:
        logging.getLogger(train_grpo.__name__).removeHandler(clock)
        acr.stop()
        sim.stop()
        os.environ.clear()
        os.environ.update(saved)
    secs = clock.step_seconds()
    marks = clock.starts + ([clock.end] if clock.end is not None else [])
    return {"steps": len(secs), "step_seconds": secs, "rollout_seconds": clock.rollout_s, "rewards": clock.rewards,
            "wall_seconds": wall, "cpu_per_step": cpu_per_step(cpu, marks),
            "optim_steps": counters.get("optim_step"), "acr": acr_counters, "load_average": load_average()}


def parse_latency(specs: list[str]) -> dict[str, float]:
    """``["forward_backward=3", "optim_step=2"]`` -> ``{"forward_backward": 3.0, "optim_step": 2.0}``.

    Raises:
        ValueError: a spec is not ``KIND=SECONDS`` with a number >= 0, or names a kind twice.
    """
    out: dict[str, float] = {}
    for spec in specs:
        kind, sep, seconds = spec.partition("=")
        try:
            value = float(seconds)
        except ValueError:
            value = -1.0
        if not sep or not kind or not value >= 0:
            raise ValueError(f"--latency {spec!r}: expected KIND=SECONDS (seconds >= 0), e.g. optim_step=2")
        if kind in out:
            raise ValueError(f"--latency names {kind!r} twice")
        out[kind] = value
    return out


def run_pipeline(config_path: Path, *, steps: int, out: Path, evals: bool = False, max_staleness: int = 0,
                 latency: dict[str, float] | None = None, cpu: CpuMonitor | None = None) -> dict[str, Any]:
    """Run ``stepwise run-local`` for ``steps`` steps at ``max_staleness``; per-step figures from its run folder.

    ``latency``: as `run_reference`'s, given to the run's simulator; ``cpu`` as `run_reference`'s."""
    from local.run import run_local

    cfg = json.loads(config_path.read_text())
    # the reference loop has no baseline eval before training: compare like with like
    overrides: dict[str, Any] = {"max_prompts": steps * int(cfg["batch_size"]), "eval_before_train": False,
                                 "max_staleness": max_staleness}
    if not evals:
        overrides.update(eval_every=10_000, save_every=10_000)
    res = run_local(config_path, run_id=f"bench-pipeline-s{max_staleness}-{int(time.time())}", out_root=out,
                    progress=False, overrides=overrides, quiet=True,
                    simulator_options={"latency": latency} if latency else None)
    times = []
    session: dict[str, list[float]] = {"time/session_busy": [], "time/session_idle": []}
    for line in (res.run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "train":
            times.append(row["time"])
            for key, values in session.items():
                if isinstance(row.get(key), (int, float)):
                    values.append(float(row[key]))
    from datetime import datetime

    stamps = [datetime.fromisoformat(t).timestamp() for t in times]
    # The first step's start is not a summary: use the timing split's per-step wall for it.
    secs = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"status": res.status, "steps": res.steps, "step_seconds": secs, "rewards": res.rewards,
            "max_staleness": max_staleness, "wall_seconds": res.wall_seconds, "timing": res.timing,
            "cpu_per_step": cpu_per_step(cpu, stamps),
            "session_busy_seconds": session["time/session_busy"], "session_idle_seconds": session["time/session_idle"],
            "optim_steps": res.simulator_counters.get("optim_step"), "run_dir": str(res.run_dir),
            "s3_requests": res.timing.get("s3_requests"), "load_average": load_average()}


def loop_rows(result: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """``(label, run)`` of each loop in ``result``: the reference, then the pipeline per max_staleness."""
    rows = [("reference", result["reference"])] if result.get("reference") else []
    rows += [(f"pipeline s={r['max_staleness']}", r) for r in result.get("pipelines", [])]
    return rows


def table(result: dict[str, Any]) -> list[str]:
    """The printed table: per loop, steps, median and p90 s/step, ratio to the reference's median,
    the session's median idle s/step (pipeline; from the step summaries) and the rewards.
    Sets each run's ``step_summary`` and ``ratio_to_reference``."""
    lines = [f"{'loop':<13} {'steps':>5} {'median s':>9} {'p90 s':>7} {'x ref':>6} {'idle s':>7}  rewards"]
    ref = (result.get("reference") or {}).get("step_seconds")
    ref_median = summary(ref)["median"] if ref else None
    for label, r in loop_rows(result):
        if not r.get("step_seconds"):
            lines.append(f"{label:<13} {r.get('steps', 0):>5}  (no step times: {r.get('status', 'no steps')})")
            continue
        s = r["step_summary"] = summary(r["step_seconds"])
        ratio = r["ratio_to_reference"] = s["median"] / ref_median if ref_median else None
        idle = r.get("session_idle_seconds") or []
        ratio_text = f"{ratio:.2f}" if ratio else "-"
        idle_text = f"{summary(idle)['median']:.2f}" if idle else "-"
        rewards = " ".join(f"{x:.2f}" for x in r["rewards"])
        lines.append(f"{label:<13} {r['steps']:>5} {s['median']:>9.2f} {s['p90']:>7.2f} {ratio_text:>6} "
                     f"{idle_text:>7}  {rewards}  (load {r['load_average']})")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--which", choices=("ref", "pipeline", "both"), default="both")
    parser.add_argument("--max-staleness", default="0,1",
                        help="comma-separated max_staleness values the pipeline runs at, one run each (default 0,1)")
    parser.add_argument("--latency", action="append", default=[], metavar="KIND=SECONDS",
                        help="simulator latency of an operation kind (repeatable), given to both loops, "
                             "e.g. --latency forward_backward=3 --latency optim_step=2")
    parser.add_argument("--evals", action="store_true", help="keep the config's evals and checkpoints")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    try:
        latency = parse_latency(args.latency)
        stalenesses = [int(x) for x in args.max_staleness.split(",") if x.strip()]
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(args.config.read_text())
    result: dict[str, Any] = {"config": str(args.config), "steps_requested": args.steps, "latency": latency,
                              "load_average_start": load_average()}
    with CpuMonitor() as cpu:
        if args.which in ("ref", "both"):
            result["reference"] = run_reference(cfg, steps=args.steps, out=args.out, evals=args.evals,
                                                latency=latency, cpu=cpu)
        if args.which in ("pipeline", "both"):
            # one after the other (never at once): the machine is shared and the figures are wall times
            result["pipelines"] = [run_pipeline(args.config, steps=args.steps, out=args.out, evals=args.evals,
                                                max_staleness=m, latency=latency, cpu=cpu) for m in stalenesses]
    if latency:
        print("simulator latency: " + ", ".join(f"{k}={v:g}s" for k, v in latency.items()))
    for line in table(result):
        print(line)
    for label, r in loop_rows(result):
        if r.get("cpu_per_step"):
            print(f"{label} CPU s/step: " + " ".join(f"{k} {v:.2f}" for k, v in r["cpu_per_step"].items()))
    for r in result.get("pipelines", []):
        s3 = r.get("s3_requests") or {}
        if s3.get("per_rollout"):
            print(f"pipeline s={r['max_staleness']} S3 requests per rollout ({s3['rollouts']} rollouts): "
                  + " ".join(f"{op} {n}" for op, n in s3["per_rollout"].items()))
    print(f"written: {write_result(args.out, 'reference_vs_pipeline', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
