"""StartRollout / OnRolloutResult / FinishRollout against moto's Step Functions engine and S3.

StartRollout runs as the callback task of a real (moto) execution; the agent side of
InvokeAgentRuntime is the loopback `FakeAgent`. OnRolloutResult gets the S3 event as S3 sends
it: object keys URL-encoded.
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from tests.support.pipeline import BUCKET, FakeAgent, Stack, init_run, run_ref, wait_ready
from tests.support.waiting import wait_for

from state_machine.definition import load_asl
from stepwise.aws.agentcore import AgentRuntimeThrottled
from stepwise.aws.runstore import RunOwnedElsewhere, RunStore
from stepwise.core.ledger import PACE_STATES
from stepwise.events import FinishEvent, RunEvent, S3Notification, StartEvent
from stepwise.handlers.plan import plan
from stepwise.handlers.rollout import finish, on_result, start
from stepwise.layout import result_key, rollout_key, session_key, task_token_key


@pytest.fixture(scope="module")
def env():
    from local import resources

    stack = Stack()
    agent = FakeAgent()
    agent.write_results = False  # the tests deliver results themselves
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", agent.url)
    arns = resources.create_functions(stack.moto, prefix="rollout-test")
    # The rollout child's callback task, exactly as the ASL has it, as a one-state machine.
    task = dict(load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]["States"]["Start rollout"])
    task.pop("Catch")
    task.pop("Next")
    task["End"] = True
    text = json.dumps({"StartAt": "Start rollout", "States": {"Start rollout": task}})
    from infra.definition import substitutions
    from state_machine.definition import PLACEHOLDER_RE

    values = substitutions(function_arns=arns, bucket_name=BUCKET)  # the rendered ASL's values
    text = PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text)
    sm = resources.create_state_machine(stack.moto, "rollout-test", text)
    # A run id with every kind of character `stepwise.executions.RUN_ID_RE` allows. (It held '=', '+' and '@',
    # which Step Functions allows in execution names and S3 URL-encodes in event keys; Init refuses them now,
    # so no result key holds a character S3 encodes. The notifications here are still URL-encoded.)
    run_id = f"Exp_1-a-{int(time.time())}"
    init_run(stack, run_id, stack.config())
    assert wait_ready(run_id)["ready"]
    p = plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    yield stack, agent, sm, run_id, p, items
    agent.stop()
    stack.stop()


def _s3_event(key: str) -> dict:
    return {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                         "s3": {"bucket": {"name": BUCKET}, "object": {"key": urllib.parse.quote_plus(key, safe="/")}}}]}


def _notification(key: str) -> S3Notification:
    """The S3 event as OnRolloutResult's entrypoint parses it."""
    return S3Notification.model_validate(_s3_event(key))


