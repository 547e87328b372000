"""`stepwise.stackinfo`: the deployment from flags, then environment, then the CloudFormation stack's outputs."""

from __future__ import annotations

import json

import boto3
import pytest

from stepwise_cli.main import main
from stepwise import stackinfo
from stepwise.stackinfo import StackNotFound, resolve

SM_ARN = "arn:aws:states:us-east-1:123456789012:stateMachine:loop"


def _stack(name, outputs):
    template = {
        "Resources": {"Topic": {"Type": "AWS::SNS::Topic"}},
        "Outputs": {k: {"Value": v} for k, v in outputs.items()},
    }
    boto3.client("cloudformation").create_stack(StackName=name, TemplateBody=json.dumps(template))


def test_outputs_of_the_default_stack(moto_env):
    _stack("Stepwise", {"BucketName": "bkt-1", "StateMachineArn": SM_ARN, "GatewayUrl": "https://gw.example/",
                        "DashboardName": "Stepwise"})
    info = resolve(env={})
    assert (info.bucket, info.state_machine_arn, info.gateway_url, info.dashboard_name) == (
        "bkt-1", SM_ARN, "https://gw.example/", "Stepwise")
    assert info.region == "us-east-1" and info.source == "stack Stepwise"


def test_flags_beat_env_beat_stack(moto_env):
    _stack("Other", {"BucketName": "from-stack", "StateMachineArn": SM_ARN})
    info = resolve(env={"STEPWISE_STACK": "Other", "STEPWISE_BUCKET": "from-env"})
    assert (info.bucket, info.state_machine_arn) == ("from-env", SM_ARN)
    info = resolve(bucket="from-flag", stack_name="Other", env={"STEPWISE_BUCKET": "from-env"})
    assert info.bucket == "from-flag"
    # both given: CloudFormation is not asked (no stack named "Stepwise" exists here)
    info = resolve(env={"STEPWISE_BUCKET": "b", "STEPWISE_STATE_MACHINE_ARN": SM_ARN})
    assert info.source == "flags/env"


def test_missing_stack_and_missing_outputs_say_what_to_do(moto_env):
    with pytest.raises(StackNotFound, match="--bucket and --state-machine-arn"):
        resolve(env={})
    _stack("Half", {"BucketName": "b"})
    with pytest.raises(StackNotFound, match="StateMachineArn"):
        resolve(stack_name="Half", env={})


def test_commands_find_the_stack(moto_dep, capsys):
    _stack("Stepwise", {"BucketName": moto_dep.bucket, "StateMachineArn": moto_dep.state_machine_arn})
    assert main(["runs"]) == 0
    assert "no runs yet" in capsys.readouterr().out
    assert main(["runs", "--stack", "Nope"]) == 1
    assert "'Nope'" in capsys.readouterr().err


def test_output_keys_match_the_stack():
    from infra import stack

    assert (stack.OUTPUT_BUCKET, stack.OUTPUT_STATE_MACHINE, stack.OUTPUT_GATEWAY_URL, stack.OUTPUT_DASHBOARD) == (
        stackinfo.OUTPUT_BUCKET, stackinfo.OUTPUT_STATE_MACHINE, stackinfo.OUTPUT_GATEWAY_URL,
        stackinfo.OUTPUT_DASHBOARD)
