"""Functions: one container-image Lambda per ``stepwise.functions.FUNCTIONS`` entry.

Every function runs the same image built from ``lambdas/Dockerfile`` and picks its handler by
the image ``cmd`` (``FunctionSpec.handler``); memory and timeout come from the spec, the
environment from ``stepwise.functions.environment()``. Each function has its own role and log
group; the role starts with its log group and X-Ray only, and the constructs that own the
resources grant the rest (``infra.stack.StepwiseStack._grant``).
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import Duration, RemovalPolicy, Size
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from cdk_nag import NagSuppressions
from constructs import Construct

from stepwise.functions import FUNCTIONS, FunctionSpec, environment

#: The image build context (the repo's ``lambdas/`` folder).
LAMBDAS_DIR = Path(__file__).resolve().parents[1] / "lambdas"
#: Left out of the image build context (and of the asset hash).
ASSET_EXCLUDE = ["**/__pycache__", "**/*.pyc", "*.egg-info", "**/.pytest_cache"]


def image_code(*, file: str = "Dockerfile", cmd: list[str] | None = None) -> lambda_.DockerImageCode:
    """The image asset built from ``lambdas/{file}`` at deploy time (synth needs no Docker).

    Built for linux/amd64 whatever the deploying machine is, to match the functions' default
    x86_64 architecture.
    """
    return lambda_.DockerImageCode.from_image_asset(str(LAMBDAS_DIR), file=file, cmd=cmd, exclude=ASSET_EXCLUDE,
                                                    platform=ecr_assets.Platform.LINUX_AMD64)


def function_role(scope: Construct, id: str, *, spec: FunctionSpec, log_group: logs.ILogGroup) -> iam.Role:
    """A role for ``spec`` that may write its log group (X-Ray comes with active tracing); every
    other grant is added by the construct that owns the resource."""
    role = iam.Role(scope, id, assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
                    description=f"Stepwise {spec.name} Lambda")
    log_group.grant_write(role)
    return role


def log_group_for(scope: Construct, id: str, retention_days: int) -> logs.LogGroup:
    return logs.LogGroup(scope, id, retention=_retention(retention_days), removal_policy=RemovalPolicy.DESTROY)


#: CloudWatch Logs' retention choices in days (the values of ``logs.RetentionDays``).
_RETENTION_DAYS = {
    1: "ONE_DAY", 3: "THREE_DAYS", 5: "FIVE_DAYS", 7: "ONE_WEEK", 14: "TWO_WEEKS", 30: "ONE_MONTH",
    60: "TWO_MONTHS", 90: "THREE_MONTHS", 120: "FOUR_MONTHS", 150: "FIVE_MONTHS", 180: "SIX_MONTHS",
    365: "ONE_YEAR", 400: "THIRTEEN_MONTHS", 545: "EIGHTEEN_MONTHS", 731: "TWO_YEARS", 1096: "THREE_YEARS",
    1827: "FIVE_YEARS", 2192: "SIX_YEARS", 2557: "SEVEN_YEARS", 2922: "EIGHT_YEARS", 3288: "NINE_YEARS",
    3653: "TEN_YEARS",
}


def _retention(days: int) -> logs.RetentionDays:
    """The shortest CloudWatch Logs retention of at least ``days`` days (at most ten years)."""
    for choice in sorted(_RETENTION_DAYS):
        if choice >= days:
            return getattr(logs.RetentionDays, _RETENTION_DAYS[choice])
    return logs.RetentionDays.TEN_YEARS


class HandlerFunctions(Construct):
    """The handler Lambdas, by logical name (``self.functions["Init"]``)."""

    def __init__(self, scope: Construct, id: str, *, bucket: s3.IBucket, gateway_url: str,
                 log_retention_days: int, extra_environment: dict[str, str] | None = None,
                 data_buckets: tuple[str, ...] = (), agent_runtime_arns: tuple[str, ...] = ()) -> None:
        """``data_buckets``, ``agent_runtime_arns``: the context values the handlers read from their
        environment (what the stack grants, for the refusals before billing)."""
        super().__init__(scope, id)
        self.functions: dict[str, lambda_.DockerImageFunction] = {}
        self.log_groups: dict[str, logs.LogGroup] = {}
        env = environment(bucket=bucket.bucket_name, gateway_url=gateway_url, extra=extra_environment,
                          data_buckets=",".join(data_buckets), agent_runtime_arns=",".join(agent_runtime_arns))
        for spec in FUNCTIONS:
            log_group = log_group_for(self, f"{spec.name}Logs", log_retention_days)
            self.log_groups[spec.name] = log_group
            role = function_role(self, f"{spec.name}Role", spec=spec, log_group=log_group)
            self.functions[spec.name] = lambda_.DockerImageFunction(
                self,
                spec.name,
                code=image_code(cmd=[spec.handler]),
                description=spec.description[:256],
                memory_size=spec.memory_mb,
                timeout=Duration.seconds(spec.timeout_s),
                ephemeral_storage_size=Size.mebibytes(spec.ephemeral_mb),
                environment=env,
                role=role,
                log_group=log_group,
                tracing=lambda_.Tracing.ACTIVE,
                # Step Functions owns retries (Retry/Catch in the ASL); S3 and EventBridge
                # deliveries are async and get the Lambda defaults.
            )
        suppress_lambda_role_findings(self)


def suppress_lambda_role_findings(scope: Construct) -> None:
    """The wildcard findings every function role has, each with why it cannot be narrower."""
    NagSuppressions.add_resource_suppressions(
        scope,
        [
            {
                "id": "AwsSolutions-IAM5",
                "reason": "X-Ray PutTraceSegments/PutTelemetryRecords (every function), s3:ListAllMyBuckets (Init, "
                          "for the SageMaker SDK's default bucket lookup), states:SendTaskSuccess/Failure/Heartbeat "
                          "(OnRolloutResult; SendTaskHeartbeat alone for the gateway; the task token authorizes) and "
                          "sagemaker:ListTrainingSessions (SweepSessions) "
                          "support no resource-level permissions.",
                "appliesTo": ["Resource::*"],
            },
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Log streams are created per container inside the function's own log group (log-group:NAME:*).",
                "appliesTo": [{"regex": "/^Resource::<.*Logs[0-9A-F]+\\.Arn>:\\*$/"}],
            },
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Run data is keyed by run id, step and session id chosen at run time; grants are limited to the "
                          "layout's prefixes (runs/, sessions/, rollout-results/, datasets/, leftovers/ in docs/internals.md).",
                "appliesTo": [{"regex": "/^Resource::<StorageBucket[0-9A-F]+\\.Arn>\\/(runs|sessions|rollout-results|datasets|leftovers)\\/.*$/"}],
            },
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Runs name their dataset, tokenizer and s3_output_path keys in the dataBuckets the "
                          "deployment lists; the grant is limited to those buckets.",
                "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:s3:::[a-z0-9.\\-]+\\/\\*$/"}],
            },
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Init names training sessions stepwise-{run}-{hash} per run (training-session/stepwise-*); "
                          "model packages and groups are created by the session's saves and named by the run config.",
                "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:(training-session\\/stepwise-|model-package\\/|model-package-group\\/)\\*$/"}],
            },
            {
                "id": "AwsSolutions-IAM5",
                "reason": "Base models are read from the AWS-owned SageMakerPublicHub; its content names are resolved at run time.",
                "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:aws:hub-content\\/SageMakerPublicHub\\/\\*$/"}],
            },
        ],
        apply_to_children=True,
    )
