"""The two-turn toy agent: the first LLM call decides the reward, the second is free.

Turn 0 asks the payload's toy question (``toy_task.messages``) and is scored like the toy agent
(1.0 for the right digit). Turn 1 asks ``free_prompt`` in a fresh conversation (the trajectory tree
gets a second leaf) and its answer is ignored. The result's ``rewards`` follows the shape the run
reads (``_rollout.reward_granularity``, docs/agent-contract.md): ``[outcome, 0.0]``, one reward per
LLM turn, with ``per_turn``; the number ``outcome`` otherwise. Deployable to ACR as it is.
"""

from __future__ import annotations

from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from openai import OpenAI

from local.agents import toy_task
from local.agents._llm import llm_settings

app = AgentCoreRLApp()


def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Two LLM calls; returns ``{"rewards", "answer", "free_answer"}``."""
    client_kwargs, request = llm_settings(payload)
    client = OpenAI(**client_kwargs, max_retries=2, timeout=120)

    def ask(messages: list[dict[str, str]]) -> str | None:
        completion = client.chat.completions.create(messages=messages, **request)
        return completion.choices[0].message.content if completion.choices else None

    answer = ask(toy_task.messages(payload))
    outcome = toy_task.score(payload, answer)
    free_answer = ask(toy_task.messages({**payload, "prompt": payload.get("free_prompt") or payload["prompt"]}))
    per_turn = (payload.get("_rollout") or {}).get("reward_granularity") == "per_turn"
    return {"rewards": [outcome, 0.0] if per_turn else outcome, "answer": answer, "free_answer": free_answer}


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return solve(payload)


if __name__ == "__main__":
    app.run()
