"""The toy-task agent: one LLM call, reward 1.0 for the right digit (``toy_task.score``).

Deployable to ACR as it is (``app = AgentCoreRLApp()`` + ``@app.rollout_entrypoint``): it
calls its LLM with the official ``openai`` client at the ``base_url`` / ``api_key`` /
``model_id`` the pipeline puts in ``_rollout`` and returns ``{"rewards": r}``, which the
toolkit writes to S3 as the rollout result.
"""

from __future__ import annotations

from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from openai import OpenAI

from local.agents import toy_task
from local.agents._llm import llm_settings

app = AgentCoreRLApp()


def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Ask the LLM the payload's question once; score the reply. Returns ``{"rewards", "answer"}``."""
    client_kwargs, request = llm_settings(payload)
    client = OpenAI(**client_kwargs, max_retries=2, timeout=120)
    completion = client.chat.completions.create(messages=toy_task.messages(payload), **request)
    answer = completion.choices[0].message.content if completion.choices else None
    return {"rewards": toy_task.score(payload, answer), "answer": answer}


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return solve(payload)


if __name__ == "__main__":
    app.run()
