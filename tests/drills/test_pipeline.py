"""Fault drills through the whole training loop: moto's Step Functions engine runs the real ASL
with the real handlers in-process, the SageMaker simulator injects faults, and a loopback agent
(throttling like ACR, writing every result twice like a duplicated S3 notification) plays ACR.

One faulty run is shared by several checks (module fixture): it must still finish, apply each
optimizer step exactly once, stop its session, and leave no sid or task token in the handlers'
logs. Other drills break one handler at a time (the catch-all must stop the session; when StopSession
itself is broken, the Cleanup rule must), and stop an execution mid-step, run Cleanup as the
stack's EventBridge rule would (moto cannot deliver it), and resume the run as `stepwise resume` does.
"""

from __future__ import annotations

import json
import logging
import time
import uuid

import boto3
import pytest
from tests.support.pipeline import FakeAgent, Stack, wait_execution as _wait
from stepwise.layout import session_key, state_key, summaries_prefix

BUCKET = "stepwise-drill-test"

#: Every SageMaker call the loop makes, refused at least once (ThrottlingException or a 500).
SAGEMAKER_FAULTS = (
    "throttle:CreateTrainingSession:1",
    "internal:DescribeTrainingSession:1",
    "throttle:ExecuteTrainingOperation:2",
    "internal:ExecuteTrainingOperation:1",
    "throttle:GetTrainingOperationResult:1",
    "internal:GetTrainingOperationResult:2",
    "throttle:ExecuteSamplingOperation:1",
    "internal:GetSamplingOperationResult:1",
    "throttle:StopTrainingSession:1",
)


class DuplicatingAgent(FakeAgent):
    """FakeAgent whose every result object is written twice: two S3 notifications per rollout."""

    def finish(self, body: dict, sid: str) -> None:
        super().finish(body, sid)
        if not self.write_results:
            return
        ro = body["_rollout"]
        key = f"{ro['exp_id']}/{ro['input_id']}/{sid}.json"
        s3 = boto3.client("s3")
        obj = s3.get_object(Bucket=ro["s3_bucket"], Key=key)["Body"].read()
        s3.put_object(Bucket=ro["s3_bucket"], Key=key, Body=obj)


class Collect(logging.Handler):
    def __init__(self, formatter: logging.Formatter) -> None:
        super().__init__()
        self.lines: list[str] = []
        self.setFormatter(formatter)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture(scope="module")
def local():
    stack = Stack(bucket=BUCKET)
    agent = DuplicatingAgent()
    arns, sm_arn = stack.deploy(agent, "drill")
    base = stack.config(
        dataset_path=stack.put_dataset("data/train.jsonl", [{"prompt": f"p{i}", "answer": str(i)} for i in range(4)]),
        max_rollout_time=20)
    yield stack.moto, stack.sim, agent, sm_arn, stack.s3, base, arns
    agent.stop()
    stack.stop()


def _state(s3, run_id: str) -> dict:
    return json.loads(s3.get_object(Bucket=BUCKET, Key=state_key(run_id))["Body"].read())


def _rollouts(s3, run_id: str) -> list[dict]:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=summaries_prefix(run_id, "steps"))
    keys = [o["Key"] for p in pages for o in p.get("Contents", []) if "/rollouts/" in o["Key"]]
    return [json.loads(s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in keys]


@pytest.fixture(scope="module")
def faulty_run(local):
    """A 2-step run under ACR throttling, SageMaker throttling/5xx on every call, duplicate notifications."""
    from stepwise.handlers._common import logger

    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    collect = Collect(logger.registered_formatter)
    logging.getLogger(logger.name).addHandler(collect)
    before = dict(sim.counters)
    calls_before = len(moto.dispatcher.invocations)
    moto.dispatcher.payloads = []
    agent.throttle = 3
    for fault in SAGEMAKER_FAULTS:
        sim.inject_fault(fault)
    run_id = f"drill-{uuid.uuid4().hex[:6]}"
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(dict(base, epochs=1)))["executionArn"]
        d = _wait(sfn, arn)
        moto.dispatcher.drain(timeout=10)
    finally:
        logging.getLogger(logger.name).removeHandler(collect)
        agent.throttle = 0
        payloads, moto.dispatcher.payloads = moto.dispatcher.payloads, None
    delta = {k: sim.counters.get(k, 0) - before.get(k, 0) for k in set(sim.counters) | set(before)}
    return {"run_id": run_id, "execution": d, "delta": delta, "logs": collect.lines,
            "calls": moto.dispatcher.invocations[calls_before:], "payloads": payloads}


