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
