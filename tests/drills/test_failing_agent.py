"""Drill: an agent that fails every rollout fails the run, loudly, and trains nothing.

The whole local stack (moto's engine with the real ASL and handlers, the gateway, the ACR emulator in
front of real toolkit agents, the SageMaker simulator), one small run per class of failing agent:

- the agent raises (`scripted_reward_agent` on payloads without ``rewards``: ValueError after its
  LLM call; the toolkit saves ``status_code`` 500 with the exception as ``stop_reason``);
- every LLM call is refused (the simulator fails every ``sample`` operation; the toy agent's OpenAI
  client raises, the toolkit saves ``status_code`` 500);
- the result is ``status_code`` 500 (the ACR emulator's ``error_result`` fault);
- the result is not JSON (``malformed_result``).

Before: the first three ended SUCCEEDED (with 2 optimizer steps on zero-advantage datums for the
agent that raised after its LLM call), billing the session for the whole dataset. Now each FAILS
through the catch-all with ``RolloutsFailed`` naming the agent's cause and its count, the session is
stopped, and no optimizer step is applied. A last run whose agent answers without ever calling its
LLM (every rollout ``ok`` but none trainable) fails with ``NoTrainingSignal`` after
``max_consecutive_empty_steps`` steps instead of skipping every step.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local.run import run_local
from prepare_datasets import prepare_toy

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "examples" / "toy.json"
SCRIPTED = "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/scripted_reward_agent-local"

pytestmark = pytest.mark.e2e


def _dataset(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps({"payload": r}) + "\n" for r in rows))
    return str(path)


def _run(tmp: Path, name: str, *, overrides: dict | None = None, simulator_options: dict | None = None,
         acr_faults: dict | None = None, rows: list[dict] | None = None):
    rows = rows or [prepare_toy.make_payload(i) for i in range(6)]
    config = {
        "batch_size": 2, "responses_per_prompt": 2, "max_prompts": 6,  # 3 steps of 4 rollouts
        "eval_every": 0, "eval_dataset_path": "", "save_every": -1, "max_rollout_time": 30,
        "dataset_path": _dataset(tmp / f"{name}.jsonl", rows), **(overrides or {}),
    }
    result = run_local(CONFIG, run_id=f"drill-{name}", out_root=tmp, progress=False, quiet=True, timeout=180,
                       overrides=config, simulator_options=simulator_options, acr_faults=acr_faults)
    state = json.loads((result.run_dir / "state.json").read_text())
    return result, state


CLASSES = {
    # name: (run arguments, the error, what the cause must name)
    "agent_raises": (dict(overrides={"agent_runtime_arn": SCRIPTED}),
                     "RolloutsFailed", "4 x AgentError: payload 'rewards' must be a non-empty list of numbers"),
    "llm_calls_refused": (dict(simulator_options={"fault": "fail:sample:1.0"}),
                          "RolloutsFailed", "4 x AgentError: "),
    "status_code_500": (dict(acr_faults={"error_result": 100}), "RolloutsFailed", "4 x AgentError: injected fault"),
    "malformed_result": (dict(acr_faults={"malformed_result": 100}), "RolloutsFailed", "4 x MalformedResult: "),
}


@pytest.mark.parametrize("name", list(CLASSES))
def test_an_agent_that_fails_every_rollout_fails_the_run_stops_the_session_and_trains_nothing(tmp_path, name):
    kwargs, error, fragment = CLASSES[name]
    result, state = _run(tmp_path, name, **kwargs)
    assert result.status == "FAILED", (result.status, result.failure)
    assert result.failure.error == error and fragment in result.failure.cause, result.failure
    assert "all 4 rollouts of the train batch of step 0" in result.failure.cause
    assert "4 error, 0 timeout, 0 ok" in result.failure.cause
    assert result.simulator_counters.get("CreateTrainingSession") == 1
    assert result.simulator_counters.get("optim_step", 0) == 0 and result.simulator_counters.get("forward_backward", 0) == 0
    assert result.session_status in ("Stopping", "Stopped") and state["session_stopped"]
    assert state["stop_reason"] == f"failed: {error}" and state["step"] == 0 and not state["finished"]


def test_steps_without_a_trainable_datum_fail_the_run_after_max_consecutive_empty_steps(tmp_path):
    # Every rollout succeeds with a reward, but the agent never calls its LLM: nothing to train on.
    rows = [{**prepare_toy.make_payload(i), "rewards": [1.0, 0.0], "call_llm": False} for i in range(6)]
    result, state = _run(tmp_path, "no_datums", rows=rows,
                         overrides={"agent_runtime_arn": SCRIPTED, "max_consecutive_empty_steps": 2})
    assert result.status == "FAILED", (result.status, result.failure)
    assert result.failure.error == "NoTrainingSignal"
    assert "2 consecutive step(s) (0 to 1) produced no trainable datum" in result.failure.cause
    assert "0 error, 0 timeout, 4 ok; 4 without a captured turn" in result.failure.cause
    assert result.simulator_counters.get("optim_step", 0) == 0
    assert result.session_status in ("Stopping", "Stopped") and state["session_stopped"]
    # steps 0 and 1 were skipped, their summaries written (and counted) before the run failed
    summaries = [json.loads((result.run_dir / "steps" / str(s) / "summary.json").read_text()) for s in (0, 1)]
    assert [(s["decision"], s["sampler/num_datums"], s["sampling/empty_rollouts"]) for s in summaries] == [("skip", 0, 4.0)] * 2
    assert state["empty_steps"] == 1 and state["step"] == 1
