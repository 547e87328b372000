"""An interrupted ``stepwise run-local`` whose simulator process had already ended (a terminal's Ctrl-C and
``timeout``'s signal reach the whole process group, and the simulator ends first): it says what happened,
stops what it started, names the run folder and exits 130, with no traceback. Before: collecting the run
asked the dead simulator for its counters and the command died of a URLError traceback, skipping
``LocalStack.stop``."""

from __future__ import annotations

import argparse
import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from local import report as report_module
from local import run as run_module
from local.stack import LocalStack, SimulatorProcess

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A simulator that hands over its URL and environment, then dies of SIGINT (what a Ctrl-C at a terminal does).
DYING_SIMULATOR = r'''
import os, signal
url = "http://127.0.0.1:{port}"
print(f"# SageMaker Training Sessions simulator on {{url}} (base model: stepwise-tiny)", flush=True)
print(f"export SAGEMAKER_TRAINING_SESSION_ENDPOINT={{url}}", flush=True)
print(f"export AWS_ENDPOINT_URL_SAGEMAKER={{url}}", flush=True)
print("# Ctrl-C to stop.", flush=True)
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.kill(os.getpid(), signal.SIGINT)
'''


@pytest.fixture
def dying_simulator(monkeypatch):
    """``LocalStack.start`` that starts a simulator process which then dies, and is interrupted (Ctrl-C)."""
    real = subprocess.Popen
    started: list[SimulatorProcess] = []

    def popen(args, **kwargs):
        script = DYING_SIMULATOR.format(port=_free_port())
        return real([sys.executable, "-c", script], **{k: v for k, v in kwargs.items() if k != "cwd"})

    def start(self, **kwargs):
        monkeypatch.setattr(subprocess, "Popen", popen)
        try:
            self.simulator = SimulatorProcess(region="us-east-1", timeout=60)
        finally:
            monkeypatch.setattr(subprocess, "Popen", real)
        started.append(self.simulator)
        self.simulator.proc.wait(30)
        raise KeyboardInterrupt

    monkeypatch.setattr(LocalStack, "start", start)
    previous = signal.getsignal(signal.SIGTERM)  # `run` installs its SIGTERM handler
    yield started
    signal.signal(signal.SIGTERM, previous)


def test_ctrl_c_after_the_simulator_died_says_so_stops_everything_and_names_the_run_folder(
        dying_simulator, tmp_path, capsys, caplog):
    parser = argparse.ArgumentParser()
    run_module.configure(parser)
    args = parser.parse_args([str(ROOT / "examples" / "toy.json"), "--run-id", "interrupted", "--runs-dir", str(tmp_path),
                              "--no-progress"])
    stopped: list[LocalStack] = []
    real_stop = LocalStack.stop

    def stop(self, **kwargs):
        stopped.append(self)
        real_stop(self, **kwargs)

    LocalStack.stop = stop
    try:
        code = run_module.run(args)
    finally:
        LocalStack.stop = real_stop
    err = capsys.readouterr().err
    run_dir = tmp_path / "interrupted"

    assert code == 130, err
    assert "Traceback" not in err and not [r for r in caplog.records if r.exc_info], err
    assert "interrupted: the execution had not started, local services shut down" in err
    assert "the simulator process had stopped answering before the run was collected (exit code -2): its training " \
           "sessions ended with it" in err
    assert f"run folder: {run_dir}" in err
    assert stopped and stopped[0].simulator is None  # LocalStack.stop ran to the end
    assert dying_simulator[0].proc.returncode == -2  # reaped
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "NOT_STARTED" and result["simulator_exit_code"] == -2
    assert result["simulator_counters"] == {}


def test_the_closing_lines_name_a_simulator_that_had_exited(tmp_path):
    result = report_module.RunResult(
        run_id="r", status="ABORTED", run_dir=tmp_path, wall_seconds=3.0, steps=0, rewards=[], evals=[], failure=None,
        timing={}, simulator_counters={}, session_status=None, executions=[], simulator_exit_code=-15)
    gone = ("the simulator process had stopped answering before the run was collected (exit code -15): its training "
            "sessions ended with it")
    assert gone in report_module.report(result)
    assert report_module.interrupted_lines(result).splitlines() == [
        "interrupted: execution ABORTED, local services shut down", gone, f"run folder: {tmp_path}"]
    alive = report_module.RunResult(**{**result.__dict__, "simulator_exit_code": None, "session_status": "Stopped"})
    assert report_module.interrupted_lines(alive).splitlines() == [
        "interrupted: execution ABORTED, local services shut down", "training session: Stopped", f"run folder: {tmp_path}"]
    assert "simulator process" not in report_module.report(alive)


def test_after_an_interrupt_a_simulator_that_no_longer_answers_is_given_a_moment_then_stopped(monkeypatch):
    """The group's Ctrl-C reached the simulator too: it refuses connections but has not exited yet."""
    from types import SimpleNamespace

    from local.stack import simulator_exit_code

    real = subprocess.Popen
    stopping = DYING_SIMULATOR.format(port=_free_port()).replace(
        "signal.signal(signal.SIGINT, signal.SIG_DFL)\nos.kill(os.getpid(), signal.SIGINT)", "import time; time.sleep(60)")
    monkeypatch.setattr(subprocess, "Popen", lambda args, **kw: real([sys.executable, "-c", stopping],
                                                                      **{k: v for k, v in kw.items() if k != "cwd"}))
    sim = SimulatorProcess(region="us-east-1", timeout=60)
    monkeypatch.setattr(subprocess, "Popen", real)
    try:
        stack = SimpleNamespace(simulator=sim)
        assert simulator_exit_code(stack) is None  # without settling: only a process that ended counts
        assert simulator_exit_code(stack, settle=0.5) == -signal.SIGTERM  # no answer, no end: stopped
        assert sim.proc.returncode == -signal.SIGTERM
    finally:
        sim.stop()


@pytest.fixture
def ctrl_c_in(monkeypatch):
    """``ctrl_c_in(seconds)``: a KeyboardInterrupt raised in the main thread that many seconds from now
    (as Ctrl-C raises it wherever the runner waits)."""
    def interrupt(*_):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    yield lambda seconds: signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, previous)


SILENT = "import time; time.sleep(120)"  # a service still loading its packages: not listening yet


REAL_POPEN = subprocess.Popen


def _spawning(monkeypatch) -> list[subprocess.Popen]:
    spawned: list[subprocess.Popen] = []

    def popen(args, **kwargs):
        spawned.append(REAL_POPEN([sys.executable, "-c", SILENT],
                                  **{k: v for k, v in kwargs.items() if k not in ("cwd", "env")}))
        return spawned[-1]

    monkeypatch.setattr(subprocess, "Popen", popen)
    return spawned


def test_a_ctrl_c_while_the_simulator_or_the_gateway_starts_leaves_neither_running(monkeypatch, ctrl_c_in):
    """Before: the process a constructor had spawned was not yet the stack's, so ``LocalStack.stop`` did not
    know it and it outlived run-local (a gateway left running by tests/e2e/test_local_interrupt.py under load)."""
    from local.gateway import GatewayProcess

    for what, start in (("simulator", lambda: SimulatorProcess(region="us-east-1", timeout=60)),
                        ("gateway", lambda: GatewayProcess({}, timeout=60))):
        spawned = _spawning(monkeypatch)
        ctrl_c_in(0.5)
        with pytest.raises(KeyboardInterrupt):
            start()
        monkeypatch.setattr(subprocess, "Popen", REAL_POPEN)
        assert len(spawned) == 1 and spawned[0].poll() is not None, f"the {what} process was left running"
