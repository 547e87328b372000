"""Least-privilege IAM on the resources outside the stack: SageMaker training sessions, AgentCore
runtimes and MLflow tracking servers, each an object whose ``grant_*(role)`` methods add exactly
the statements one concern needs (as the constructs do for what the stack owns:
``Storage.grant_run_state(role)``, ``TrainingLoop.grant_task_response(role)``, ...). Which function
gets which grant is written once, in ``infra.stack.StepwiseStack._grant``. The SageMaker action names
are the operation names of botocore's models (``sagemaker`` control plane and
``sagemakertrainingsessionruntime``, whose signing name is ``sagemaker``), as the SDK
``sagemaker.train.training_session`` calls them:
CreateTrainingSession / DescribeTrainingSession / StopTrainingSession
(``ServiceClient.create_lora_training_client``, ``_wait_until_running``, ``stop_session``),
ExecuteTrainingOperation / GetTrainingOperationResult (forward_backward, optim_step,
save_weights, save_state), ExecuteSamplingOperation / GetSamplingOperationResult
(sample, load_weights_for_sampling), DescribeHubContent / ListHubContents on
``SageMakerPublicHub`` (``resolve_base_model``, ``list_base_models``, ``load_tokenizer``) and
DescribeModelPackage / DescribeModelPackageGroup (``create_training_client_from_state*``),
and DeleteModelPackage (retention ``best_and_last``: StopSession, Cleanup and the session sweeper).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

PUBLIC_HUB = "SageMakerPublicHub"
#: Init names every training session ``stepwise-{run}-{hash}`` (``stepwise.core.phases.session_name_for``).
SESSION_NAME_PATTERN = "stepwise-*"
#: The SDK's defaults when a run config leaves them blank (``ServiceClient._auto_create_mpg``,
#: ``ServiceClient._default_s3_output_path`` -> ``Session.default_bucket()``).
SDK_DEFAULT_MODEL_PACKAGE_GROUP = "sagemaker-default"
#: What ``stepwise.aws.tracking`` asks an MLflow tracking server, as ``sagemaker-mlflow`` IAM actions
#: (named after MLflow's REST messages): ``get_experiment_by_name``, ``create_experiment``,
#: ``search_runs``, ``create_run``, ``log_batch`` (params and metrics), ``set_terminated``.
MLFLOW_ACTIONS = (
    "sagemaker-mlflow:GetExperimentByName", "sagemaker-mlflow:CreateExperiment", "sagemaker-mlflow:SearchRuns",
    "sagemaker-mlflow:CreateRun", "sagemaker-mlflow:LogBatch", "sagemaker-mlflow:UpdateRun",
)
#: What an MLflow app (``arn:...:mlflow-app/ID``) asks: the ``sagemaker-mlflow`` plugin signs its
#: calls with the ``sagemaker`` signing name, and the Service Authorization Reference authorizes every
#: MLflow API call on an app with this one action (resource type ``mlflow-app``).
MLFLOW_APP_ACTIONS = ("sagemaker:CallMlflowAppApi",)
#: What CreateTrainingSession needs of the caller on a customer managed key (training sessions
#: prerequisites: the KMS permissions "to use a customer managed key through SageMaker AI"),
#: allowed only on requests SageMaker makes for the caller (``kms:ViaService``).
KMS_SESSION_ACTIONS = ("kms:CreateGrant", "kms:DescribeKey", "kms:GenerateDataKey", "kms:Decrypt")


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


class TrainingSessions:
    """The run's SageMaker training sessions (``training-session/stepwise-*``), the public hub the
    base models come from, the model packages the sessions save, the session roles Init passes
    and the KMS key it names."""

    def __init__(self, stack: Stack, *, sagemaker_role_arns: tuple[str, ...] = (), kms_key_arn: str = "") -> None:
        self.stack = stack
        self.sagemaker_role_arns = sagemaker_role_arns
        self.kms_key_arn = kms_key_arn
        self.arns = training_session_arns(stack)

    def grant_lifecycle(self, role: iam.IGrantable) -> None:
        """Create/describe/stop sessions, pass the session role, read the public hub and model packages,
        the SDK's defaults (model package group, default bucket) and the KMS key when one is set."""
        stack = self.stack
        add_statements(role,
             iam.PolicyStatement(
                 actions=["sagemaker:CreateTrainingSession", "sagemaker:DescribeTrainingSession",
                          "sagemaker:StopTrainingSession", "sagemaker:AddTags"],
                 resources=self.arns,
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
                 resources=pass_role_resources(stack, self.sagemaker_role_arns),
                 conditions={"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}},
             ),
             *([iam.PolicyStatement(
                 actions=list(KMS_SESSION_ACTIONS), resources=[self.kms_key_arn],
                 conditions={"StringEquals": {"kms:ViaService": f"sagemaker.{stack.region}.{stack.url_suffix}"}},
             )] if self.kms_key_arn else []))

    def grant_describe(self, role: iam.IGrantable) -> None:
        """DescribeTrainingSession."""
        add_statements(role, iam.PolicyStatement(actions=["sagemaker:DescribeTrainingSession"], resources=self.arns))

    def grant_stop(self, role: iam.IGrantable) -> None:
        """Stop and describe sessions."""
        add_statements(role, iam.PolicyStatement(actions=["sagemaker:StopTrainingSession", "sagemaker:DescribeTrainingSession"],
                                       resources=self.arns))

    def grant_sweep(self, role: iam.IGrantable) -> None:
        """List the account's sessions (ListTrainingSessions names no resource type: '*'), describe
        (status and tags) and stop this stack's (the session sweeper, ``stepwise.handlers.sweeper``)."""
        add_statements(role,
                       iam.PolicyStatement(actions=["sagemaker:ListTrainingSessions"], resources=["*"]),
                       iam.PolicyStatement(actions=["sagemaker:StopTrainingSession", "sagemaker:DescribeTrainingSession"],
                                           resources=self.arns))

    def grant_training_operations(self, role: iam.IGrantable) -> None:
        """Submit and read training operations (forward_backward, optim_step, save_weights, save_state)."""
        add_statements(role, iam.PolicyStatement(
            actions=["sagemaker:ExecuteTrainingOperation", "sagemaker:GetTrainingOperationResult",
                     "sagemaker:DescribeTrainingSession"],
            resources=self.arns))

    def grant_sampling_operations(self, role: iam.IGrantable) -> None:
        """Submit and read sampling operations (sample, load_weights_for_sampling)."""
        add_statements(role, iam.PolicyStatement(
            actions=["sagemaker:ExecuteSamplingOperation", "sagemaker:GetSamplingOperationResult"],
            resources=self.arns))

    def grant_prune_model_packages(self, role: iam.IGrantable) -> None:
        """DeleteModelPackage on this account's and region's model packages (``keep_model_packages:
        best_and_last``: the run's end, then the session sweeper, delete the intermediate packages a run
        created, by their ARNs recorded in state.json, with DeleteModelPackage alone:
        ``stepwise.aws.sagemaker.delete_model_package``). No DescribeModelPackage (which would need
        ``kms:Decrypt`` for an encrypted package), no ListModelPackages: nothing is found by listing."""
        add_statements(role, iam.PolicyStatement(actions=["sagemaker:DeleteModelPackage"],
                                                 resources=[_sm_arn(self.stack, "model-package")]))

    def grant_read_model_packages(self, role: iam.IGrantable) -> None:
        """DescribeModelPackage (checkpoints saved as model packages)."""
        add_statements(role, iam.PolicyStatement(actions=["sagemaker:DescribeModelPackage"],
                                       resources=[_sm_arn(self.stack, "model-package")]))


class AgentRuntimes:
    """The AgentCore runtimes the rollouts invoke (``agentRuntimeArns``; every runtime of the
    account and region when none is configured)."""

    def __init__(self, stack: Stack, arns: tuple[str, ...] = ()) -> None:
        self.resources = agent_runtime_resources(stack, arns)

    def grant_invoke(self, role: iam.IGrantable) -> None:
        """InvokeAgentRuntime (StartRollout)."""
        add_statements(role, iam.PolicyStatement(actions=["bedrock-agentcore:InvokeAgentRuntime"], resources=self.resources))

    def grant_stop_sessions(self, role: iam.IGrantable) -> None:
        """StopRuntimeSession (FinishRollout ends each rollout's runtime session; StartRollout the one a
        failed invoke may have started; StopSession and Cleanup those of rollouts a run abandons)."""
        add_statements(role, iam.PolicyStatement(actions=["bedrock-agentcore:StopRuntimeSession"], resources=self.resources))

    def grant_lookup(self, role: iam.IGrantable) -> None:
        """GetAgentRuntime (Init's refusal before billing: the runtimes StartRollout may invoke)."""
        add_statements(role, iam.PolicyStatement(actions=["bedrock-agentcore:GetAgentRuntime"], resources=self.resources))


class TrackingServers:
    """Where runs are tracked: the SageMaker managed MLflow tracking servers and MLflow apps runs log to
    (``mlflowTrackingServerArns``) and the Secrets Manager secret of the W&B API key
    (``wandbApiKeySecretArn``); none configured: no grant. The function that logs (Track) gets its grant
    here (`grant_tracking`), so a new one inherits every kind."""

    def __init__(self, arns: tuple[str, ...] = (), wandb_secret_arn: str = "") -> None:
        self.arns = arns
        self.servers = [a for a in arns if ":mlflow-tracking-server/" in a]
        self.apps = [a for a in arns if ":mlflow-app/" in a]
        self.wandb_secret_arn = wandb_secret_arn

    def grant_tracking(self, role: iam.IGrantable) -> None:
        """Log params and metrics, end runs: :data:`MLFLOW_ACTIONS` on the tracking servers,
        :data:`MLFLOW_APP_ACTIONS` on the apps, and read the W&B API key (``secretsmanager:GetSecretValue``
        on that one secret); nothing for what is not configured."""
        if self.servers:
            add_statements(role, iam.PolicyStatement(actions=list(MLFLOW_ACTIONS), resources=self.servers))
        if self.apps:
            add_statements(role, iam.PolicyStatement(actions=list(MLFLOW_APP_ACTIONS), resources=self.apps))
        if self.wandb_secret_arn:
            add_statements(role, iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                     resources=[self.wandb_secret_arn]))


def add_statements(role: iam.IGrantable, *statements: iam.PolicyStatement) -> None:
    """Add ``statements`` to ``role``'s identity policy (its default policy)."""
    for statement in statements:
        role.grant_principal.add_to_principal_policy(statement)
