"""Least-privilege IAM for each Lambda: what each function may do, as named capabilities.

Every IAM action the stack grants a function comes from one :class:`Capability`, and
:data:`FUNCTION_CAPABILITIES` says which function holds which. The SageMaker action names
are the operation names of botocore's models (``sagemaker`` control plane and
``sagemakertrainingsessionruntime``, whose signing name is ``sagemaker``), as the SDK
``sagemaker.train.training_session`` calls them:
CreateTrainingSession / DescribeTrainingSession / StopTrainingSession
(``ServiceClient.create_lora_training_client``, ``_wait_until_running``, ``stop_session``),
ExecuteTrainingOperation / GetTrainingOperationResult (forward_backward, optim_step,
save_weights, save_state), ExecuteSamplingOperation / GetSamplingOperationResult
(sample, load_weights_for_sampling), DescribeHubContent / ListHubContents on
``SageMakerPublicHub`` (``resolve_base_model``, ``list_base_models``, ``load_tokenizer``) and
DescribeModelPackage / DescribeModelPackageGroup (``create_training_client_from_state*``).
"""

from __future__ import annotations

import enum

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3

from stepwise.layout import DATASETS_PREFIX, RESULTS_PREFIX, RUNS_PREFIX, SESSIONS_PREFIX, run_sessions_prefix, tokenizer_prefix

PUBLIC_HUB = "SageMakerPublicHub"
#: Init names every training session ``stepwise-{run}-{hash}`` (``stepwise.core.phases.session_name_for``).
SESSION_NAME_PATTERN = "stepwise-*"
#: The SDK's defaults when a run config leaves them blank (``ServiceClient._auto_create_mpg``,
#: ``ServiceClient._default_s3_output_path`` -> ``Session.default_bucket()``).
SDK_DEFAULT_MODEL_PACKAGE_GROUP = "sagemaker-default"


class Capability(enum.Enum):
    """One concern a function needs permissions for (see :func:`statements`)."""

    RUN_STATE = "read/write runs/*, read datasets/*"
    GATEWAY_SESSIONS = "read/write gateway session records sessions/*"
    READ_RESULTS = "read agent result objects rollout-results/*"
    GATEWAY_S3 = "read sessions/* and runs/*/tokenizer/*, write runs/*/sessions/* (captured turns)"
    SESSION_LIFECYCLE = "create/describe/stop training sessions, pass the session role, read the public hub and model packages"
    SESSION_DESCRIBE = "describe training sessions"
    SESSION_STOP = "stop and describe training sessions"
    TRAINING_OPS = "submit and read training operations"
    SAMPLING_OPS = "submit and read sampling operations"
    MODEL_PACKAGES_READ = "describe model packages (checkpoints)"
    INVOKE_AGENT = "InvokeAgentRuntime on the configured ACR runtimes"
    LOOKUP_AGENT = "GetAgentRuntime of the configured ACR runtimes (Init's refusal before billing)"
    TASK_RESPONSE = "SendTaskSuccess/Failure/Heartbeat for the training loop's callback tasks"
    CONTINUE_RUN = "StartExecution of the training loop (continue the run as a new execution)"
    READ_HISTORY = "GetExecutionHistory of the training loop's executions (PlanStep's history budget)"
    DATA_READ = "read datasets and tokenizers in the dataBuckets"
    DATA_READ_WRITE = "read and write the dataBuckets (datasets, tokenizers, s3_output_path)"
    TRACKING = "log params and metrics to the configured SageMaker managed MLflow tracking servers"


C = Capability

