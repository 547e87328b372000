"""Drills on single handlers against moto and the simulator: bad data refused before any session,
a session that never reaches Running (bounded wait, clear failure, stopped), and rollouts whose
invoke failed or whose reward is not a finite number scoring 0.0 without failing."""

from __future__ import annotations

import json
import time
import uuid

import pytest
from tests.support.pipeline import BUCKET, execution_arn, init_run, new_run_id, play_rollout, run_ref, session_creates, wait_ready

from stepwise.datasets import DatasetError
from stepwise.handlers import plan
from stepwise.events import FinishEvent, RunEvent, StopEvent
from stepwise.handlers.rollout import finish
from stepwise.handlers.session import SessionStartTimeout, poll_session, stop
from stepwise.layout import rollouts_prefix, state_key
from stepwise.aws.runstore import RunStore


GOOD = json.dumps({"payload": {"prompt": "p", "answer": "1"}})


@pytest.mark.parametrize("name, body, fragment", [
    ("bad-row.jsonl", "\n".join([GOOD, GOOD, '{"payload": {"prompt": "p"', GOOD]), ":3: not valid JSON"),
    ("not-object.jsonl", "\n".join([GOOD, GOOD, GOOD, json.dumps({"payload": [1, 2]})]), ":4:"),
    ("no-payload.jsonl", "\n".join([json.dumps({"prompt": "p"})] * 4), "'payload'"),
    ("broken.parquet", "PAR1 this is not parquet", "not a readable Parquet file"),
    ("binary.jsonl", b"\xff\xfe\x00garbage", "not UTF-8"),
    ("missing.jsonl", None, "cannot read from S3"),
])
@pytest.mark.parametrize("which", ["dataset_path", "eval_dataset_path"])
def test_bad_data_is_refused_naming_the_problem_before_any_session(stack, name, body, fragment, which):
    key = f"drill-data/{uuid.uuid4().hex[:6]}/{name}"
    if body is not None:
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=body.encode() if isinstance(body, str) else body)
    run_id = new_run_id("baddata")
    before = session_creates(stack)
    with pytest.raises(DatasetError) as e:
        init_run(stack, run_id, stack.config(**{which: f"s3://{BUCKET}/{key}"}))
    assert fragment in str(e.value) and key in str(e.value)
    assert session_creates(stack) == before
    assert not RunStore(BUCKET, stack.s3).exists(state_key(run_id))  # nothing claimed: the run id can be reused


def test_a_session_that_never_runs_fails_within_the_bound_and_is_stopped(stack):
    stack.mp.setenv("STEPWISE_SESSION_START_TIMEOUT", "1")
    stack.sim.set_session_start("hang")
    run_id = new_run_id("hang")
    try:
        init_run(stack, run_id, stack.config())
        ev = RunEvent.model_validate({"run": run_ref(run_id)})
        with pytest.raises(SessionStartTimeout, match="STEPWISE_SESSION_START_TIMEOUT=1"):
            for _ in range(20):
                assert poll_session(ev)["ready"] is False
                time.sleep(0.25)
    finally:
        stack.sim.set_session_start("ok")
        stack.mp.setenv("STEPWISE_SESSION_START_TIMEOUT", "1800")
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.training_session_name in stack.sim.session_statuses()
    # The catch-all's StopSession with the error, as the state machine runs it.
    stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={},
                   error={"Error": "SessionStartTimeout", "Cause": "drill"}))
    assert stack.sim.session_statuses()[state.training_session_name] in ("Stopping", "Stopped")
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.session_stopped and state.stop_reason == "failed: SessionStartTimeout"


def test_invoke_errors_and_non_finite_rewards_score_zero_and_never_fail_the_rollout(stack):
    run_id = new_run_id("rewards")
    init_run(stack, run_id, stack.config(batch_size=4, responses_per_prompt=2))
    assert wait_ready(run_id)["ready"]
    p = plan.plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = RunStore(BUCKET, stack.s3).get_json(p["items_key"])
    outcomes = []
    # StartRollout raised a non-retryable error (ACR refused the invoke): the Catch goes to FinishRollout.
    err = {"Error": "ValidationException", "Cause": "InvokeAgentRuntime: runtime is not READY"}
    outcomes.append(finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": items[0],
                                                       "result": None, "error": err})))
    for item, value in zip(items[1:], ["NaN", "Infinity", "-Infinity", None]):
        sid = str(uuid.uuid4())
        key = play_rollout(stack, run_id, sid, item["input_id"], 1.0, [5, 6])
        raw = '{"rewards": %s, "status_code": 200}' % value if value else '{"status_code": 200}'  # NaN/inf as Python's json writes them
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=raw.encode())
        outcomes.append(finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                                           "result": {"sid": sid, "result_key": key}, "error": None})))
    assert [o["reward"] for o in outcomes] == [0.0] * 5
    assert outcomes[0]["status"] == "error" and all(o["status"] == "ok" for o in outcomes[1:])
    records = [RunStore(BUCKET, stack.s3).get_json(k)
               for k in RunStore(BUCKET, stack.s3).list_keys(rollouts_prefix(run_id, 0, 0))]
    reasons = sorted(str(r["reward_reason"]) for r in records)
    assert any("nan" in r for r in reasons) and any("inf" in r for r in reasons), reasons
