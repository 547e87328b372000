"""`stepwise.aws.hub.tokenizer_source`: where a run's tokenizer comes from, checked with the Hugging Face client's own
``auth_check`` against a loopback hub (tests/support/hf_hub.py): a gated repository is refused without a token that
has access, the tokens tried in order (``HF_TOKEN``, then the stack's secret), and anything else is said, not refused."""

from __future__ import annotations

import pytest

from stepwise.aws.hub import tokenizer_source, token_sources
from stepwise.core.preflight import HubModel
from tests.support.hf_hub import FakeHub


@pytest.fixture(scope="module")
def hub():
    h = FakeHub(public={"org/open"}, gated={"org/gated"}, tokens={"good"})
    yield h
    h.stop()


def model(hf_id: str) -> HubModel:
    return HubModel("m", "arn", "org/m", hf_model_id=hf_id)


def test_a_gated_tokenizer_needs_a_token_with_access_tried_in_order(hub, tmp_path):
    public = tokenizer_source("", model("org/open"), [], endpoint=hub.url)
    assert (public.kind, public.where, public.gated, public.problem) == ("Hugging Face", "org/open", False, "")
    refused = tokenizer_source("", model("org/gated"), [], endpoint=hub.url)
    assert refused.gated and "is gated and no token with access was found" in refused.problem
    assert "HF_TOKEN" in refused.problem and "huggingFaceTokenSecretArn" in refused.problem and "s3://" in refused.problem
    # HF_TOKEN first, then the stack's secret: the first with access is used; a token without access is named
    read = []
    sources = token_sources({"HF_TOKEN": "bad", "STEPWISE_HF_TOKEN_SECRET_ARN": "arn:aws:secretsmanager:us-west-2:1:secret:hf-AbCdEf"},
                            secret_reader=lambda arn: read.append(arn) or "good")
    ok = tokenizer_source("", model("org/gated"), sources, endpoint=hub.url)
    assert (ok.gated, ok.problem, ok.token_from) == (True, "", "the secret arn:aws:secretsmanager:us-west-2:1:secret:hf-AbCdEf")
    assert read == ["arn:aws:secretsmanager:us-west-2:1:secret:hf-AbCdEf"]
    denied = tokenizer_source("", model("org/gated"), token_sources({"HF_TOKEN": "bad"}), endpoint=hub.url)
    assert "HF_TOKEN (no access: accept the model's license" in denied.problem
    unreadable = tokenizer_source("", model("org/gated"), [("the secret X", lambda: 1 / 0)], endpoint=hub.url)
    assert "the secret X (not readable: ZeroDivisionError)" in unreadable.problem
    assert ("/api/models/org/gated/auth-check", "Bearer good") in hub.requests  # the client's own request


def test_other_sources_are_named_and_only_a_missing_repository_is_refused(hub, tmp_path):
    assert tokenizer_source("s3://b/tok/", model("org/gated"), [], endpoint=hub.url).kind == "tokenizer_path (s3)"
    local = tokenizer_source("", model(str(tmp_path)), [], endpoint=hub.url)
    assert (local.kind, local.problem) == ("local directory", "")
    explicit = tokenizer_source("org/gated", model("org/open"), [], endpoint=hub.url)
    assert explicit.kind == "tokenizer_path" and explicit.problem  # tokenizer_path names the repository itself
    missing = tokenizer_source("", model("org/none"), [], endpoint=hub.url)
    assert "does not exist or is private" in missing.problem
    unreachable = tokenizer_source("", model("org/gated"), [], endpoint="http://127.0.0.1:9")
    assert unreachable.problem == "" and "not checked" in unreachable.note
