"""``stepwise run-local CONFIG.json``: a whole training run on this machine, same code as on AWS.

Starts, on free loopback ports: moto (S3, Step Functions with execution, Lambda whose
invocations run the real handlers in-process), the SageMaker Training Sessions simulator,
the rollout gateway (its own process, as in the Lambda) and the ACR emulator with the agent
the config's ``agent_runtime_arn`` names (``runtime/NAME-...`` -> ``local/agents/NAME.py``).
Then it creates the stack's resources (bucket + result notification, one function per
``stepwise.functions`` entry, the state machine from ``state_machine/`` with the stack's
substitutions), uploads the datasets, starts the execution (name = run id) and follows it
with a progress bar until it ends. On success, failure or Ctrl-C everything is stopped
(the training session too: moto's EventBridge does not deliver to Lambda, so on an
abnormal end the runner runs the Cleanup function itself, as the stack's rule would).

The run folder ``runs-local/{run_id}/`` gets the config, ``metrics.jsonl`` (one line per
step summary, eval summaries too), the step summaries, ``timing.json`` (wall time per
step split into rollouts, advantages, training, eval/checkpoint, orchestration) and
``reward.png``. Exit code 0 when the execution succeeded, 1 otherwise (the failing state
and cause are printed), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import math
import os
import shutil
import signal
import sys
import threading
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from local._proc import restore_env, stop_process
from local.workers import WorkerPool, workers_from_env
from stepwise.clients import ENV_MAX_POOL_CONNECTIONS
from stepwise_cli.commands.watch import eval_when, kept_groups

log = logging.getLogger("stepwise.run_local")

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = Path("runs-local")
LOCAL_ROLE_ARN = "arn:aws:iam::123456789012:role/stepwise-local-sagemaker"
TERMINAL = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")


# --------------------------------------------------------------------------------------
# Datasets: generation hooks and upload
# --------------------------------------------------------------------------------------


def _shared_data_dir() -> Path:
    """``shared/`` beside the clone (CI) or the team's copy on this machine."""
    for candidate in (REPO_ROOT.parent / "shared", Path("/work/shared")):
        if (candidate / "data").is_dir():
            return candidate / "data"
    raise FileNotFoundError("no shared/data directory beside the clone (../shared/data) or at /work/shared/data")


def _gen_toy(rows: int, seed: int) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_toy import write_rows

        write_rows(path, rows, seed)

    return gen


def _gen_gsm8k(split: str) -> Callable[[Path], None]:
    def gen(path: Path) -> None:
        from prepare_datasets.prepare_gsm8k import gsm8k_rows, write_rows

        write_rows(gsm8k_rows(_shared_data_dir() / "gsm8k" / f"{split}.jsonl"), path)

    return gen


#: Dataset file name -> how to make it when the config names it and it does not exist yet.
DATASET_GENERATORS: dict[str, Callable[[Path], None]] = {
    "toy_train.jsonl": _gen_toy(rows=200, seed=0),
    "toy_eval.jsonl": _gen_toy(rows=10, seed=1),
    "toy_small.jsonl": _gen_toy(rows=40, seed=2),
    "gsm8k_test.jsonl": _gen_gsm8k("test"),
    "gsm8k_train.jsonl": _gen_gsm8k("train"),
}


def resolve_dataset(path_str: str, config_dir: Path) -> Path:
    """A local dataset path (relative to the repo, then the config's folder); generated if a
    known generator makes it. Raises FileNotFoundError naming what was tried."""
    path = Path(path_str)
    candidates = [path] if path.is_absolute() else [REPO_ROOT / path, config_dir / path, Path.cwd() / path]
    for c in candidates:
        if c.is_file():
            return c
    gen = DATASET_GENERATORS.get(path.name)
    if gen is None:
        raise FileNotFoundError(f"dataset {path_str!r} not found (tried {[str(c) for c in candidates]}) and no "
                                f"generator for {path.name!r}; known: {sorted(DATASET_GENERATORS)}")
    target = candidates[0]
    target.parent.mkdir(parents=True, exist_ok=True)
    gen(target)
    return target


def upload_datasets(cfg: dict[str, Any], *, s3: Any, bucket: str, run_id: str, config_dir: Path) -> dict[str, Any]:
    """Copy local dataset files to ``s3://bucket/datasets/{run_id}/`` and point the config at
    them (as a user does before starting an execution on AWS). ``s3://`` paths are kept."""
    out = dict(cfg)
    for key in ("dataset_path", "eval_dataset_path"):
        value = out.get(key)
        if not value or str(value).startswith("s3://"):
            continue
        local = resolve_dataset(str(value), config_dir)
        s3_key = f"datasets/{run_id}/{local.name}"
        s3.upload_file(str(local), bucket, s3_key)
        out[key] = f"s3://{bucket}/{s3_key}"
    return out


# --------------------------------------------------------------------------------------
# The stack
# --------------------------------------------------------------------------------------