#: Actions of the capabilities that name the state machine (granted by ``infra.state_machine``).
STATE_MACHINE_ACTIONS: dict[Capability, tuple[str, ...]] = {
    Capability.CONTINUE_RUN: ("states:StartExecution", "states:DescribeExecution"),
    Capability.READ_HISTORY: ("states:GetExecutionHistory",),
}
#: Task-token responses: the Service Authorization Reference lists no resource type for them
#: (the token, here from a Distributed Map child execution, is the authorization), so '*'.
TASK_RESPONSE_ACTIONS = ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat")
#: What ``stepwise.aws.tracking`` asks an MLflow tracking server, as ``sagemaker-mlflow`` IAM actions
#: (named after MLflow's REST messages): ``get_experiment_by_name``, ``create_experiment``,
#: ``search_runs``, ``create_run``, ``log_batch`` (params and metrics), ``set_terminated``.
MLFLOW_ACTIONS = (
    "sagemaker-mlflow:GetExperimentByName", "sagemaker-mlflow:CreateExperiment", "sagemaker-mlflow:SearchRuns",
    "sagemaker-mlflow:CreateRun", "sagemaker-mlflow:LogBatch", "sagemaker-mlflow:UpdateRun",
)
#: What CreateTrainingSession needs of the caller on a customer managed key (training sessions
#: prerequisites: the KMS permissions "to use a customer managed key through SageMaker AI"),
#: allowed only on requests SageMaker makes for the caller (``kms:ViaService``).
KMS_SESSION_ACTIONS = ("kms:CreateGrant", "kms:DescribeKey", "kms:GenerateDataKey", "kms:Decrypt")
#: Function name (``FunctionSpec.name``, or ``Gateway``) -> its capabilities. A function
#: missing here gets only RUN_STATE, and tests/infra/test_stack_iam_coverage.py fails naming it.
FUNCTION_CAPABILITIES: dict[str, frozenset[Capability]] = {
    # Init looks the agent runtime up before any session (stepwise.core.preflight): the runtimes StartRollout may invoke.
    "Init": frozenset({C.RUN_STATE, C.SESSION_LIFECYCLE, C.DATA_READ_WRITE, C.LOOKUP_AGENT}),
    # PollSession also drives the resume phase (load_state, save_weights, load_weights_for_sampling).
    "PollSession": frozenset({C.RUN_STATE, C.SESSION_DESCRIBE, C.TRAINING_OPS, C.SAMPLING_OPS, C.MODEL_PACKAGES_READ}),
    # PlanStep reads its execution's history length before each step (continue-as-new on a budget).
    "PlanStep": frozenset({C.RUN_STATE, C.DATA_READ, C.READ_HISTORY}),
    "StartRollout": frozenset({C.RUN_STATE, C.GATEWAY_SESSIONS, C.INVOKE_AGENT}),
    "OnRolloutResult": frozenset({C.RUN_STATE, C.GATEWAY_SESSIONS, C.READ_RESULTS, C.TASK_RESPONSE}),
    "FinishRollout": frozenset({C.RUN_STATE, C.GATEWAY_SESSIONS, C.READ_RESULTS}),
    # The functions that publish summaries (handlers._common.write_summary) or end the MLflow run
    # (handlers.session.stop_owned_session) hold TRACKING.
    "ComputeAdvantages": frozenset({C.RUN_STATE, C.TRACKING}),
    "RecordEval": frozenset({C.RUN_STATE, C.TRACKING}),
    # The operation driver (``stepwise.aws.sagemaker.drive``: SubmitTrain, PollOperation, Rebind, Checkpoint,
    # PollSession) may submit or poll either kind of operation.
    "SubmitTrain": frozenset({C.RUN_STATE, C.TRAINING_OPS, C.SAMPLING_OPS}),
    "PollOperation": frozenset({C.RUN_STATE, C.TRAINING_OPS, C.SAMPLING_OPS}),
    "Rebind": frozenset({C.RUN_STATE, C.TRAINING_OPS, C.SAMPLING_OPS, C.TRACKING}),
    "Checkpoint": frozenset({C.RUN_STATE, C.TRAINING_OPS, C.SAMPLING_OPS, C.MODEL_PACKAGES_READ}),
    "ContinueRun": frozenset({C.RUN_STATE, C.CONTINUE_RUN}),
    "StopSession": frozenset({C.RUN_STATE, C.SESSION_STOP, C.TRACKING}),
    "Cleanup": frozenset({C.RUN_STATE, C.SESSION_STOP, C.TRACKING}),
    "Gateway": frozenset({C.GATEWAY_S3, C.SAMPLING_OPS}),
}
DEFAULT_CAPABILITIES = frozenset({C.RUN_STATE})


def capabilities_of(name: str) -> frozenset[Capability]:
    """The capabilities of function ``name`` (:data:`DEFAULT_CAPABILITIES` when unlisted)."""
    return FUNCTION_CAPABILITIES.get(name, DEFAULT_CAPABILITIES)


