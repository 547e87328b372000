"""The difficulty mix the mix task promises (``prepare_datasets/prepare_mix.py``), measured on the
simulator's base model through the SDK."""

from __future__ import annotations

import statistics

from local.agents import toy_task
from prepare_datasets import prepare_mix
from sagemaker.train.training_session import SamplingParams

GROUP = 8  # examples/mix.json's responses_per_prompt


def test_the_base_model_always_solves_easy_never_hard_and_sometimes_middle(sim, svc):
    tc = svc.create_lora_training_client(base_model="stepwise-tiny", rank=8, alpha=16)
    try:
        tok = tc.get_tokenizer()
        sc = tc.create_sampling_client()
        solved: dict[str, list[float]] = {d: [] for d in prepare_mix.DIFFICULTIES}
        greedy: dict[str, list[float]] = {d: [] for d in prepare_mix.DIFFICULTIES}
        all_equal = []
        for i, payload in enumerate(prepare_mix.all_payloads()):
            text = tok.apply_chat_template(toy_task.messages(payload), add_generation_prompt=True, tokenize=False)
            ids = tok.encode(text, add_special_tokens=False)
            seqs = sc.sample(ids, num_samples=4 * GROUP, sampling_params=SamplingParams(max_tokens=512, temperature=1.0, seed=i)).result().sequences
            rewards = [toy_task.score(payload, tok.decode(s.tokens, skip_special_tokens=True)) for s in seqs]
            solved[payload["difficulty"]].append(statistics.fmean(rewards))
            all_equal += [len(set(rewards[g : g + GROUP])) == 1 for g in range(0, len(rewards), GROUP)]
            best = sc.sample(ids, num_samples=1, sampling_params=SamplingParams(max_tokens=512, temperature=0.0)).result().sequences[0]
            greedy[payload["difficulty"]].append(toy_task.score(payload, tok.decode(best.tokens, skip_special_tokens=True)))
    finally:
        tc.stop()
    rate = {d: statistics.fmean(v) for d, v in solved.items()}
    share = statistics.fmean(all_equal)
    print(f"sampled solve rate {rate}, greedy {({d: statistics.fmean(v) for d, v in greedy.items()})}, all-equal groups of {GROUP}: {share:.3f}")
    assert min(solved["easy"]) >= 0.9 and statistics.fmean(greedy["easy"]) == 1.0
    assert max(solved["hard"]) == 0.0 and statistics.fmean(greedy["hard"]) == 0.0
    assert 0.1 <= rate["middle"] <= 0.4 and statistics.fmean(greedy["middle"]) <= 0.2
    assert share >= 0.6  # DAPO's regime: most groups carry no GRPO signal at the start