def test_start_rollout_opens_the_session_and_stores_the_token_before_invoking(env):
    stack, agent, sm, run_id, p, items = env
    sfn = stack.moto.client("stepfunctions")
    item = items[1]
    arn = sfn.start_execution(stateMachineArn=sm, input=json.dumps({"run": run_ref(run_id), "batch": p["batch"], "item": item}))["executionArn"]
    body = wait_for(lambda: next((b for b in agent.invocations if b["_rollout"]["input_id"] == item["input_id"]), None))
    ro = body["_rollout"]
    sid, _, secret = ro["api_key"].partition(".")
    assert agent.visible_at_invoke[sid] == {"session": True, "task_token": True}
    assert len(secret) >= 43  # a fresh 32-byte secret, not the sid
    assert ro["exp_id"] == f"rollout-results/{run_id}" and ro["s3_bucket"] == BUCKET and ro["model_id"] == "stepwise-tiny"
    assert ro["sampling_params"] == {"temperature": 1.0, "max_tokens": 512}
    assert body["prompt"] == "What digit comes after 0?"  # the dataset row's payload, by reference from S3
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
    assert record["run_id"] == run_id and record["closed"] is False and record["sampler_model_package_arn"] == ""
    assert record["max_turns"] == 64 and record["deadline"] > time.time()

    # The agent's result arrives; S3 sends its key URL-encoded (AWS keeps '/', moto encodes it too).
    key = result_key(run_id, item['input_id'], sid)
    stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"rewards": 1.0}).encode())
    event = _s3_event(key)
    event["Records"][0]["s3"]["object"]["key"] = urllib.parse.quote_plus(key)
    assert "%2F" in event["Records"][0]["s3"]["object"]["key"]
    assert on_result(S3Notification.model_validate(event)) == {"resumed": 1, "ignored": 0}
    done = wait_for(lambda: (d := sfn.describe_execution(executionArn=arn))["status"] != "RUNNING" and d)
    assert done["status"] == "SUCCEEDED"
    # the session record as StartRollout wrote it rides along (FinishRollout closes the session with it),
    # without the api key's digest; the key itself appears nowhere in the task's output
    out = json.loads(done["output"])["result"]
    carried = out.pop("usage", None)  # OnRolloutResult's measurement, when the notified invocation resumed it
    assert carried is None or carried["lambda_requests"].get("OnRolloutResult", 0) >= 0
    assert out == {"sid": sid, "result_key": key, "session": {k: v for k, v in record.items() if k != "api_key_sha256"}}
    assert "api_key_sha256" in record and secret not in done["output"]

    # Duplicate and late notifications are harmless; unknown sessions are ignored.
    assert on_result(_notification(key)) == {"resumed": 0, "ignored": 1}
    assert on_result(_notification(f"rollout-results/{run_id}/{item['input_id']}/no-such-sid.json")) == {"resumed": 0, "ignored": 1}
    assert on_result(_notification("rollout-results/not-a-result-key")) == {"resumed": 0, "ignored": 1}


def test_throttled_invokes_raise_the_error_the_state_machine_retries(env):
    stack, agent, sm, run_id, p, items = env
    agent.throttle = 10  # ACR keeps refusing: after botocore's few retries, the state machine's Retry takes over
    event = StartEvent.model_validate({"task_token": "t", "run": run_ref(run_id), "batch": p["batch"], "item": items[0]})
    with pytest.raises(AgentRuntimeThrottled):
        start(event)
    retry = load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]["States"]["Start rollout"]["Retry"][0]
    assert AgentRuntimeThrottled.__name__ in retry["ErrorEquals"]
    assert 10 - agent.throttle <= 3  # no long in-Lambda retry loop: pacing belongs to the state machine
    agent.throttle = 0


def test_a_throttled_start_that_is_retried_keeps_its_measurement_for_the_ledger(env):
    """A StartRollout that ACR throttled writes a session record (with its measurement riding in it) that
    nobody reads when the state machine retries it (the retry opens a fresh session): its measurement and
    what it carried for the run stay in the process's carry (`stepwise.metering.CARRY`) and ride with the
    next record. The last attempt (retries spent: FinishRollout reads its record) and a refusal that is not
    retried keep theirs in the record. Before, a retried attempt's request and the carried measurements it
    took were lost: the ledger counted 2,048 StartRollout requests where the engine ran 3,049."""
    from local.engine import LambdaContext
    from stepwise import metering
    from stepwise.core.ledger import START_ROLLOUT_RETRIED_ERRORS, START_ROLLOUT_RETRIES
    from stepwise.handlers.rollout import start_handler
    from stepwise.records import Usage

    stack, agent, sm, run_id, p, items = env
    retry = load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]["States"]["Start rollout"]["Retry"][0]
    assert set(START_ROLLOUT_RETRIED_ERRORS) <= set(retry["ErrorEquals"]) and retry["MaxAttempts"] == START_ROLLOUT_RETRIES

    def attempt(retry_count: int) -> tuple[Usage, dict]:
        metering.CARRY.clear()
        metering.CARRY.put(run_id, Usage(lambda_requests={"OnRolloutResult": 1}))  # an earlier invocation's tail
        agent.throttle = 10
        received = len(agent.received)
        try:
            with pytest.raises(AgentRuntimeThrottled):
                start_handler({"task_token": "t-thr", "run": run_ref(run_id), "batch": p["batch"], "item": items[0],
                               "retry_count": retry_count}, LambdaContext("StartRollout", 512, "arn:aws:lambda:local", 120))
        finally:
            agent.throttle = 0
        sid = agent.received[received]
        record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
        return metering.CARRY.pending(run_id), record["usage"]

    carried, in_record = attempt(0)  # retried: the whole invocation and the tail it took wait in the carry
    assert carried.lambda_requests == {"StartRollout": 1, "OnRolloutResult": 1}
    assert in_record["lambda_requests"] == {"StartRollout": 1, "OnRolloutResult": 1}  # written, never read
    assert carried.state_transitions == 0  # the attempt that succeeds counts its state's retries (1 + retry_count)

    carried, in_record = attempt(START_ROLLOUT_RETRIES)  # the last attempt: FinishRollout sums its record
    assert in_record["lambda_requests"] == {"StartRollout": 1, "OnRolloutResult": 1}
    assert in_record["state_transitions"] == PACE_STATES + 1 + START_ROLLOUT_RETRIES  # Pace start once
    assert carried.lambda_requests == {}  # only the invoke's seconds after the record's write
    metering.CARRY.clear()


