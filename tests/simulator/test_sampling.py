"""Sampling semantics of the tiny model's sampler (the engine behind ExecuteSamplingOperation):
maxTokens/length, end-of-turn and stop sequences, greedy, top-k, seeds, prompt logprobs."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from local.simulator import engine
from local.simulator.model import ASSETS_DIR

PROMPT = list(b"<x>")


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(str(ASSETS_DIR))


def _sampler(tok, model):
    eos = [tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")]
    return engine.Sampler(model, eos, lambda ids: tok.decode(ids, skip_special_tokens=False))


@pytest.fixture(scope="module")
def sampler(tok):
    """A freshly initialised (seeded) model: near-uniform over the vocabulary, so it babbles
    and rarely ends a turn, which exercises every stopping rule."""
    import torch

    from local.simulator.model import TinyConfig, TinyLM

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the simulator runs it
    torch.manual_seed(0)
    yield _sampler(tok, TinyLM(TinyConfig()))
    torch.set_num_threads(threads)


def test_max_tokens_ends_with_length(sampler):
    seqs = sampler.sample(PROMPT, 4, {"maxTokens": 3, "temperature": 1.0, "seed": 1})
    for s in seqs:
        assert s["stopReason"] in ("length", "stop")
        assert len(s["tokens"]) <= 3 and len(s["logprobs"]) == len(s["tokens"])
        if s["stopReason"] == "length":
            assert len(s["tokens"]) == 3
    assert any(s["stopReason"] == "length" for s in seqs)


def test_end_of_turn_token_stops_and_is_kept(tok):
    from local.agents import toy_task
    from prepare_datasets import prepare_toy

    base = _sampler(tok, engine.base_model())
    text = tok.apply_chat_template(toy_task.messages(prepare_toy.make_payload(1)), add_generation_prompt=True, tokenize=False)
    seqs = base.sample(tok.encode(text, add_special_tokens=False), 8, {"maxTokens": 512, "seed": 3})
    for s in seqs:
        assert s["stopReason"] == "stop" and s["tokens"][-1] in base.eos_ids


def test_stop_sequences_end_generation_on_decoded_text(sampler):
    free = sampler.sample(PROMPT, 1, {"maxTokens": 40, "temperature": 0.0})[0]
    assert free["stopReason"] == "length" and len(free["tokens"]) == 40
    index = next(i for i, t in enumerate(free["tokens"]) if i >= 1 and 32 < t < 127)  # an ASCII byte
    stop = chr(free["tokens"][index])
    stopped = sampler.sample(PROMPT, 1, {"maxTokens": 40, "temperature": 0.0, "stop": [stop]})[0]
    assert stopped["stopReason"] == "stop"
    assert stopped["tokens"] == free["tokens"][: len(stopped["tokens"])]  # same greedy path, cut short
    assert len(stopped["tokens"]) <= index + 1 and sampler.decode(stopped["tokens"]).endswith(stop)


def test_greedy_equals_top_k_1_and_seeds_reproduce(sampler):
    greedy = sampler.sample(PROMPT, 2, {"maxTokens": 20, "temperature": 0.0})
    top1 = sampler.sample(PROMPT, 1, {"maxTokens": 20, "temperature": 1.5, "topK": 1, "seed": 9})
    assert greedy[0]["tokens"] == greedy[1]["tokens"] == top1[0]["tokens"]
    a = sampler.sample(PROMPT, 3, {"maxTokens": 20, "temperature": 1.0, "seed": 42})
    b = sampler.sample(PROMPT, 3, {"maxTokens": 20, "temperature": 1.0, "seed": 42})
    c = sampler.sample(PROMPT, 3, {"maxTokens": 20, "temperature": 1.0, "seed": 43})
    assert [s["tokens"] for s in a] == [s["tokens"] for s in b] != [s["tokens"] for s in c]


def test_tiny_top_p_is_greedy(sampler):
    greedy = sampler.sample(PROMPT, 1, {"maxTokens": 20, "temperature": 0.0})[0]
    nucleus = sampler.sample(PROMPT, 1, {"maxTokens": 20, "temperature": 1.0, "topP": 1e-6, "seed": 5})[0]
    assert nucleus["tokens"] == greedy["tokens"]


def test_sampled_logprobs_are_the_models_and_agree_with_prompt_logprobs(sampler):
    seq = sampler.sample(PROMPT, 1, {"maxTokens": 30, "temperature": 0.7, "topK": 20, "seed": 2})[0]
    scored = sampler.prompt_logprobs(PROMPT + seq["tokens"])
    assert scored[0] is None
    assert max(abs(a - b) for a, b in zip(seq["logprobs"], scored[len(PROMPT):])) < 1e-4
    topk = sampler.topk_prompt_logprobs(PROMPT + seq["tokens"], 3)
    assert topk[0] == [] and all(len(row) == 3 for row in topk[1:])
    assert all(row[0]["logprob"] >= row[1]["logprob"] >= row[2]["logprob"] for row in topk[1:])
