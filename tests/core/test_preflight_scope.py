"""The pure half of the refusals before billing (`stepwise.core.preflight`), property-tested: what is refused
is exactly what the stack does not grant, each refusal names the field and the value, and the
lookups run only for what the stack grants (fake probes record the calls; no AWS here)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.config import load_run_config
from stepwise.core.preflight import Probes, StackScope, bucket_scope_errors, refusals, region_errors, s3_locations

REGIONS = st.sampled_from(["", "us-east-1", "us-west-2", "eu-west-1"])
BUCKETS = st.sampled_from(["stack-bucket", "data-a", "data-b", "elsewhere"])
BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/R",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent-local",
}


def config(region: str, dataset: str, output: str, tokenizer: str):
    return load_run_config({**BASE, "region": region, "dataset_path": f"s3://{dataset}/train.jsonl",
                            "s3_output_path": f"s3://{output}/out/", "tokenizer_path": f"s3://{tokenizer}/tok/"})


@settings(max_examples=200, deadline=None)
@given(REGIONS, BUCKETS, BUCKETS, BUCKETS, st.lists(st.sampled_from(["data-a", "data-b"]), max_size=2, unique=True))
def test_a_location_is_refused_exactly_when_its_bucket_is_not_granted(region, dataset, output, tokenizer, data):
    cfg = config(region, dataset, output, tokenizer)
    scope = StackScope(region="us-east-1", bucket="stack-bucket", data_buckets=tuple(data))
    granted = {"stack-bucket", *data}
    errors = bucket_scope_errors(s3_locations(cfg), scope)
    expected = [f for f, b in (("dataset_path", dataset), ("tokenizer_path", tokenizer), ("s3_output_path", output))
                if b not in granted]
    assert [e.split(":", 1)[0] for e in errors] == expected
    for e in errors:
        assert "'dataBuckets'" in e and "(got 's3://" in e

    calls: list[tuple[str, str]] = []
    probes = Probes(bucket=lambda s3, b: calls.append(("bucket", b)) or "",
                    prefix=lambda s3, b, k: calls.append(("prefix", b)) or "",
                    runtime=lambda arn: calls.append(("runtime", arn)) or "")
    all_errors = refusals(cfg, scope, probes)
    assert {b for kind, b in calls if kind in ("bucket", "prefix")} <= granted  # nothing outside is looked up
    assert len([c for c in calls if c[0] == "bucket"]) == len({b for b in (dataset, output, tokenizer) if b in granted})
    assert (region_errors(cfg, scope) != []) == (region not in ("", "us-east-1"))
    assert len(all_errors) == len(errors) + len(region_errors(cfg, scope))


def test_a_failed_lookup_names_the_field_the_problem_and_the_value():
    cfg = config("", "stack-bucket", "stack-bucket", "stack-bucket")
    scope = StackScope(region="us-east-1", bucket="stack-bucket")
    probes = Probes(bucket=lambda s3, b: "", prefix=lambda s3, b, k: "no files directly under it",
                    runtime=lambda arn: "no agent runtime 'toy_agent-local' in us-east-1")
    assert refusals(cfg, scope, probes) == [
        f"agent_runtime_arn: no agent runtime 'toy_agent-local' in us-east-1 (got {BASE['agent_runtime_arn']!r})",
        "tokenizer_path: no files directly under it (got 's3://stack-bucket/tok/')",
    ]