def test_one_invoke_attempt_per_session_and_a_failed_invoke_leaves_no_session_behind(env):
    """No client-side retry reuses a runtimeSessionId: one InvokeAgentRuntime request per sid, the error
    raised for the state machine's Retry (which starts a fresh sid). A 5xx, after which the agent may run,
    closes the gateway session and stops the runtime session; a throttled invoke started neither, so
    nothing is stopped (before: botocore retried the 500 with the same sid)."""
    from stepwise.aws.agentcore import AgentRuntimeUnavailable

    stack, agent, sm, run_id, p, items = env
    retry = load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]["States"]["Start rollout"]["Retry"][0]
    assert {"AgentRuntimeThrottled", "AgentRuntimeUnavailable"} <= set(retry["ErrorEquals"])
    event = StartEvent.model_validate({"task_token": "t", "run": run_ref(run_id), "batch": p["batch"], "item": items[0]})

    agent.fail = 5
    before = len(agent.received)
    with pytest.raises(AgentRuntimeUnavailable):
        start(event)
    [sid] = agent.received[before:]  # one attempt, whatever botocore's retry policy would have allowed
    assert agent.stop_calls[-1] == sid and sid not in agent.active_sessions()
    assert json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())["closed"] is True
    agent.fail = 0

    agent.throttle = 5
    before, stops = len(agent.received), len(agent.stop_calls)
    with pytest.raises(AgentRuntimeThrottled):
        start(event)
    assert len(agent.received) == before + 1 and len(agent.stop_calls) == stops  # refused: nothing to stop
    agent.throttle = 0


def test_finish_rollout_stops_the_runtime_session_on_every_path_and_a_gone_session_is_no_error(env):
    """Result, agent error, timeout: FinishRollout stops the rollout's runtime session (as the reference's
    AgentCoreHttpSession does after every rollout); a retried FinishRollout finds it gone and succeeds."""
    stack, agent, sm, run_id, p, items = env
    sids = []
    for n, (result, error) in enumerate([(True, None), (False, {"Error": "AgentError", "Cause": "boom"}),
                                         (False, {"Error": "States.Timeout", "Cause": ""})]):
        item = items[n]
        event = StartEvent.model_validate({"task_token": f"t{n}", "run": run_ref(run_id), "batch": p["batch"], "item": item})
        sid = start(event)["sid"]
        assert sid in agent.active_sessions(run_id)
        key = result_key(run_id, item["input_id"], sid)
        if result:
            stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"rewards": 1.0}).encode())
        finish_event = FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                                   "result": {"sid": sid, "result_key": key} if result else None,
                                                   "error": error})
        out = finish(finish_event)
        assert out["status"] == ("ok" if result else "timeout" if error["Error"] == "States.Timeout" else "error")
        assert sid not in agent.active_sessions() and sid in agent.stop_calls
        assert finish(finish_event)["sid"] == sid  # retried: the session is gone, which is fine
        sids.append(sid)
    assert agent.stopped[-3:] == sids