def _sm_arn(stack: Stack, resource: str, name: str = "*", account: str | None = None) -> str:
    return stack.format_arn(
        service="sagemaker", resource=resource, resource_name=name, account=account,
        arn_format=ArnFormat.SLASH_RESOURCE_NAME,
    )


def training_session_arns(stack: Stack) -> list[str]:
    """``arn:PARTITION:sagemaker:{region}:{account}:training-session/stepwise-*`` (Init names them per run)."""
    return [_sm_arn(stack, "training-session", SESSION_NAME_PATTERN)]


def sdk_default_bucket_arn(stack: Stack) -> str:
    """``arn:PARTITION:s3:::sagemaker-{region}-{account}``: the SageMaker SDK's default bucket."""
    return bucket_arn(stack, f"sagemaker-{stack.region}-{stack.account}")


def bucket_arn(stack: Stack, name: str) -> str:
    """``arn:PARTITION:s3:::NAME`` (S3 bucket ARNs carry no region or account)."""
    return stack.format_arn(service="s3", region="", account="", resource=name, arn_format=ArnFormat.NO_RESOURCE_NAME)


def agent_runtime_resources(stack: Stack, runtime_arns: tuple[str, ...]) -> list[str]:
    """The configured runtimes and their endpoints; every runtime of this account/region when none is configured."""
    if runtime_arns:
        return [r for arn in runtime_arns for r in (arn, f"{arn}/runtime-endpoint/*")]
    return [stack.format_arn(service="bedrock-agentcore", resource="runtime", resource_name="*",
                             arn_format=ArnFormat.SLASH_RESOURCE_NAME)]


def pass_role_resources(stack: Stack, role_arns: tuple[str, ...]) -> list[str]:
    """The configured SageMaker session roles; any role of this account when none is configured."""
    if role_arns:
        return list(role_arns)
    return [stack.format_arn(service="iam", region="", resource="role", resource_name="*",
                             arn_format=ArnFormat.SLASH_RESOURCE_NAME)]


