"""Operator commands without AWS setup end with one clear line and exit code 2, not a traceback."""

from __future__ import annotations

from stepwise_cli import main as cli


def test_no_region_is_one_clear_line(monkeypatch, capsys):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    assert cli.main(["runs"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("stepwise runs: no AWS region configured") and "Traceback" not in err


def test_a_region_name_botocore_refuses_is_one_clear_line(monkeypatch, capsys):
    """``stepwise models --region 'not a region'`` (or such an AWS_REGION): exit 2 naming the value, not
    botocore's InvalidRegionError traceback."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    for bad in ("not a region", "us-east-1'; x", "é"):
        assert cli.main(["models", "--json", "--no-templates", "--region", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"stepwise models: {bad!r} is not an AWS region name") and err.count("\n") == 1, err


def test_other_errors_still_raise():
    from botocore.exceptions import NoCredentialsError

    assert cli._aws_setup_error(NoCredentialsError()).startswith("no AWS credentials found")
    assert cli._aws_setup_error(ValueError("x")) is None
    from botocore.exceptions import EndpointConnectionError

    assert cli._aws_setup_error(EndpointConnectionError(endpoint_url="https://cloudformation.us-east-1.amazonaws.com/")) \
        == ("cannot reach the AWS endpoint https://cloudformation.us-east-1.amazonaws.com/: check the network (proxy, "
            "VPC endpoint) and the region")


def test_aws_region_alone_is_the_region_of_every_client_the_commands_build(monkeypatch, capsys):
    """Only ``AWS_REGION`` set (no ``AWS_DEFAULT_REGION``, no profile): the commands find the stack in that
    region. botocore reads only ``AWS_DEFAULT_REGION`` and the profile, so before the fix the
    CloudFormation client had no region and `stepwise runs` ended "no AWS region configured"."""
    import json

    import boto3
    from moto import mock_aws

    for name in ("AWS_DEFAULT_REGION", "AWS_PROFILE", "STEPWISE_BUCKET", "STEPWISE_STATE_MACHINE_ARN", "STEPWISE_STACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    with mock_aws():
        sm = "arn:aws:states:eu-west-3:123456789012:stateMachine:loop"
        template = {"Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
                    "Outputs": {"BucketName": {"Value": "runs-eu"}, "StateMachineArn": {"Value": sm}}}
        boto3.client("cloudformation", region_name="eu-west-3").create_stack(
            StackName="Stepwise", TemplateBody=json.dumps(template))
        boto3.client("s3", region_name="eu-west-3").create_bucket(
            Bucket="runs-eu", CreateBucketConfiguration={"LocationConstraint": "eu-west-3"})
        boto3.client("stepfunctions", region_name="eu-west-3").create_state_machine(
            name="loop", definition=json.dumps({"StartAt": "Done", "States": {"Done": {"Type": "Succeed"}}}),
            roleArn="arn:aws:iam::123456789012:role/StepwiseStates")
        assert cli.main(["runs"]) == 0, capsys.readouterr().err
        assert "no runs yet" in capsys.readouterr().out
    import os

    assert "AWS_DEFAULT_REGION" not in os.environ  # the command's copy is undone when it returns
