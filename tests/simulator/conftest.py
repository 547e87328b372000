"""The simulator folder's fixtures: one running simulator per test module, and an SDK client on it.

Modules that need a simulator started with options define their own ``sim`` (a module's fixture
overrides this one) with ``tests.support.simulator.running_simulator``.
"""

from __future__ import annotations

import pytest

from tests.support.simulator import running_simulator


@pytest.fixture(scope="module")
def sim():
    """A simulator with default options, its environment exported for the module; stopped after it."""
    yield from running_simulator()


@pytest.fixture(scope="module")
def svc(sim):
    """The SDK's ``ServiceClient`` on ``sim`` (its role, model package group and output path)."""
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(
        role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path
    )
