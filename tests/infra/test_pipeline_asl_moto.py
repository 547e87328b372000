"""The training-loop ASL executed by moto's Step Functions engine with the real handlers.

Everything the pipeline owns is real: the rendered definition, moto's engine (Distributed Map,
callback tasks, S3 notification -> OnRolloutResult), every handler, S3 (moto) and the SageMaker
simulator. Only the far side of InvokeAgentRuntime is a stand-in: a loopback server that plays
the agent and the gateway (one captured turn, then the toolkit's result object). The full local
stack with real agents and the real gateway is the e2e test (tests/e2e/).
"""

from __future__ import annotations

import json
import uuid

import pytest
from tests.support.pipeline import FakeAgent, Stack, wait_execution as _wait
from stepwise.layout import eval_summary_key, result_key, rollouts_prefix, state_key, summary_key

BUCKET = "stepwise-asl-test"


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = FakeAgent()
    _arns, sm_arn = stack.deploy(agent, "asl-test")
    rows = [{"prompt": f"p{i} & more", "answer": str(i)} for i in range(4)]
    base = stack.config(dataset_path=stack.put_dataset("data/train.jsonl", rows), max_rollout_time=20)
    yield stack.moto, stack.sim, agent, sm_arn, stack.s3, base, stack.put_dataset
    agent.stop()
    stack.stop()


def _state(s3, run_id: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=state_key(run_id))["Body"].read())


def test_a_run_trains_evaluates_continues_as_new_saves_and_stops(local):
    moto, sim, agent, sm_arn, s3, base, put = local
    sfn = moto.client("stepfunctions")
    config = dict(base, steps_per_execution=1, save_weights_at_end=True, eval_every=2,
                  eval_dataset_path=put("data/eval.jsonl", [{"prompt": "e0", "answer": "0"}, {"prompt": "e1", "answer": "1"}]))
    run_id = f"asl-{uuid.uuid4().hex[:6]}"
    before = dict(sim.counters)
    first = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(config))["executionArn"]
    handed = _wait(sfn, first)
    assert handed["status"] == "SUCCEEDED"
    # steps_per_execution=1: step 0 in the first execution, step 1 in the second.
    second = _wait(sfn, first.replace(f":{run_id}", f":{run_id}--1"))
    # the hand-over's output names the next execution (the run-end notification leaves it out)
    assert json.loads(handed["output"])["handed_over_to"] == second["executionArn"]
    assert "handed_over_to" not in second["output"]
    assert second["status"] == "SUCCEEDED", second.get("cause")
    state = _state(s3, run_id)
    assert state["step"] == 2 and state["policy_version"] == 2 and state["segment"] == 1
    assert state["finished"] and state["session_stopped"] and state["final_checkpoint_done"] and state["final_weights_done"]
    assert state["eval_steps"] == [0, 2]  # the baseline before step 0 (eval_before_train's default), the final eval
    assert state["last_eval_step"] == 2 and state["pending"] == [] and state["owner_execution_arn"] == second["executionArn"]
    delta = {k: sim.counters.get(k, 0) - before.get(k, 0) for k in ("optim_step", "save_state", "save_weights", "StopTrainingSession")}
    assert delta == {"optim_step": 2, "save_state": 1, "save_weights": 3, "StopTrainingSession": 1}
    assert sim.running_sessions() == []
    # The execution's output names every checkpoint and the final weights, and how to use them.
    out = json.loads(second["output"])["stopped"]
    assert [(c["step"], c["kind"], c["reason"]) for c in out["checkpoints"]] == [(2, "state", "final"), (2, "weights", "weights_at_end")]
    fields = ("step", "kind", "reason", "model_package_arn")
    assert out["checkpoints"] == [{k: c[k] for k in (*fields, "deleted")} for c in state["checkpoints"]]
    assert not any(c["deleted"] for c in out["checkpoints"])  # keep_model_packages: all
    assert out["final_weights"] == {k: state["checkpoints"][1][k] for k in (*fields, "policy_version")}
    assert out["final_weights"]["model_package_arn"] in out["use_final_weights"] and "deploy it" in out["use_final_weights"]
    assert len(agent.invocations) >= 10  # 2 steps x 4 rollouts + one eval of 2
    ro = agent.invocations[0]["_rollout"]
    assert ro["exp_id"] == f"rollout-results/{run_id}" and ro["api_key"] and ro["sampling_params"]["max_tokens"] == 512
    summary = json.loads(s3.get_object(Bucket=BUCKET, Key=summary_key(run_id, 1))["Body"].read())
    assert summary["sampler/num_datums"] == 4 and "train/loss" in summary and summary["policy_version"] == 2
    evals = json.loads(s3.get_object(Bucket=BUCKET, Key=eval_summary_key(run_id, 2))["Body"].read())
    assert evals["eval/n"] == 2
    # Step Functions never carried a payload or a trajectory: every event is small.
    history = sfn.get_execution_history(executionArn=first, maxResults=1000)["events"]
    assert max(len(json.dumps(e, default=str)) for e in history) < 8_000