class SimulatorProcess:
    """The simulator in its own process (``stepwise simulator --port 0``), so the tiny model's
    torch work runs beside, not inside, the process that hosts moto and the handlers.

    Same surface as ``local.simulator.SimulatorHandle`` where the runner needs it: ``url``,
    ``env``, ``counters`` and ``session_statuses`` (read from ``/_simulator/state``), ``stop()``.
    """

    def __init__(self, *, region: str, log_path: Path | None = None, options: dict[str, Any] | None = None,
                 timeout: float = 120.0):
        import re
        import subprocess

        args = [sys.executable, "-m", "stepwise_cli", "simulator", "--port", "0",
                "--region", region]
        for key, value in (options or {}).items():
            flag = f"--{key.replace('_', '-')}"
            if value is True:
                args.append(flag)
            elif value is not False and value is not None:
                args += [flag, str(value)]
        self._log = log_path.open("a") if log_path else None
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=str(REPO_ROOT))
        self.url = ""
        self.env: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"simulator exited (code {self.proc.poll()}) before serving")
            m = re.search(r"simulator on (http://\S+)", line)
            if m:
                self.url = m.group(1)
            m = re.match(r"export (\w+)=(\S+)", line.strip())
            if m:
                self.env[m.group(1)] = m.group(2).strip("'\"")
            if "Ctrl-C" in line:
                break
        if not self.url:
            self.stop()
            raise RuntimeError("simulator did not report its URL")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION"):
            self.env.pop(key, None)  # credentials and region stay the runner's

    def state(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/_simulator/state", timeout=10) as resp:
            return json.loads(resp.read())

    @property
    def counters(self) -> dict[str, Any]:
        return dict(self.state().get("counters", {}))

    def stop(self) -> None:
        stop_process(self.proc, self._log, timeout=15)


@dataclass
class LocalStack:
    """Every local service of one run; ``stop()`` ends them all (idempotent)."""

    bucket: str
    moto: Any = None
    simulator: Any = None
    gateway: Any = None
    acr: Any = None
    resources: Any = None
    simulator_in_process: bool = False
    _saved_env: dict[str, str | None] = field(default_factory=dict)

    def set_env(self, env: dict[str, str]) -> None:
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def start(self, *, tps_limit: float | None, simulator_options: dict[str, Any] | None = None,
              acr_faults: dict[str, int] | None = None, log_dir: Path | None = None) -> "LocalStack":
        from local import engine
        from local.acr import AcrEmulator, Faults
        from local.gateway import GatewayProcess
        from local.simulator import start_simulator

        # Every handler of the Map runs in this process on shared clients: size their pools (and the
        # gateway's, which inherits this environment) to the concurrency the run will drive.
        self.set_env({ENV_MAX_POOL_CONNECTIONS: os.environ.get(ENV_MAX_POOL_CONNECTIONS) or
                      str(local_pool_size(tps_limit))})
        self.moto = engine.MotoServer().start()
        if n_workers := workers_from_env():
            # the handlers off moto's GIL (local/workers.py), importing while the other services start;
            # their output goes where quiet mode sends the handlers' (every invocation carries the env)
            self.moto.dispatcher.workers = WorkerPool(n_workers, log_path=str(log_dir / "lambdas.log") if log_dir else None)
        if self.simulator_in_process:
            self.simulator = start_simulator(port=0, **(simulator_options or {}))
        else:
            self.simulator = SimulatorProcess(region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                                              log_path=log_dir / "simulator.log" if log_dir else None,
                                              options=simulator_options)
        self.set_env(dict(self.simulator.env))
        self.set_env({"STEPWISE_BUCKET": self.bucket})
        # Loopback gateway: a streamed turn lands within ms of [DONE]; the 1 s default grace sat on
        # every rollout's critical path (FinishRollout sleeps it). A value set by the user wins.
        self.set_env({"STEPWISE_TURN_GRACE_SECONDS": os.environ.get("STEPWISE_TURN_GRACE_SECONDS", "0.2")})
        engine.create_bucket(self.moto, self.bucket, result_function_arn=None)
        self.gateway = GatewayProcess(dict(os.environ), log_path=str(log_dir / "gateway.log") if log_dir else None)
        self.set_env({"STEPWISE_GATEWAY_URL": self.gateway.url})
        # ACR scoped as the stack's IAM grant scopes it: the stack's region, or its allow-list.
        from stepwise.preflight import StackScope

        allowed = StackScope.from_env().agent_runtime_arns  # STEPWISE_AGENT_RUNTIME_ARNS, read as Init reads it
        self.acr = AcrEmulator(tps_limit=tps_limit, faults=Faults(**(acr_faults or {})),
                               agent_env=engine.endpoint_env(self.moto.endpoint),
                               log_dir=str(log_dir) if log_dir else None, region=engine.REGION,
                               allowed_runtime_arns=allowed).start()
        self.set_env(self.acr.env)
        if self.moto.dispatcher.workers is not None:
            self.moto.dispatcher.workers.wait()
        self.resources = create_resources(self.moto, self.bucket)
        return self

    def stop(self) -> None:
        for name in ("acr", "gateway"):
            part = getattr(self, name)
            if part is not None:
                try:
                    part.stop()
                except Exception:  # keep stopping the rest
                    log.exception("stopping %s", name)
                setattr(self, name, None)
        if self.moto is not None:
            self.moto.dispatcher.drain(timeout=10)
            if self.moto.dispatcher.workers is not None:
                self.moto.dispatcher.workers.stop()
                self.moto.dispatcher.workers = None
        if self.simulator is not None:
            try:
                self.simulator.stop()
            except Exception:
                log.exception("stopping the simulator")
            self.simulator = None
        if self.moto is not None:
            self.moto.stop()
            self.moto = None
        restore_env(self._saved_env)


def local_pool_size(tps_limit: float | None) -> int:
    """Connections per client and host for the local stack: two per rollout the Map may run at
    once (PlanStep's bound: ``acr_tps_limit`` x CONCURRENCY_PER_TPS, at most MAX_MAP_CONCURRENCY;
    StartRollout's or FinishRollout's call plus OnRolloutResult's), plus the parent's tasks."""
    from stepwise.handlers.plan import CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY

    concurrency = MAX_MAP_CONCURRENCY if not tps_limit else min(MAX_MAP_CONCURRENCY,
                                                                  math.ceil(tps_limit * CONCURRENCY_PER_TPS))
    return 2 * concurrency + 16


def local_substitutions(function_arns: dict[str, str], bucket: str) -> dict[str, str]:
    """The state machine's substitutions, computed exactly as the stack computes them."""
    from infra.definition import substitutions

    return substitutions(function_arns=function_arns, bucket_name=bucket)


def create_resources(moto: Any, bucket: str, *, state_machine_name: str = "stepwise-training-loop") -> Any:
    """Functions, bucket notification and state machine, as the stack creates them."""
    from local import engine
    from state_machine.definition import render_definition

    arns = engine.create_functions(moto)
    engine.create_bucket(moto, bucket, result_function_arn=arns["OnRolloutResult"])
    definition = render_definition(local_substitutions(arns, bucket))
    sm_arn = engine.create_state_machine(moto, state_machine_name, definition)
    return engine.LocalResources(bucket=bucket, state_machine_arn=sm_arn, function_arns=arns, definition=definition)


# --------------------------------------------------------------------------------------
# Following the execution
# --------------------------------------------------------------------------------------


def _metric(summary: dict[str, Any], *names: str, contains: str | None = None) -> float | None:
    flat = _flatten(summary)
    for n in names:
        if isinstance(flat.get(n), (int, float)):
            return float(flat[n])
    if contains:
        for k, v in flat.items():
            if contains in k and isinstance(v, (int, float)) and not isinstance(v, bool):
                return float(v)
    return None


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def mean_reward(summary: dict[str, Any]) -> float | None:
    return _metric(summary, "sampler/mean_reward", "reward/mean", "mean_reward", contains="mean_reward")


def eval_accuracy(summary: dict[str, Any]) -> float | None:
    return _metric(summary, "eval/accuracy", "accuracy", contains="accuracy")


@dataclass
class Failure:
    """Where an execution failed: the state whose error started it, and the final error."""

    state: str | None
    error: str | None
    cause: str | None


def failure_from_history(events: list[dict[str, Any]]) -> Failure:
    """The first failing task/map state (and its error and cause) from an execution history,
    falling back to the ExecutionFailed/Aborted/TimedOut event."""
    current: str | None = None
    for ev in events:
        etype = ev["type"]
        if etype.endswith("StateEntered"):
            current = ev["stateEnteredEventDetails"]["name"]
        details_key = next((k for k in ev if k.endswith("EventDetails") and k != "stateEnteredEventDetails"), None)
        if etype in ("TaskFailed", "LambdaFunctionFailed", "TaskTimedOut", "MapRunFailed", "LambdaFunctionTimedOut",
                     "ExecutionFailed", "ExecutionTimedOut", "ExecutionAborted", "MapStateFailed"):
            det = ev.get(details_key, {}) if details_key else {}
            return Failure(current, det.get("error") or etype, det.get("cause"))
    return Failure(current, None, None)


@dataclass
class RunResult:
    """What ``run_local`` reports."""

    run_id: str
    status: str
    run_dir: Path
    wall_seconds: float
    steps: int
    rewards: list[float]
    evals: list[dict[str, Any]]
    failure: Failure | None
    timing: dict[str, Any]
    simulator_counters: dict[str, Any]
    session_status: str | None
    executions: list[str]


class Follower:
    """Polls the run's executions and S3 summaries; writes ``metrics.jsonl`` as they appear."""

    def __init__(self, stack: LocalStack, run_id: str, run_dir: Path, total_steps: int | None, progress: bool,
                 responses_per_prompt: int | None = None):
        self.stack = stack
        self.responses_per_prompt = responses_per_prompt
        self.run_id = run_id
        self.run_dir = run_dir
        self.sfn = stack.moto.client("stepfunctions")
        self.s3 = stack.moto.client("s3")
        self.seen: set[str] = set()
        self.summaries: dict[int, dict[str, Any]] = {}
        self.evals: dict[int, dict[str, Any]] = {}
        self.executions: list[str] = []
        self._last_step_t = time.monotonic()
        self._step_seconds: list[float] = []
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, unit="step", desc=run_id, dynamic_ncols=True)

    def _new_summaries(self, *, full: bool = False) -> None:
        """Record summaries that appeared since the last call. While the run goes on, the next
        train step's summary is probed with one GET: listing ``steps/`` returned every rollout
        record and datum chunk of the run, so each poll cost moto and this process more as the
        run grew. ``full`` lists both prefixes (at the end, nothing can be missed)."""
        prefix = f"runs/{self.run_id}/"
        if not full:
            self._probe_steps(prefix)
        for kind in ("steps", "evals") if full else ("evals",):
            paginator = self.s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.stack.bucket, Prefix=f"{prefix}{kind}/"):
                for obj in page.get("Contents", []):
                    key = obj["Key"]
                    if not key.endswith("/summary.json") or key in self.seen:
                        continue
                    try:
                        step = int(key[len(prefix) + len(kind) + 1:].split("/")[0])
                    except ValueError:
                        continue
                    body = json.loads(self.s3.get_object(Bucket=self.stack.bucket, Key=key)["Body"].read())
                    self.seen.add(key)
                    self._record(kind, step, body)

    def _probe_steps(self, prefix: str) -> None:
        while True:
            step = max(self.summaries, default=-1) + 1
            key = f"{prefix}steps/{step}/summary.json"
            try:
                body = json.loads(self.s3.get_object(Bucket=self.stack.bucket, Key=key)["Body"].read())
            except self.s3.exceptions.NoSuchKey:
                return
            self.seen.add(key)
            self._record("steps", step, body)

    def _record(self, kind: str, step: int, summary: dict[str, Any]) -> None:
        line = {"kind": "train" if kind == "steps" else "eval", "step": step,
                "time": datetime.now(timezone.utc).isoformat(), **_flatten(summary)}
        with (self.run_dir / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")
        target = self.run_dir / kind / str(step)
        target.mkdir(parents=True, exist_ok=True)
        (target / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if kind == "evals":
            self.evals[step] = summary
            if self.bar is not None:
                acc = eval_accuracy(summary)
                self.bar.write(f"{eval_when(step)}: accuracy {acc if acc is None else round(acc, 3)}")
            return
        self.summaries[step] = summary
        now = time.monotonic()
        self._step_seconds.append(now - self._last_step_t)
        self._last_step_t = now
        if self.bar is not None:
            reward = mean_reward(summary)
            kept = kept_groups(summary, {"responses_per_prompt": self.responses_per_prompt})
            self.bar.set_postfix(step=step, reward=None if reward is None else f"{reward:.3f}",
                                 kept=None if kept is None else int(kept), s_per_step=f"{self._step_seconds[-1]:.1f}")
            self.bar.update(1)

    def current_execution(self) -> dict[str, Any] | None:
        """The run's newest execution (continue-as-new starts more of them)."""
        arn = self.stack.resources.state_machine_arn
        runs = [e for e in self.sfn.list_executions(stateMachineArn=arn)["executions"]
                if e["name"] == self.run_id or e["name"].startswith(f"{self.run_id}-")]
        runs.sort(key=lambda e: e["startDate"])
        for e in runs:
            if e["executionArn"] not in self.executions:
                self.executions.append(e["executionArn"])
        return runs[-1] if runs else None

    def poll(self) -> dict[str, Any] | None:
        """One poll; returns the newest execution's description once it has ended."""
        self._new_summaries()
        newest = self.current_execution()
        if newest is None:
            return None
        desc = self.sfn.describe_execution(executionArn=newest["executionArn"])
        if desc["status"] == "RUNNING":
            return None
        time.sleep(0.5)  # a continue-as-new successor may be starting right now
        if self.current_execution()["executionArn"] != newest["executionArn"]:
            return None
        self._new_summaries(full=True)
        return desc

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# --------------------------------------------------------------------------------------
# Timing split and plot
# --------------------------------------------------------------------------------------

_TRAIN_STATES = ("Submit training step", "Wait for training step", "Check training step", "Training step done?",
                 "Rebind sampler to new weights", "Sampler rebound?", "Wait for sampler")
_EVAL_CKPT_STATES = ("Record eval accuracy", "Save checkpoint", "Checkpoint saved?", "Wait for checkpoint")


def timing_split(events: list[dict[str, Any]], steps: int) -> dict[str, Any]:
    """Seconds per category from one execution history (state entered -> next state entered).

    Categories: rollouts (the train Map), eval_rollouts (Maps followed by eval bookkeeping),
    advantages, training (submit/poll/rebind), eval_checkpoint, orchestration (planning,
    choices, session start and everything else). ``per_step`` divides by ``steps``.
    """
    spans: list[tuple[str, float]] = []
    entered: list[tuple[str, datetime]] = [
        (ev["stateEnteredEventDetails"]["name"], ev["timestamp"]) for ev in events if ev["type"].endswith("StateEntered")
    ]
    end = events[-1]["timestamp"] if events else None
    for i, (name, t0) in enumerate(entered):
        t1 = entered[i + 1][1] if i + 1 < len(entered) else end
        spans.append((name, (t1 - t0).total_seconds()))
    out = {"rollouts": 0.0, "eval_rollouts": 0.0, "advantages": 0.0, "training": 0.0, "eval_checkpoint": 0.0,
           "orchestration": 0.0, "session_start": 0.0}
    for i, (name, secs) in enumerate(spans):
        if name == "Roll out generation batch":
            following = next((n for n, _ in spans[i + 1:] if not n.endswith("?")), "")
            out["eval_rollouts" if following == "Record eval accuracy" else "rollouts"] += secs
        elif name == "Compute advantages and filter groups":
            out["advantages"] += secs
        elif name in _TRAIN_STATES:
            out["training"] += secs
        elif name in _EVAL_CKPT_STATES:
            out["eval_checkpoint"] += secs
        elif name in ("Initialize run", "Is the training session ready?", "Wait for training session",
                      "Check training session"):
            out["session_start"] += secs
        else:
            out["orchestration"] += secs
    total = sum(out.values())
    result: dict[str, Any] = {"total_seconds": round(total, 3), "steps": steps,
                              "seconds": {k: round(v, 3) for k, v in out.items()}}
    if steps:
        train_keys = ("rollouts", "advantages", "training", "orchestration")
        result["per_step"] = {k: round(out[k] / steps, 3) for k in train_keys}
        result["per_step"]["wall"] = round(sum(out[k] for k in train_keys) / steps, 3)
    return result


def lambda_stats(invocations: list[Any]) -> dict[str, dict[str, float]]:
    """Per function: invocation count, errors, total and mean seconds (in-process handler time), and
    the largest memory growth one invocation was measured at (``peak_mb``, `local.limits`)."""
    out: dict[str, dict[str, float]] = {}
    for inv in invocations:
        name = inv.function_name.rsplit("-", 1)[-1]
        st = out.setdefault(name, {"count": 0, "errors": 0, "seconds": 0.0, "peak_mb": 0.0})
        st["count"] += 1
        st["errors"] += 1 if inv.error else 0
        st["seconds"] += inv.seconds
        st["peak_mb"] = round(max(st["peak_mb"], getattr(inv, "peak_mb", 0.0)), 1)
    for st in out.values():
        st["mean_seconds"] = round(st["seconds"] / st["count"], 4)
        st["seconds"] = round(st["seconds"], 3)
    return out


def s3_requests_per_rollout(counts: dict[str, int], rollouts: int) -> dict[str, Any]:
    """The run's S3 requests (``{"OP kind": n}`` from `local.engine.S3RequestLog`) with totals per
    operation and, when ``rollouts`` > 0, per rollout (every request of the run divided by the
    rollouts it ran: Init's and the steps' own requests are a few percent of it)."""
    by_op: dict[str, int] = {}
    for name, n in counts.items():
        op = name.split(" ", 1)[0]
        by_op[op] = by_op.get(op, 0) + n
    out: dict[str, Any] = {"rollouts": rollouts, "total": sum(counts.values()), "by_operation": by_op,
                           "by_kind": counts}
    if rollouts:
        out["per_rollout"] = {op: round(n / rollouts, 2) for op, n in sorted(by_op.items())}
        out["per_rollout"]["total"] = round(out["total"] / rollouts, 2)
        out["per_rollout_by_kind"] = {k: round(n / rollouts, 2) for k, n in counts.items()}
    return out


def plot(run_dir: Path, rewards: list[tuple[int, float]], evals: list[tuple[int, float]],
         steps: dict[int, dict[str, Any]] | None = None) -> Path | None:
    """``reward.png``: mean training reward per step and eval accuracy (the baseline at step 0
    included), and a second panel of the behaviour metrics of the step summaries
    (`stepwise_cli.commands.watch.write_plot`, the plot `stepwise watch --plot` draws)."""
    if not rewards and not evals:
        return None
    from stepwise_cli.commands.watch import behaviour_curves, write_plot

    return write_plot(run_dir / "reward.png", rewards, evals, run_dir.name, behaviour_curves(steps or {}))


def _history(sfn: Any, arn: str) -> list[dict[str, Any]]:
    events, token = [], None
    while True:
        kw = {"executionArn": arn, "maxResults": 1000}
        if token:
            kw["nextToken"] = token
        page = sfn.get_execution_history(**kw)
        events.extend(page["events"])
        token = page.get("nextToken")
        if not token:
            return events


def _cleanup(stack: LocalStack, execution: dict[str, Any]) -> None:
    """What the stack's EventBridge rule does on an abnormal end: run Cleanup with the event."""
    event = {
        "version": "0", "id": str(uuid.uuid4()), "source": "aws.states",
        "detail-type": "Step Functions Execution Status Change",
        "account": "123456789012", "region": os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
        "time": datetime.now(timezone.utc).isoformat(), "resources": [execution["executionArn"]],
        "detail": {"executionArn": execution["executionArn"], "stateMachineArn": execution.get("stateMachineArn"),
                   "name": execution.get("name"), "status": execution["status"],
                   "input": execution.get("input"), "output": None},
    }
    lam = stack.moto.client("lambda")
    resp = lam.invoke(FunctionName=stack.resources.function_arns["Cleanup"], Payload=json.dumps(event).encode())
    if resp.get("FunctionError"):
        log.error("Cleanup failed: %s", resp["Payload"].read()[:2000])


def simulator_sessions(simulator: Any) -> dict[str, str]:
    """Session name -> status, from the simulator (in-process handle or process)."""
    if hasattr(simulator, "state"):
        return dict(simulator.state().get("sessions", {}))
    return dict(simulator.simulator.session_statuses())


def _session_status(stack: LocalStack, run_id: str) -> str | None:
    """The run's training session status (name from state.json, status from the simulator)."""
    try:
        s3 = stack.moto.client("s3")
        state = json.loads(s3.get_object(Bucket=stack.bucket, Key=f"runs/{run_id}/state.json")["Body"].read())
        return simulator_sessions(stack.simulator).get(state["training_session_name"])
    except Exception as exc:
        log.warning("could not read the training session status: %s", exc)
        return None


def load_local_config(path: Path) -> dict[str, Any]:
    """Read the JSON or YAML config (RunConfig fields; validated by Init like on AWS, and here first).

    Reference fields that cannot apply serverless are dropped, with a warning on stderr each.
    """
    from stepwise.config import drop_unsupported, load_run_config, read_config_file

    warnings: list[str] = []
    load_run_config(path, warnings=warnings)  # every problem at once, before anything starts
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    return drop_unsupported(read_config_file(path))[0]


def run_local(config_path: Path, *, run_id: str | None = None, out_root: Path = DEFAULT_OUT, progress: bool = True,
              simulator_options: dict[str, Any] | None = None, acr_faults: dict[str, int] | None = None,
              timeout: float | None = None, overrides: dict[str, Any] | None = None,
              mirror_s3: bool = False, quiet: bool = False) -> RunResult:
    """Run one training run through the local stack; see the module docstring.

    ``mirror_s3`` copies every object under ``runs/{run_id}/`` (and the run's rollout
    results) into ``{run_dir}/s3/`` before moto stops, for inspection and tests.
    ``quiet`` sends the handlers' output (Powertools logs, EMF lines) to
    ``{run_dir}/logs/lambdas.log``; the gateway and agents always log under ``logs/``.

    Raises:
        stepwise.config.ConfigError: the config is invalid (nothing was started).
        KeyboardInterrupt: after stopping everything, when interrupted.
    """
    from stepwise.config import load_run_config

    t_start = time.monotonic()
    config_path = Path(config_path)
    cfg = {**load_local_config(config_path), **(overrides or {})}
    config = load_run_config(cfg)
    run_id = run_id or f"{config_path.stem}-{datetime.now(timezone.utc).strftime('%Y%m%d-%H%M%S')}"
    run_dir = Path(out_root) / run_id
    if run_dir.exists():
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps(cfg, indent=2))

    log_dir = run_dir / "logs"
    log_dir.mkdir()
    bucket = f"stepwise-local-{uuid.uuid4().hex[:12]}"
    stack = LocalStack(bucket=bucket)
    follower: Follower | None = None
    desc: dict[str, Any] | None = None
    interrupted = False
    with contextlib.ExitStack() as outputs:
        if quiet:
            lambda_log = outputs.enter_context((log_dir / "lambdas.log").open("a"))
            stream = outputs.enter_context(_SwitchableStream.into(lambda_log))
            outputs.enter_context(contextlib.redirect_stdout(stream))
        result, interrupted = _run(stack, config, cfg, config_path, run_id, run_dir, log_dir, simulator_options,
                                   acr_faults, timeout, progress, mirror_s3, t_start)
    if interrupted:
        raise KeyboardInterrupt
    return result


class _SwitchableStream(io.TextIOBase):
    """stdout for the run: writes go to ``target`` until the run ends, then to the real stdout
    (loggers created during the run keep a reference to this object, not to the closed file)."""

    def __init__(self, target: Any):
        self.target = target

    def write(self, s: str) -> int:
        try:
            return self.target.write(s)
        except ValueError:
            return sys.__stdout__.write(s)

    def flush(self) -> None:
        try:
            self.target.flush()
        except ValueError:
            pass

    @classmethod
    @contextlib.contextmanager
    def into(cls, target: Any):
        stream = cls(target)
        try:
            yield stream
        finally:
            stream.target = sys.__stdout__


def _run(stack: LocalStack, config: Any, cfg: dict[str, Any], config_path: Path, run_id: str, run_dir: Path,
         log_dir: Path, simulator_options: dict[str, Any] | None, acr_faults: dict[str, int] | None,
         timeout: float | None, progress: bool, mirror_s3: bool, t_start: float) -> tuple[RunResult, bool]:
    bucket = stack.bucket
    follower: Follower | None = None
    desc: dict[str, Any] | None = None
    interrupted = False
    try:
        stack.start(tps_limit=config.acr_tps_limit, simulator_options=simulator_options, acr_faults=acr_faults,
                    log_dir=log_dir)
        s3 = stack.moto.client("s3")
        run_cfg = upload_datasets(cfg, s3=s3, bucket=bucket, run_id=run_id, config_dir=config_path.parent)
        if not run_cfg.get("s3_output_path"):
            # the SDK's default (sagemaker-{region}-{account}) asks STS on a hard-wired endpoint
            run_cfg["s3_output_path"] = f"s3://{bucket}/checkpoints/{run_id}/"
        (run_dir / "config.json").write_text(json.dumps(run_cfg, indent=2))
        sfn = stack.moto.client("stepfunctions")
        sfn.start_execution(stateMachineArn=stack.resources.state_machine_arn, name=run_id, input=json.dumps(run_cfg))
        total = _total_steps(config, s3, bucket, run_cfg)
        follower = Follower(stack, run_id, run_dir, total, progress, responses_per_prompt=config.responses_per_prompt)
        deadline = None if timeout is None else time.monotonic() + timeout
        while desc is None:
            if deadline is not None and time.monotonic() > deadline:
                newest = follower.current_execution()
                desc = stop_execution(sfn, newest["executionArn"], error="States.Timeout",
                                      cause=f"run-local timeout of {timeout:.0f}s")
                break
            time.sleep(0.5)
            desc = follower.poll()
    except KeyboardInterrupt:
        interrupted = True
        if follower is not None and stack.moto is not None:
            newest = follower.current_execution()
            if newest is not None:
                desc = stop_execution(stack.moto.client("stepfunctions"), newest["executionArn"],
                                      error="Interrupted", cause="Ctrl-C in run-local")
    finally:
        result = _finish(stack, follower, desc, run_id, run_dir, t_start, mirror_s3)
        stack.stop()
        if follower is not None:
            follower.close()
    return result, interrupted


def stop_execution(sfn: Any, arn: str, *, error: str, cause: str, wait: float = 15.0) -> dict[str, Any]:
    """StopExecution, then wait until moto's worker reports it ended; the description it ends with
    (status forced to ABORTED if the worker is still winding down, as the API reports at once)."""
    sfn.stop_execution(executionArn=arn, error=error, cause=cause)
    deadline = time.monotonic() + wait
    desc = sfn.describe_execution(executionArn=arn)
    while desc["status"] == "RUNNING" and time.monotonic() < deadline:
        time.sleep(0.2)
        desc = sfn.describe_execution(executionArn=arn)
    if desc["status"] == "RUNNING":
        desc = {**desc, "status": "ABORTED", "error": error, "cause": cause}
    return desc


def _total_steps(config: Any, s3: Any, bucket: str, run_cfg: dict[str, Any]) -> int | None:
    try:
        from stepwise.datasets import load_payloads

        rows = len(load_payloads(run_cfg["dataset_path"], s3_client=s3))
        return config.steps_per_epoch(rows) * config.epochs
    except Exception:
        return None


def mirror_run_objects(s3: Any, bucket: str, run_id: str, target: Path) -> int:
    """Copy ``runs/{run_id}/`` and ``rollout-results/{run_id}/`` to ``target``; returns the object count."""
    count = 0
    paginator = s3.get_paginator("list_objects_v2")
    for prefix in (f"runs/{run_id}/", f"rollout-results/{run_id}/"):
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix):
            for obj in page.get("Contents", []):
                path = target / obj["Key"]
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(s3.get_object(Bucket=bucket, Key=obj["Key"])["Body"].read())
                count += 1
    return count


