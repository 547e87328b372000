"""Drills of overlapped steps (``max_staleness: 1``) through the whole training loop: moto's
Step Functions engine runs the real ASL (its Parallel state "Train this step while rolling out the
next") with the real handlers in-process, the SageMaker simulator counts every optimizer step it
applies and injects latency and faults, and a loopback agent plays ACR.

The run: 8 prompts, batch_size 2 -> 4 steps, ``save_every`` 2. Steps 0 and 2 roll out the next
step's batch while they train (steps 1 and 3 train on rollouts one version old); step 1 does not
(the step-2 checkpoint comes first) and step 3 does not (the run ends). forward_backward takes
``TRAIN_LATENCY_S`` in the simulator, so a drill can act while a step trains in the Parallel state.
"""

from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.support.pipeline import FakeAgent, Stack, wait_execution as _wait
from stepwise.layout import session_key, rollouts_prefix, state_key, summary_key

BUCKET = "stepwise-overlap-drill"
TRAIN_LATENCY_S = 2.0
PARALLEL = "Train this step while rolling out the next"


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = FakeAgent()
    arns, sm_arn = stack.deploy(agent, "overlap")
    rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(8)]
    base = stack.config(dataset_path=stack.put_dataset("data/train.jsonl", rows), max_rollout_time=20,
                        max_staleness=1, save_every=2, epochs=1)
    stack.sim.set_latency("forward_backward", TRAIN_LATENCY_S)
    yield stack.moto, stack.sim, agent, sm_arn, stack.s3, base, arns
    agent.stop()
    stack.stop()


def _json(s3, key: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def _state(s3, run_id: str) -> dict:
    return _json(s3, state_key(run_id))


def _keys(s3, prefix: str) -> list[str]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix)
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def _entered(sfn, arn: str, state_name: str) -> int:
    events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    return sum(1 for e in events if (e.get("stateEnteredEventDetails") or {}).get("name") == state_name)


def _optim(sim) -> int:
    return sim.counters.get("optim_step", 0)


def test_an_overlapped_run_trains_every_step_once_on_rollouts_at_most_one_version_old(local):
    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"overlap-{uuid.uuid4().hex[:6]}"
    before = _optim(sim)
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _state(s3, run_id)
    assert (state["step"], state["policy_version"], state["finished"]) == (4, 4, True)
    assert _optim(sim) - before == 4  # each step applied once, none twice
    assert _entered(sfn, arn, PARALLEL) == 4  # every trained step went through the Parallel state
    # Step 3 only, ahead: step 1's batch is not planned while step 0 trains on the base model's sampler
    # ("" = the session's latest checkpoint for the service, which step 0 is replacing); step 2's
    # checkpoint comes first; then the end.
    assert _entered(sfn, arn, "Roll out the next step's generation batch") == 1
    assert _entered(sfn, arn, "Nothing to roll out ahead") == 3
    # the sampler is rebound after both branches joined, once per step
    assert _entered(sfn, arn, "Rebind sampler to new weights") >= 4
    summaries = {s: _json(s3, summary_key(run_id, s)) for s in range(4)}
    # Step 3 sampled on the policy step 2 was still training (forward_backward takes 2 s, the agent
    # answers at once); 0, 1 and 2 are on-policy.
    assert [summaries[s]["staleness/max"] for s in range(4)] == [0.0, 0.0, 0.0, 1.0]
    assert summaries[3]["staleness/stale_fraction"] == 1.0
    for s in range(4):
        assert summaries[s]["time/session_busy"] >= TRAIN_LATENCY_S
        assert summaries[s]["time/session_idle"] >= 0.0 and "time/step_wall" in summaries[s]
    # every rollout record names the policy it sampled with: the version before its step's predecessor rebound
    # and sampled exactly the model package of that version (its session record: what the gateway sampled)
    package_of = {0: ""} | {summaries[s]["policy_version"]: summaries[s]["sampler_model_package_arn"] for s in range(4)}
    for s, expected in ((0, 0), (1, 1), (2, 2), (3, 2)):
        records = [_json(s3, k) for k in _keys(s3, rollouts_prefix(run_id, s, 0))]
        assert records and {r["policy_version"] for r in records} == {expected}, s
        sampled = {_json(s3, session_key(r["sid"]))["sampler_model_package_arn"] for r in records}
        assert sampled == {package_of[expected]}, (s, sampled)
    # the step-2 checkpoint's cursor is where step 2 starts: no batch rolled out ahead in it
    (ckpt,) = [c for c in state["checkpoints"] if c["reason"] == "save_every"]
    assert (ckpt["step"], ckpt["cursor"]) == (2, 4)
    assert state["ahead_batch"] is None and sim.running_sessions() == []


