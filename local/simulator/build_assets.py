"""Rebuild the tiny model's shipped files: ``python -m local.simulator.build_assets``.

Writes the byte-level tokenizer (with ``trl``'s Qwen3 chat template) and the base weights to
``local/assets/tiny-model/``. The base weights are pre-trained, deterministically (seed 0,
full batch), on the text the gateway renders for the toy task (``prepare_datasets/prepare_toy.py``):
the chat template applied to the toy system prompt and each user prompt with
``add_generation_prompt=True``, then one digit and ``<|im_end|>``. The digit target is the
mixture ``base_answer_distribution`` (right 20%, a favourite digit 40%), so the
model learns the answer format and a little of the task (a tiny model from random weights needs hundreds of GRPO steps on this task; one that knows the format, tens).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from local.agents import toy_task
from prepare_datasets import prepare_toy
from local.simulator.model import ASSETS_DIR, TinyConfig, TinyLM, build_tokenizer, save_model


#: Base-model answer distribution under the toy prompt: 5% on every digit, plus
#: ``BASE_CORRECT_BONUS`` on the right one and ``BASE_FAVORITE_BONUS`` on ``BASE_FAVORITE_DIGIT``
#: (its most likely answer, so greedy evaluation of the base model is mostly wrong).
BASE_CORRECT_BONUS = 0.15
BASE_FAVORITE_BONUS = 0.35
BASE_FAVORITE_DIGIT = 0


def base_answer_distribution(n: int) -> list[float]:
    """The base model's intended p(digit d | toy prompt n), d = 0..9 (what it is pre-trained on)."""
    floor = (1.0 - BASE_CORRECT_BONUS - BASE_FAVORITE_BONUS) / 10
    probs = [floor] * 10
    probs[int(prepare_toy.answer_for(n))] += BASE_CORRECT_BONUS
    probs[BASE_FAVORITE_DIGIT] += BASE_FAVORITE_BONUS
    return probs


def pretrain_batch(tokenizer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Full pre-training batch: (ids [N, T], soft targets [N, T, V], weights [N, T]).

    Per prompt and digit, one row per context: with the toy system prompt the digit target
    is the mixture ``base_answer_distribution`` (mostly wrong); with
    ``prepare_toy.KNOWING_SYSTEM_PROMPT`` or no system prompt it is the right digit. So the model *has*
    the skill (as a real base model would) but under the toy prompt answers mostly at
    random: GRPO only has to surface it. The ``<|im_end|>`` after the digit is a hard target.
    """
    eos = tokenizer.convert_tokens_to_ids(toy_task_eos())
    digit_ids = [tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)]
    rows = []
    for n in range(prepare_toy.NUM_PROMPTS):
        payload = prepare_toy.make_payload(n)
        correct = int(payload["answer"])
        mix = base_answer_distribution(n)
        one_hot = [1.0 if d == correct else 0.0 for d in range(10)]
        user = {"role": "user", "content": payload["prompt"]}
        contexts = [
            (toy_task.messages(payload), mix),
            ([{"role": "system", "content": prepare_toy.KNOWING_SYSTEM_PROMPT}, user], one_hot),
            ([user], one_hot),
        ]
        for c, (messages, target) in enumerate(contexts):
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt_ids = tokenizer.encode(text, add_special_tokens=False)
            # The digit position's target does not depend on the digit that follows it, so one
            # row per context suffices; the appended digit rotates so <|im_end|> follows each.
            appended = (n + 3 * c) % 10
            rows.append((list(prompt_ids), digit_ids[appended], target, digit_ids, eos))
    t = max(len(r[0]) for r in rows) + 1
    vocab = TinyConfig().vocab_size
    ids = torch.zeros(len(rows), t, dtype=torch.long)
    targets = torch.zeros(len(rows), t, vocab)
    weights = torch.zeros(len(rows), t)
    for i, (p, dig, mix, digit_ids, eos) in enumerate(rows):
        seq = p + [dig, eos]
        ids[i, : len(seq) - 1] = torch.tensor(seq[:-1])
        pos = len(p) - 1  # predicts the digit
        for d, prob in enumerate(mix):
            targets[i, pos, digit_ids[d]] = prob
        weights[i, pos] = 1.0
        targets[i, pos + 1, eos] = 1.0  # predicts <|im_end|> after the digit
        weights[i, pos + 1] = 1.0
    return ids, targets, weights


def toy_task_eos() -> str:
    return "<|im_end|>"


def pretrain(tokenizer, steps: int = 600, lr: float = 3e-3, seed: int = 0) -> TinyLM:
    """Pre-train ``TinyLM`` on ``pretrain_batch`` (soft cross-entropy, Adam, full batch)."""
    torch.manual_seed(seed)
    model = TinyLM(TinyConfig())
    ids, targets, weights = pretrain_batch(tokenizer)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for step in range(steps):
        logits, _ = model(ids)
        logp = F.log_softmax(logits, dim=-1)
        loss = -((targets * logp).sum(-1) * weights).sum() / weights.sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == steps - 1:
            print(f"pretrain step {step}: loss {loss.item():.4f}")
    model.eval()
    return model


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ASSETS_DIR)
    parser.add_argument("--steps", type=int, default=600)
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    build_tokenizer(args.out)
    tokenizer = AutoTokenizer.from_pretrained(str(args.out))
    model = pretrain(tokenizer, steps=args.steps)
    save_model(model, args.out)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
