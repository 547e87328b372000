"""The toy task's agent side: the chat the toy agent sends and the reward of its reply.

The task ("what digit comes after N?", ten prompts) and its rows are defined in
``prepare_datasets/prepare_toy.py``; the simulator's base model was pre-trained on exactly the
text the gateway renders for it (``local/simulator/build_assets.py``), so greedy evaluation of
the base model is mostly wrong: it knows the answer *format*, barely the task, and GRPO has
something to learn (`local/simulator/build_assets.py` says how it was pre-trained).
"""

from __future__ import annotations

import re
from typing import Any

#: The system prompt sent when the payload names none: the task's (``prepare_datasets.prepare_toy.SYSTEM_PROMPT``,
#: copied here because the agents' image holds only ``local/agents/``; a test keeps the two equal).
SYSTEM_PROMPT = "Reply with one digit."

_THINK = re.compile(r"<think>.*?</think>", re.DOTALL)


def messages(payload: dict[str, Any]) -> list[dict[str, str]]:
    """The chat the toy agent sends: the payload's ``system`` prompt (default ``SYSTEM_PROMPT``;
    the mix task sets it per difficulty) and the payload's prompt."""
    system = str(payload.get("system") or SYSTEM_PROMPT)
    return [{"role": "system", "content": system}, {"role": "user", "content": str(payload["prompt"])}]


def score(payload: dict[str, Any], answer_text: str | None) -> float:
    """Reward in [0, 1]: 1.0 when the reply (reasoning removed, whitespace stripped) is
    exactly the payload's ``answer``, else 0.0. ``None`` (no reply) scores 0.0."""
    if not answer_text:
        return 0.0
    text = _THINK.sub("", answer_text).replace("<|im_end|>", "").strip()
    return 1.0 if text == str(payload["answer"]) else 0.0
