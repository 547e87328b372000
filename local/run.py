"""``stepwise run-local CONFIG.json``: a whole training run on this machine, same code as on AWS.

Starts, on free loopback ports: moto (S3, Step Functions with execution, Lambda whose
invocations run the real handlers in-process), the SageMaker Training Sessions simulator,
the rollout gateway (its own process, as in the Lambda) and the ACR emulator with the agent
the config's ``agent_runtime_arn`` names (``runtime/NAME-...`` -> ``local/agents/NAME.py``), or, with
``--agent FOLDER`` / ``--agent PATH.py[:APP]`` / ``--agent MODULE:APP``, the user's own ``AgentCoreRLApp`` from
wherever it lives, in an environment built from its folder's own requirements (`local.agent_env`), imported from
its folder, served for the config's runtime, which becomes `USER_AGENT_ARN` (`user_agent`).
Then it creates the stack's resources (bucket + result notification, one function per
``stepwise.functions`` entry, the state machine from ``state_machine/`` with the stack's
substitutions), uploads the datasets, starts the execution (name = run id) and follows it
with a progress bar until it ends. On success, failure or Ctrl-C everything is stopped
(the training session too: moto's EventBridge does not deliver to Lambda, so on an
abnormal end the runner runs the Cleanup function itself, as the stack's rule would).

The run folder ``runs-local/{run_id}/`` gets the config, ``metrics.jsonl`` (one line per
step summary, eval summaries too), the step summaries, ``timing.json`` (wall time per
step split into rollouts, advantages, training, eval/checkpoint, orchestration) and
``reward.png``; each eval's ``evals/{step}/results.json`` (every prompt's rollouts) beside its summary.
The simulator keeps the model packages it saves in ``runs-local/.simulator/`` (`simulator_state_dir`),
so a checkpoint of one local run loads in a later one. Exit code 0 when the execution succeeded,
1 otherwise (the failing state and cause are printed), 130 on Ctrl-C.

This module is the orchestration (start the stack, follow the execution) and the CLI entry; the services
are started in `local.stack`, the datasets made and uploaded in `local.datasets`, the run folder collected
at the run's end in `local.collect`, and the figures and closing lines computed in `local.report`.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import signal
import sys
import threading
import time
import uuid
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from local._proc import shared_line_log
from local.datasets import planned_steps, upload_datasets
from local.report import LOCAL_ASSUMPTIONS
from stepwise_cli.cost import put_estimate
from local.collect import DRAIN_SECONDS, INTERRUPTED_DRAIN_SECONDS, REPORT_FILE, write_local_report  # noqa: F401
from local.collect import finish as _finish
from local.collect import history as _history  # noqa: F401 (read from here too)
from local.report import RunResult, interrupted_lines, report
from local.stack import LocalStack, simulator_exit_code
from stepwise import layout
from stepwise.executions import run_id_stem
from stepwise.settings import ENV_JUDGE_MODEL_IDS
from stepwise.stackinfo import StackInfo
from stepwise_cli.commands._runs import Deployment, mean_reward
from stepwise_cli.commands.watch import eval_line, kept_groups
from stepwise_cli.follow import RunFollower

log = logging.getLogger("stepwise.run_local")

DEFAULT_OUT = Path("runs-local")
#: The runtime ARN a user's own agent (``--agent``) is served under: the local stack's region and account.
USER_AGENT_ARN = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/user_agent-local"


class AgentNotStarted(RuntimeError):
    """The user's agent (``--agent``) did not start; the message names it and its log."""


class RunInterrupted(KeyboardInterrupt):
    """`run_local` was interrupted (Ctrl-C, or SIGTERM: ``timeout``, ``kill``), raised once everything it
    started is stopped; ``result`` is what it collected (its run folder is written)."""

    def __init__(self, result: RunResult):
        super().__init__(f"run-local interrupted; run folder {result.run_dir}")
        self.result = result


