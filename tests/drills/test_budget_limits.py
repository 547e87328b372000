"""Drill: budget limits end a run gracefully where the cost ledger's projection says, through the real
state machine on moto, the real handlers and the SageMaker simulator (the agent is `FakeAgent`, whose
rollouts each take a few seconds: a step is worth projecting).

A limit is checked before each step (`stepwise.core.stopping`): the ledger's figure so far plus the
largest of the last steps' figures. So the run must end before the first step whose check passes the
limit, every step that ran must have had a check within it, and the check that ended the run must be
made of the ledger's own figures (each step's summary keeps its ``cost/*`` and ``budget/*`` keys).
Then the run ends as the end of its epochs does: final checkpoint, session stopped, SUCCEEDED. A
resume after the limit keeps the ledger (and the limit still holds: no step is trained).
"""

from __future__ import annotations

import json
import uuid

import pytest
from tests.support.pipeline import FakeAgent, Stack, wait_execution

from stepwise.executions import continuation_name
from stepwise.layout import state_key, summary_key

pytestmark = pytest.mark.e2e

BUCKET = "stepwise-budget-test"
STEPS = 10  # 20 prompts, 2 per step: every limit below binds well before the epoch ends


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = FakeAgent()
    agent.result_delay = 4.0  # each rollout's ACR session: the step's cost and wall time grow with it
    _arns, sm_arn = stack.deploy(agent, "budget-test")
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(2 * STEPS)]
    base = stack.config(dataset_path=stack.put_dataset("data/budget.jsonl", rows), max_rollout_time=60)
    yield stack, sm_arn, base
    agent.stop()
    stack.stop()


def _json(stack: Stack, key: str) -> dict:
    return json.loads(stack.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _run(stack: Stack, sm_arn: str, config: dict) -> tuple[str, dict, dict, list[dict]]:
    """Start a run of ``config``; ``(run id, its execution, its state, its step summaries)`` once it ended."""
    sfn = stack.moto.client("stepfunctions")
    run_id = f"budget-{uuid.uuid4().hex[:6]}"
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(config))["executionArn"]
    done = wait_execution(sfn, arn, timeout=600)
    state = _json(stack, state_key(run_id))
    return run_id, done, state, [_json(stack, summary_key(run_id, s)) for s in range(state["step"])]


def _ended_where_the_projection_says(state: dict, summaries: list[dict], limit: str, step_key: str,
                                     scale: float = 1.0) -> dict:
    """The run stopped before a step whose check passed ``limit``, after steps whose checks did not, and
    the stopping check is the ledger's figure plus the largest of the last steps' ``step_key`` (x
    ``scale``). Returns that check."""
    check = state["ledger"]["checks"][limit]
    assert state["stop_reason"].startswith(f"{limit}: ") and "(the run would pass it)" in state["stop_reason"]
    assert check["projected"] > check["limit"]
    recent = [s[step_key] * scale for s in summaries[-5:]]
    assert check["next_step"] == pytest.approx(max(recent) if recent else 0.0, rel=1e-9, abs=1e-12)
    assert check["projected"] == pytest.approx(check["spent"] + check["next_step"])
    for s in summaries:  # each step that ran was let in by a check within the limit
        assert s[f"budget/{limit}_projected"] <= s[f"budget/{limit}_limit"] == check["limit"]
    return check


def _ended_gracefully(stack: Stack, done: dict, state: dict) -> None:
    assert done["status"] == "SUCCEEDED", done.get("cause")
    assert state["finished"] and state["session_stopped"] and state["step"] < STEPS
    assert [(c["step"], c["reason"]) for c in state["checkpoints"]] == [(state["step"], "final")]
    assert stack.sim.running_sessions() == []
    out = json.loads(done["output"])["stopped"]
    assert out["cost"]["line"].startswith("this run cost $") and out["cost"] == state["ledger"]["final"]


def test_max_cost_usd_ends_the_run_where_its_projection_says_and_a_resume_keeps_the_ledger(local):
    stack, sm_arn, base = local
    before = dict(stack.sim.counters)
    # the session at $1 a second: a step (4 rollouts of 4 s at once, then training) costs about $5-15
    run_id, done, state, summaries = _run(stack, sm_arn, dict(base, session_usd_per_hour=3600.0, max_cost_usd=40.0))
    _ended_gracefully(stack, done, state)
    check = _ended_where_the_projection_says(state, summaries, "max_cost_usd", "cost/step_usd")
    if summaries:  # the ledger only grows: what the check saw is at least the last step's total
        assert check["spent"] >= summaries[-1]["cost/total_usd"]
    assert state["ledger"]["final"]["total_usd"] >= check["spent"]
    assert stack.sim.counters.get("optim_step", 0) - before.get("optim_step", 0) == state["step"]
    for s in summaries:  # the summary's parts add up, and the session was priced
        parts = sum(s[f"cost/{p}_usd"] for p in ("session", "agent", "lambda", "step_functions", "s3"))
        assert s["cost/step_usd"] == pytest.approx(parts) and s["cost/session_usd"] > 0
        assert s["cost/acr_session_seconds"] >= 4 * 4.0  # the fake agent's four 4-second sessions

    # `stepwise resume` of the run (its continuation with "resume": true): the ledger is not reset,
    # the limit still holds (no step trained), and the resumed session's seconds are added.
    sfn = stack.moto.client("stepfunctions")
    segment = state["segment"] + 1
    body = {"continuation": {"run_id": run_id, "parent_execution_arn": state["owner_execution_arn"],
                             "segment": segment, "resume": True}}
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=continuation_name(run_id, segment),
                              input=json.dumps(body))["executionArn"]
    assert wait_execution(sfn, arn, timeout=300)["status"] == "SUCCEEDED"
    after = _json(stack, state_key(run_id))
    assert after["stop_reason"] == state["stop_reason"] and after["step"] == state["step"]
    assert stack.sim.counters.get("optim_step", 0) - before.get("optim_step", 0) == state["step"]
    old, new = state["ledger"], after["ledger"]
    assert new["sessions_closed_seconds"] > old["sessions_closed_seconds"]
    assert new["final"]["total_usd"] > old["final"]["total_usd"]
    for key in ("state_transitions", "s3_put_class", "s3_get_class"):
        assert new["usage"][key] > old["usage"][key]
    assert all(new["usage"]["lambda_gb_seconds"][f] >= v for f, v in old["usage"]["lambda_gb_seconds"].items())
    assert new["recent_steps"] == old["recent_steps"] and new["run_started_at"] == old["run_started_at"]


def test_max_run_hours_ends_the_run_where_its_projection_says(local):
    stack, sm_arn, base = local
    run_id, done, state, summaries = _run(stack, sm_arn, dict(base, max_run_hours=40 / 3600))
    _ended_gracefully(stack, done, state)
    check = _ended_where_the_projection_says(state, summaries, "max_run_hours", "cost/step_wall_seconds", 1 / 3600)
    # the wall clock since the run started holds every step's wall time, and the start-up before them
    assert check["spent"] * 3600 >= sum(s["cost/step_wall_seconds"] for s in summaries)
    final = state["ledger"]["final"]
    assert "session" not in final["usd"] and "(not priced: no session_usd_per_hour)" in final["line"]
