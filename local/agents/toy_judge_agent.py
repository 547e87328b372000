"""The judged toy task's agent: the toy agent without an answer key (examples/toy_judge.json).

It asks its LLM the toy question once (``toy_task.messages``) and returns the reply as ``answer``. Its training
payloads carry no answer (``prepare_datasets.prepare_toy --no-answer``), so it returns a useless constant reward,
0.0: the run's group judge scores the group's answers against its rubric instead (docs/judge.md). An eval
payload that carries an ``answer`` is scored as the toy agent scores it (exact match), so the run's evals measure
what the judge taught against the known answer.
"""

from __future__ import annotations

from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from openai import OpenAI

from local.agents import toy_task
from local.agents._llm import llm_settings

app = AgentCoreRLApp()


def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """Ask the LLM the payload's question once. Returns ``{"rewards", "answer"}``: the exact-match reward when
    the payload has an answer key, else 0.0."""
    client_kwargs, request = llm_settings(payload)
    client = OpenAI(**client_kwargs, max_retries=2, timeout=120)
    completion = client.chat.completions.create(messages=toy_task.messages(payload), **request)
    answer = completion.choices[0].message.content if completion.choices else None
    reward = toy_task.score(payload, answer) if "answer" in payload else 0.0
    return {"rewards": reward, "answer": answer}


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return solve(payload)


if __name__ == "__main__":
    app.run()