def _finish(stack: LocalStack, follower: Follower | None, desc: dict[str, Any] | None, run_id: str, run_dir: Path,
            t_start: float, mirror_s3: bool = False) -> RunResult:
    """After the execution ends (or on any error): cleanup on abnormal ends, collect, write the run folder."""
    status = desc["status"] if desc else "NOT_STARTED"
    failure = None
    timing: dict[str, Any] = {}
    session_status = None
    counters: dict[str, Any] = {}
    if stack.moto is not None and stack.resources is not None and follower is not None:
        sfn = stack.moto.client("stepfunctions")
        if desc is not None and status in ("FAILED", "TIMED_OUT", "ABORTED"):
            try:
                _cleanup(stack, desc)
            except Exception:
                log.exception("Cleanup")
        stack.moto.dispatcher.drain(timeout=10)
        try:
            follower._new_summaries(full=True)
        except Exception:
            log.exception("reading summaries")
        histories = [(_arn, _history(sfn, _arn)) for _arn in follower.executions]
        all_events = [ev for _, h in histories for ev in h]
        if status != "SUCCEEDED" and histories:
            failure = failure_from_history(histories[-1][1])
            if desc is not None and desc.get("error"):
                failure.error = failure.error or desc.get("error")
                if failure.cause is None:
                    failure.cause = desc.get("cause")
        timing = timing_split(all_events, len(follower.summaries))
        timing["lambdas"] = lambda_stats(stack.moto.dispatcher.invocations)
        if stack.moto.s3_requests is not None:
            timing["s3_requests"] = s3_requests_per_rollout(stack.moto.s3_requests.snapshot(),
                                                            timing["lambdas"].get("FinishRollout", {}).get("count", 0))
        if stack.acr is not None:
            c = stack.acr.counters
            timing["acr"] = {"invocations": c.invocations, "forwarded": c.forwarded, "throttled": c.throttled,
                             "mean_forward_seconds": round(c.forward_seconds / max(1, c.forwarded), 4),
                             "max_forward_seconds": round(c.max_forward_seconds, 4)}
        session_status = _session_status(stack, run_id)
        s3 = stack.moto.client("s3")
        for key in (f"runs/{run_id}/state.json", f"runs/{run_id}/config.json"):
            try:
                body = s3.get_object(Bucket=stack.bucket, Key=key)["Body"].read()
                (run_dir / ("state.json" if key.endswith("state.json") else "run_config.json")).write_bytes(body)
            except Exception:
                pass
        if mirror_s3:
            mirror_run_objects(s3, stack.bucket, run_id, run_dir / "s3")
    if stack.simulator is not None:
        counters = dict(getattr(stack.simulator, "counters", {}) or {})
    steps = sorted(follower.summaries) if follower else []
    rewards = [(s, r) for s in steps if (r := mean_reward(follower.summaries[s])) is not None] if follower else []
    evals = sorted((s, a) for s, e in (follower.evals.items() if follower else []) if (a := eval_accuracy(e)) is not None)
    plot(run_dir, rewards, evals, follower.summaries if follower else {})
    result = RunResult(
        run_id=run_id, status=status, run_dir=run_dir, wall_seconds=round(time.monotonic() - t_start, 1),
        steps=len(steps), rewards=[r for _, r in rewards],
        evals=[{"step": s, "accuracy": a} for s, a in evals], failure=failure, timing=timing,
        simulator_counters=_jsonable(counters), session_status=session_status,
        executions=follower.executions if follower else [],
    )
    (run_dir / "timing.json").write_text(json.dumps(timing, indent=2))
    (run_dir / "result.json").write_text(json.dumps(asdict(result), indent=2, default=str))
    return result


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", type=Path, help="run config, JSON or YAML (RunConfig fields), e.g. examples/toy.json")
    parser.add_argument("--run-id", help="run id = execution name (default: CONFIG-STEM-UTCTIME)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="parent of the run folder (default runs-local)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--timeout", type=float, help="stop the execution after this many seconds")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON",
                        help="override a config field, e.g. --set batch_size=4 (value parsed as JSON)")
    parser.add_argument("--acr-fault", action="append", default=[], metavar="KIND=N",
                        help="inject ACR faults: throttle, invoke_error, drop_result, malformed_result, error_result")
    parser.add_argument("--mirror-s3", action="store_true", help="copy the run's S3 objects into the run folder")
    parser.add_argument("-v", "--verbose", action="store_true", help="log the handlers' INFO lines")