def test_a_finish_that_kept_failing_is_recorded_as_an_error_rollout_its_session_stopped_and_its_transitions_counted(env):
    """The child's "Record failed rollout" state (FinishRollout with ``finish_error``): an error rollout
    (reward 0.0, cause FinishRolloutFailed naming the last error), the runtime session stopped, and what
    the rollout used counted for the ledger: Finish rollout's spent retries (1 + 8) and this state's (1 + its
    retries), and what rode to the FinishRollout that never wrote it: StartRollout's measurement (the session
    record: its request and its state's transition), OnRolloutResult's (the result) and the ACR session.
    Before, the record held the transitions of the two Finish states only."""
    from local.engine import LambdaContext
    from stepwise import metering
    from stepwise.handlers.rollout import FINISH_ROLLOUT_RETRIES, finish_handler, start_handler

    stack, agent, sm, run_id, p, items = env
    item = items[3]
    metering.CARRY.clear()
    sid = start_handler({"task_token": "t-rec", "run": run_ref(run_id), "batch": p["batch"], "item": item},
                        LambdaContext("StartRollout", 512, "arn:aws:lambda:local", 120))["sid"]
    metering.CARRY.clear()  # the invoke's tail, after the session record's ride: not this test's subject
    out = finish_handler({
        "run": run_ref(run_id), "batch": p["batch"], "item": item, "error": None, "retry_count": 2,
        "result": {"sid": sid, "usage": {"lambda_requests": {"OnRolloutResult": 1}, "s3_get_class": 1}},
        "finish_error": {"Error": "Lambda.TooManyRequestsException", "Cause": "Rate exceeded"}},
        LambdaContext("FinishRollout", 1024, "arn:aws:lambda:local", 300))
    assert out == {"sid": sid, "reward": 0.0, "status": "error", "records": 0}
    assert sid not in agent.active_sessions() and sid in agent.stop_calls
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=rollout_key(run_id, 0, 0, sid))["Body"].read())
    assert record["status"] == "error" and record["reward"] == 0.0
    assert record["error"]["error"] == "FinishRolloutFailed" and "Rate exceeded" in record["error"]["cause"]
    usage = record["usage"]
    assert usage["state_transitions"] == (1 + FINISH_ROLLOUT_RETRIES) + (PACE_STATES + 1 + 2) + 1
    assert usage["lambda_requests"] == {"StartRollout": 1, "OnRolloutResult": 1, "FinishRollout": 1}
    assert usage["acr_sessions"] == 1 and usage["acr_session_seconds"] > 0
    assert usage["s3_get_class"] >= 2 and usage["s3_put_class"] >= 3  # the result's GET, this one's; Start's PUTs


def test_malformed_and_failed_agent_results_score_zero_without_failing_the_rollout(env):
    stack, agent, sm, run_id, p, items = env
    item = items[2]
    outcomes = []
    for body in (b"{not json", b"[1, 2]", json.dumps({"status_code": 500, "rewards": 1.0}).encode()):
        sid = f"sid-{len(outcomes)}"
        key = result_key(run_id, item['input_id'], sid)
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=body)
        out = finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                                 "result": {"sid": sid, "result_key": key}, "error": None}))
        outcomes.append((out["status"], out["reward"]))
    # a non-200 result is the toolkit's record of an agent that raised: a failed rollout, not a 0.0 reward
    assert outcomes == [("error", 0.0), ("error", 0.0), ("error", 0.0)]
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=rollout_key(run_id, 0, 0, "sid-0"))["Body"].read())
    assert record["error"]["error"] == "MalformedResult" and record["reward_reason"].startswith("error")


