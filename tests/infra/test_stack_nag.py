"""The cdk-nag wiring the app uses really turns a finding into a synth error.

(tests/infra/test_stack_template.py asserts the real stack has none; this shows that assertion can fail.)
"""

from __future__ import annotations

import os

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

import aws_cdk as cdk  # noqa: E402
from aws_cdk import assertions  # noqa: E402
from aws_cdk import aws_s3 as s3  # noqa: E402

from app import apply_checks  # noqa: E402


def test_an_unlogged_unencrypted_bucket_is_reported_as_an_error():
    app = cdk.App()
    stack = cdk.Stack(app, "NagProbe")
    s3.Bucket(stack, "Careless", enforce_ssl=False)
    apply_checks(app)
    errors = assertions.Annotations.from_stack(stack).find_error("*", assertions.Match.string_like_regexp("AwsSolutions-S1.*"))
    assert errors, "cdk-nag did not report a bucket without server access logs"


# --- suppressions in an environment-specific stack (what `cdk deploy` synthesizes) -------------------

ACCOUNT, OTHER_ACCOUNT, REGION = "111122223333", "444455556666", "us-west-2"
TOKEN_FORM = {"regex": "/^Resource::arn:<AWS::Partition>:sagemaker:<AWS::Region>:<AWS::AccountId>:model-package\\/\\*$/"}


def _probe(env: cdk.Environment | None, account: str | None = None) -> cdk.Stack:
    """A stack granting model-package/* (the account's own, or ``account``'s), suppressed in the token form."""
    from aws_cdk import aws_iam as iam
    from cdk_nag import NagSuppressions

    stack = cdk.Stack(cdk.App(), "NagEnvProbe", env=env)
    role = iam.Role(stack, "Role", assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"))
    arn = stack.format_arn(service="sagemaker", resource="model-package", resource_name="*", account=account)
    role.add_to_policy(iam.PolicyStatement(actions=["sagemaker:DescribeModelPackage"], resources=[arn]))
    NagSuppressions.add_resource_suppressions(role, [
        {"id": "AwsSolutions-IAM5", "reason": "model packages are named at run time", "appliesTo": [TOKEN_FORM]}],
        apply_to_children=True)
    return stack


def _iam5_errors(stack: cdk.Stack) -> list:
    return assertions.Annotations.from_stack(stack).find_error(
        "*", assertions.Match.string_like_regexp("AwsSolutions-IAM5.*"))


def test_a_suppression_in_token_form_holds_in_an_environment_specific_stack():
    """The literal ARN of an environment-specific stack is suppressed by the token form written once; cdk-nag
    alone (the wiring before `infra.nag.ConcreteEnvironmentSuppressions`) reports it."""
    from cdk_nag import AwsSolutionsChecks

    env = cdk.Environment(account=ACCOUNT, region=REGION)
    stack = _probe(env)
    apply_checks(stack.node.scope)
    assert _iam5_errors(stack) == []

    bare = _probe(env)
    cdk.Aspects.of(bare.node.scope).add(AwsSolutionsChecks(verbose=True))
    errors = _iam5_errors(bare)
    assert errors and f"sagemaker:{REGION}:{ACCOUNT}:model-package/*" in str(errors[0].entry.data)

    agnostic = _probe(None)
    apply_checks(agnostic.node.scope)
    assert _iam5_errors(agnostic) == []


def test_the_derived_suppression_accepts_this_stack_s_account_only():
    stack = _probe(cdk.Environment(account=ACCOUNT, region=REGION), account=OTHER_ACCOUNT)
    apply_checks(stack.node.scope)
    errors = _iam5_errors(stack)
    assert errors and OTHER_ACCOUNT in str(errors[0].entry.data)
