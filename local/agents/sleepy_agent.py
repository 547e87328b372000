"""The toy task played by a slow agent: after each LLM turn it sleeps a heavy-tailed (lognormal) time.

What deep asynchrony is measured with (``benchmarks/async_depth.py``): a rollout's duration must come
from the agent, not from the CPU of the machine running the local stack, and every arm must see the
same durations. Each rollout makes ``STEPWISE_SLEEPY_TURNS`` LLM calls (default 2): the first asks the
toy question and is scored like the toy agent (``toy_task.score``), the others ask it again and are not
scored; after each call the agent sleeps a lognormal time of mean ``STEPWISE_SLEEPY_TURN_SECONDS``
(default 2.0) and log-sd ``STEPWISE_SLEEPY_SIGMA`` (default 1.0). The durations are a function of the
prompt, the rollout's ``input_id`` (which the pipeline derives from the prompt's place in the
synchronous loop, the same in every engine: `stepwise.core.groups.seed_place`), the rollout's rank
among the rollouts of that ``input_id`` this process has seen, the turn and ``STEPWISE_SLEEPY_SEED``:
a group's members get the same set of durations in every arm, whichever starts first.

Deployable to ACR as it is; its knobs are environment variables of the agent's process.
"""

from __future__ import annotations

import hashlib
import math
import os
import random
import threading
import time
from typing import Any

from agentcore_rl_toolkit import AgentCoreRLApp
from openai import OpenAI

from local.agents import toy_task
from local.agents._llm import llm_settings

app = AgentCoreRLApp()

_seen: dict[str, int] = {}
_lock = threading.Lock()


def knobs() -> tuple[int, float, float, str]:
    """``(turns, mean seconds per turn, log-sd, seed)`` from the environment."""
    env = os.environ
    return (max(1, int(env.get("STEPWISE_SLEEPY_TURNS", "2"))), float(env.get("STEPWISE_SLEEPY_TURN_SECONDS", "2.0")),
            float(env.get("STEPWISE_SLEEPY_SIGMA", "1.0")), env.get("STEPWISE_SLEEPY_SEED", "0"))


def turn_seconds(prompt: str, input_id: str, rank: int, turn: int, *, mean_s: float, sigma: float, seed: str) -> float:
    """The sleep after turn ``turn`` of the ``rank``-th rollout of ``input_id`` (lognormal, mean ``mean_s``)."""
    digest = hashlib.sha256(f"sleepy/{seed}/{prompt}/{input_id}/{rank}/{turn}".encode()).digest()
    rng = random.Random(int.from_bytes(digest[:8], "big"))
    return math.exp(rng.gauss(math.log(max(mean_s, 1e-6)) - sigma * sigma / 2, sigma))


def solve(payload: dict[str, Any]) -> dict[str, Any]:
    """The toy question, then the sleeps and the unscored turns. Returns ``{"rewards", "answer", "slept"}``."""
    turns, mean_s, sigma, seed = knobs()
    input_id = str((payload.get("_rollout") or {}).get("input_id", ""))
    with _lock:
        rank = _seen.get(input_id, 0)
        _seen[input_id] = rank + 1
    client_kwargs, request = llm_settings(payload)
    client = OpenAI(**client_kwargs, max_retries=2, timeout=120)
    answer, slept = None, 0.0
    for turn in range(turns):
        completion = client.chat.completions.create(messages=toy_task.messages(payload), **request)
        if turn == 0:
            answer = completion.choices[0].message.content if completion.choices else None
        pause = turn_seconds(str(payload.get("prompt", "")), input_id, rank, turn, mean_s=mean_s, sigma=sigma, seed=seed)
        time.sleep(pause)
        slept += pause
    return {"rewards": toy_task.score(payload, answer), "answer": answer, "slept": round(slept, 3)}


@app.rollout_entrypoint
def invoke_agent(payload: dict[str, Any]) -> dict[str, Any]:
    return solve(payload)


if __name__ == "__main__":
    app.run()
