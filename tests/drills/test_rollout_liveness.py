"""Drill: a dead agent is noticed at its heartbeat, a live one is kept alive by its LLM calls, and a result
whose S3 notification never came is scored, at the level of one rollout child.

The rollout child runs as the real ASL has it (its ``ItemProcessor``: Start rollout with its
``TimeoutSecondsPath`` and ``HeartbeatSecondsPath``, Finish rollout, Record failed rollout) in moto's
Step Functions engine (`local.engine`, which names a stopped heartbeat ``States.HeartbeatTimeout`` as AWS
does), with the real StartRollout / FinishRollout handlers dispatched in-process and `FakeAgent` playing
ACR's data plane. The batch has ``heartbeat_seconds`` 3 and ``timeout_seconds`` 60:

- a silent agent (invoked, then nothing): its child ends ``timeout`` with the cause ``no LLM call for 3 s``
  a few seconds after the invoke, not after the 60 s timeout (before: the callback task had no heartbeat, so
  a dead agent held its place in the Map for ``max_rollout_time``, 1,800 s by default): the heartbeat timeout
  re-checks the rollout (no result, no LLM call for ``rollout_heartbeat_seconds``: ``States.HeartbeatTimeout``);
- an agent that keeps calling its LLM: the gateway's heartbeat sender (`stepwise.gateway.heartbeat.TaskHeartbeats`,
  here against the engine's real ``SendTaskHeartbeat``) keeps its task alive past 3 s, and its result scores;
- an agent that wrote its result but whose S3 notification never arrived: the re-check at the task's heartbeat
  timeout finds the result object and FinishRollout scores it (``late: true``; before: 0.0 as ``timeout``).

Every runtime session is stopped. Each test takes about 10 s (the heartbeat waits).
"""

from __future__ import annotations

import json
import time
import urllib.parse

import pytest
from tests.support.pipeline import BUCKET, FakeAgent, Stack, init_run, play_rollout, run_ref, wait_ready
from tests.support.waiting import wait_for

from stepwise.events import RunEvent, S3Notification
from stepwise.handlers.plan import plan
from stepwise.handlers.rollout import on_result
from stepwise.layout import rollout_key, session_key

HEARTBEAT_S = 3
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def child():
    from infra.definition import substitutions
    from local import resources
    from state_machine.definition import PLACEHOLDER_RE, load_asl

    stack = Stack()
    agent = FakeAgent()
    agent.write_results = False  # each test plays its agent itself
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", agent.url)
    arns = resources.create_functions(stack.moto, prefix="liveness")
    processor = load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]
    text = json.dumps({"StartAt": processor["StartAt"], "States": processor["States"]})
    values = substitutions(function_arns=arns, bucket_name=BUCKET)
    sm = resources.create_state_machine(stack.moto, "liveness-child", PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text))
    run_id = f"liveness-{int(time.time())}"
    init_run(stack, run_id, stack.config(batch_size=4, rollout_heartbeat_seconds=HEARTBEAT_S))
    assert wait_ready(run_id)["ready"]
    p = plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    # the task's heartbeat: the silence limit (3 s), below the re-check interval (60 s) and the timeout (30 s); the
    # re-check (on each heartbeat timeout) judges the silence against rollout_heartbeat_seconds
    assert (p["batch"]["timeout_seconds"], p["batch"]["heartbeat_seconds"], p["batch"]["heartbeat_on"]) == (30, HEARTBEAT_S, True)
    batch = {**p["batch"], "timeout_seconds": TIMEOUT_S, "heartbeat_seconds": HEARTBEAT_S, "heartbeat_on": True}
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    items = list({item["input_id"]: item for item in reversed(items)}.values())[::-1]  # one item per prompt
    assert len(items) >= 4
    yield stack, agent, sm, run_id, batch, items
    agent.stop()
    stack.stop()


def _start(child, item, batch: dict | None = None) -> tuple[str, str, float]:
    """Start one rollout child (of the fixture's batch, or ``batch``); (execution ARN, sid, when the agent was invoked)."""
    stack, agent, sm, run_id, fixture_batch, items = child
    sfn = stack.moto.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=sm, name=f"child-{item['input_id']}", input=json.dumps({"run": run_ref(run_id), "batch": batch or fixture_batch, "item": item,
                                                                    "result": None, "error": None}))["executionArn"]
    body = wait_for(lambda: next((b for b in agent.invocations if b["_rollout"]["input_id"] == item["input_id"]
                                  and b["_rollout"]["exp_id"].endswith(run_id)), None), 30)
    return arn, body["_rollout"]["api_key"].partition(".")[0], time.monotonic()


def _ended(child, arn: str, timeout: float) -> dict:
    sfn = child[0].moto.client("stepfunctions")
    return wait_for(lambda: (d := sfn.describe_execution(executionArn=arn))["status"] != "RUNNING" and d, timeout)


