"""`stepwise.aws.hub`: what the hub's DescribeHubContent says of a model, read defensively (the document is a JSON
string the service fills); gated exactly when the document's GatedBucket is true."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.aws.hub import describe
from stepwise.config import load_run_config
from stepwise.core.preflight import HubModel, license_errors

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=8), c, max_size=3), max_leaves=6)


class Hub:
    def __init__(self, document):
        self.document = document

    def describe_hub_content(self, **kw):
        return {"HubContentName": kw["HubContentName"], "HubContentArn": "arn:aws:sagemaker:us-west-2:aws:hub-content/"
                f"SageMakerPublicHub/Model/{kw['HubContentName']}/1.0.0", "HubContentVersion": "1.0.0",
                "HubContentDocument": self.document}


@settings(max_examples=200, deadline=None)
@given(document=st.one_of(JSON.map(json.dumps), st.text(max_size=30), st.none()))
def test_any_hub_document_describes_a_model_gated_only_when_gated_bucket_is_true(document):
    model = describe(Hub(document), "some-model")
    parsed = None
    try:
        parsed = json.loads(document) if document else None
    except ValueError:
        pass
    assert model.gated == (isinstance(parsed, dict) and bool(parsed.get("GatedBucket", False)))
    assert model.name == "some-model" and model.arn.endswith("/some-model/1.0.0")


def test_only_a_gated_model_without_accept_eula_is_refused():
    base = {"role_arn": "arn:aws:iam::123456789012:role/R", "base_model_arn": "m", "dataset_path": "d.jsonl",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/a-1"}
    for gated in (False, True):
        for accept in (False, True):
            errors = license_errors(load_run_config({**base, "accept_eula": accept}), HubModel("m", "arn", "org/m", gated=gated))
            assert bool(errors) == (gated and not accept)
