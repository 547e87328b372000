"""Helpers for the simulator tests: a running simulator, raw boto3 clients on it, sessions, polls.

The module-scoped fixtures ``sim`` and ``svc`` are in ``tests/simulator/conftest.py``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from local.simulator import SimulatorHandle, start_simulator


def running_simulator(**options) -> Iterator[SimulatorHandle]:
    """Yield a simulator started with ``options``, its environment exported; stop it afterwards."""
    handle = start_simulator(**options)
    mp = pytest.MonkeyPatch()
    for key, value in handle.env.items():
        mp.setenv(key, value)
    try:
        yield handle
    finally:
        mp.undo()
        handle.stop()


def session_request(sim: SimulatorHandle, name: str) -> dict:
    """CreateTrainingSession parameters for the tiny model on ``sim`` (LoRA rank 8, alpha 16)."""
    return {
        "TrainingSessionName": name,
        "ModelPackageGroupArn": sim.model_package_group_arn,
        "LoraConfig": {"Rank": 8, "Alpha": 16},
        "RoleArn": sim.role_arn,
        "ModelConfig": {"BaseModelArn": f"arn:aws:sagemaker:{sim.region}:aws:hub-content/SageMakerPublicHub/Model/stepwise-tiny/1.0.0"},
        "OutputConfig": {"S3Location": {"Path": sim.s3_output_path}},
    }


def create_session(sim: SimulatorHandle, name: str, timeout: float = 10.0) -> str:
    """Create a training session with raw boto3 and wait until it is Running; returns its name."""
    import time

    sm = control_client(sim)
    sm.create_training_session(**session_request(sim, name))
    deadline = time.monotonic() + timeout
    while sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]["TrainingSessionStatus"] != "Running":
        assert time.monotonic() < deadline, f"session {name} did not reach Running"
        time.sleep(0.05)
    return name


def _client(sim: SimulatorHandle, service: str):
    """A boto3 client of ``service`` on ``sim`` that sends each call once (no retries)."""
    import boto3
    from botocore.config import Config

    return boto3.client(
        service,
        endpoint_url=sim.url,
        region_name=sim.region,
        config=Config(retries={"mode": "standard", "total_max_attempts": 1}),
        **_credentials(sim),
    )


def runtime_client(sim: SimulatorHandle):
    return _client(sim, "sagemakertrainingsessionruntime")


def control_client(sim: SimulatorHandle):
    return _client(sim, "sagemaker")


def _credentials(sim: SimulatorHandle) -> dict[str, str]:
    if "AWS_ACCESS_KEY_ID" not in sim.env:
        return {}  # the environment has credentials of its own
    return {"aws_access_key_id": sim.env["AWS_ACCESS_KEY_ID"], "aws_secret_access_key": sim.env["AWS_SECRET_ACCESS_KEY"]}


def wait_op(rt, session: str, op_id: str, *, sampling: bool = False, timeout: float = 10.0) -> dict:
    """Poll an operation until it leaves Pending/InProgress; returns the last answer."""
    import time

    get = rt.get_sampling_operation_result if sampling else rt.get_training_operation_result
    deadline = time.monotonic() + timeout
    while True:
        resp = get(trainingSessionName=session, operationId=op_id)
        if resp["status"] not in ("Pending", "InProgress") or time.monotonic() > deadline:
            return resp
        time.sleep(0.02)


def unique_name(prefix: str) -> str:
    """A valid, unique training-session name starting with ``prefix``."""
    import re
    import uuid

    cleaned = re.sub(r"[^a-zA-Z0-9]+", "-", prefix)[:40].strip("-") or "s"
    return f"{cleaned}-{uuid.uuid4().hex[:8]}"