def user_agent_spec(agent: str, cwd: Path | None = None) -> str:
    """``--agent``'s value as the ACR emulator serves it: ``PATH.py[:ATTR]`` made absolute (so the agent's
    process finds it whatever its working directory), ``MODULE[:ATTR]`` as it is (imported from the current
    directory, which the agent's process starts in, as ``python -m`` does).

    Raises:
        FileNotFoundError: a ``.py`` path that does not exist.
    """
    from local.agents.serve import split_spec

    target, attr = split_spec(agent)
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = (Path(cwd or Path.cwd()) / target).resolve()
        if not path.is_file():
            raise FileNotFoundError(f"--agent {agent!r}: no file {path}")
        return f"{path}:{attr}"
    return f"{target}:{attr}"


def user_agent(agent: str, cwd: Path | None = None):
    """``--agent``'s agent folder (`infra.agent_folder.AgentFolder`): a folder (entrypoint ``agent:app``), a
    ``PATH.py[:ATTR]`` (its folder, entrypoint ``FILE:ATTR``) or ``MODULE[:ATTR]`` (the current directory). Its
    requirements file, when it has one, is what `local.agent_env` builds its environment from.

    Raises:
        infra.agent_folder.AgentFolderError: no such folder, file or module.
    """
    from infra.agent_folder import AgentFolder
    from local.agents.serve import split_spec

    base = Path(cwd or Path.cwd())
    if (base / agent).is_dir():
        return AgentFolder.of(base / agent, need_requirements=False)
    target, attr = split_spec(agent)
    if target.endswith(".py") or "/" in target or "\\" in target:
        return AgentFolder.of_file(base / target, attr)
    return AgentFolder.of(base, f"{target}:{attr}", need_requirements=False)


#: Seconds an interrupted run waits for moto's worker to report the stopped execution's end (then it is taken as
#: ABORTED, as the API reports at once); measured: the full 15 s of `stop_execution`'s default on a loaded machine.
INTERRUPTED_STOP_WAIT = 3.0
# --------------------------------------------------------------------------------------
# Following the execution
# --------------------------------------------------------------------------------------