def _pairs(items: list[str], *, parse_json: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected KEY=VALUE, got {item!r}")
        if parse_json:
            try:
                out[key] = json.loads(value)
            except json.JSONDecodeError:
                out[key] = value
        else:
            out[key] = int(value)
    return out


def run(args: argparse.Namespace) -> int:
    from stepwise.config import ConfigError

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops cleanly too, like Ctrl-C
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.verbose:
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")  # handlers' INFO lines
        for noisy in ("moto", "werkzeug", "botocore", "urllib3", "sagemaker", "sagemaker.config", "local.acr"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL if noisy == "moto" else logging.ERROR)
    try:
        result = run_local(args.config, run_id=args.run_id, out_root=args.out, progress=not args.no_progress,
                           timeout=args.timeout, overrides=_pairs(args.set, parse_json=True),
                           acr_faults=_pairs(args.acr_fault, parse_json=False), mirror_s3=args.mirror_s3,
                           quiet=not args.verbose)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\ninterrupted: execution stopped, training session stopped, local services shut down", file=sys.stderr)
        return 130
    print(report(result))
    return 0 if result.status == "SUCCEEDED" else 1


def report(result: RunResult) -> str:
    """A few lines for the terminal."""
    lines = [f"run {result.run_id}: {result.status} in {result.wall_seconds:.0f}s, {result.steps} steps -> {result.run_dir}"]
    if result.rewards:
        r = result.rewards
        head, tail = r[:3], r[-3:]
        lines.append(f"mean reward: first 3 steps {sum(head) / len(head):.3f}, last 3 steps {sum(tail) / len(tail):.3f}")
    for e in result.evals:
        lines.append(f"{eval_when(e['step'])}: accuracy {e['accuracy']:.3f}")
    for ckpt in _checkpoints(result.run_dir):
        lines.append(f"checkpoint at step {ckpt.get('step')} ({ckpt.get('reason')}): {ckpt.get('model_package_arn')}")
    per = result.timing.get("per_step")
    if per:
        lines.append("per step (s): " + ", ".join(f"{k} {v:.2f}" for k, v in per.items()))
    if result.session_status:
        lines.append(f"training session: {result.session_status}")
    if result.failure:
        lines.append(f"FAILED in state {result.failure.state!r}: {result.failure.error}")
        if result.failure.cause:
            lines.append(f"cause: {result.failure.cause[:2000]}")
    return "\n".join(lines)


def _checkpoints(run_dir: Path) -> list[dict[str, Any]]:
    """The run's saved checkpoints, as recorded in the run folder's ``state.json`` (none if absent)."""
    try:
        return list(json.loads((run_dir / "state.json").read_text()).get("checkpoints") or [])
    except (OSError, ValueError):
        return []


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="stepwise run-local")
    configure(parser)
    sys.exit(run(parser.parse_args()))
