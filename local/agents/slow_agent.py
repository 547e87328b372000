"""A test agent that takes its time: the rollouts a drill keeps in flight (a stop with hundreds of
runtime sessions busy, `tests/drills/test_run_end_at_scale.py`, `benchmarks/run_end_at_scale.py`).

Selected like every local agent by its runtime ARN (``.../runtime/slow_agent-local``). Each rollout
asks its LLM the toy question once through the gateway when the payload says ``"call_llm": true``
(default false: no model needed), then waits ``"seconds"`` (default 600) without holding a thread
(an ``async`` entrypoint: hundreds of rollouts are coroutines of one process), then returns reward 0.
Its runtime session stays busy (ACR's ``HealthyBusy``) the whole time, so only a ``StopRuntimeSession``
or the session's maximum lifetime ends it early; a stopped session's work is cancelled and writes no
result (`local.agents.serve`).
"""

from __future__ import annotations

import asyncio
from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp

app = AgentCoreRLApp()


@app.rollout_entrypoint
async def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    answer = None
    if payload.get("call_llm", False):
        from local.agents.toy_agent import solve

        answer = (await asyncio.to_thread(solve, payload)).get("answer")
    await asyncio.sleep(float(payload.get("seconds", 600)))
    return {"rewards": 0.0, "answer": answer}


if __name__ == "__main__":
    app.run()