def test_the_run_survives_throttling_and_server_errors_and_applies_each_step_once(local, faulty_run):
    moto, sim, agent, sm_arn, s3, base, arns = local
    d, delta = faulty_run["execution"], faulty_run["delta"]
    assert d["status"] == "SUCCEEDED", d.get("cause")
    state = _state(s3, faulty_run["run_id"])
    assert state["step"] == 2 and state["policy_version"] == 2 and state["session_stopped"] and state["finished"]
    assert delta["optim_step"] == 2 and delta["forward_backward"] == 2  # expected steps, applied once each
    assert delta["ExecuteTrainingOperation"] > delta["optim_step"] + delta["forward_backward"] + delta["save_weights"]
    assert sim.running_sessions() == []


def test_throttled_invokes_and_duplicate_notifications_lose_and_double_no_rollout(local, faulty_run):
    moto, sim, agent, sm_arn, s3, base, arns = local
    records = _rollouts(s3, faulty_run["run_id"])
    assert len(records) == 8 and {r["status"] for r in records} == {"ok"}  # 2 steps x 2 prompts x 2
    assert len({r["sid"] for r in records}) == 8
    notified = [c for c in faulty_run["calls"] if c.function_name.endswith("OnRolloutResult")]
    assert len(notified) >= 16 and all(c.error is None for c in notified)  # every result notified twice, harmless


def test_the_ledger_counts_every_invocation_the_engine_ran_retries_and_duplicates_included(local, faulty_run):
    """The cost ledger's Lambda requests, function by function, equal the invocations the local engine
    dispatched for the run: StartRollout's throttled attempts (each retried in a fresh session) and
    OnRolloutResult's duplicate notifications (SendTaskSuccess refused: the task already has its outcome)
    included. Before, a throttled attempt's measurement rode in a session record nobody reads and a refused
    duplicate's was dropped by an engine that took a second outcome (AWS answers TaskTimedOut): the ledger
    counted one StartRollout and one OnRolloutResult per rollout."""
    from collections import Counter

    moto, sim, agent, sm_arn, s3, base, arns = local
    ran = Counter(c.function_name.rsplit("-", 1)[-1] for c in faulty_run["calls"])
    assert ran["StartRollout"] > 8 and ran["OnRolloutResult"] >= 16  # throttled retries, duplicates
    counted = _state(s3, faulty_run["run_id"])["ledger"]["usage"]["lambda_requests"]
    assert {name: counted.get(name, 0) for name in ran} == dict(ran)


def test_no_sid_or_task_token_is_logged_in_clear(local, faulty_run):
    moto, sim, agent, sm_arn, s3, base, arns = local
    run_id = faulty_run["run_id"]
    sids = {r["sid"] for r in _rollouts(s3, run_id)}
    tokens = {json.loads(s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())["task_token"]
              for sid in sids}
    logs = "\n".join(faulty_run["logs"])
    assert run_id in logs and "rollout started" in logs  # the capture saw the handlers' records
    leaked = [s for s in sids | tokens if s in logs]
    assert leaked == [], f"{len(leaked)} secrets in the logs, e.g. {leaked[:1]}"


def test_the_gateway_key_is_a_secret_found_only_in_the_agents_payload(local, faulty_run):
    """Each rollout's api key is a fresh secret ({sid}.{secret}), distinct from the sid: the secret is in no
    log line, no S3 key or object (session records keep its SHA-256 only), no Lambda event or result (what
    the executions' histories hold: OnRolloutResult's SendTaskSuccess output is FinishRollout's input), no
    event of the execution's history; the agent's invocation payload is where it is."""
    moto, sim, agent, sm_arn, s3, base, arns = local
    run_id = faulty_run["run_id"]
    keys = [b["_rollout"]["api_key"] for b in agent.invocations if b["_rollout"]["exp_id"].endswith(f"/{run_id}")]
    assert len(keys) >= 8 and len(set(keys)) == len(keys)
    secrets_ = set()
    for key in keys:
        sid, _, secret = key.partition(".")
        assert len(secret) >= 43 and secret != sid and sid in {r["sid"] for r in _rollouts(s3, run_id)}
        secrets_.add(secret)

    def leaks(text: str) -> list[str]:
        return [x for x in secrets_ if x in text]

    assert leaks("\n".join(faulty_run["logs"])) == []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            assert leaks(obj["Key"]) == [], obj["Key"]
            assert leaks(s3.get_object(Bucket=BUCKET, Key=obj["Key"])["Body"].read().decode(errors="replace")) == [], obj["Key"]
    payloads = faulty_run["payloads"]
    assert any(name.endswith("FinishRollout") for name, _, _ in payloads)
    for name, event, result in payloads:
        assert leaks(event) == [] and leaks(result.decode(errors="replace")) == [], name
    sfn = moto.client("stepfunctions")
    history = sfn.get_execution_history(executionArn=faulty_run["execution"]["executionArn"], maxResults=1000)
    assert leaks(json.dumps(history["events"], default=str)) == []


