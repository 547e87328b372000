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

Usage: ``python -m benchmarks.reference_vs_pipeline --steps 8 [--which ref|pipeline|both]``.
Prints a table and writes ``runs-bench/reference_vs_pipeline.json``.
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

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, summary, write_result

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


def run_reference(cfg: dict[str, Any], *, steps: int, out: Path, evals: bool = False) -> dict[str, Any]:
    """Run ``train_grpo.train`` (unmodified) against the simulator + ACR emulator; per-step figures."""
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
    sim = SimulatorProcess(region=region)
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
    return {"steps": len(secs), "step_seconds": secs, "rollout_seconds": clock.rollout_s, "rewards": clock.rewards,
            "wall_seconds": wall,
            "optim_steps": counters.get("optim_step"), "acr": acr_counters, "load_average": load_average()}


def run_pipeline(config_path: Path, *, steps: int, out: Path, evals: bool = False) -> dict[str, Any]:
    """Run ``stepwise run-local`` for ``steps`` steps; per-step figures from its run folder."""
    from local.run import run_local

    cfg = json.loads(config_path.read_text())
    # the reference loop has no baseline eval before training: compare like with like
    overrides: dict[str, Any] = {"max_prompts": steps * int(cfg["batch_size"]), "eval_before_train": False}
    if not evals:
        overrides.update(eval_every=10_000, save_every=10_000)
    res = run_local(config_path, run_id=f"bench-pipeline-{int(time.time())}", out_root=out, progress=False,
                    overrides=overrides, quiet=True)
    times = []
    for line in (res.run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["kind"] == "train":
            times.append(row["time"])
    from datetime import datetime

    stamps = [datetime.fromisoformat(t).timestamp() for t in times]
    # The first step's start is not a summary: use the timing split's per-step wall for it.
    secs = [b - a for a, b in zip(stamps, stamps[1:])]
    return {"status": res.status, "steps": res.steps, "step_seconds": secs, "rewards": res.rewards,
            "wall_seconds": res.wall_seconds, "timing": res.timing,
            "optim_steps": res.simulator_counters.get("optim_step"), "run_dir": str(res.run_dir),
            "s3_requests": res.timing.get("s3_requests"), "load_average": load_average()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--which", choices=("ref", "pipeline", "both"), default="both")
    parser.add_argument("--evals", action="store_true", help="keep the config's evals and checkpoints")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    cfg = json.loads(args.config.read_text())
    result: dict[str, Any] = {"config": str(args.config), "steps_requested": args.steps,
                              "load_average_start": load_average()}
    if args.which in ("ref", "both"):
        result["reference"] = run_reference(cfg, steps=args.steps, out=args.out, evals=args.evals)
    if args.which in ("pipeline", "both"):
        result["pipeline"] = run_pipeline(args.config, steps=args.steps, out=args.out, evals=args.evals)
    print(f"{'loop':<10} {'steps':>5} {'median s':>9} {'p90 s':>7}  rewards")
    for name in ("reference", "pipeline"):
        r = result.get(name)
        if r and r["step_seconds"]:
            s = summary(r["step_seconds"])
            r["step_summary"] = s
            print(f"{name:<10} {r['steps']:>5} {s['median']:>9.2f} {s['p90']:>7.2f}  "
                  f"{' '.join(f'{x:.2f}' for x in r['rewards'])}  (load {r['load_average']})")
    if "step_summary" in result.get("reference", {}) and "step_summary" in result.get("pipeline", {}):
        ratio = result["pipeline"]["step_summary"]["median"] / result["reference"]["step_summary"]["median"]
        result["ratio_median"] = ratio
        print(f"pipeline / reference, median step: {ratio:.2f}x")
    s3 = (result.get("pipeline") or {}).get("s3_requests") or {}
    if s3.get("per_rollout"):
        print(f"pipeline S3 requests per rollout ({s3['rollouts']} rollouts): "
              + " ".join(f"{op} {n}" for op, n in s3["per_rollout"].items()))
        print("  by kind: " + ", ".join(f"{k} {n}" for k, n in s3["per_rollout_by_kind"].items()))
    print(f"written: {write_result(args.out, 'reference_vs_pipeline', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
