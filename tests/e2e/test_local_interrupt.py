"""Ctrl-C during `stepwise start --local`, as a terminal sends it (SIGINT to the whole process group): exit 130,
nothing left running (agents, gateway, simulator), the training session stopped by the run, and no
"asynchronous invocation dropped" warning (the services get their signal from the run, not the terminal)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.e2e


def test_ctrl_c_stops_everything(tmp_path):
    cmd = [sys.executable, "-m", "stepwise_cli", "start", "--local", str(ROOT / "examples" / "toy.json"),
           "--run-id", "e2e-interrupt", "--runs-dir", str(tmp_path), "--no-progress",
           "--set", "batch_size=4", "--set", "responses_per_prompt=4", "--set", "max_prompts=40"]
    # A shell that starts jobs in the background (CI under nohup, `cmd &`) leaves SIGINT ignored, and
    # Python then installs no KeyboardInterrupt handler: restore the default for the child.
    # Its own process group, which the SIGINT below reaches as a whole, as a terminal's Ctrl-C does.
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: (os.setpgrp(), signal.signal(signal.SIGINT, signal.SIG_DFL)))
    parent = psutil.Process(proc.pid)
    run_dir = tmp_path / "e2e-interrupt"
    deadline = time.monotonic() + 300  # the stack's start took over 120 s at a load average of 30: the
    # interrupt then came before the execution started (status NOT_STARTED, not the ABORTED this test is about)
    children: list[psutil.Process] = []
    while time.monotonic() < deadline:  # wait until rollouts are under way: the agent process exists
        children = parent.children(recursive=True)
        if len(children) >= 3 and (run_dir / "logs" / "agent-toy_agent.log").exists():
            break
        assert proc.poll() is None, proc.stdout.read()
        time.sleep(0.5)
    assert len(children) >= 3, "simulator, gateway and agent processes were started"
    time.sleep(3)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=90)
    assert proc.returncode == 130, out
    assert "interrupted" in out
    assert "asynchronous invocation dropped" not in out, out
    time.sleep(1)
    alive = [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"left running: {[c.cmdline() for c in alive]}"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "ABORTED"
    assert result["session_status"] == "Stopped"