def test_with_per_rollout_the_training_branch_rebinds_while_the_next_steps_rollouts_run(local):
    """``sampler_binding: per_rollout`` (a service that serves several packages): the load overlaps the
    rollouts rolled out ahead, inside the Parallel state, and the run never rebinds after the join; each
    rollout still samples its own batch's package, and the run's current sampler names the last one."""
    from stepwise.layout import current_sampler_key

    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"overlap-inbranch-{uuid.uuid4().hex[:6]}"
    # 3 steps, no checkpoint: step 1 rolls out step 2's batch ahead (step 0 samples the base model)
    cfg = dict(base, save_every=0, max_prompts=6, sampler_binding="per_rollout")
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(cfg))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _state(s3, run_id)
    assert (state["step"], state["policy_version"], state["finished"]) == (3, 3, True)
    assert _entered(sfn, arn, "Rebind sampler while the next step rolls out") >= 3
    assert _entered(sfn, arn, "Rebind sampler to new weights") == 0
    assert _entered(sfn, arn, "Roll out the next step's generation batch") == 1
    summaries = {s: _json(s3, summary_key(run_id, s)) for s in range(3)}
    assert [summaries[s]["staleness/max"] for s in range(3)] == [0.0, 0.0, 1.0]
    records = [_json(s3, k) for k in _keys(s3, rollouts_prefix(run_id, 2, 0))]
    assert {r["policy_version"] for r in records} == {1}
    assert {_json(s3, session_key(r["sid"]))["sampler_binding"] for r in records} == {"per_rollout"}
    current = _json(s3, current_sampler_key(run_id))
    assert (current["gate"], current["policy_version"]) == ("open", 3)
    assert current["sampler_model_package_arn"] == summaries[2]["sampler_model_package_arn"]
    assert sim.running_sessions() == []


def test_a_failed_training_operation_in_the_parallel_state_stops_the_session_and_fails(local):
    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"overlap-fail-{uuid.uuid4().hex[:6]}"
    before = _optim(sim)
    sim.inject_fault("fail:optim_step:1")  # step 0's optimizer step, trained inside the Parallel state
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    d = _wait(sfn, arn)
    assert d["status"] == "FAILED"
    assert "optim_step" in d.get("cause", "") and "failed" in d.get("cause", "")
    assert _entered(sfn, arn, PARALLEL) == 1 and _entered(sfn, arn, "Stop training session after failure") == 1
    state = _state(s3, run_id)
    assert state["policy_version"] == 0 and state["step"] == 0 and _optim(sim) == before  # nothing applied
    assert state["session_stopped"] and state["training_session_name"] not in sim.running_sessions()


@pytest.mark.e2e  # ~1 min: a stopped run, then the resumed rest
def test_stop_execution_while_an_overlapped_step_trains_then_resume_applies_no_step_twice(local):
    from stepwise.handlers.session import continuation_name

    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"overlap-stop-{uuid.uuid4().hex[:6]}"
    start = _optim(sim)
    arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
    # Wait until step 2 trains in the Parallel state with step 3's batch planned ahead (after the
    # step-2 checkpoint), then stop the execution there, as an operator would.
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        st = _state(s3, run_id) if state_key(run_id) in _keys(s3, state_key(run_id)) else {}
        if st.get("ahead_batch") and st["ahead_batch"]["step"] == 3 and st["phase"] in ("train", "rebind"):
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"step 2 never trained with step 3 rolled out ahead: {st}")
    sfn.stop_execution(executionArn=arn, cause="drill: operator stop mid-overlap")
    d = _wait(sfn, arn, timeout=30)
    assert d["status"] == "ABORTED"
    session = _state(s3, run_id)["training_session_name"]
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "name": run_id, "status": "ABORTED", "input": d.get("input")}}
    resp = moto.client("lambda").invoke(FunctionName=arns["Cleanup"], Payload=json.dumps(event).encode())
    assert not resp.get("FunctionError"), resp["Payload"].read()  # the EventBridge rule's Cleanup (moto cannot deliver it)
    stopped = _state(s3, run_id)
    assert stopped["session_stopped"] and session not in sim.running_sessions()
    assert stopped["policy_version"] == 2  # step 2's update was not committed before the stop
    first_session = _optim(sim) - start
    assert first_session in (2, 3)  # steps 0, 1 (and maybe 2's optimizer step, on the stopped session)

    # `stepwise resume`: rewinds to the step-2 checkpoint on a new session; steps 2 and 3 run once more there.
    before = _optim(sim)
    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": arn, "segment": 1, "resume": True}}
    second = sfn.start_execution(stateMachineArn=sm_arn, name=continuation_name(run_id, 1),
                                 input=json.dumps(cont))["executionArn"]
    d2 = _wait(sfn, second)
    assert d2["status"] == "SUCCEEDED", d2.get("cause")
    state = _state(s3, run_id)
    assert (state["step"], state["policy_version"], state["finished"]) == (4, 4, True)
    assert state["training_session_name"] != session
    assert _optim(sim) - before == 2  # steps 2 and 3 on the resumed session, once each
    # step 3's rows were rolled out ahead before the stop; the resumed run rolled them out again
    # (the rewind dropped the batch) and trained them once, on rollouts at most one version old
    summary3 = _json(s3, summary_key(run_id, 3))
    assert summary3["policy_version"] == 4 and summary3["staleness/max"] <= 1.0
    assert state["ahead_batch"] is None and sim.running_sessions() == []
