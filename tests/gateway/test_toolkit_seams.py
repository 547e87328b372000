"""Pins every non-public third-party API the gateway relies on (stepwise/gateway/_toolkit.py).
A failure here means agentcore-rl-toolkit, transformers or the SageMaker SDK changed
under us: re-check _toolkit.py before anything else."""

from __future__ import annotations

import inspect

import openai
import pytest

from agentcore_rl_toolkit.rollout_gateway import HfTemplateRenderer
from agentcore_rl_toolkit.rollout_gateway.adapters.common import BaseAdapter, Session
from stepwise.gateway import _toolkit
from stepwise.gateway.app import GATEWAY

from tests.support.gateway import (
    TINY_MODEL,
    api_key,
    open_session,
    scripted_gateway,
)

RUN = "run-seams"
TOOL_CALL = '<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call><|im_end|>'


def test_toolkit_is_the_pinned_line():
    _toolkit.check_toolkit_version()
    assert _toolkit.toolkit_version().startswith("0.2.")


def test_adapter_turn_pipeline_uses_the_seams_we_replace():
    """The turn path reads per-sid state through store.setdefault, resolves the sid through
    _session_id, and hands each turn to manager.record_turn after responding."""
    src = inspect.getsource(BaseAdapter._run_turn)
    assert "self.store.setdefault(sid, Session())" in src
    assert "sid = self._session_id(request, body)" in src
    assert "self.inflight.setdefault(sid, set()).add(task)" in src
    assert src.index("await self._respond(") < src.index("self.manager.record_turn(")
    assert 'getattr(self.backend, "min_new_tokens", 1)' in src
    assert {f for f in Session.__dataclass_fields__} == {"sampling_defaults", "max_context_tokens"}


@pytest.fixture(scope="module")
def stack():
    yield from scripted_gateway(RUN)


def test_session_record_state_reaches_the_sampler_and_nothing_stays_in_memory(stack):
    s3, sampler, gw = stack
    sid, _ = open_session(s3.client, RUN, sampling_defaults={"max_new_tokens": 40, "temperature": 0.3, "top_p": 0.9},
                          max_context_tokens=2000)
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=30)
    client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    first, second = sampler.params[-2:]
    assert (first["temperature"], first["top_p"], first["max_new_tokens"]) == (0.3, 0.9, 30)
    assert second["max_new_tokens"] == 40
    for adapter in gw.app[GATEWAY]["adapters"]:
        assert isinstance(adapter.store, _toolkit.RequestScopedSessions)
        assert sid not in adapter.store and sid not in adapter.inflight
        assert sid not in adapter._sid_turn_count and adapter.manager is gw.app[GATEWAY]["recorder"]


def test_tokenizer_is_loaded_once_per_run(stack):
    s3, sampler, gw = stack
    renderers = gw.app[GATEWAY]["renderers"]
    for _ in range(3):
        sid, _ = open_session(s3.client, RUN)
        openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0).chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}])
    assert renderers.loads == 1


def test_toolkit_renderer_parses_tool_calls_with_the_pinned_transformers():
    """toolkit 0.2.0 passes a legacy response_schema to parse_response, a format transformers
    5.13 replaced: past the pin every turn would degrade to raw, ill-formed text."""
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(str(TINY_MODEL))
    ids = raw.encode(TOOL_CALL, add_special_tokens=False)
    parsed = HfTemplateRenderer(raw).parse(ids, tools_schema=[{}])
    assert parsed.tool_uses == [{"name": "add", "input": {"a": 2}}] and not parsed.ill_formed
    plain = HfTemplateRenderer(raw).parse(raw.encode("<think>\nhm\n</think>\n\nHi<|im_end|>",
                                                     add_special_tokens=False))
    assert (plain.reasoning, plain.text, plain.ill_formed) == ("hm", "Hi", False)


def test_directly_built_sampling_client_cannot_stop_the_session_and_retires():
    import boto3
    from sagemaker.train.training_session import SamplingClient
    from sagemaker.train.training_session.exceptions import TrainingSessionError

    runtime = boto3.client("sagemakertrainingsessionruntime", region_name="us-west-2",
                           endpoint_url="http://127.0.0.1:9", aws_access_key_id="x", aws_secret_access_key="x")
    client = SamplingClient("ts", runtime, model_package_arn="arn:p", service_client=None)
    assert client._handle.auto_stop_armed is False
    _toolkit.retire_sampling_client(client)
    with pytest.raises(TrainingSessionError):
        client.sample([1, 2, 3])
