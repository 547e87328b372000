"""The local stack's resources, the same ones the stack creates: the run bucket with its notifications, one
Lambda function per `stepwise.functions` entry (routed to the real handlers by `local.dispatch`), the state
machine from ``state_machine/``; made in the moto server `local.engine.MotoServer` runs."""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from local.engine import ACCOUNT_ID, REGION
from stepwise.layout import RESULTS_PREFIX, RUNS_PREFIX, SUMMARY_NAME

if TYPE_CHECKING:
    from local.engine import MotoServer

LAMBDA_ROLE_NAME = "stepwise-local-lambda"
STATE_MACHINE_ROLE_NAME = "stepwise-local-states"


# --------------------------------------------------------------------------------------
# Resources: the same ones the stack creates
# --------------------------------------------------------------------------------------


@dataclass
class LocalResources:
    """What ``create_resources`` made: names and ARNs the runner needs."""

    bucket: str
    state_machine_arn: str
    function_arns: dict[str, str]
    definition: str
    group_state_machine_arn: str = ""  # the rollout group state machine (admission: group)


def _ensure_role(iam: Any, name: str, service: str) -> str:
    doc = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})
    try:
        return iam.create_role(RoleName=name, AssumeRolePolicyDocument=doc)["Role"]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        return iam.get_role(RoleName=name)["Role"]["Arn"]


def local_function_name(prefix: str, logical: str) -> str:
    return f"{prefix}-{logical}"


def create_functions(moto: MotoServer, *, prefix: str = "stepwise-local") -> dict[str, str]:
    """Create one moto Lambda per ``stepwise.functions.FUNCTIONS`` entry, routed in-process.

    Returns logical name -> function ARN. The environment is the one the stack gives
    (``functions.environment``), set on the moto function and in this process's environment
    (restored by ``MotoServer.stop``).
    """
    from stepwise import functions, settings

    lam = moto.client("lambda")
    role = _ensure_role(moto.client("iam"), LAMBDA_ROLE_NAME, "lambda.amazonaws.com")
    env = functions.environment(bucket=os.environ.get("STEPWISE_BUCKET", ""),
                                gateway_url=os.environ.get("STEPWISE_GATEWAY_URL", ""),
                                data_buckets=os.environ.get(settings.ENV_DATA_BUCKETS, ""),
                                agent_runtime_arns=os.environ.get(settings.ENV_AGENT_RUNTIME_ARNS, ""),
                                judge_model_ids=os.environ.get(settings.ENV_JUDGE_MODEL_IDS, ""))
    # Handlers run in this process: they see the stack's environment (plus the local endpoints
    # already set here). Every function gets the same one, so the process env can carry it.
    moto.set_env(env)
    arns: dict[str, str] = {}
    for spec in functions.FUNCTIONS:
        name = local_function_name(prefix, spec.name)
        try:
            arn = lam.create_function(
                FunctionName=name,
                Role=role,
                PackageType="Image",
                Code={"ImageUri": f"{ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/stepwise:local"},
                ImageConfig={"Command": [spec.handler]},
                MemorySize=spec.memory_mb,
                Timeout=spec.timeout_s,
                Description=spec.description[:256],
                Environment={"Variables": env},
            )["FunctionArn"]
        except lam.exceptions.ResourceConflictException:
            # moto's backends outlive a server in this process: a function left by an earlier
            # local stack must take this stack's environment, not keep the old one.
            arn = lam.update_function_configuration(
                FunctionName=name, MemorySize=spec.memory_mb, Timeout=spec.timeout_s,
                Environment={"Variables": env},
            )["FunctionArn"]
        moto.dispatcher.register(name, handler_path=spec.handler, memory_mb=spec.memory_mb,
                                 timeout_s=spec.timeout_s, arn=arn, beside_loop=spec.beside_loop)
        arns[spec.name] = arn
    return arns


def create_bucket(moto: MotoServer, bucket: str, *, result_function_arn: str | None,
                  track_function_arn: str | None = None) -> None:
    """The run bucket, with the stack's ObjectCreated notifications: ``rollout-results/`` ->
    OnRolloutResult, and (when given) ``runs/`` + suffix ``summary.json`` -> Track."""
    s3 = moto.client("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)
    configs = []
    if result_function_arn:
        configs.append({
            "Id": "rollout-results",
            "LambdaFunctionArn": result_function_arn,
            "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": RESULTS_PREFIX}]}},
        })
    if track_function_arn:
        configs.append({
            "Id": "summaries",
            "LambdaFunctionArn": track_function_arn,
            "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": RUNS_PREFIX},
                                               {"Name": "suffix", "Value": SUMMARY_NAME}]}},
        })
    if configs:
        s3.put_bucket_notification_configuration(Bucket=bucket,
                                                 NotificationConfiguration={"LambdaFunctionConfigurations": configs})


def create_state_machine(moto: MotoServer, name: str, definition: str) -> str:
    """A STANDARD state machine with ``definition`` (already substituted). Returns its ARN."""
    sfn = moto.client("stepfunctions")
    role = _ensure_role(moto.client("iam"), STATE_MACHINE_ROLE_NAME, "states.amazonaws.com")
    for sm in sfn.list_state_machines()["stateMachines"]:
        if sm["name"] == name:
            sfn.update_state_machine(stateMachineArn=sm["stateMachineArn"], definition=definition)
            return sm["stateMachineArn"]
    return sfn.create_state_machine(name=name, definition=definition, roleArn=role, type="STANDARD")["stateMachineArn"]


def state_machine_arn_for(name: str) -> str:
    return f"arn:aws:states:{REGION}:{ACCOUNT_ID}:stateMachine:{name}"
