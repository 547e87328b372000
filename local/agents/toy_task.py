"""The toy task: "what digit comes after N?", small enough for the tiny model to learn by RL.

Ten distinct prompts (N = 0..9); the answer is ``(N + 1) % 10`` as one digit. The simulator's
base model was pre-trained on exactly the text the gateway renders for this task (the Qwen3
chat template with ``SYSTEM_PROMPT`` and one user message, ``add_generation_prompt=True``)
followed by one digit and ``<|im_end|>``, drawn from ``base_answer_distribution``: right 20% of
the time, a favourite digit (0) 40% of the time, so greedy evaluation of the base model is
mostly wrong. It knows the answer *format*, barely the task, so GRPO has something to learn
(FINDINGS.md, "Toy-task learnability").

Payload rows look like ``{"prompt": "What digit comes after 3?", "answer": "4"}``.
"""

from __future__ import annotations

import random
import re
from typing import Any

SYSTEM_PROMPT = "Reply with one digit."
#: A system prompt under which the base model answers the toy question correctly (pre-trained so:
#: ``local/simulator/build_assets.py``); the mix task's easy bucket uses it.
KNOWING_SYSTEM_PROMPT = "You are good at counting. Reply with the next digit."
NUM_PROMPTS = 10
#: Base-model answer distribution under the toy prompt: 5% on every digit, plus
#: ``BASE_CORRECT_BONUS`` on the right one and ``BASE_FAVORITE_BONUS`` on ``BASE_FAVORITE_DIGIT``
#: (its most likely answer, so greedy evaluation of the base model is mostly wrong).
BASE_CORRECT_BONUS = 0.15
BASE_FAVORITE_BONUS = 0.35
BASE_FAVORITE_DIGIT = 0


def base_answer_distribution(n: int) -> list[float]:
    """The base model's intended p(digit d | prompt n), d = 0..9 (what it was pre-trained on)."""
    floor = (1.0 - BASE_CORRECT_BONUS - BASE_FAVORITE_BONUS) / 10
    probs = [floor] * 10
    probs[(n + 1) % 10] += BASE_CORRECT_BONUS
    probs[BASE_FAVORITE_DIGIT] += BASE_FAVORITE_BONUS
    return probs


_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def prompt_text(n: int) -> str:
    """The user message for digit ``n`` (0..9)."""
    if not 0 <= n < NUM_PROMPTS:
        raise ValueError(f"toy task digit must be in 0..{NUM_PROMPTS - 1}, got {n!r}")
    return f"What digit comes after {n}?"


def answer_for(n: int) -> str:
    return str((n + 1) % 10)


def make_payload(n: int) -> dict[str, str]:
    """The payload for prompt ``n``: ``{"prompt": ..., "answer": ...}``."""
    return {"prompt": prompt_text(n), "answer": answer_for(n)}


def all_payloads() -> list[dict[str, str]]:
    return [make_payload(n) for n in range(NUM_PROMPTS)]


def messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """The chat the toy agent sends: the payload's ``system`` prompt (default ``SYSTEM_PROMPT``;
    the mix task sets it per difficulty) and the payload's prompt."""
    system = str(payload.get("system") or SYSTEM_PROMPT)
    return [{"role": "system", "content": system}, {"role": "user", "content": str(payload["prompt"])}]


def score(payload: dict[str, Any], answer_text: str | None) -> float:
    """Reward in [0, 1]: 1.0 when the reply (reasoning removed, whitespace stripped) is
    exactly the expected digit, else 0.0. ``None`` (no reply) scores 0.0."""
    if not answer_text:
        return 0.0
    text = _THINK.sub("", answer_text).replace("<|im_end|>", "").strip()
    return 1.0 if text == str(payload["answer"]) else 0.0


def sample_payloads(rows: int, seed: int = 0) -> list[dict[str, str]]:
    """``rows`` payloads: every prompt once per cycle, each cycle shuffled with ``seed``."""
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    rng = random.Random(seed)
    out: list[dict[str, str]] = []
    while len(out) < rows:
        cycle = all_payloads()
        rng.shuffle(cycle)
        out.extend(cycle)
    return out[:rows]