def test_a_result_over_the_bound_is_an_error_rollout_naming_its_size_and_is_never_read_whole(env):
    """An agent's result object over `MAX_RESULT_BYTES` (16 MiB): FinishRollout's one ranged GET learns its
    size and reads no more than the bound, so the rollout is an ``error`` (ResultTooLarge, its size in the
    cause), scored 0.0, its sessions ended; before, FinishRollout read and parsed any size (an out-of-memory
    Lambda, retried 8 times, then Record failed rollout). A result of exactly the bound is read."""
    from stepwise.core.rewards import MAX_RESULT_BYTES

    stack, agent, sm, run_id, p, items = env
    item = items[2]
    head = b'{"rewards": 1.0, "pad": "'
    for name, size in (("at-bound", MAX_RESULT_BYTES), ("over", MAX_RESULT_BYTES + 1)):
        sid = f"sid-{name}"
        key = result_key(run_id, item["input_id"], sid)
        stack.s3.put_object(Bucket=BUCKET, Key=key, Body=head + b"x" * (size - len(head) - 2) + b'"}')
        before = stack.moto.s3_requests.snapshot()
        out = finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item,
                                                 "result": {"sid": sid, "result_key": key}, "error": None}))
        record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=rollout_key(run_id, 0, 0, sid))["Body"].read())
        if name == "at-bound":
            assert out["status"] == "ok" and out["reward"] == 1.0
            continue
        assert out["status"] == "error" and out["reward"] == 0.0
        assert record["error"]["error"] == "ResultTooLarge" and f"{MAX_RESULT_BYTES + 1:,} bytes" in record["error"]["cause"]
        assert record["reward_reason"].startswith("error: ResultTooLarge")
        assert _s3_delta(stack, before).get("GET result", 0) == 1  # one (ranged) GET of the result


def _s3_delta(stack, before: dict) -> dict:
    after = stack.moto.s3_requests.snapshot()
    # one GET session is the fake agent's own probe of what exists at invoke time, not StartRollout's
    delta = {k: n - before.get(k, 0) for k, n in after.items() if n != before.get(k, 0)}
    delta["GET session"] = delta.get("GET session", 0) - 1
    return {k: n for k, n in delta.items() if n}


def test_start_rollout_takes_the_policy_from_the_batch_and_reads_no_state(env):
    stack, agent, sm, run_id, p, items = env
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    assert p["batch"]["policy"] == {"training_session_name": state.training_session_name,
                                    "sampler_model_package_arn": state.sampler_model_package_arn,
                                    "policy_version": state.policy_version}
    start(StartEvent.model_validate({"task_token": "warm", "run": run_ref(run_id), "batch": p["batch"], "item": items[0]}))
    before = stack.moto.s3_requests.snapshot()  # config.json and prompts.json are now cached
    sid = start(StartEvent.model_validate({"task_token": "t4", "run": run_ref(run_id), "batch": p["batch"],
                                           "item": items[1]}))["sid"]
    assert _s3_delta(stack, before) == {"PUT start_marker": 1, "PUT session": 1}  # the token rides in the session
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
    assert record["training_session_name"] == state.training_session_name and record["policy_version"] == state.policy_version


def test_a_batch_without_a_policy_reads_state_and_refuses_a_non_owner(env):
    stack, agent, sm, run_id, p, items = env
    old = {k: v for k, v in p["batch"].items() if k != "policy"}  # planned before batches carried it
    before = stack.moto.s3_requests.snapshot()
    start(StartEvent.model_validate({"task_token": "t5", "run": run_ref(run_id), "batch": old, "item": items[0]}))
    assert _s3_delta(stack, before).get("GET state") == 1
    stranger = {"run_id": run_id, "execution_arn": run_ref(run_id)["execution_arn"] + "-other"}
    with pytest.raises(RunOwnedElsewhere):
        start(StartEvent.model_validate({"task_token": "t6", "run": stranger, "batch": old, "item": items[0]}))