class LocalFollower(RunFollower):
    """run-local's view of the run it follows (`stepwise_cli.follow.RunFollower`, as `stepwise watch`
    follows one): writes each summary into the run folder as it appears (a ``metrics.jsonl`` line
    when first seen; ``steps|evals/{step}/summary.json`` as it last read) and drives the progress bar."""

    def __init__(self, stack: LocalStack, run_id: str, run_dir: Path, total_steps: int | None, progress: bool,
                 responses_per_prompt: int | None = None):
        info = StackInfo(bucket=stack.bucket, state_machine_arn=stack.resources.state_machine_arn, source="run-local")
        super().__init__(Deployment(info, stack.moto.client("stepfunctions"), stack.moto.client("s3")), run_id,
                         probe_steps=True)
        self.responses_per_prompt = responses_per_prompt
        self.run_dir = run_dir
        self._seen: set[tuple[str, int]] = set()
        self._last_step_t = time.monotonic()
        self._step_seconds: list[float] = []
        self.bar = None
        if progress:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, unit="step", desc=run_id, dynamic_ncols=True)

    @property
    def summaries(self) -> dict[int, dict[str, Any]]:
        """``{step: summary}`` of the train steps read so far."""
        return self.cache.steps

    @property
    def evals(self) -> dict[int, dict[str, Any]]:
        """``{step: summary}`` of the evals read so far."""
        return self.cache.evals

    def record_new(self, *, full: bool = False) -> None:
        """Read new or changed summaries (`RunFollower.refresh`; ``full`` at the end, when nothing
        may be missed) and write them into the run folder."""
        for kind, step in self.refresh(full=full):
            self._record(kind, step, (self.cache.steps if kind == "steps" else self.cache.evals)[step])

    def copy_report(self) -> None:
        """The run's report page as the Track function last wrote it -> ``{run_dir}/report.html``."""
        try:
            body = self.dep.s3.get_object(Bucket=self.dep.bucket, Key=layout.report_key(self.run_id))["Body"].read()
        except Exception:  # not written yet
            return
        (self.run_dir / REPORT_FILE).write_bytes(body)

    def _record(self, kind: str, step: int, summary: dict[str, Any]) -> None:
        target = self.run_dir / kind / str(step)
        target.mkdir(parents=True, exist_ok=True)
        (target / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
        if (kind, step) in self._seen:  # a summary extended later: its copy is updated, nothing more
            return
        self._seen.add((kind, step))
        self.copy_report()  # the page of the step before: Track renders this one beside the loop
        line = {"kind": "train" if kind == "steps" else "eval", "step": step,
                "time": datetime.now(timezone.utc).isoformat(), **flatten(summary)}
        with (self.run_dir / "metrics.jsonl").open("a") as fh:
            fh.write(json.dumps(line, default=str) + "\n")
        if kind == "evals":
            self._copy_eval_results(step, target)
            # as it happens, on the terminal (stderr: stdout is the handlers' log file unless -v), with or
            # without the bar; before, it went to the bar's write (stdout), so into logs/lambdas.log
            if self.bar is not None:
                self.bar.write(eval_line(step, summary), file=sys.stderr)
            else:
                say(eval_line(step, summary))
            return
        now = time.monotonic()
        self._step_seconds.append(now - self._last_step_t)
        self._last_step_t = now
        if self.bar is not None:
            reward = mean_reward(summary)
            kept = kept_groups(summary, {"responses_per_prompt": self.responses_per_prompt})
            self.bar.set_postfix(step=step, reward=None if reward is None else f"{reward:.3f}",
                                 kept=None if kept is None else int(kept), s_per_step=f"{self._step_seconds[-1]:.1f}")
            self.bar.update(1)

    def _copy_eval_results(self, step: int, target: Path) -> None:
        """The eval's per-prompt results (``results.json``, written before its summary) into the run folder."""
        try:
            body = self.dep.s3.get_object(Bucket=self.dep.bucket, Key=layout.eval_results_key(self.run_id, step))
            (target / "results.json").write_bytes(body["Body"].read())
        except Exception:  # an eval recorded before per-prompt results: nothing to copy
            log.debug("no eval results for step %s", step)

    def poll(self) -> dict[str, Any] | None:
        """One poll; returns the newest execution's description once the run has ended."""
        self.record_new()
        desc = self.describe_newest()
        if not self.ended(desc):
            return None
        self.record_new(full=True)
        return desc

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A summary's nested dicts as ``outer/inner`` keys (``metrics.jsonl`` lines are flat)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, key + "/"))
        else:
            out[key] = v
    return out


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


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


#: The simulator's state folder under the run folders' parent: model packages saved by every local run.
SIMULATOR_STATE = ".simulator"


def simulator_state_dir(out_root: Path = DEFAULT_OUT) -> Path:
    """Where local runs' simulators keep model packages (``{out_root}/.simulator/``): one file pair
    per package (`local.simulator.service`), so ARNs printed by one ``make run`` load in the next."""
    return Path(out_root) / SIMULATOR_STATE


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
              mirror_s3: bool = False, quiet: bool = False, agent: str | None = None) -> RunResult:
    """Run one training run through the local stack; see the module docstring.

    ``agent``: the user's own agent (a folder, ``PATH.py[:ATTR]`` or ``MODULE[:ATTR]``, `user_agent`), served
    as the run's agent runtime (the config's ``agent_runtime_arn`` becomes `USER_AGENT_ARN`) from its own
    environment when its folder has a requirements file (`local.agent_env`).

    Every object under ``runs/{run_id}/`` (rollout records, captured turns, summaries, the report) is
    copied into ``{run_dir}/s3/`` before moto stops; ``mirror_s3`` adds the agents' rollout results.
    ``quiet`` sends the handlers' output (Powertools logs, EMF lines) to
    ``{run_dir}/logs/lambdas.log``; the gateway and agents always log under ``logs/``.

    Raises:
        stepwise.config.ConfigError: the config is invalid, or (`RunRefused`) the run id breaks
            `stepwise.executions.RUN_ID_RE` (nothing was started).
        RunInterrupted: a KeyboardInterrupt, after stopping everything, when interrupted (its ``result``).
    """
    from stepwise.config import load_run_config
    from stepwise.core.preflight import RunRefused
    from stepwise.executions import run_id_problem

    t_start = time.monotonic()
    config_path = Path(config_path)
    say(f"checking {config_path}: the config, its datasets and its agent")
    agents = None
    if agent:  # its own environment and an import check before anything starts (local.agent_env)
        from local.agent_env import prepare

        agents = {USER_AGENT_ARN: prepare(user_agent(agent), log=None if quiet else print)}
        overrides = {**(overrides or {}), "agent_runtime_arn": USER_AGENT_ARN}
    cfg = {**load_local_config(config_path), **(overrides or {})}
    config = load_run_config(cfg)
    if run_id and (problem := run_id_problem(run_id)) is not None:  # the rule Init and `stepwise start` refuse by
        raise RunRefused([problem])
    if problems := preflight(cfg, config, config_path.parent, user_agent=bool(agents)):
        raise RunRefused(problems, source="run-local, before starting the local stack")
    run_id, run_dir = new_run_folder(Path(out_root), run_id, config_path.stem)
    (run_dir / "config.json").write_text(json.dumps(cfg, indent=2))

    log_dir = run_dir / "logs"
    log_dir.mkdir()
    # The simulator keeps the model packages it saves beside the run folders, so a later local run can
    # evaluate or resume an earlier run's checkpoint (`stepwise eval --model-package ARN`).
    simulator_options = {"state_dir": str(simulator_state_dir(out_root)), **(simulator_options or {})}
    bucket = f"stepwise-local-{uuid.uuid4().hex[:12]}"
    stack = LocalStack(bucket=bucket)
    with contextlib.ExitStack() as outputs:
        if quiet:
            lambda_log = outputs.enter_context(contextlib.closing(shared_line_log(log_dir / "lambdas.log")))
            stream = outputs.enter_context(_SwitchableStream.into(lambda_log))
            outputs.enter_context(contextlib.redirect_stdout(stream))
        result, interrupted = _run(stack, config, cfg, config_path, run_id, run_dir, log_dir, simulator_options,
                                   acr_faults, timeout, progress, mirror_s3, t_start, agents)
    if interrupted:
        raise RunInterrupted(result)
    return result


