"""The toolkit's response schemas, evaluated by the pinned transformers' own ``parse_response``
(what ``HfTemplateRenderer`` calls), parse each model family's output (reasoning, text, tool
calls) as the schemas describe.

transformers 5.13 replaced this schema format; pyproject pins ``transformers<5.13`` for it. If
an upgrade slips past the pin, these cases fail before any agent sees raw, unparsed output."""

from __future__ import annotations

import pytest

from agentcore_rl_toolkit.rollout_gateway.response_schemas import RESPONSE_SCHEMAS
from transformers import AutoTokenizer

from tests.support.gateway import TINY_MODEL


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(TINY_MODEL))


def parse_with_schema(tokenizer, text, schema):
    return tokenizer.parse_response(text, schema=schema)


def call(name, **arguments):
    return {"type": "function", "function": {"name": name, "arguments": arguments}}


CASES = [
    ("qwen3", "Hello<|im_end|>", {"content": "Hello"}),
    ("qwen3", "<think>\nhm\n</think>\n\nHi<|im_end|>", {"content": "Hi", "reasoning_content": "hm"}),
    ("qwen3", 'a\n<tool_call>\n{"name": "add", "arguments": {"a": 1, "b": "x"}}\n</tool_call>\n'
              '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call><|im_end|>',
     {"content": "a", "tool_calls": [call("add", a=1, b="x"), call("b")]}),
    ("qwen3", "cut off mid-sentence", {"content": "cut off mid-sentence"}),
    ("qwen3_5", "<think>\nplan\n</think>\n\nok\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
                "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call><|im_end|>",
     {"content": "ok", "reasoning_content": "plan", "tool_calls": [call("get_weather", city="Paris", days=3)]}),
    ("glm4moe", "\n<think>why</think>answer\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
                "<arg_value>Paris</arg_value>\n</tool_call>",
     {"content": "answer", "reasoning_content": "why", "tool_calls": [call("get_weather", city="Paris")]}),
    ("gptoss", "<|channel|>analysis<|message|>think hard<|end|><|start|>assistant<|channel|>final<|message|>"
               "The answer is 4.<|return|>", {"content": "The answer is 4.", "reasoning_content": "think hard"}),
    ("gptoss", "<|channel|>analysis<|message|>need tool<|end|><|start|>assistant<|channel|>commentary "
               'to=functions.add code<|message|>{"a": 1}<|call|>',
     {"reasoning_content": "need tool", "tool_calls": [call("add", a=1)]}),
]


@pytest.mark.parametrize("family, text, expected", CASES)
def test_family_outputs_parse(tokenizer, family, text, expected):
    assert parse_with_schema(tokenizer, text, RESPONSE_SCHEMAS[family]) == {"role": "assistant", **expected}


def test_truncated_tool_call_does_not_match(tokenizer):
    """The toolkit then degrades the turn to raw text flagged ill_formed."""
    assert parse_with_schema(tokenizer, '<tool_call>\n{"name": "add", "argu', RESPONSE_SCHEMAS["qwen3"]) is None


def test_malformed_tool_json_raises_for_the_toolkit_to_degrade(tokenizer):
    with pytest.raises(ValueError):
        parse_with_schema(tokenizer, "<tool_call>\n{not json}\n</tool_call><|im_end|>", RESPONSE_SCHEMAS["qwen3"])


def test_every_toolkit_schema_is_covered():
    assert set(RESPONSE_SCHEMAS) == {family for family, _, _ in CASES}
