"""GRPO on the toy task, purely through the SDK against the simulator: the base model starts
near chance and learns. This pins the toy task's recipe the local stack relies on
(``TOY_RECIPE``): sample -> score -> group advantages -> datums -> forward_backward ->
optim_step -> save_weights_and_get_sampling_client, every step."""

from __future__ import annotations

import math
import random
import statistics
import time

import pytest

from local.agents import toy_task
from local.simulator import TOY_RECIPE
from prepare_datasets import prepare_toy
from sagemaker.train.training_session import AdamParams, SamplingParams



def greedy_reward(sc, tok) -> float:
    """Mean toy reward of greedy (temperature 0) answers over all prompts: the eval metric."""
    params = SamplingParams(max_tokens=512, temperature=0.0)
    rewards = []
    for payload in prepare_toy.all_payloads():
        text = tok.apply_chat_template(toy_task.messages(payload), add_generation_prompt=True, tokenize=False)
        seq = sc.sample(tok.encode(text, add_special_tokens=False), num_samples=1, sampling_params=params).result().sequences[0]
        rewards.append(toy_task.score(payload, tok.decode(seq.tokens, skip_special_tokens=True)))
    return statistics.fmean(rewards)


def grpo_curve(svc, steps: int, *, prompts_per_step: int = 8, group_size: int = 8, seed: int = 0, greedy: list | None = None) -> list[float]:
    """Run ``steps`` GRPO steps; returns the mean reward of each step's rollouts. If ``greedy``
    is a list, the greedy eval reward before and after training is appended to it."""
    rng = random.Random(seed)
    tc = svc.create_lora_training_client(base_model="stepwise-tiny", rank=TOY_RECIPE["lora_rank"], alpha=TOY_RECIPE["lora_alpha"])
    try:
        tok = tc.get_tokenizer()
        sc = tc.create_sampling_client()
        params = SamplingParams(max_tokens=TOY_RECIPE["max_tokens"], temperature=TOY_RECIPE["temperature"], seed=seed)
        if greedy is not None:
            greedy.append(greedy_reward(sc, tok))
        curve = []
        for step in range(steps):
            payloads = [prepare_toy.make_payload(rng.randrange(prepare_toy.NUM_PROMPTS)) for _ in range(prompts_per_step)]
            futures = []
            for payload in payloads:
                text = tok.apply_chat_template(toy_task.messages(payload), add_generation_prompt=True, tokenize=False)
                prompt_ids = tok.encode(text, add_special_tokens=False)
                params.seed = rng.randrange(2**31)
                futures.append((payload, prompt_ids, sc.sample(prompt_ids, num_samples=group_size, sampling_params=params)))
            datums, rewards = [], []
            for payload, prompt_ids, fut in futures:
                seqs = fut.result().sequences
                rewards_G = [toy_task.score(payload, tok.decode(s.tokens, skip_special_tokens=True)) for s in seqs]
                rewards.extend(rewards_G)
                mean, std = statistics.fmean(rewards_G), statistics.pstdev(rewards_G)
                if std < 1e-6:
                    continue  # no signal in this group
                for s, r in zip(seqs, rewards_G):
                    adv = (r - mean) / (std + 1e-6)
                    ids = prompt_ids + list(s.tokens)
                    n_prompt, n_resp = len(prompt_ids), len(s.tokens)
                    datums.append(
                        {
                            "modelInput": {"chunks": [{"tokens": ids[:-1], "type": "encoded_text"}]},
                            "lossFnInputs": {
                                "target_tokens": {"data": ids[1:], "dtype": "int64"},
                                "weights": {"data": [0.0] * (n_prompt - 1) + [1.0] * n_resp, "dtype": "float32"},
                                "logprobs": {"data": [0.0] * (n_prompt - 1) + list(s.logprobs), "dtype": "float32"},
                                "advantages": {"data": [0.0] * (n_prompt - 1) + [adv] * n_resp, "dtype": "float32"},
                            },
                        }
                    )
            curve.append(statistics.fmean(rewards))
            if datums:
                tc.forward_backward(datums, loss_fn=TOY_RECIPE["loss"])
                tc.optim_step(AdamParams(learning_rate=TOY_RECIPE["learning_rate"]))
                sc = tc.save_weights_and_get_sampling_client()
        if greedy is not None:
            greedy.append(greedy_reward(sc, tok))
        return curve
    finally:
        tc.stop()


def expected_base_reward(svc) -> float:
    """The base model's exact expected toy reward: the mean over the prompts of
    p(right digit) * p(<|im_end|> | digit), scored with compute_logprobs through the SDK."""
    tc = svc.create_lora_training_client(base_model="stepwise-tiny")
    try:
        tok = tc.get_tokenizer()
        sc = tc.create_sampling_client()
        probs = []
        for n in range(prepare_toy.NUM_PROMPTS):
            payload = prepare_toy.make_payload(n)
            text = tok.apply_chat_template(toy_task.messages(payload), add_generation_prompt=True, tokenize=False)
            ids = tok.encode(text + payload["answer"] + "<|im_end|>", add_special_tokens=False)
            lp = sc.compute_logprobs(ids).result()
            probs.append(math.exp(lp[-1] + lp[-2]))
        return statistics.fmean(probs)
    finally:
        tc.stop()


def test_toy_task_base_model_starts_low_and_grpo_learns_it(sim, svc):
    base = expected_base_reward(svc)
    assert 0.1 <= base <= 0.3, base
    started = time.monotonic()
    greedy: list[float] = []
    curve = grpo_curve(svc, steps=20, greedy=greedy)
    elapsed = time.monotonic() - started
    print(f"toy base expected reward {base:.3f}; greedy {greedy}; GRPO curve:", [round(r, 3) for r in curve], f"{elapsed:.1f}s")
    assert statistics.fmean(curve[:3]) <= 0.4, curve
    assert statistics.fmean(curve[-3:]) >= 0.8, curve
    # Greedy eval: the base model's most likely answer is wrong; the trained one's is right.
    assert greedy[0] <= 0.2 and greedy[1] >= 0.9, greedy
    assert sim.running_sessions() == []


@pytest.mark.e2e
def test_toy_task_grpo_keeps_its_gains_over_40_steps(sim, svc):
    curve = grpo_curve(svc, steps=40, seed=1)
    print("toy GRPO curve (40 steps):", [round(r, 3) for r in curve])
    assert statistics.fmean(curve[-5:]) >= 0.9, curve