def say(line: str) -> None:
    """One line of what run-local is doing, for the person at the terminal (stderr, flushed: stdout may
    be the handlers' log)."""
    print(line, file=sys.stderr, flush=True)


def preflight(cfg: dict[str, Any], config: Any, config_dir: Path, *, user_agent: bool = False) -> list[str]:
    """Every problem knowable from the config before a service starts (``field: message``, [] when none):
    each local dataset exists (or a generator makes it, `local.datasets.resolve_dataset`) and holds enough
    valid rows (`stepwise.datasets.check_dataset`: ``batch_size`` for the train set, 1 for an eval set),
    and the agent the config's ``agent_runtime_arn`` names has a module the ACR emulator can serve
    (``runtime/NAME-...`` -> ``local.agents.NAME``; ``user_agent``: ``--agent`` was checked by its own import).
    ``s3://`` datasets are read by Init, as on AWS. Before, a missing dataset was found only after the whole
    stack was up (41 s to 1 min 50 s on this machine)."""
    import importlib.util

    from local.acr import agent_spec_for_arn
    from local.datasets import resolve_dataset
    from stepwise.datasets import DatasetError, check_dataset

    problems: list[str] = []
    checks = [("dataset_path", cfg.get("dataset_path"), config.batch_size),
              ("eval_dataset_path", cfg.get("eval_dataset_path"), 1)]
    checks += [(f"eval_datasets.{name}", path, 1) for name, path in (cfg.get("eval_datasets") or {}).items()]
    for field, value, min_rows in checks:
        if not value or str(value).startswith("s3://"):
            continue
        try:
            check_dataset(str(resolve_dataset(str(value), config_dir)), min_rows)
        except (FileNotFoundError, DatasetError) as exc:
            problems.append(f"{field}: {exc}")
    if not user_agent:
        arn = str(cfg.get("agent_runtime_arn") or "")
        try:
            module = agent_spec_for_arn(arn).split(":", 1)[0]
            if importlib.util.find_spec(module) is None:
                problems.append(f"agent_runtime_arn: the local stack serves runtime/NAME-... from local/agents/NAME.py, "
                                f"and there is no {module.replace('.', '/')}.py (got {arn!r}); or train your own "
                                f"agent with --agent FOLDER")
        except (ValueError, ImportError) as exc:
            problems.append(f"agent_runtime_arn: {exc}")
    return problems


