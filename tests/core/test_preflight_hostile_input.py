"""Hostile strings in the fields the refusals before billing read (ARNs, regions, s3:// URIs) and in the
stack's grants: each is refused with ``field: message`` or accepted as exactly what the run will use,
never an unhandled exception. An accepted value has no trailing newline, control character or non-ASCII
digit (Python's ``$`` matches before a final newline and ``\\d`` matches any Unicode digit), and an
accepted s3:// URI is the bucket and key the refusals look up, character for character."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.config import ConfigError, load_run_config, parse_s3_uri
from stepwise.core.preflight import Probes, StackScope, refusals, s3_locations

BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/R",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent-local",
    "dataset_path": "s3://stack-bucket/train.jsonl",
}
ARABIC_ACCOUNT = "\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660\u0661\u0662"  # 12 Unicode digits
SCOPE = StackScope(region="us-east-1", bucket="stack-bucket", account="123456789012")


def _probes(calls: list) -> Probes:
    return Probes(bucket=lambda s3, b: calls.append(("bucket", b)) or "",
                  prefix=lambda s3, b, k: calls.append(("prefix", b, k)) or "",
                  runtime=lambda arn: calls.append(("runtime", arn)) or "")


@pytest.mark.parametrize("field, value", [
    ("role_arn", BASE["role_arn"] + "\n"),
    ("agent_runtime_arn", BASE["agent_runtime_arn"] + "\n"),
    ("region", "us-east-1\n"),
    ("dataset_path", BASE["dataset_path"] + "\n"),
    ("tokenizer_path", "s3://stack-bucket/tok/\n"),
    ("s3_output_path", "s3://stack-bucket/out/\n"),
    ("kms_key_arn", "arn:aws:kms:us-east-1:123456789012:key/abc\n"),
    ("base_model_arn", "Qwen3-4B\n"),
    ("mlflow_tracking_uri", "http://mlflow:5000\n"),
    ("model_package_group_arn", "arn:aws:sagemaker:us-east-1:123456789012:model-package-group/g\n"),
    ("vpc_config", {"subnets": ["subnet-1\n"], "security_group_ids": ["sg-1"]}),
])
def test_a_trailing_newline_is_refused_not_matched_by_dollar(field, value):
    # A YAML block scalar (``role_arn: |``) ends with a newline; the service would refuse it after billing.
    with pytest.raises(ConfigError) as e:
        load_run_config({**BASE, field: value})
    assert any(err.startswith(field) for err in e.value.errors), e.value.errors


@pytest.mark.parametrize("field, value", [
    ("role_arn", f"arn:aws:iam::{ARABIC_ACCOUNT}:role/R"),
    ("agent_runtime_arn", f"arn:aws:bedrock-agentcore:us-east-1:{ARABIC_ACCOUNT}:runtime/a-1"),
    ("region", "us-east-\u0661"),
    ("kms_key_arn", f"arn:aws:kms:us-east-1:{ARABIC_ACCOUNT}:key/abc"),
])
def test_an_account_or_region_in_non_ascii_digits_is_refused(field, value):
    with pytest.raises(ConfigError) as e:
        load_run_config({**BASE, field: value})
    assert any(err.startswith(field) for err in e.value.errors), e.value.errors


@pytest.mark.parametrize("uri", ["s3://stack-bucket/a\x00b.jsonl", "s3://stack-bucket/a\tb.jsonl",
                                 "s3://stack-bucket/a\x7fb.jsonl", "s3://b..b/x.jsonl", "s3://192.168.1.1/x.jsonl",
                                 "s3://stack-bucket-/x.jsonl", "s3://-stack/x.jsonl", "s3://STACK/x.jsonl"])
def test_an_s3_uri_that_s3_cannot_hold_is_refused(uri):
    with pytest.raises(ConfigError) as e:
        load_run_config({**BASE, "dataset_path": uri})
    assert any(err.startswith("dataset_path") for err in e.value.errors), e.value.errors


def test_unicode_keys_are_s3_keys():
    cfg = load_run_config({**BASE, "dataset_path": "s3://stack-bucket/données/训练 1.jsonl"})
    assert [(loc.bucket, loc.key) for loc in s3_locations(cfg)] == [("stack-bucket", "données/训练 1.jsonl")]


_ARNISH = st.one_of(
    st.text(max_size=80),
    st.builds(lambda p, s, r, a, res: f"arn:{p}:{s}:{r}:{a}:{res}",
              st.sampled_from(["aws", "aws-cn", "aws-us-gov", "aws-x", "", "AWS"]),
              st.sampled_from(["bedrock-agentcore", "iam", "kms", "sagemaker", "s3"]),
              st.sampled_from(["us-east-1", "cn-north-1", "us-gov-west-1", "", "us-east-\u0661", "US-EAST-1"]),
              st.sampled_from(["123456789012", "999999999999", "", "12345678901", ARABIC_ACCOUNT, "aws"]),
              st.text(max_size=30).map(lambda t: "runtime/" + t) | st.sampled_from(["runtime/", "runtime/a-1",
                                                                                    "role/R", "key/abc", "runtime/a/b"])),
)
_URIISH = st.one_of(st.text(max_size=60), st.builds(lambda b, k: f"s3://{b}{k}", st.text(max_size=12),
                                                     st.text(max_size=20)),
                    st.sampled_from(["s3://", "s3://stack-bucket", "s3://stack-bucket/", "s3:///key", "S3://stack-bucket/k",
                                     "s3://stack-bucket//k.jsonl", "s3://stack-bucket/k.jsonl?versionId=1"]))


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["role_arn", "agent_runtime_arn", "region", "kms_key_arn", "resume_from_model_package",
                              "model_package_group_arn", "base_model_arn", "mlflow_tracking_uri"]), value=_ARNISH)
def test_any_arn_is_refused_or_accepted_as_plain_ascii_and_the_refusals_answer(field, value):
    try:
        cfg = load_run_config({**BASE, field: value})
    except ConfigError as e:
        assert all(": " in err for err in e.errors)
        return
    got = getattr(cfg, field)
    assert got == value and (not got or (got.isprintable() and not any(c.isspace() for c in got)))
    assert got.isascii() or field == "mlflow_tracking_uri"  # a URL may hold any host name
    calls: list = []
    errors = refusals(cfg, SCOPE, _probes(calls))
    assert all(isinstance(e, str) and ": " in e for e in errors)
    if field == "agent_runtime_arn" and ("runtime", got) in calls:  # looked up only when the stack may invoke it
        assert got.split(":")[3] == "us-east-1" and got.split(":")[4] == "123456789012"


@settings(max_examples=300, deadline=None)
@given(field=st.sampled_from(["dataset_path", "eval_dataset_path", "tokenizer_path", "s3_output_path"]), uri=_URIISH)
def test_any_s3_uri_is_refused_or_looked_up_as_exactly_what_it_says(field, uri):
    try:
        cfg = load_run_config({**BASE, field: uri})
    except ConfigError as e:
        assert all(": " in err for err in e.errors)
        return
    for loc in s3_locations(cfg):
        bucket, key = parse_s3_uri(loc.uri)
        assert loc.uri == f"s3://{bucket}" + (f"/{key}" if key or loc.uri.endswith("/") else "")
        assert not any(ord(c) < 32 or ord(c) == 127 for c in key)
    calls: list = []
    errors = refusals(cfg, SCOPE, _probes(calls))
    assert all(isinstance(e, str) and ": " in e for e in errors)
    assert {c[1] for c in calls if c[0] in ("bucket", "prefix")} <= {"stack-bucket"}


@settings(max_examples=200, deadline=None)
@given(env=st.fixed_dictionaries({}, optional={k: st.text(max_size=60) for k in (
    "AWS_REGION", "STEPWISE_BUCKET", "STEPWISE_DATA_BUCKETS", "STEPWISE_AGENT_RUNTIME_ARNS")}),
    account=st.text(max_size=14))
def test_any_stack_environment_gives_refusals_not_exceptions(env, account):
    cfg = load_run_config({**BASE, "tokenizer_path": "s3://stack-bucket/tok/", "s3_output_path": "s3://data-a/out/"})
    errors = refusals(cfg, StackScope.from_env(env, account=account), _probes([]))
    assert all(isinstance(e, str) and ": " in e for e in errors)
