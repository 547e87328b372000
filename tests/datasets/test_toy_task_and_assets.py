"""The toy task's scoring and dataset, and the shipped tiny-model files."""

from __future__ import annotations

import hashlib
import json

import pytest

from local.agents import toy_task
from local.simulator.model import ASSETS_DIR, load_base_model, qwen3_chat_template
from prepare_datasets import prepare_toy
from stepwise.datasets import load_payloads


@pytest.mark.parametrize(
    ("reply", "reward"),
    [("4", 1.0), (" 4\n", 1.0), ("<think>3 then 4</think>\n\n4", 1.0), ("4<|im_end|>", 1.0), ("5", 0.0), ("44", 0.0), ("", 0.0), (None, 0.0)],
)
def test_score_is_exact_match_of_the_next_digit(reply, reward):
    assert toy_task.score(prepare_toy.make_payload(3), reply) == reward


def test_the_toy_agent_sends_the_tasks_system_prompt():
    """The task's prompts live with its dataset (`prepare_datasets.prepare_toy`); the agent keeps its own copy of the
    default (its image holds only local/agents/), which must be the task's, or the base model's pre-training misses."""
    assert toy_task.SYSTEM_PROMPT == prepare_toy.SYSTEM_PROMPT
    assert toy_task.messages(prepare_toy.make_payload(1))[0] == {"role": "system", "content": prepare_toy.SYSTEM_PROMPT}


def test_nine_wraps_to_zero_and_out_of_range_prompts_are_refused():
    assert prepare_toy.make_payload(9) == {"prompt": "What digit comes after 9?", "answer": "0"}
    with pytest.raises(ValueError, match="0..9"):
        prepare_toy.make_payload(10)


def test_prepare_toy_writes_deterministic_payload_rows(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert prepare_toy.main(["--output", str(a), "--rows", "25", "--seed", "3"]) == 0
    prepare_toy.main(["--output", str(b), "--rows", "25", "--seed", "3"])
    prepare_toy.main(["--output", str(c), "--rows", "25", "--seed", "4"])
    assert a.read_text() == b.read_text() != c.read_text()
    rows = [json.loads(line) for line in a.read_text().splitlines()]
    assert len(rows) == 25 and all(set(r) == {"payload"} for r in rows)
    payloads = load_payloads(str(a))
    assert len(payloads) == 25
    assert {p["prompt"] for p in payloads[:10]} == {prepare_toy.prompt_text(n) for n in range(10)}  # each prompt once per cycle
    assert all(toy_task.score(p, p["answer"]) == 1.0 for p in payloads)


def test_shipped_tokenizer_is_byte_level_with_trls_qwen3_template():
    from transformers import AutoTokenizer

    from agentcore_rl_toolkit.rollout_gateway.response_schemas import resolve_schema_name

    tok = AutoTokenizer.from_pretrained(str(ASSETS_DIR))
    assert hashlib.sha256(tok.chat_template.encode()).hexdigest() == hashlib.sha256(qwen3_chat_template().encode()).hexdigest()
    assert resolve_schema_name(tok) is not None  # the gateway's renderer gets real tool-call parsing
    text = "héllo <|im_end|>"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:7] == list("héllo ".encode())  # byte ids are byte values
    assert ids[-1] == tok.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(ids) == text


def test_shipped_weights_are_small_and_load():
    model = load_base_model()
    size = (ASSETS_DIR / "model.safetensors").stat().st_size
    assert size < 2_000_000
    assert model.cfg.vocab_size >= 265 and model.cfg.max_context >= 2048