class RunFolderExists(FileExistsError):
    """``--run-id`` names a run folder that exists: an earlier run's report, metrics and objects are
    never overwritten (as `stepwise start` refuses a run id the stack has run)."""


def new_run_folder(out_root: Path, run_id: str | None, stem: str,
                   now: datetime | None = None) -> tuple[str, Path]:
    """The run id and its new, empty folder under ``out_root``: ``run_id`` as given (`RunFolderExists`
    when its folder exists), else ``STEM-YYYYMMDD-HHMMSS`` (UTC; ``STEM`` as `stepwise.executions.run_id_stem`
    makes it, so the id obeys the run-id rule) with ``-2``, ``-3``, ... when runs started
    in the same second. The folder is made here (``mkdir`` without ``exist_ok``), so two runs racing for
    one id cannot share it."""
    if run_id:
        candidates = iter([run_id])
    else:
        base = f"{run_id_stem(stem)}-{(now or datetime.now(timezone.utc)).strftime('%Y%m%d-%H%M%S')}"
        candidates = (base if n == 1 else f"{base}-{n}" for n in range(1, 10_000))
    out_root.mkdir(parents=True, exist_ok=True)
    for candidate in candidates:
        try:
            (out_root / candidate).mkdir()
        except FileExistsError:
            if run_id:
                raise RunFolderExists(f"{out_root / run_id} exists: an earlier run of that id; give another "
                                      f"--run-id, or remove the folder to start it again") from None
            continue
        return candidate, out_root / candidate
    raise RunFolderExists(f"{out_root}: no free run id for {stem} in this second")


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
         timeout: float | None, progress: bool, mirror_s3: bool, t_start: float,
         agents: dict[str, str] | None = None) -> tuple[RunResult, bool]:
    bucket = stack.bucket
    follower: LocalFollower | None = None
    desc: dict[str, Any] | None = None
    interrupted = False
    marks: dict[str, float] = {}  # time.monotonic() at StartExecution ("started") and when it ended ("ended")
    try:
        # W&B (a config naming wandb_project) logs offline into the run folder unless told otherwise.
        stack.set_env({"WANDB_MODE": os.environ.get("WANDB_MODE") or "offline",
                       "WANDB_DIR": os.environ.get("WANDB_DIR") or str(run_dir.resolve()), "WANDB_SILENT": "true"})
        if config.judge is not None and not os.environ.get(ENV_JUDGE_MODEL_IDS):
            # the judge's model granted, as a stack deployed with -c judgeModelIds=MODEL grants it
            stack.set_env({ENV_JUDGE_MODEL_IDS: config.judge.model_id})
        say("starting the local stack: moto (S3, Step Functions, Lambda), Lambda workers, the SageMaker simulator, "
            "the gateway, the ACR and Bedrock emulators (about a minute on 2 cores)")
        t_stack = time.monotonic()
        stack.start(tps_limit=config.acr_tps_limit, simulator_options=simulator_options, acr_faults=acr_faults,
                    log_dir=log_dir, agents=agents)
        say(f"local stack up in {time.monotonic() - t_stack:.0f}s; starting run {run_id} (run folder {run_dir})")
        for arn, spec in (agents or {}).items():  # the user's agent: a clear error now, not every rollout failing
            if stack.acr.agent_for(arn) is None:
                raise AgentNotStarted(f"the agent {spec} did not start (it must import and serve an AgentCoreRLApp "
                                      f"named by :ATTR, default 'app'); its output: {log_dir}/")
        s3 = stack.moto.client("s3")
        run_cfg = upload_datasets(cfg, s3=s3, bucket=bucket, run_id=run_id, config_dir=config_path.parent)
        if not run_cfg.get("s3_output_path"):
            # the SDK's default (sagemaker-{region}-{account}) asks STS on a hard-wired endpoint
            run_cfg["s3_output_path"] = f"s3://{bucket}/checkpoints/{run_id}/"
        (run_dir / "config.json").write_text(json.dumps(run_cfg, indent=2))
        total = planned_steps(config, s3, bucket, run_cfg)
        # the run's cost estimate (as `stepwise start` writes it), at the local stack's timings
        put_estimate(s3, bucket, run_id, config, total, LOCAL_ASSUMPTIONS)
        sfn = stack.moto.client("stepfunctions")
        marks["started"] = time.monotonic()
        sfn.start_execution(stateMachineArn=stack.resources.state_machine_arn, name=run_id, input=json.dumps(run_cfg))
        follower = LocalFollower(stack, run_id, run_dir, total, progress, responses_per_prompt=config.responses_per_prompt)
        deadline = None if timeout is None else time.monotonic() + timeout
        while desc is None:
            if deadline is not None and time.monotonic() > deadline:
                newest = follower.newest_execution()
                desc = stop_execution(sfn, newest["executionArn"], error="States.Timeout",
                                      cause=f"run-local timeout of {timeout:.0f}s")
                break
            if (code := simulator_exit_code(stack)) is not None:  # no training can go on: say so, now
                newest = follower.newest_execution()
                desc = stop_execution(sfn, newest["executionArn"], error="LocalSimulatorExited",
                                      cause=f"the SageMaker simulator process exited with code {code} "
                                            f"(its log: {log_dir}/simulator.log)")
                break
            time.sleep(0.5)
            desc = follower.poll()
        marks["ended"] = time.monotonic()
    except KeyboardInterrupt:
        interrupted = True
        say("\ninterrupted: stopping the execution, then its training session (Cleanup) and the local services")
        if follower is not None and stack.moto is not None:
            newest = follower.newest_execution()
            if newest is not None:  # a person is waiting: moto's worker may take its time to report the end
                desc = stop_execution(stack.moto.client("stepfunctions"), newest["executionArn"],
                                      error="Interrupted", cause="Ctrl-C in run-local", wait=INTERRUPTED_STOP_WAIT)
    finally:
        marks.setdefault("ended", time.monotonic())
        try:
            result = _finish(stack, follower, desc, run_id, run_dir, t_start, mirror_s3, degraded=interrupted,
                             marks=marks)
        finally:  # whatever collecting met, everything started is stopped
            stack.stop(drain_seconds=0.0 if interrupted else 10.0)
            if follower is not None:
                follower.close()
    return result, interrupted


