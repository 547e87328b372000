"""run-local's simulator process (`local.stack.SimulatorProcess`): its URL and environment are read in
full however late the simulator starts speaking (on a loaded machine its first line can come after
the start timeout; cutting the environment off sent the handlers to the real SageMaker endpoints)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from local.stack import SimulatorProcess

LATE_SIMULATOR = r'''
import sys, time
time.sleep(1.0)
print("# SageMaker Training Sessions simulator on http://127.0.0.1:4567 (base model: stepwise-tiny)", flush=True)
print("export SAGEMAKER_TRAINING_SESSION_ENDPOINT=http://127.0.0.1:4567", flush=True)
print("export AWS_ENDPOINT_URL_SAGEMAKER=http://127.0.0.1:4567", flush=True)
print("# Ctrl-C to stop.", flush=True)
time.sleep(60)
'''


def _fake_simulator(monkeypatch, script: str) -> None:
    real = subprocess.Popen

    def popen(args, **kwargs):
        return real([sys.executable, "-c", script], **{k: v for k, v in kwargs.items() if k != "cwd"})

    monkeypatch.setattr(subprocess, "Popen", popen)


def test_a_simulator_that_starts_after_the_timeout_still_hands_over_its_whole_environment(monkeypatch):
    _fake_simulator(monkeypatch, LATE_SIMULATOR)
    sim = SimulatorProcess(region="us-east-1", timeout=0.2)
    try:
        assert sim.url == "http://127.0.0.1:4567"
        assert sim.env == {"SAGEMAKER_TRAINING_SESSION_ENDPOINT": "http://127.0.0.1:4567",
                           "AWS_ENDPOINT_URL_SAGEMAKER": "http://127.0.0.1:4567"}
    finally:
        sim.stop()


def test_a_simulator_that_reports_no_endpoint_is_refused(monkeypatch):
    _fake_simulator(monkeypatch, LATE_SIMULATOR.replace('print("export AWS_ENDPOINT_URL_SAGEMAKER=http://127.0.0.1:4567", flush=True)', ""))
    with pytest.raises(RuntimeError, match="did not report its URL and environment"):
        SimulatorProcess(region="us-east-1", timeout=5)
