"""run-local's stack: moto, the SageMaker simulator, the gateway, the ACR emulator and the Bedrock emulator (the
group judge), started and stopped.

``LocalStack.start`` starts every service on free loopback ports, points the environment at
them (restored by ``stop``; it refuses to go on unless every service the handlers call is pointed at
one, `local.no_aws.endpoint_problems`) and creates the stack's resources (functions, bucket notification,
state machine) as the CDK stack creates them. ``run_cleanup`` and ``run_sweeper`` stand in for the
stack's EventBridge rules (the abnormal-end rule and the sweeper's schedule), which moto does not
deliver to Lambda.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, ClassVar

from local import REPO_ROOT
from local._proc import EnvChanges, service_env, stop_process
from local.no_aws import endpoint_problems
from local.workers import WorkerPool, workers_from_env
from stepwise import layout
from stepwise.aws.clients import ENV_MAX_POOL_CONNECTIONS
from stepwise.executions import EXECUTION_STATUS_CHANGE

log = logging.getLogger("stepwise.run_local")

LOCAL_ROLE_ARN = "arn:aws:iam::123456789012:role/stepwise-local-sagemaker"

#: Training session statuses in which a session no longer bills (botocore's ``TrainingSessionStatus``
#: values after StopTrainingSession or an end of the service's own).
ENDED_TRAINING_SESSION_STATUSES = frozenset({"Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed"})


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
            elif isinstance(value, dict):  # start_simulator's form, e.g. latency={"optim_step": 2.0}
                for target, amount in value.items():
                    args += [flag, f"{target}={amount}"]
            elif value is not False and value is not None:
                args += [flag, str(value)]
        self._log = log_path.open("a") if log_path else None
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self._log, text=True, cwd=str(REPO_ROOT),
                                     env=service_env())
        self.url = ""
        self.env: dict[str, str] = {}
        deadline = time.monotonic() + timeout
        assert self.proc.stdout is not None
        # The deadline bounds the wait for the first line only: the simulator prints its URL, its
        # environment and the Ctrl-C line at once, so once it speaks the rest follows (a machine so
        # loaded that the first line came late must not cut the environment off: without it the
        # handlers would ask the real SageMaker endpoints).
        try:
            while self.url or time.monotonic() < deadline:
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
        except BaseException:  # it died, or a Ctrl-C came first: not left running either way
            self.stop()
            raise
        if not self.url or "AWS_ENDPOINT_URL_SAGEMAKER" not in self.env:
            self.stop()
            raise RuntimeError(f"simulator did not report its URL and environment (url {self.url!r}, env {self.env})")
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION", "AWS_REGION"):
            self.env.pop(key, None)  # credentials and region stay the runner's

    def state(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/_simulator/state", timeout=10) as resp:
            return json.loads(resp.read())

    @property
    def counters(self) -> dict[str, Any]:
        return dict(self.state().get("counters", {}))

    @property
    def exit_code(self) -> int | None:
        """The process's exit code once it has ended (a Ctrl-C in a terminal or ``timeout``'s signal
        reaches the whole process group, so the simulator can end before run-local collects); None while
        it runs. Its training sessions end with it (it keeps only model packages on disk)."""
        return self.proc.poll()

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
    bedrock: Any = None
    resources: Any = None
    simulator_in_process: bool = False
    _env: EnvChanges = field(default_factory=EnvChanges)
    #: Called with `billing_report` when a stack stops (before its services do): the tests' check that
    #: nothing is left billing after every end-to-end run (tests/support/billing.py).
    observers: ClassVar[list[Callable[[dict[str, Any]], None]]] = []

    def set_env(self, env: dict[str, str]) -> None:
        """Set process environment variables, put back by ``stop()`` (`local._proc.EnvChanges`)."""
        self._env.set(env)

    def start(self, *, tps_limit: float | None, simulator_options: dict[str, Any] | None = None,
              acr_faults: dict[str, int] | None = None, log_dir: Path | None = None,
              agents: dict[str, str] | None = None) -> "LocalStack":
        """Start every service; ``agents`` maps runtime ARNs to the apps the ACR emulator serves for them
        (``MODULE:ATTR`` or ``PATH.py:ATTR``, `local.agents.serve.load_app`; others by their runtime name)."""
        from local import engine, resources
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
        resources.create_bucket(self.moto, self.bucket, result_function_arn=None)
        self.gateway = GatewayProcess(dict(os.environ), log_path=str(log_dir / "gateway.log") if log_dir else None)
        self.set_env({"STEPWISE_GATEWAY_URL": self.gateway.url})
        # ACR scoped as the stack's IAM grant scopes it: the stack's region, or its allow-list.
        from stepwise import settings

        allowed = settings.current().agent_runtime_arns  # STEPWISE_AGENT_RUNTIME_ARNS, read as Init reads it
        # Session lifetimes and the active-session quota: ACR's defaults unless STEPWISE_LOCAL_ACR_* say otherwise.
        self.acr = AcrEmulator(agents, tps_limit=tps_limit, faults=Faults(**(acr_faults or {})),
                               agent_env=engine.endpoint_env(self.moto.endpoint),
                               log_dir=str(log_dir) if log_dir else None, region=engine.REGION,
                               allowed_runtime_arns=allowed).start()
        self.set_env(self.acr.env)
        # Bedrock (the group judge) scoped as the stack's grant scopes it: STEPWISE_JUDGE_MODEL_IDS, none when unset.
        from local.bedrock import from_env as bedrock_from_env

        self.bedrock = bedrock_from_env(region=engine.REGION).start()
        self.set_env(self.bedrock.env)
        if problems := endpoint_problems(os.environ):  # every handler's client on an emulator, or no run
            raise RuntimeError("the local stack did not point every client of its handlers at an emulator on "
                               f"loopback, so they could reach AWS: {'; '.join(problems)}")
        if self.moto.dispatcher.workers is not None:
            self.moto.dispatcher.workers.wait()
        self.resources = create_resources(self.moto, self.bucket)
        return self

    def billing_report(self) -> dict[str, Any]:
        """What this stack leaves billing now: ``{"acr": the emulator's session counters, "acr_active":
        [sid, ...], "training_sessions": {name: status} of the sessions not ended}`` (a status outside
        `ENDED_TRAINING_SESSION_STATUSES` bills)."""
        report: dict[str, Any] = {"source": "run-local", "acr": {}, "acr_active": [], "training_sessions": {}}
        if self.acr is not None:
            report["acr"] = self.acr.session_counters()
            report["acr_active"] = self.acr.active_sessions()
        if (code := simulator_exit_code(self)) is not None:  # its sessions ended with its process
            report["simulator_exit_code"] = code
        elif self.simulator is not None:
            try:
                report["training_sessions"] = {name: status for name, status in simulator_sessions(self.simulator).items()
                                               if status not in ENDED_TRAINING_SESSION_STATUSES}
            except Exception as exc:  # the simulator is gone: say so rather than report nothing
                report["training_sessions"] = {"?": f"could not ask the simulator: {exc}"}
        return report

    def stop(self, drain_seconds: float = 10.0) -> None:
        """Stop every service; ``drain_seconds``: how long asynchronous invocations still running may finish
        first (0 after an interrupt: run-local has waited its own few seconds and named what it left)."""
        try:
            if self.acr is not None and self.observers:
                report = self.billing_report()
                for observe in list(self.observers):
                    observe(report)
            for name in ("acr", "gateway", "bedrock"):
                part = getattr(self, name)
                if part is not None:
                    try:
                        part.stop()
                    except Exception:  # keep stopping the rest
                        log.exception("stopping %s", name)
                    setattr(self, name, None)
            if self.moto is not None:
                self.moto.dispatcher.drain(timeout=drain_seconds)
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
        finally:  # the environment as it was, even when a service's stop raised
            self._env.restore()


def local_pool_size(tps_limit: float | None) -> int:
    """Connections per client and host for the local stack: two per rollout the Map may run at
    once (PlanStep's bound: ``acr_tps_limit`` x CONCURRENCY_PER_TPS, at most MAX_MAP_CONCURRENCY;
    StartRollout's or FinishRollout's call plus OnRolloutResult's), plus the parent's tasks."""
    from stepwise.core.service_limits import CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY

    concurrency = MAX_MAP_CONCURRENCY if not tps_limit else min(MAX_MAP_CONCURRENCY,
                                                                  math.ceil(tps_limit * CONCURRENCY_PER_TPS))
    return 2 * concurrency + 16


def local_substitutions(function_arns: dict[str, str], bucket: str, group_state_machine_arn: str | None = None
                        ) -> dict[str, str]:
    """The state machines' substitutions, computed exactly as the stack computes them."""
    from infra.definition import substitutions

    return substitutions(function_arns=function_arns, bucket_name=bucket, group_state_machine_arn=group_state_machine_arn)


def create_state_machines(moto: Any, arns: dict[str, str], bucket: str, name: str) -> tuple[str, str, str]:
    """The rollout group state machine (``{name}-rollout-group``), then the training loop ``name`` that starts
    its executions, as the stack creates them. Returns ``(training loop ARN, its definition, group ARN)``."""
    from local import resources
    from state_machine.definition import load_group_definition, render_definition

    group_text = load_group_definition()
    group_arn = resources.create_state_machine(moto, f"{name}-rollout-group",
                                               render_definition(local_substitutions(arns, bucket), group_text))
    definition = render_definition(local_substitutions(arns, bucket, group_arn))
    return resources.create_state_machine(moto, name, definition), definition, group_arn


def create_resources(moto: Any, bucket: str, *, state_machine_name: str = "stepwise-training-loop") -> Any:
    """Functions, bucket notification and state machines, as the stack creates them."""
    from local import resources

    arns = resources.create_functions(moto)
    resources.create_bucket(moto, bucket, result_function_arn=arns["OnRolloutResult"], track_function_arn=arns["Track"])
    sm_arn, definition, group_arn = create_state_machines(moto, arns, bucket, state_machine_name)
    return resources.LocalResources(bucket=bucket, state_machine_arn=sm_arn, function_arns=arns, definition=definition,
                                    group_state_machine_arn=group_arn)


def run_cleanup(stack: LocalStack, execution: dict[str, Any]) -> None:
    """What the stack's EventBridge rule does on an abnormal end: run Cleanup with the event."""
    event = {
        "version": "0", "id": str(uuid.uuid4()), "source": "aws.states",
        "detail-type": EXECUTION_STATUS_CHANGE,
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


def run_sweeper(stack: LocalStack, *, dry_run: bool = False) -> dict[str, Any]:
    """What the stack's schedule does every few minutes: run the session sweeper once (moto's
    EventBridge delivers no schedule). Returns its report (``stopped``, ``left``, ``errors``)."""
    lam = stack.moto.client("lambda")
    # After the run ended nothing of it is changing: no grace period (STEPWISE_SWEEP_GRACE_SECONDS), so
    # a session the run leaked is stopped now, and its leftovers (rollouts, retention) finished.
    resp = lam.invoke(FunctionName=stack.resources.function_arns["SweepSessions"],
                      Payload=json.dumps({"dry_run": dry_run, "grace_seconds": 0}).encode())
    body = json.loads(resp["Payload"].read() or b"{}")
    if resp.get("FunctionError"):
        log.error("SweepSessions failed: %s", str(body)[:2000])
        return {"stopped": [], "left": [], "errors": [body]}
    if body.get("stopped"):
        log.warning("the session sweeper stopped %d training session(s) no execution drove: %s",
                    len(body["stopped"]), body["stopped"])
    return body


def simulator_exit_code(stack: LocalStack, *, settle: float = 0.0) -> int | None:
    """The simulator process's exit code if it has ended, else None (running, in-process or never started).

    ``settle`` > 0 (after an interrupt): a simulator process that no longer answers (the group's Ctrl-C
    reached it too and it is shutting down) is given that many seconds to end, then stopped; its exit
    code is returned either way (measured: a toy run interrupted by a SIGINT to its process group found
    the simulator refusing connections, not yet exited).
    """
    import subprocess

    sim = stack.simulator
    code = getattr(sim, "exit_code", None)
    if code is not None or settle <= 0 or not hasattr(sim, "proc"):
        return code
    try:
        sim.state()
        return None
    except OSError:
        try:
            return sim.proc.wait(settle)
        except subprocess.TimeoutExpired:  # no answer and no end: of no use any more
            sim.stop()
            return sim.proc.returncode


def simulator_sessions(simulator: Any) -> dict[str, str]:
    """Session name -> status, from the simulator (in-process handle or process)."""
    if hasattr(simulator, "state"):
        return dict(simulator.state().get("sessions", {}))
    return dict(simulator.simulator.session_statuses())


def training_session_status(stack: LocalStack, run_id: str) -> str | None:
    """The run's training session status (name from state.json, status from the simulator)."""
    try:
        s3 = stack.moto.client("s3")
        state = json.loads(s3.get_object(Bucket=stack.bucket, Key=layout.state_key(run_id))["Body"].read())
        return simulator_sessions(stack.simulator).get(state["training_session_name"])
    except Exception as exc:
        log.warning("could not read the training session status: %s", exc)
        return None