# --------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """run-local's arguments: `stepwise start --local`'s (``stepwise run-local`` is its old spelling, kept for one
    release); the shared flags are `stepwise_cli.grammar`'s."""
    from stepwise_cli.grammar import add_json, add_local, add_set, add_timeout, add_verbose

    parser.add_argument("config", type=Path, help="run config, JSON or YAML (RunConfig fields), e.g. examples/toy.json")
    parser.add_argument("--run-id", help="run id = execution name (default: CONFIG-STEM-UTCTIME)")
    add_json(parser, "the run's result (result.json) instead of its closing lines")
    add_set(parser)
    add_timeout(parser)
    add_local(parser, old_runs_dir=("--out",), simulator=True)
    add_verbose(parser)


def simulator_latency_options(latency: list[str]) -> dict[str, Any] | None:
    """``--simulator-latency OP=SECONDS`` values as the simulator's options (``{"latency": {op: seconds}}``; None
    when none is given): the seconds the training-session simulator adds to each operation of that kind.

    Raises:
        UsageError: an item that is not ``OP=SECONDS`` with a number of seconds >= 0.
    """
    from stepwise_cli.grammar import UsageError

    out: dict[str, float] = {}
    for item in latency:
        op, sep, value = item.partition("=")
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not sep or not op or seconds < 0:
            raise UsageError(f"--simulator-latency expects OP=SECONDS, got {item!r}")
        out[op] = seconds
    return {"latency": out} if out else None


