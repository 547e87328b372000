"""Find a deployment: the run bucket, the state machine and the gateway URL of a Stepwise stack.

The operator commands (`stepwise start|watch|stop|resume|runs`) need three values the stack
creates. They are looked up, per value, in this order:

1. an explicit argument (the commands' ``--bucket`` / ``--state-machine-arn`` / ``--gateway-url``);
2. the environment: ``STEPWISE_BUCKET``, ``STEPWISE_STATE_MACHINE_ARN``, ``STEPWISE_GATEWAY_URL``;
3. the outputs of the deployed CloudFormation stack (``DescribeStacks``), named by ``--stack`` or
   ``STEPWISE_STACK`` (default ``Stepwise``, the name ``app.py`` deploys). Output keys are the
   ones ``infra/stack.py`` declares (``OUTPUT_*`` there; a test pins that they agree).

CloudFormation is asked only when a value is still missing after 1 and 2, so the commands also
work against moto or the local stack, where no stack exists.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from stepwise.settings import ENV_BUCKET, ENV_GATEWAY_URL

DEFAULT_STACK_NAME = "Stepwise"

#: CloudFormation output keys of the stack (mirror ``infra.stack.OUTPUT_*``; kept here so the
#: CLI need not import aws_cdk).
OUTPUT_BUCKET = "BucketName"
OUTPUT_STATE_MACHINE = "StateMachineArn"
OUTPUT_GATEWAY_URL = "GatewayUrl"
OUTPUT_DASHBOARD = "DashboardName"

ENV_STACK = "STEPWISE_STACK"
ENV_STATE_MACHINE = "STEPWISE_STATE_MACHINE_ARN"


class StackNotFound(LookupError):
    """The stack (or one of its outputs) cannot be found; the message says what was tried."""


@dataclass(frozen=True)
class StackInfo:
    """Where a deployment lives.

    Attributes:
        bucket: the run bucket name.
        state_machine_arn: the training loop's ARN (``arn:aws:states:REGION:ACCOUNT:stateMachine:NAME``).
        gateway_url: the agents' LLM base URL ('' when unknown; only informational for the CLI).
        dashboard_name: the CloudWatch dashboard ('' when unknown).
        region: the region of the state machine (parsed from its ARN).
        source: where the values came from, e.g. ``"flags/env"`` or ``"stack Stepwise"``.
    """

    bucket: str
    state_machine_arn: str
    gateway_url: str = ""
    dashboard_name: str = ""
    source: str = ""

    @property
    def region(self) -> str:
        return region_of_arn(self.state_machine_arn)


def region_of_arn(arn: str) -> str:
    """The region field of an ARN (``arn:PARTITION:SERVICE:REGION:...``); '' if it has none."""
    parts = arn.split(":")
    return parts[3] if len(parts) > 4 and parts[0] == "arn" else ""


def stack_outputs(stack_name: str, cfn: Any) -> dict[str, str]:
    """``{OutputKey: OutputValue}`` of a deployed stack.

    Raises:
        StackNotFound: the stack does not exist (message names the stack and how to override).
    """
    from botocore.exceptions import ClientError

    try:
        stacks = cfn.describe_stacks(StackName=stack_name)["Stacks"]
    except ClientError as e:
        msg = e.response.get("Error", {}).get("Message", str(e))
        raise StackNotFound(
            f"cannot read CloudFormation stack {stack_name!r}: {msg}. Deploy it (cdk deploy), name it with "
            f"--stack / {ENV_STACK}, or pass --bucket and --state-machine-arn"
        ) from None
    if not stacks:
        raise StackNotFound(f"CloudFormation stack {stack_name!r} not found")
    return {o["OutputKey"]: o["OutputValue"] for o in stacks[0].get("Outputs", []) or []}


def resolve(
    *,
    stack_name: str | None = None,
    bucket: str | None = None,
    state_machine_arn: str | None = None,
    gateway_url: str | None = None,
    cfn: Any = None,
    region: str | None = None,
    env: dict[str, str] | None = None,
) -> StackInfo:
    """The deployment's values: arguments, then environment, then the stack's outputs (see module doc).

    Args:
        cfn: a boto3 CloudFormation client (default: one for ``region``), used only when needed.
        env: the environment to read (default ``os.environ``).

    Raises:
        StackNotFound: the bucket or the state machine is still unknown after all three sources.
    """
    env = os.environ if env is None else env
    bucket = bucket or env.get(ENV_BUCKET) or ""
    state_machine_arn = state_machine_arn or env.get(ENV_STATE_MACHINE) or ""
    gateway_url = gateway_url or env.get(ENV_GATEWAY_URL) or ""
    dashboard = ""
    source = "flags/env"
    if not (bucket and state_machine_arn):
        name = stack_name or env.get(ENV_STACK) or DEFAULT_STACK_NAME
        if cfn is None:
            import boto3

            cfn = boto3.client("cloudformation", region_name=region) if region else boto3.client("cloudformation")
        outputs = stack_outputs(name, cfn)
        bucket = bucket or outputs.get(OUTPUT_BUCKET, "")
        state_machine_arn = state_machine_arn or outputs.get(OUTPUT_STATE_MACHINE, "")
        gateway_url = gateway_url or outputs.get(OUTPUT_GATEWAY_URL, "")
        dashboard = outputs.get(OUTPUT_DASHBOARD, "")
        missing = [k for k, v in ((OUTPUT_BUCKET, bucket), (OUTPUT_STATE_MACHINE, state_machine_arn)) if not v]
        if missing:
            raise StackNotFound(
                f"stack {name!r} has no output(s) {missing} (outputs: {sorted(outputs)}); is it a Stepwise stack?"
            )
        source = f"stack {name}"
    return StackInfo(bucket=bucket, state_machine_arn=state_machine_arn, gateway_url=gateway_url,
                     dashboard_name=dashboard, source=source)
