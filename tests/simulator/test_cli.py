"""`stepwise simulator --port N`: prints the exports, serves, stops on Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import ClientError

REPO = Path(__file__).resolve().parents[2]


def test_cli_prints_exports_serves_and_stops_on_ctrl_c():
    # No AWS settings inherited: the simulator prints dummy ones, and only then.
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "stepwise_cli", "simulator", "--port", "0", "--fault", "throttle:ListTrainingSessions:1"],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=child_env,
        # A shell that starts jobs in the background (CI under nohup, `cmd &`) leaves SIGINT ignored,
        # and Python then installs no KeyboardInterrupt handler: restore the default for the child.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        env: dict[str, str] = {}
        for line in proc.stdout:
            if line.startswith("export "):
                key, _, value = line[len("export "):].strip().partition("=")
                env[key] = value
            if line.startswith("# Ctrl-C"):
                break
        assert env["SAGEMAKER_TRAINING_SESSION_ENDPOINT"].startswith("http://127.0.0.1:")
        assert env["AWS_ENDPOINT_URL_SAGEMAKER"] == env["SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT"]
        sm = boto3.client(
            "sagemaker", endpoint_url=env["AWS_ENDPOINT_URL_SAGEMAKER"], region_name=env["AWS_REGION"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"], aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        )
        with pytest.raises(ClientError) as exc:
            sm.describe_training_session(TrainingSessionName="nothing-here")
        assert exc.value.response["Error"]["Code"] == "ResourceNotFound"
        # The --fault flag armed one throttle; botocore's standard retry absorbs it.
        assert sm.list_training_sessions()["TrainingSessionSummaries"] == []
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