def run(args: argparse.Namespace) -> int:
    """`stepwise start --local` (old spelling ``stepwise run-local``). A config that cannot run, a usage error or an
    agent folder that cannot be used reach `stepwise_cli.main`, which reports them for every command."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _interrupt)  # `kill` stops cleanly too, like Ctrl-C
    args.verbose = getattr(args, "verbose", False)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # what quiet mode changes in this process is put back when the command returns (a test, or a script calling
    # `main` in-process, keeps its own log levels): the handlers' INFO lines and the services' chatter
    saved_level = os.environ.get("POWERTOOLS_LOG_LEVEL")
    noisy_levels = {name: logging.getLogger(name).level for name in _NOISY_LOGGERS}
    if not args.verbose:
        os.environ.setdefault("POWERTOOLS_LOG_LEVEL", "WARNING")
        for noisy in _NOISY_LOGGERS:
            logging.getLogger(noisy).setLevel(logging.CRITICAL if noisy == "moto" else logging.ERROR)
    try:
        return _start(args)
    finally:
        if saved_level is None:
            os.environ.pop("POWERTOOLS_LOG_LEVEL", None)
        else:
            os.environ["POWERTOOLS_LOG_LEVEL"] = saved_level
        for name, level in noisy_levels.items():
            logging.getLogger(name).setLevel(level)


_NOISY_LOGGERS = ("moto", "werkzeug", "botocore", "urllib3", "sagemaker", "sagemaker.config", "local.acr")


def _start(args: argparse.Namespace) -> int:
    from stepwise_cli.grammar import parse_acr_faults, parse_sets

    try:
        result = run_local(Path(args.config), run_id=args.run_id, out_root=args.runs_dir, progress=not args.no_progress,
                           timeout=args.timeout, overrides=parse_sets(args.set), acr_faults=parse_acr_faults(args.acr_fault),
                           mirror_s3=args.mirror_s3, quiet=not args.verbose, agent=args.agent,
                           simulator_options=simulator_latency_options(getattr(args, "simulator_latency", [])))
    except (AgentNotStarted, FileNotFoundError, RunFolderExists) as exc:
        print(f"stepwise start --local: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # RunInterrupted once run_local has stopped what it started
        print("\n" + interrupted_lines(getattr(exc, "result", None)), file=sys.stderr)
        return 130
    if getattr(args, "json", False):
        print(json.dumps(asdict(result), indent=2, default=str))
    else:
        print(report(result))
    return 0 if result.status == "SUCCEEDED" else 1


def _interrupt(*_: Any) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="stepwise run-local")
    configure(parser)
    sys.exit(run(parser.parse_args()))