@pytest.mark.e2e  # ~50 s: a stopped run, then a whole resumed run
def test_stop_execution_mid_step_stops_the_session_and_a_resumed_run_finishes(local):
    from stepwise.executions import continuation_name

    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"drill-stop-{uuid.uuid4().hex[:6]}"
    agent.write_results = False  # rollouts hang: the execution is stopped mid-step
    invoked = len(agent.invocations)
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(dict(base, epochs=1)))["executionArn"]
        deadline = time.monotonic() + 60
        while len(agent.invocations) < invoked + 4 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert len(agent.invocations) >= invoked + 4, "the step never started its rollouts"
        sfn.stop_execution(executionArn=arn, cause="drill: operator stop")
        d = _wait(sfn, arn, timeout=30)
    finally:
        agent.write_results = True
    assert d["status"] == "ABORTED"
    session = _state(s3, run_id)["training_session_name"]
    assert session in sim.running_sessions()  # Catch does not run on StopExecution ...
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "name": run_id, "status": "ABORTED", "input": d.get("input")}}
    lam = moto.client("lambda")
    resp = lam.invoke(FunctionName=arns["Cleanup"], Payload=json.dumps(event).encode())  # ... the rule's Cleanup does
    assert not resp.get("FunctionError"), resp["Payload"].read()
    state = _state(s3, run_id)
    assert state["session_stopped"] and state["stop_reason"] == "execution ABORTED"
    assert session not in sim.running_sessions()

    # `stepwise resume`: a continuation with resume: true; no checkpoint yet, so step 0 again on a new session.
    before = dict(sim.counters)
    cont = {"continuation": {"run_id": run_id, "parent_execution_arn": arn, "segment": 1, "resume": True}}
    second = sfn.start_execution(stateMachineArn=sm_arn, name=continuation_name(run_id, 1), input=json.dumps(cont))["executionArn"]
    d2 = _wait(sfn, second)
    assert d2["status"] == "SUCCEEDED", d2.get("cause")
    state = _state(s3, run_id)
    assert state["step"] == 2 and state["policy_version"] == 2 and state["finished"] and state["stop_reason"] is None
    assert state["training_session_name"] != session
    assert sim.counters.get("optim_step", 0) - before.get("optim_step", 0) == 2
    assert sim.running_sessions() == []


class DrillFault(RuntimeError):
    """Raised by a handler the drill breaks."""


def _break(moto, logical: str, arns: dict) -> "callable":
    """Make the Lambda ``logical`` raise DrillFault; returns the function that restores it."""
    name = arns[logical].rsplit(":", 1)[-1]
    reg = moto.dispatcher._functions[name]
    original = reg.handler_path

    def broken(event, context):
        raise DrillFault(f"{logical} broken by the drill")

    moto.dispatcher.register(name, handler_path=original, memory_mb=reg.memory_mb, timeout_s=reg.timeout_s,
                             arn=reg.arn, handler=broken)
    return lambda: moto.dispatcher.register(name, handler_path=original, memory_mb=reg.memory_mb,
                                            timeout_s=reg.timeout_s, arn=reg.arn)


@pytest.mark.parametrize("logical", ["PollSession", "PlanStep", "ComputeAdvantages", "Rebind"])
def test_a_failure_in_any_state_stops_the_session(local, logical):
    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"drill-{logical.lower()}-{uuid.uuid4().hex[:6]}"
    if logical == "PollSession":
        sim.set_session_start("ok", seconds=1.5)  # Init hands the wait to PollSession
    restore = _break(moto, logical, arns)
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
        d = _wait(sfn, arn)
    finally:
        restore()
        sim.set_session_start("ok", seconds=0.0)
    assert d["status"] == "FAILED" and d["error"] == "DrillFault", (d.get("error"), d.get("cause"))
    state = _state(s3, run_id)
    assert state["session_stopped"] and state["stop_reason"] == "failed: DrillFault"
    assert sim.session_statuses()[state["training_session_name"]] in ("Stopping", "Stopped")


def test_when_the_catch_all_cannot_stop_the_session_the_cleanup_rule_does(local):
    moto, sim, agent, sm_arn, s3, base, arns = local
    sfn = moto.client("stepfunctions")
    run_id = f"drill-nostop-{uuid.uuid4().hex[:6]}"
    restore = [_break(moto, "PlanStep", arns), _break(moto, "StopSession", arns)]
    try:
        arn = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(base))["executionArn"]
        d = _wait(sfn, arn)
    finally:
        for r in restore:
            r()
    assert d["status"] == "FAILED"
    session = _state(s3, run_id)["training_session_name"]
    assert session in sim.running_sessions()
    event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
             "detail": {"executionArn": arn, "name": run_id, "status": "FAILED", "input": d.get("input")}}
    resp = moto.client("lambda").invoke(FunctionName=arns["Cleanup"], Payload=json.dumps(event).encode())
    assert not resp.get("FunctionError"), resp["Payload"].read()
    assert session not in sim.running_sessions()
    assert _state(s3, run_id)["stop_reason"] == "execution FAILED"
