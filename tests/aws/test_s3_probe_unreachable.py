"""The S3 lookups of the refusals before billing (`stepwise.aws.s3_probe`) answer a problem in words when
S3 cannot be asked at all (no endpoint, no credentials), as `stepwise.aws.agentcore` does, instead
of raising botocore's error out of `stepwise validate --check-aws` or Init. Real botocore clients,
pointed at a closed local port or given no credentials."""

from __future__ import annotations

import socket

import boto3
import pytest
from botocore.config import Config

from stepwise.aws.s3_probe import bucket_problem, prefix_problem


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def unreachable_s3():
    return boto3.client("s3", region_name="us-east-1", endpoint_url=f"http://127.0.0.1:{_closed_port()}",
                        aws_access_key_id="x", aws_secret_access_key="x",
                        config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=1))


@pytest.fixture
def no_credentials_s3(monkeypatch, tmp_path):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return boto3.session.Session().client("s3", region_name="us-east-1",
                                          endpoint_url=f"http://127.0.0.1:{_closed_port()}")


@pytest.mark.parametrize("client", ["unreachable_s3", "no_credentials_s3"])
def test_a_lookup_s3_cannot_answer_is_a_problem_not_an_exception(client, request):
    s3 = request.getfixturevalue(client)
    problem = bucket_problem(s3, "my-bucket")
    assert problem.startswith("bucket 'my-bucket' cannot be checked (HeadBucket: "), problem
    problem = prefix_problem(s3, "my-bucket", "tok")
    assert problem.startswith("prefix s3://my-bucket/tok/ cannot be listed (ListObjectsV2: "), problem
