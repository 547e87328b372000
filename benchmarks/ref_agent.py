"""The toy agent for the toolkit's reference loop (``train_grpo``), which sends ``_config``.

The reference loop (``agentcore_rl_toolkit.backends.experimental.sagemaker.rollout.run_one_rollout``)
invokes the agent through ``AgentCoreHttpClient`` with ``{**payload, "_config": {base_url,
model_id, api_key}}`` and reads ``{"reward": float}`` from the HTTP answer. A plain
``BedrockAgentCoreApp`` answers that JSON directly, which the client turns into an already
completed handle (no 10 s ``get`` polling). It does the same work as ``local/agents/toy_agent.py``
(one LLM call through the ``openai`` client, ``toy_task.score``), so the two loops run the same agent.
It also accepts the pipeline's ``_rollout`` (then it simply answers the reward as well).
"""

from __future__ import annotations

from typing import Any

from bedrock_agentcore.runtime import BedrockAgentCoreApp
from openai import OpenAI

from local.agents import toy_task
from local.agents._llm import llm_settings

app = BedrockAgentCoreApp()


def _as_rollout(payload: dict[str, Any]) -> dict[str, Any]:
    """Map the reference's ``_config`` onto the ``_rollout`` shape ``llm_settings`` reads."""
    if "_rollout" in payload or not isinstance(payload.get("_config"), dict):
        return payload
    return {**payload, "_rollout": dict(payload["_config"])}


@app.entrypoint
def invoke(payload: dict[str, Any]) -> dict[str, Any]:
    """One LLM call, scored. Returns ``{"reward": 0.0|1.0, "answer": str|None}``."""
    client_kwargs, request = llm_settings(_as_rollout(payload))
    client = OpenAI(**client_kwargs, max_retries=2, timeout=120)
    completion = client.chat.completions.create(messages=toy_task.messages(payload), **request)
    answer = completion.choices[0].message.content if completion.choices else None
    return {"reward": toy_task.score(payload, answer), "answer": answer}


if __name__ == "__main__":
    app.run()