def test_a_session_started_before_the_token_moved_still_resumes_and_another_run_s_sid_is_ignored(env):
    stack, agent, sm, run_id, p, items = env
    sfn = stack.moto.client("stepfunctions")
    item = items[1]
    seen = {b["_rollout"]["api_key"] for b in agent.invocations}
    arn = sfn.start_execution(stateMachineArn=sm, name="legacy-token", input=json.dumps({"run": run_ref(run_id), "batch": p["batch"], "item": item}))["executionArn"]
    sid = wait_for(lambda: next((b["_rollout"]["api_key"] for b in agent.invocations[::-1]
                                 if b["_rollout"]["input_id"] == item["input_id"] and b["_rollout"]["api_key"] not in seen), None))
    sid = sid.partition(".")[0]
    key = result_key(run_id, item['input_id'], sid)
    other_run = f"rollout-results/other-run/{item['input_id']}/{sid}.json"
    assert on_result(_notification(other_run)) == {"resumed": 0, "ignored": 1}  # the record names another run
    # as an older StartRollout left it: the token in runs/{run_id}/sessions/{sid}/task_token.json only
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
    token = record.pop("task_token")
    stack.s3.put_object(Bucket=BUCKET, Key=session_key(sid), Body=json.dumps(record).encode())
    stack.s3.put_object(Bucket=BUCKET, Key=task_token_key(run_id, sid),
                        Body=json.dumps({"task_token": token}).encode())
    stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"rewards": 1.0}).encode())
    assert on_result(_notification(key)) == {"resumed": 1, "ignored": 0}
    done = wait_for(lambda: (d := sfn.describe_execution(executionArn=arn))["status"] != "RUNNING" and d)
    assert done["status"] == "SUCCEEDED"


def test_finish_rollout_closes_the_session_with_the_record_on_result_passed_without_reading_it(env):
    stack, agent, sm, run_id, p, items = env
    item = items[3]
    sid = start(StartEvent.model_validate({"task_token": "t-close", "run": run_ref(run_id), "batch": p["batch"],
                                           "item": item}))["sid"]
    key = result_key(run_id, item['input_id'], sid)
    stack.s3.put_object(Bucket=BUCKET, Key=key, Body=json.dumps({"rewards": 1.0}).encode())
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
    before = stack.moto.s3_requests.snapshot()
    out = finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item, "error": None,
                                             "result": {"sid": sid, "result_key": key, "session": record}}))
    assert out["status"] == "ok" and out["reward"] == 1.0
    delta = {k: n - before.get(k, 0) for k, n in stack.moto.s3_requests.snapshot().items() if n != before.get(k, 0)}
    assert "GET session" not in delta and delta["PUT session"] == 1
    closed = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read())
    assert closed == {**record, "closed": True}  # the token and every field kept: a late result is still recognised
    # a record of another session (or none) is not trusted: the record is read, as before
    sid2 = start(StartEvent.model_validate({"task_token": "t-close2", "run": run_ref(run_id), "batch": p["batch"],
                                            "item": item}))["sid"]
    before = stack.moto.s3_requests.snapshot()
    finish(FinishEvent.model_validate({"run": run_ref(run_id), "batch": p["batch"], "item": item, "error": None,
                                       "result": {"sid": sid2, "result_key": key.replace(sid, sid2), "session": record}}))
    after = stack.moto.s3_requests.snapshot()
    assert after["GET session"] - before.get("GET session", 0) == 1
    assert json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid2))["Body"].read())["closed"] is True


def test_the_session_record_gates_turns_of_group_engine_rollouts_that_a_load_may_meet():
    """admission 'group' from max_staleness 1 admits groups while a step trains: they run through its Rebind,
    so the gateway must enforce the run's binding (turn_gate holds their turns during the load). The batch
    engine at 1 rebinds turn_gate after the join, with no turn in flight: its rollouts take the free
    per_rollout. (Before, a group-engine run at max_staleness 1 got per_rollout: nothing held its turns.)"""
    from stepwise.config import RunConfig
    from stepwise.handlers.rollout import session_record
    from stepwise.records import BatchRef, SamplerPolicy

    base = {"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/R", "base_model_arn": "stepwise-tiny",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/agent",
            "dataset_path": f"s3://{BUCKET}/d.jsonl", "batch_size": 2, "sampler_binding": "turn_gate"}
    batch = BatchRef(kind="train", step=1, policy=SamplerPolicy(training_session_name="s", policy_version=1))

    def binding(**over) -> str:
        return session_record(RunConfig.model_validate({**base, **over}), "r", batch, "sid", "in", 0).sampler_binding

    assert binding(admission="group", max_staleness=1, sampling_steps_ahead=1) == "turn_gate"
    assert binding(admission="group", max_staleness=2) == "turn_gate"
    assert binding(max_staleness=1) == "per_rollout" and binding(admission="group", max_staleness=0) == "per_rollout"