def test_a_failed_operation_stops_the_session_and_fails_with_the_cause(local):
    moto, sim, agent, sm_arn, s3, base, put = local
    sfn = moto.client("stepfunctions")
    run_id = f"asl-fail-{uuid.uuid4().hex[:6]}"
    sim.inject_fault("fail:optim_step:1")
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "FAILED"
    assert d.get("error") == "OperationFailed" and "optim_step" in d.get("cause", "")
    state = _state(s3, run_id)
    assert state["session_stopped"] and state["stop_reason"].startswith("failed")
    assert sim.session_statuses()[state["training_session_name"]] in ("Stopping", "Stopped")


def test_a_bad_config_fails_the_execution_before_any_session_exists(local):
    moto, sim, agent, sm_arn, s3, base, put = local
    sfn = moto.client("stepfunctions")
    before = sim.counters.get("CreateTrainingSession", 0)
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=f"asl-bad-{uuid.uuid4().hex[:6]}",
                              input=json.dumps(dict(base, batch_size=0)))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "FAILED" and d["error"] == "ConfigError" and "batch_size" in d["cause"]
    assert sim.counters.get("CreateTrainingSession", 0) == before


def test_a_run_the_stack_cannot_serve_fails_the_execution_before_any_session_exists(local):
    moto, sim, agent, sm_arn, s3, base, put = local
    sfn = moto.client("stepfunctions")
    before = sim.counters.get("CreateTrainingSession", 0)
    west = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/toy_agent-abc"
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=f"asl-refused-{uuid.uuid4().hex[:6]}",
                              input=json.dumps(dict(base, region="eu-west-1", agent_runtime_arn=west)))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "FAILED" and d["error"] == "RunRefused", d
    assert "region: the run's region 'eu-west-1'" in d["cause"] and "agent_runtime_arn:" in d["cause"]
    assert sim.counters.get("CreateTrainingSession", 0) == before


def test_rollouts_that_time_out_score_zero_and_late_results_are_harmless(local):
    # (every rollout of this run times out, so it also fails the run: RolloutsFailed)
    moto, sim, agent, sm_arn, s3, base, put = local
    sfn = moto.client("stepfunctions")
    run_id = f"asl-timeout-{uuid.uuid4().hex[:6]}"
    before = sim.counters.get("optim_step", 0)
    agent.write_results = False  # the agent never reports back
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id,
                                  input=json.dumps(dict(base, max_rollout_time=2, max_prompts=2)))["executionArn"]
        d = _wait(sfn, arn)
    finally:
        agent.write_results = True
    # A batch whose every rollout timed out is a broken agent or result delivery, not a policy to train:
    # the run fails naming it, the catch-all stops the session, nothing is trained.
    assert d["status"] == "FAILED" and d["error"] == "RolloutsFailed", d
    assert "all 4 rollouts of the train batch of step 0" in d["cause"] and "0 error, 4 timeout, 0 ok" in d["cause"]
    # the heartbeat is off (the default 300 s is not below 2 s): the task's HeartbeatSeconds is max_rollout_time
    # and its TimeoutSeconds a second longer, so either ends it, each named for max_rollout_time
    assert "no result within 2 s (max_rollout_time)" in d["cause"] and "no LLM call" not in d["cause"]
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=rollouts_prefix(run_id, 0, 0))["Contents"]]
    records = [json.loads(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in keys]
    assert len(records) == 4 and {(r["status"], r["reward"]) for r in records} == {("timeout", 0.0)}
    assert {r["error"]["error"] for r in records} <= {"States.HeartbeatTimeout", "States.Timeout"}
    assert {r["error"]["cause"] for r in records} == {"no result within 2 s (max_rollout_time)"}
    assert all(r["sid"] for r in records)  # the timeout path still knows which session it closes
    assert sim.counters.get("optim_step", 0) == before
    assert _state(s3, run_id)["session_stopped"]
    # A result that arrives after its task timed out resumes nothing and breaks nothing.
    late = result_key(run_id, records[0]['input_id'], records[0]['sid'])
    s3.put_object(Bucket=BUCKET, Key=late, Body=json.dumps({"rewards": 1.0}).encode())
    moto.dispatcher.drain(timeout=10)
    late_calls = [i for i in moto.dispatcher.invocations if i.function_name.endswith("OnRolloutResult")]
    assert late_calls and late_calls[-1].error is None