def statements(
    capability: Capability,
    *,
    stack: Stack,
    bucket: s3.IBucket,
    agent_runtime_arns: tuple[str, ...] = (),
    sagemaker_role_arns: tuple[str, ...] = (),
    data_buckets: tuple[str, ...] = (),
    kms_key_arn: str = "",
    mlflow_tracking_server_arns: tuple[str, ...] = (),
) -> list[iam.PolicyStatement]:
    """The identity-policy statements of one capability.

    Every ARN is built with the stack's partition and, for regional services, its region
    (``Stack.format_arn``); context ARNs come in as given (the stack checks their region).
    CONTINUE_RUN and READ_HISTORY have none here: they name the state machine, which depends on
    the functions, so the state machine construct grants them with a separate policy. DATA_READ(_WRITE),
    TRACKING and the KMS grant of SESSION_LIFECYCLE are empty when the stack is told no
    bucket, tracking server or key.
    """
    objects = bucket.arn_for_objects
    list_bucket = iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn])
    sessions = training_session_arns(stack)
    if capability is C.RUN_STATE:
        return [
            iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"],
                                resources=[objects(f"{RUNS_PREFIX}*")]),
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects(f"{DATASETS_PREFIX}*")]),
            list_bucket,
        ]
    if capability is C.GATEWAY_SESSIONS:
        return [iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"],
                                    resources=[objects(f"{SESSIONS_PREFIX}*")]), list_bucket]
    if capability is C.READ_RESULTS:
        return [iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects(f"{RESULTS_PREFIX}*")]),
                list_bucket]
    if capability is C.GATEWAY_S3:
        return [
            iam.PolicyStatement(actions=["s3:GetObject"],
                                resources=[objects(f"{SESSIONS_PREFIX}*"), objects(f"{tokenizer_prefix('*')}*"),
                                           objects(f"{run_sessions_prefix('*')}*")]),
            iam.PolicyStatement(actions=["s3:PutObject", "s3:PutObjectTagging"],
                                resources=[objects(f"{run_sessions_prefix('*')}*")]),
            list_bucket,
        ]
    if capability is C.SESSION_LIFECYCLE:
        return [
            iam.PolicyStatement(
                actions=["sagemaker:CreateTrainingSession", "sagemaker:DescribeTrainingSession",
                         "sagemaker:StopTrainingSession", "sagemaker:AddTags"],
                resources=sessions,
            ),
            iam.PolicyStatement(
                actions=["sagemaker:DescribeHubContent", "sagemaker:ListHubContents"],
                resources=[_sm_arn(stack, "hub", PUBLIC_HUB, account="aws"),
                           _sm_arn(stack, "hub-content", f"{PUBLIC_HUB}/*", account="aws")],
            ),
            iam.PolicyStatement(
                actions=["sagemaker:DescribeModelPackage", "sagemaker:DescribeModelPackageGroup"],
                resources=[_sm_arn(stack, "model-package"), _sm_arn(stack, "model-package-group")],
            ),
            # Only when a run config leaves model_package_group_arn / s3_output_path blank: the SDK
            # then creates (or finds) its default group and the account's SageMaker default bucket.
            iam.PolicyStatement(
                actions=["sagemaker:CreateModelPackageGroup"],
                resources=[_sm_arn(stack, "model-package-group", SDK_DEFAULT_MODEL_PACKAGE_GROUP)],
            ),
            iam.PolicyStatement(
                actions=["s3:ListBucket", "s3:GetBucketLocation", "s3:CreateBucket"],
                resources=[sdk_default_bucket_arn(stack)],
            ),
            # Session.default_bucket() asks Bucket.creation_date, which boto3 answers with ListBuckets.
            iam.PolicyStatement(actions=["s3:ListAllMyBuckets"], resources=["*"]),
            iam.PolicyStatement(
                actions=["iam:PassRole"],
                resources=pass_role_resources(stack, sagemaker_role_arns),
                conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
            ),
            *([iam.PolicyStatement(
                actions=list(KMS_SESSION_ACTIONS), resources=[kms_key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"sagemaker.{stack.region}.{stack.url_suffix}"}},
            )] if kms_key_arn else []),
        ]
    if capability is C.SESSION_DESCRIBE:
        return [iam.PolicyStatement(actions=["sagemaker:DescribeTrainingSession"], resources=sessions)]
    if capability is C.SESSION_STOP:
        return [iam.PolicyStatement(actions=["sagemaker:StopTrainingSession", "sagemaker:DescribeTrainingSession"],
                                    resources=sessions)]
    if capability is C.TRAINING_OPS:
        return [iam.PolicyStatement(
            actions=["sagemaker:ExecuteTrainingOperation", "sagemaker:GetTrainingOperationResult",
                     "sagemaker:DescribeTrainingSession"],
            resources=sessions)]
    if capability is C.SAMPLING_OPS:
        return [iam.PolicyStatement(
            actions=["sagemaker:ExecuteSamplingOperation", "sagemaker:GetSamplingOperationResult"],
            resources=sessions)]
    if capability is C.MODEL_PACKAGES_READ:
        return [iam.PolicyStatement(actions=["sagemaker:DescribeModelPackage"],
                                    resources=[_sm_arn(stack, "model-package")])]
    if capability is C.INVOKE_AGENT:
        return [iam.PolicyStatement(actions=["bedrock-agentcore:InvokeAgentRuntime"],
                                    resources=agent_runtime_resources(stack, agent_runtime_arns))]
    if capability is C.LOOKUP_AGENT:
        return [iam.PolicyStatement(actions=["bedrock-agentcore:GetAgentRuntime"],
                                    resources=agent_runtime_resources(stack, agent_runtime_arns))]
    if capability is C.TASK_RESPONSE:
        return [iam.PolicyStatement(actions=list(TASK_RESPONSE_ACTIONS), resources=["*"])]
    if capability in (C.DATA_READ, C.DATA_READ_WRITE):
        if not data_buckets:
            return []
        actions = ["s3:GetObject"] + (["s3:PutObject"] if capability is C.DATA_READ_WRITE else [])
        return [
            iam.PolicyStatement(actions=actions, resources=[f"{bucket_arn(stack, b)}/*" for b in data_buckets]),
            iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"],
                                resources=[bucket_arn(stack, b) for b in data_buckets]),
        ]
    if capability is C.TRACKING:
        if not mlflow_tracking_server_arns:
            return []
        return [iam.PolicyStatement(actions=list(MLFLOW_ACTIONS), resources=list(mlflow_tracking_server_arns))]
    if capability in (C.CONTINUE_RUN, C.READ_HISTORY):
        return []
    raise ValueError(f"no statements for capability {capability!r}")