def _record(child, sid: str) -> dict:
    stack, _, _, run_id, batch, _ = child
    key = rollout_key(run_id, batch["step"], batch["generation_batch"], sid, batch["kind"])
    return json.loads(stack.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def test_a_silent_agent_times_out_at_its_heartbeat_and_one_calling_its_llm_lives_on(child):
    from stepwise.gateway.heartbeat import TaskHeartbeats
    from stepwise.records import SessionRecord

    stack, agent, sm, run_id, batch, items = child
    silent_arn, silent_sid, silent_t0 = _start(child, items[0])
    alive_arn, alive_sid, alive_t0 = _start(child, items[1])
    # The live agent calls its LLM every 0.5 s for 2 heartbeat timeouts; each call goes through the
    # gateway's heartbeat sender (at most one SendTaskHeartbeat per interval: 1 s here).
    beats = TaskHeartbeats(client_factory=lambda region: stack.moto.client("stepfunctions"))
    record = SessionRecord.model_validate(json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(alive_sid))["Body"].read()))
    assert record.heartbeat_seconds == HEARTBEAT_S
    while time.monotonic() - alive_t0 < 2 * HEARTBEAT_S:
        beats.send(record)
        time.sleep(0.5)
    assert 2 * HEARTBEAT_S - 1 <= beats.sent <= 2 * HEARTBEAT_S + 1 and beats.failed == 0
    key = play_rollout(stack, run_id, alive_sid, items[1]["input_id"], 1.0, [20, 21, 22])
    assert on_result(S3Notification.model_validate({"Records": [{"eventSource": "aws:s3", "s3": {
        "bucket": {"name": BUCKET}, "object": {"key": urllib.parse.quote_plus(key, safe="/")}}}]})) == {"resumed": 1, "ignored": 0}

    silent = _ended(child, silent_arn, TIMEOUT_S / 2)  # before the task's own timeout
    held = time.monotonic() - silent_t0
    assert silent["status"] == "SUCCEEDED"  # the child ends: its rollout is recorded, the step goes on
    r = _record(child, silent_sid)
    # its heartbeat timeout re-checked the result (none) and the agent's last LLM call (none for 3 s): silent,
    # named as the task's own heartbeat timeout was
    assert r["status"] == "timeout" and r["reward"] == 0.0 and r["error"]["error"] == "States.HeartbeatTimeout"
    assert r["error"]["cause"].startswith(f"no LLM call for {HEARTBEAT_S} s (rollout_heartbeat_seconds)")
    assert held < TIMEOUT_S / 3, held

    assert _ended(child, alive_arn, 30)["status"] == "SUCCEEDED"
    r = _record(child, alive_sid)
    assert r["status"] == "ok" and r["reward"] == 1.0 and not r["late"] and len(r["records"]) == 1
    assert r["duration_s"] > 2 * HEARTBEAT_S - 1  # it outlived its heartbeat timeout twice over
    assert agent.active_sessions(run_id) == []  # both runtime sessions stopped


def test_a_result_whose_notification_never_came_is_scored_late_not_zeroed(child):
    stack, agent, sm, run_id, batch, items = child
    arn, sid, t0 = _start(child, items[2])
    play_rollout(stack, run_id, sid, items[2]["input_id"], 1.0, [30, 31])  # written; its notification is lost
    assert _ended(child, arn, TIMEOUT_S / 2)["status"] == "SUCCEEDED"
    r = _record(child, sid)
    assert r["status"] == "ok" and r["late"] is True and r["error"] is None
    assert r["reward"] == 1.0 and len(r["records"]) == 1 and r["records"][0]["reward"] == 1.0  # trained on
    assert sid not in agent.active_sessions(run_id)


def test_with_the_heartbeat_off_a_silent_agent_ends_at_max_rollout_time_never_before(child):
    """``rollout_heartbeat_seconds: 0`` (max_rollout_time 4 s): the task's HeartbeatSeconds (4) is below its
    TimeoutSeconds (5), as the States Language requires, the gateway sends no heartbeat, and the silent
    rollout ends at 4 s, not earlier, named for max_rollout_time (before: both were 4, the heartbeat equal to
    the timeout)."""
    from stepwise.core.liveness import rollout_timeouts
    from stepwise.records import SessionRecord

    stack, agent, sm, run_id, batch, items = child
    timeouts = rollout_timeouts(4.0, 0)
    assert timeouts == (5, 4, False)
    off = {**batch, **timeouts._asdict()}
    arn, sid, t0 = _start(child, items[3], off)
    record = SessionRecord.model_validate(json.loads(stack.s3.get_object(Bucket=BUCKET, Key=session_key(sid))["Body"].read()))
    assert record.heartbeat_seconds == 0  # the gateway sends no heartbeat for this task
    ended = _ended(child, arn, 30)
    held = time.monotonic() - t0
    assert ended["status"] == "SUCCEEDED"
    r = _record(child, sid)
    assert r["status"] == "timeout" and r["reward"] == 0.0
    assert r["error"]["cause"] == "no result within 4 s (max_rollout_time)", r["error"]
    assert held >= 4 - 0.5, held  # t0 is taken when the agent was seen invoked, a moment after the task began
    assert sid not in agent.active_sessions(run_id)
