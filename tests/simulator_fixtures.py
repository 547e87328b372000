"""Shared pytest fixtures for the simulator tests: a running simulator and an SDK client."""

from __future__ import annotations

import pytest

from local.simulator import SimulatorHandle, start_simulator


@pytest.fixture(scope="module")
def sim() -> SimulatorHandle:
    handle = start_simulator()
    mp = pytest.MonkeyPatch()
    for key, value in handle.env.items():
        mp.setenv(key, value)
    yield handle
    mp.undo()
    handle.stop()


@pytest.fixture(scope="module")
def svc(sim):
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(
        role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path
    )
