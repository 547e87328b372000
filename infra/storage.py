"""Storage: the run bucket (all run state, datasets, rollout results) and its access-log bucket."""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.permissions import add_statements, bucket_arn
from stepwise.layout import (  # the key prefixes and the bulk tag (docs/internals.md, "S3 layout")
    BULK_TAG_KEY,
    BULK_TAG_VALUE,
    DATASETS_PREFIX,
    LEFTOVERS_PREFIX,
    RESULTS_PREFIX,
    RUNS_PREFIX,
    SAGEMAKER_OUTPUT_PREFIX,
    SESSIONS_PREFIX,
    current_sampler_key,
    leases_prefix,
    run_sessions_prefix,
    tokenizer_prefix,
)


class Storage(Construct):
    """The run bucket: SSE-S3, TLS only, public access blocked, server access logs, lifecycle.

    Lifecycle (S3 lifecycle filters match key prefixes and tags, not wildcards, so bulky
    objects under ``runs/{run_id}/steps/`` are found by their tag):
    - objects under ``runs/`` tagged ``stepwise-class=bulk`` expire after ``bulk_retention_days``;
    - agent result objects (``rollout-results/``) and gateway session records
      (``sessions/``) expire after ``bulk_retention_days``;
    - incomplete multipart uploads are aborted after 7 days.
    ``config.json``, ``state.json``, step summaries and checkpoints' records never expire.
    """

    def __init__(
        self,
        scope: Construct,
        id: str,
        *,
        bulk_retention_days: int,
        destroy_on_delete: bool,
        agent_role_arns: tuple[str, ...] = (),
        sagemaker_role_arns: tuple[str, ...] = (),
        data_buckets: tuple[str, ...] = (),
    ) -> None:
        """``data_buckets``: the buckets outside the stack that runs read datasets and tokenizers from
        and write ``s3_output_path`` to (``dataBuckets``); granted by :meth:`grant_data_read` and
        :meth:`grant_data_read_write`."""
        super().__init__(scope, id)
        self.data_buckets = data_buckets
        removal = RemovalPolicy.DESTROY if destroy_on_delete else RemovalPolicy.RETAIN
        self.access_logs = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_PREFERRED,
            lifecycle_rules=[s3.LifecycleRule(id="expire-access-logs", expiration=Duration.days(90))],
            removal_policy=removal,
            auto_delete_objects=destroy_on_delete,
        )
        NagSuppressions.add_resource_suppressions(
            self.access_logs,
            [{"id": "AwsSolutions-S1", "reason": "This is the server access log bucket of the run bucket; logging it again would recurse."}],
        )
        bulk = Duration.days(bulk_retention_days)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=False,
            server_access_logs_bucket=self.access_logs,
            server_access_logs_prefix="run-bucket/",
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="expire-bulky-step-data",
                    prefix=RUNS_PREFIX,
                    tag_filters={BULK_TAG_KEY: BULK_TAG_VALUE},
                    expiration=bulk,
                ),
                s3.LifecycleRule(id="expire-agent-results", prefix=RESULTS_PREFIX, expiration=bulk),
                s3.LifecycleRule(id="expire-gateway-sessions", prefix=SESSIONS_PREFIX, expiration=bulk),
                s3.LifecycleRule(id="abort-incomplete-uploads", abort_incomplete_multipart_upload_after=Duration.days(7)),
            ],
            removal_policy=removal,
            auto_delete_objects=destroy_on_delete,
        )
        # ACR agents write their results with their own execution role (the toolkit's
        # AgentCoreRLApp puts {exp_id}/{input_id}/{sid}.json), so they need PutObject here.
        if agent_role_arns:
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="AgentsWriteRolloutResults",
                    principals=[iam.ArnPrincipal(a) for a in agent_role_arns],
                    actions=["s3:PutObject"],
                    resources=[self.bucket.arn_for_objects(f"{RESULTS_PREFIX}*")],
                )
            )
        # The training session writes checkpoints to OutputConfig.S3Location; the default
        # output path the stack hands to Init lives in this bucket.
        if sagemaker_role_arns:
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="SageMakerSessionOutput",
                    principals=[iam.ArnPrincipal(a) for a in sagemaker_role_arns],
                    actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                    resources=[self.bucket.arn_for_objects(f"{SAGEMAKER_OUTPUT_PREFIX}*")],
                )
            )
            self.bucket.add_to_resource_policy(
                iam.PolicyStatement(
                    sid="SageMakerSessionOutputList",
                    principals=[iam.ArnPrincipal(a) for a in sagemaker_role_arns],
                    actions=["s3:ListBucket", "s3:GetBucketLocation"],
                    resources=[self.bucket.bucket_arn],
                )
            )

    @property
    def default_sagemaker_output_path(self) -> str:
        """``s3://{bucket}/sagemaker-output/`` (a token until deploy)."""
        return self.bucket.s3_url_for_object(SAGEMAKER_OUTPUT_PREFIX)

    # --- grants: each adds one concern's statements to a role's policy ----------------------

    def grant_run_state(self, role: iam.IGrantable) -> None:
        """Read/write ``runs/*``, read ``datasets/*`` (every handler)."""
        objects = self.bucket.arn_for_objects
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"],
                                      resources=[objects(f"{RUNS_PREFIX}*")]),
                  iam.PolicyStatement(actions=["s3:GetObject"], resources=[objects(f"{DATASETS_PREFIX}*")]),
                  self._list_bucket())

    def grant_session_records(self, role: iam.IGrantable) -> None:
        """Read/write the gateway session records ``sessions/*`` (the rollout handlers)."""
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:PutObjectTagging"],
                                      resources=[self.bucket.arn_for_objects(f"{SESSIONS_PREFIX}*")]),
                  self._list_bucket())

    def grant_leftovers(self, role: iam.IGrantable) -> None:
        """Read, write and delete the runs' leftovers ``leftovers/*`` (the clean-up a run's end hands to
        the session sweeper: StopSession, Cleanup, SweepSessions; ``stepwise.handlers._leftovers``)."""
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject"],
                                      resources=[self.bucket.arn_for_objects(f"{LEFTOVERS_PREFIX}*")]),
                  self._list_bucket())

    def grant_read_results(self, role: iam.IGrantable) -> None:
        """Read the agents' result objects ``rollout-results/*``."""
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject"], resources=[self.bucket.arn_for_objects(f"{RESULTS_PREFIX}*")]),
                  self._list_bucket())

    def grant_gateway_objects(self, role: iam.IGrantable) -> None:
        """The gateway's objects: read ``sessions/*``, ``runs/*/tokenizer/*`` and the run's current sampler
        ``runs/*/sampler/current.json``, read/write the captured turns ``runs/*/sessions/*``, write and delete
        the turn leases ``runs/*/sampler/leases/*`` (`stepwise.gateway.binding`)."""
        objects = self.bucket.arn_for_objects
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject"],
                                      resources=[objects(f"{SESSIONS_PREFIX}*"), objects(f"{tokenizer_prefix('*')}*"),
                                                 objects(f"{run_sessions_prefix('*')}*"), objects(current_sampler_key("*"))]),
                  iam.PolicyStatement(actions=["s3:PutObject", "s3:PutObjectTagging"],
                                      resources=[objects(f"{run_sessions_prefix('*')}*"), objects(f"{leases_prefix('*')}*")]),
                  iam.PolicyStatement(actions=["s3:DeleteObject"], resources=[objects(f"{leases_prefix('*')}*")]),
                  self._list_bucket())

    def grant_session_output(self, role: iam.IGrantable) -> None:
        """What a training session's role needs of the buckets (``infra.session_role``): read/write its
        checkpoints under ``sagemaker-output/`` (the same actions the bucket policy gives the listed
        ``sagemakerRoleArns``) and in the ``data_buckets`` (a run's own ``s3_output_path``)."""
        add_statements(role,
                  iam.PolicyStatement(actions=["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"],
                                      resources=[self.bucket.arn_for_objects(f"{SAGEMAKER_OUTPUT_PREFIX}*")]),
                  iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"], resources=[self.bucket.bucket_arn]))
        self._grant_data(role, ["s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload"])

    def grant_write_results(self, role: iam.IGrantable) -> None:
        """Write the agent's result objects ``rollout-results/*`` (an ACR agent's execution role: the toolkit's
        ``AgentCoreRLApp`` puts ``{exp_id}/{input_id}/{session_id}.json``)."""
        add_statements(role, iam.PolicyStatement(actions=["s3:PutObject"],
                                                 resources=[self.bucket.arn_for_objects(f"{RESULTS_PREFIX}*")]))

    def grant_data_read(self, role: iam.IGrantable) -> None:
        """Read datasets and tokenizers in the ``data_buckets`` (nothing when there are none)."""
        self._grant_data(role, ["s3:GetObject"])

    def grant_data_read_write(self, role: iam.IGrantable) -> None:
        """Read and write the ``data_buckets`` (datasets, tokenizers, ``s3_output_path``; nothing when none)."""
        self._grant_data(role, ["s3:GetObject", "s3:PutObject"])

    def _grant_data(self, role: iam.IGrantable, actions: list[str]) -> None:
        if not self.data_buckets:
            return
        stack = Stack.of(self)
        add_statements(role,
                  iam.PolicyStatement(actions=actions, resources=[f"{bucket_arn(stack, b)}/*" for b in self.data_buckets]),
                  iam.PolicyStatement(actions=["s3:ListBucket", "s3:GetBucketLocation"],
                                      resources=[bucket_arn(stack, b) for b in self.data_buckets]))

    def _list_bucket(self) -> iam.PolicyStatement:
        return iam.PolicyStatement(actions=["s3:ListBucket"], resources=[self.bucket.bucket_arn])
