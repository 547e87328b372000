"""A test agent whose rewards the dataset fixes: known mixes of solved / unsolved / mixed prompts.

Selected like every local agent by its runtime ARN (``.../runtime/scripted_reward_agent-local``,
`local.acr.agent_spec_for_arn`). It asks its LLM the toy question once through the gateway (so
every rollout has a captured turn and trainable datums), then ignores the answer and returns
the reward the payload scripts:

- ``"rewards": [r0, r1, ...]``: the n-th rollout of this prompt (``_rollout.input_id``) to finish
  in this process gets ``rewards[n % len(rewards)]``. ``[1.0]`` = always solved, ``[0.0]`` =
  never solved, ``[1.0, 0.0]`` = a mixed group (rewards differ whenever the group has >= 2
  members). The group's multiset of rewards is therefore fixed; which member gets which is
  the order of arrival.
- ``"call_llm": false``: return without calling the LLM, so the rollout has no captured turn and
  no trainable datum (an "empty rollout").

Payload rows look like ``{"prompt": "What digit comes after 3?", "answer": "4", "rewards": [1.0, 0.0]}``.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp

from local.agents import toy_task

app = AgentCoreRLApp()
_lock = threading.Lock()
_seen: collections.Counter[str] = collections.Counter()


def scripted_reward(payload: dict[str, Any]) -> float:
    """The reward of this rollout: ``rewards[n % len]`` for the n-th rollout of its ``input_id``.

    Raises:
        ValueError: ``rewards`` is missing, empty, or not a list of numbers.
    """
    rewards = payload.get("rewards")
    if not isinstance(rewards, list) or not rewards or not all(isinstance(r, (int, float)) for r in rewards):
        raise ValueError(f"payload 'rewards' must be a non-empty list of numbers, got {rewards!r}")
    key = str((payload.get("_rollout") or {}).get("input_id", ""))
    with _lock:
        n = _seen[key]
        _seen[key] += 1
    return float(rewards[n % len(rewards)])


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    answer = None
    if payload.get("call_llm", True):
        from openai import OpenAI

        from local.agents._llm import llm_settings

        client_kwargs, request = llm_settings(payload)
        client = OpenAI(**client_kwargs, max_retries=2, timeout=120)
        completion = client.chat.completions.create(messages=toy_task.messages(payload), **request)
        answer = completion.choices[0].message.content if completion.choices else None
    return {"rewards": scripted_reward(payload), "answer": answer}


if __name__ == "__main__":
    app.run()
