"""The synthesized stack, once per pytest process and context (a synthesis takes about 8 s).

``synthesized()`` is the default app (``cdk.json``'s context, cdk-nag applied), as ``cdk synth``
builds it; ``synthesized(SCOPED_CONTEXT)`` sets every context value the stack accepts. Each call
returns the same stack and a fresh copy of its template (tests may not share mutations).
"""

from __future__ import annotations

import copy
import functools
import json
import os
import re
from typing import Any

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

REGION = "us-west-2"
ACCOUNT = "111122223333"
RUNTIME = f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:runtime/toy_agent-AbC123"
SM_ROLE = f"arn:aws:iam::{ACCOUNT}:role/StepwiseSageMakerSessions"
AGENT_ROLE = f"arn:aws:iam::{ACCOUNT}:role/AgentCoreRuntimeRole"
TOPIC = f"arn:aws:sns:{REGION}:{ACCOUNT}:stepwise-runs"
KMS_KEY = f"arn:aws:kms:{REGION}:{ACCOUNT}:key/1234abcd-12ab-34cd-56ef-1234567890ab"
MLFLOW_SERVER = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-tracking-server/stepwise"
MLFLOW_APP = f"arn:aws:sagemaker:{REGION}:{ACCOUNT}:mlflow-app/app-0123456789ab"
DATA_BUCKETS = ("my-datasets", "my-session-outputs")
WANDB_SECRET = f"arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:stepwise/wandb-AbC123"
GATEWAY_CONCURRENCY = 200
#: The group judge's models: a cross-Region inference profile and an on-demand foundation model.
JUDGE_MODELS = ("us.amazon.nova-micro-v1:0", "amazon.nova-lite-v1:0")

#: Every context value the stack accepts, set.
SCOPED_CONTEXT: dict[str, Any] = {
    "agentRuntimeArns": RUNTIME, "sagemakerRoleArns": SM_ROLE, "agentRoleArns": AGENT_ROLE,
    "notificationTopicArn": TOPIC, "stackName": "StepwiseScoped", "kmsKeyArn": KMS_KEY,
    "mlflowTrackingServerArns": f"{MLFLOW_SERVER},{MLFLOW_APP}", "dataBuckets": ",".join(DATA_BUCKETS),
    "gatewayReservedConcurrency": str(GATEWAY_CONCURRENCY), "wandbApiKeySecretArn": WANDB_SECRET,
    "sessionStartTimeoutSeconds": "3600", "pollSeconds": "30", "createSageMakerRole": "true", "deployMathAgent": "true",
    "judgeModelIds": ",".join(JUDGE_MODELS),
}


@functools.lru_cache(maxsize=None)
def _synth(context_json: str) -> tuple[Any, dict]:
    from aws_cdk import assertions

    from app import build_app

    _, stack = build_app(json.loads(context_json) or None)
    return stack, assertions.Template.from_stack(stack).to_json()


def synthesized(context: dict[str, Any] | None = None) -> tuple[Any, dict]:
    """``(stack, template)`` of the app built with ``context`` over ``cdk.json``'s."""
    stack, template = _synth(json.dumps(context or {}, sort_keys=True))
    return stack, copy.deepcopy(template)


# --- CloudFormation values as the deployed strings ---------------------------------------

#: Pseudo parameters as CloudFormation sets them in the commercial partition, in ``REGION``.
PSEUDO = {"AWS::Partition": "aws", "AWS::Region": REGION, "AWS::AccountId": ACCOUNT, "AWS::URLSuffix": "amazonaws.com",
          "AWS::StackName": "Stepwise"}


def physical_name(logical_id: str) -> str:
    """A plausible physical name for a resource CloudFormation names (S3-safe: lowercase, <= 63)."""
    return f"stepwise-{logical_id.lower()}"[:63]


def _ref(template: dict, name: str) -> str:
    if name in PSEUDO:
        return PSEUDO[name]
    resource = template["Resources"][name]
    props, kind = resource.get("Properties", {}), resource["Type"]
    if kind == "AWS::StepFunctions::StateMachine":
        return f"arn:aws:states:{REGION}:{ACCOUNT}:stateMachine:{physical_name(name)}"
    if kind == "AWS::SNS::Topic":
        return f"arn:aws:sns:{REGION}:{ACCOUNT}:{physical_name(name)}"
    if kind == "AWS::Logs::LogGroup" and isinstance(props.get("LogGroupName"), str):
        return props["LogGroupName"]
    return physical_name(name)


def _get_att(template: dict, name: str, attr: str) -> str:
    kind = template["Resources"][name]["Type"]
    ref = _ref(template, name)
    arns = {
        "AWS::S3::Bucket": f"arn:aws:s3:::{ref}",
        "AWS::Lambda::Function": f"arn:aws:lambda:{REGION}:{ACCOUNT}:function:{ref}",
        "AWS::IAM::Role": f"arn:aws:iam::{ACCOUNT}:role/{ref}",
        # CloudFormation's LogGroup Arn attribute ends with ':*'
        "AWS::Logs::LogGroup": f"arn:aws:logs:{REGION}:{ACCOUNT}:log-group:{ref}:*",
        "AWS::StepFunctions::StateMachine": ref,
    }
    if attr == "Arn" and kind in arns:
        return arns[kind]
    if kind == "AWS::StepFunctions::StateMachine" and attr == "Name":
        return physical_name(name)
    if kind == "AWS::BedrockAgentCore::Runtime" and attr == "AgentRuntimeArn":
        return f"arn:aws:bedrock-agentcore:{REGION}:{ACCOUNT}:runtime/{physical_name(name).replace('-', '_')}-AbC123dEf4"
    if kind == "AWS::Lambda::Url" and attr == "FunctionUrl":
        return f"https://{physical_name(name)}.lambda-url.{REGION}.on.aws/"
    raise ValueError(f"no plausible value for Fn::GetAtt {name}.{attr} ({kind})")


def resolve(value: Any, template: dict) -> Any:
    """``value`` with every ``Ref``/``Fn::GetAtt``/``Fn::Join``/``Fn::Select``/``Fn::Split``/``Fn::Sub`` replaced by
    the string CloudFormation would put there (pseudo parameters from :data:`PSEUDO`, physical
    names from :func:`physical_name`), so validators see deployed values, not tokens.

    Raises:
        ValueError: an intrinsic this resolver does not know (named).
    """
    if isinstance(value, list):
        return [resolve(v, template) for v in value]
    if not isinstance(value, dict):
        return value
    if len(value) == 1:
        (fn, arg), = value.items()
        if fn == "Ref":
            return _ref(template, arg)
        if fn == "Fn::GetAtt":
            name, attr = arg if isinstance(arg, list) else arg.split(".", 1)
            return _get_att(template, name, attr)
        if fn == "Fn::Join":
            return arg[0].join(str(resolve(p, template)) for p in arg[1])
        if fn == "Fn::Select":
            return resolve(arg[1], template)[int(arg[0])]
        if fn == "Fn::Split":
            return str(resolve(arg[1], template)).split(arg[0])
        if fn == "Fn::Sub" and isinstance(arg, str):  # CDK's asset repositories: pseudo parameters only
            return re.sub(r"\$\{([^}]+)\}", lambda m: str(resolve({"Ref": m.group(1)}, template)), arg)
        if fn.startswith("Fn::") or fn == "Condition":
            raise ValueError(f"resolve() does not know {fn}: {json.dumps(value)[:200]}")
    return {k: resolve(v, template) for k, v in value.items()}
