"""The SageMaker execution role a training session assumes (the run config's ``role_arn``), created by the
stack with CDK context ``createSageMakerRole=true`` (off by default: it adds an IAM role to the account).

What it holds, and why (SageMaker AI developer guide, "Training sessions" > "Prerequisites": the session's
execution role needs read and write access to its checkpoints in Amazon S3, KMS permissions for S3-side
encryption when a customer managed key is used, and access to SageMaker AI hub content; checkpoints are
published as model packages in the run's model package group):

- trust: ``sagemaker.amazonaws.com`` only, and only for requests made for this account
  (``aws:SourceAccount``: the IAM user guide's confused-deputy prevention);
- S3: read/write under the stack bucket's ``sagemaker-output/`` (where Init points a run that names no
  ``s3_output_path``) and in the ``dataBuckets`` (a run's own ``s3_output_path``);
- the public hub: ``DescribeHubContent`` / ``ListHubContents`` on ``SageMakerPublicHub`` (the base model);
- model packages: create and describe them in this account's model package groups (checkpoint publication;
  ``save_state`` / ``save_weights`` register one each);
- KMS (with ``kmsKeyArn``): ``GenerateDataKey`` / ``Decrypt`` / ``DescribeKey`` through S3 only.

The AWS managed policy ``AmazonSageMakerTrainingSessionFullAccess`` is the documented superset; this role
grants the parts above on this stack's resources only. docs/first-run.md says how to tell a missing
permission from an AccessDenied in the session's ``ErrorDetails``.
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.permissions import PUBLIC_HUB, add_statements

SAGEMAKER_PRINCIPAL = "sagemaker.amazonaws.com"


class SessionRole(Construct):
    """The training session's execution role (``self.role``); see the module doc."""

    def __init__(self, scope: Construct, id: str, *, storage, kms_key_arn: str = "") -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.role = iam.Role(
            self, "Role",
            assumed_by=iam.ServicePrincipal(SAGEMAKER_PRINCIPAL, conditions={
                "StringEquals": {"aws:SourceAccount": stack.account}}),
            description="Stepwise RL: the SageMaker training sessions' execution role (run config role_arn)",
        )
        storage.grant_session_output(self.role)

        def sm(resource: str, name: str, account: str | None = None) -> str:
            return stack.format_arn(service="sagemaker", resource=resource, resource_name=name, account=account,
                                    arn_format=ArnFormat.SLASH_RESOURCE_NAME)

        add_statements(
            self.role,
            iam.PolicyStatement(actions=["sagemaker:DescribeHubContent", "sagemaker:ListHubContents"],
                                resources=[sm("hub", PUBLIC_HUB, account="aws"),
                                           sm("hub-content", f"{PUBLIC_HUB}/*", account="aws")]),
            iam.PolicyStatement(actions=["sagemaker:CreateModelPackage", "sagemaker:DescribeModelPackage",
                                         "sagemaker:DescribeModelPackageGroup"],
                                resources=[sm("model-package-group", "*"), sm("model-package", "*")]),
        )
        if kms_key_arn:
            add_statements(self.role, iam.PolicyStatement(
                actions=["kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"], resources=[kms_key_arn],
                conditions={"StringEquals": {"kms:ViaService": f"s3.{stack.region}.{stack.url_suffix}"}}))

        NagSuppressions.add_resource_suppressions(self.role, [
            {"id": "AwsSolutions-IAM5",
             "reason": "A training session writes its checkpoints under a path named per run (sagemaker-output/RUN/, or "
                       "a run's s3_output_path in the dataBuckets); base models are read from the AWS-owned "
                       "SageMakerPublicHub by a name chosen per run; each checkpoint is a new model package version in "
                       "a group the run config names.",
             "appliesTo": [{"regex": "/^Resource::<StorageBucket[0-9A-F]+\\.Arn>\\/sagemaker-output\\/\\*$/"},
                           {"regex": "/^Resource::arn:<AWS::Partition>:s3:::[a-z0-9.\\-]+\\/\\*$/"},
                           {"regex": "/^Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:aws:hub-content\\/"
                                     "SageMakerPublicHub\\/\\*$/"},
                           {"regex": "/^Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:"
                                     "model-package(-group)?\\/\\*$/"}]},
        ], apply_to_children=True)

    @property
    def role_arn(self) -> str:
        return self.role.role_arn

