"""Fixtures shared across test folders (pytest finds them here; no test module imports them).

``stack``: the pipeline stack (moto S3 + Step Functions, the SageMaker simulator; ``tests/support/pipeline.py``),
one per test module, for the handler tests and drills. Modules that need another kind of stack
(the gateway's, the local stack's) define their own ``stack``, which overrides this one.

``moto_env`` and ``moto_dep``: a moto deployment for the operator commands (``tests/cli/``) and
the reference-config tests (``tests/config/``); the deployment's data and helpers are in
``tests/support/cli.py``. Imports are inside the fixtures, so collecting a folder that does not
use them (the 3.13 rehearsal's fast tests, say) does not import moto.
"""

from __future__ import annotations

import json

import pytest

from tests.support.cli import BUCKET, DEFINITION, REGION, ROLE, MotoDeployment


@pytest.fixture
def moto_env(monkeypatch):
    """Moto for S3 and Step Functions (executions run), the deployment's variables cleared."""
    from moto import mock_aws

    for key in ("STEPWISE_BUCKET", "STEPWISE_STATE_MACHINE_ARN", "STEPWISE_GATEWAY_URL", "STEPWISE_STACK",
                "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SFN", "AWS_PROFILE"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws(config={"stepfunctions": {"execute_state_machine": True}}):
        yield


@pytest.fixture
def moto_dep(moto_env) -> MotoDeployment:
    """The bucket and the stand-in state machine (``tests/support/cli.py``'s ``DEFINITION``) on moto."""
    import boto3

    s3 = boto3.client("s3", region_name=REGION)
    s3.create_bucket(Bucket=BUCKET)
    sfn = boto3.client("stepfunctions", region_name=REGION)
    arn = sfn.create_state_machine(name="stepwise-test-loop", definition=json.dumps(DEFINITION),
                                   roleArn=ROLE)["stateMachineArn"]
    return MotoDeployment(BUCKET, arn, s3, sfn)


@pytest.fixture(scope="module")
def stack():
    """A pipeline :class:`tests.support.pipeline.Stack` for the module; stopped after it."""
    from tests.support.pipeline import Stack

    s = Stack()
    yield s
    s.stop()
