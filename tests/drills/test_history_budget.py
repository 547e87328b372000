"""Drill: an execution's history is bounded by a budget of events, not by a count of steps.

Every training step here waits on a slow ``optim_step`` (the simulator's latency injection) with no
inline wait and a 1 s poll interval, so each step adds a dozen Wait/Check/Choice rounds to the
parent's history. ``steps_per_execution`` (20) would never continue this 4-step run; the history
budget must, before any execution's history passes it.
"""

from __future__ import annotations

import json
import uuid

import pytest
from tests.support.pipeline import FakeAgent, Stack, wait_execution
from stepwise.layout import state_key

pytestmark = pytest.mark.e2e  # four slow steps over several executions: ~2 min

BUCKET = "stepwise-history-drill"
BUDGET = 200
OPTIM_STEP_SECONDS = 4.0


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = FakeAgent()
    _arns, sm_arn = stack.deploy(agent, "history-drill")
    yield stack, agent, sm_arn
    agent.stop()
    stack.stop()


def test_long_polling_steps_continue_as_new_before_the_history_budget(local):
    stack, agent, sm_arn = local
    sfn = stack.moto.client("stepfunctions")
    stack.mp.setenv("STEPWISE_INLINE_WAIT_SECONDS", "0")  # every wait goes through the state machine's poll loop
    stack.mp.setenv("STEPWISE_POLL_SECONDS", "1")
    stack.sim.set_latency("optim_step", OPTIM_STEP_SECONDS)
    stack.sim.set_result_wait(0)  # no long poll: GetTrainingOperationResult answers InProgress at once
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(8)]
    config = stack.config(dataset_path=stack.put_dataset("data/history.jsonl", rows), max_rollout_time=20,
                          steps_per_execution=20, history_event_budget=BUDGET)
    run_id = f"hist-{uuid.uuid4().hex[:6]}"
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(config))["executionArn"]
        executions = []
        while True:
            d = wait_execution(sfn, arn, timeout=300)
            assert d["status"] == "SUCCEEDED", d.get("cause")
            events = sfn.get_execution_history(executionArn=arn)["events"]
            executions.append((arn, events))
            outputs = [json.loads(e["lambdaFunctionSucceededEventDetails"]["output"]) for e in events
                       if e["type"] == "LambdaFunctionSucceeded"]
            outputs = [o for o in outputs if isinstance(o, dict) and "action" in o]  # PlanStep's
            if not any(o.get("action") == "continue" for o in outputs):
                break
            reasons = [o["reason"] for o in outputs if o.get("action") == "continue"]
            assert reasons and f"history_event_budget {BUDGET}" in reasons[0], reasons
            arn = arn.rsplit(":", 1)[0] + f":{run_id}--{len(executions)}"
    finally:
        stack.sim.set_latency("optim_step", 0.0)
        stack.sim.set_result_wait(5.0)
    state = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=state_key(run_id))["Body"].read())
    steps = 4
    assert state["finished"] and state["step"] == steps and state["segment"] == len(executions) - 1
    lengths = [len(events) for _, events in executions]
    polls = sum(1 for _, events in executions for e in events
                if e["type"] == "WaitStateEntered" and e["stateEnteredEventDetails"]["name"] == "Wait for training step")
    print(f"history drill: {len(executions)} executions of {lengths} events, {polls} training polls, "
          f"max_step_events {state['max_step_events']}")
    # the steps were long (they polled), and together they would not fit in one execution's budget
    assert polls >= 2 * steps and state["max_step_events"] * steps > BUDGET
    # ... yet the run continued as new in time: no execution's history reached the budget
    assert len(executions) >= 3 and max(lengths) <= BUDGET, lengths
