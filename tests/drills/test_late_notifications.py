"""Drill: an S3 notification that comes late, or never, costs a rollout (and the step waiting for it) a bounded
re-check interval, not its heartbeat or its whole timeout.

One rollout child as the real ASL has it (its ``ItemProcessor``) in moto's Step Functions engine, with the real
StartRollout / OnRolloutResult / FinishRollout handlers, the bucket's real ObjectCreated notification on
``rollout-results/`` -> OnRolloutResult, and `FakeAgent` playing ACR: it writes one captured turn and its result
at once. The local engine delays or drops that one notification (`local.engine.InvocationFaults`: on AWS, S3
notifications are at-least-once and may come a minute or more late). What a rollout pays is the time from its
result object to its rollout record (FinishRollout's write), measured for each case; run with ``-s`` to see them.
"""

from __future__ import annotations

import json
import time
from urllib.parse import unquote_plus

import pytest
from tests.support.pipeline import BUCKET, FakeAgent, Stack, init_run, run_ref, wait_ready
from tests.support.waiting import wait_for

from stepwise.events import RunEvent
from stepwise.handlers.plan import plan
from stepwise.layout import result_key, rollout_key

TIMEOUT_S = 30  # max_rollout_time of the drill's config
#: The drill's functions: logical name -> ARN (the fixture fills it).
ARNS: dict[str, str] = {}


@pytest.fixture(scope="module")
def child():
    from infra.definition import substitutions
    from local import resources
    from state_machine.definition import PLACEHOLDER_RE, load_asl

    stack = Stack()
    agent = FakeAgent()
    stack.mp.setenv("AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", agent.url)
    arns = resources.create_functions(stack.moto, prefix="late")
    ARNS.update(arns)
    resources.create_bucket(stack.moto, BUCKET, result_function_arn=arns["OnRolloutResult"])
    processor = load_asl()["States"]["Roll out generation batch"]["ItemProcessor"]
    text = json.dumps({"StartAt": processor["StartAt"], "States": processor["States"]})
    values = substitutions(function_arns=arns, bucket_name=BUCKET)
    sm = resources.create_state_machine(stack.moto, "late-child", PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text))
    yield stack, agent, sm
    agent.stop()
    stack.stop()


def _run(child, name: str, **config) -> tuple[str, dict, list[dict]]:
    """A run of one batch planned by PlanStep from ``config``: (run id, batch, one item per prompt)."""
    stack, agent, sm = child
    run_id = f"late-{name}-{int(time.time())}"
    init_run(stack, run_id, stack.config(batch_size=3, max_rollout_time=TIMEOUT_S, **config))
    assert wait_ready(run_id)["ready"]
    p = plan(RunEvent.model_validate({"run": run_ref(run_id)}))
    items = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=p["items_key"])["Body"].read())
    return run_id, p["batch"], list({item["input_id"]: item for item in reversed(items)}.values())[::-1]


def _rollout(child, run_id: str, batch: dict, item: dict, *, fault: tuple[str, float] | None,
             wait_result: bool = True, sm: str | None = None) -> dict:
    """Roll out ``item`` in a child execution (of ``sm``, default the training loop's child states) with its
    notification ``fault`` (("drop", 0) or ("delay", s), or None); returns its record plus ``paid``: seconds
    from its result object to its record (``wait_result`` False: the child may end before the result is
    written; nothing paid is measured). A group engine's ``batch`` (``group``) keeps its records in its folder."""
    stack, agent, child_sm = child
    sm = sm or child_sm
    faults = stack.moto.dispatcher.faults
    mine = lambda e: f"/{item['input_id']}/" in unquote_plus(e["Records"][0]["s3"]["object"]["key"])  # noqa: E731
    if fault is not None and fault[0] == "drop":
        faults.drop_events("OnRolloutResult", match=mine)
    elif fault is not None:
        faults.delay_events("OnRolloutResult", fault[1], match=mine)
    sfn = stack.moto.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=sm, name=f"c-{run_id}-{item['i']}", input=json.dumps(
        {"run": run_ref(run_id), "batch": batch, "item": item, "result": None, "error": None}))["executionArn"]
    body = wait_for(lambda: next((b for b in agent.invocations if b["_rollout"]["input_id"] == item["input_id"]
                                  and b["_rollout"]["exp_id"].endswith(run_id)), None), 30)
    sid = body["_rollout"]["api_key"].partition(".")[0]
    written = wait_for(lambda: _modified(stack, result_key(run_id, item["input_id"], sid)), 30) if wait_result else None
    wait_for(lambda: sfn.describe_execution(executionArn=arn)["status"] != "RUNNING", TIMEOUT_S * 3)
    key = rollout_key(run_id, batch["step"], batch["generation_batch"], sid, batch["kind"], group=batch.get("group"),
                      attempt=batch.get("attempt", 0))
    record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())
    return {**record, "paid": _modified(stack, key) - written if written else None}


def _modified(stack, key: str) -> float | None:
    try:
        return stack.s3.head_object(Bucket=BUCKET, Key=key)["LastModified"].timestamp()
    except stack.s3.exceptions.ClientError:
        return None


RECHECK_S = 3  # rollout_recheck_seconds of the drill's config (default 60)


def test_a_late_or_lost_notification_costs_the_recheck_interval_not_the_heartbeat_or_the_timeout(child):
    """Each rollout's result is written at once; its notification comes on time, 8 s late, or never. The
    rollout pays (result to record) at most the re-check interval (3 s here): before the re-check, 8.0 s late and
    31.0 s lost with the heartbeat off (max_rollout_time 30), 8.0 s and 12.0 s with a 12 s heartbeat (the same
    drill on the code before: a notification late pays its delay, a lost one the heartbeat or the timeout). A
    rollout found by the re-check is scored and marked ``late``; the re-check's transitions are in its record's
    ``usage``."""
    stack, agent, sm = child
    heartbeat = 0  # off: only max_rollout_time, the worst case before the re-check
    run_id, batch, items = _run(child, "lost", rollout_heartbeat_seconds=heartbeat, rollout_recheck_seconds=RECHECK_S)
    assert batch["heartbeat_seconds"] == RECHECK_S and batch["timeout_seconds"] == TIMEOUT_S
    paid = {}
    for item, (case, fault) in zip(items, [("on time", None), ("late 8 s", ("delay", 8.0)), ("lost", ("drop", 0.0))]):
        rechecks = _rechecks(stack)
        r = _rollout(child, run_id, batch, item, fault=fault)
        assert r["status"] == "ok" and r["reward"] in (0.0, 1.0) and r["records"], r
        assert r["late"] is (fault is not None)
        paid[case] = round(r["paid"], 1)
        # Pace start, Start rollout, Finish rollout, and per re-check (each an OnRolloutResult call) Rollout silent and Wait for
        # rollout result
        assert r["usage"]["state_transitions"] == 3 + 2 * (_rechecks(stack) - rechecks)
    print(f"\nrollout_heartbeat_seconds {heartbeat}, max_rollout_time {TIMEOUT_S}, "
          f"rollout_recheck_seconds {RECHECK_S}: "
          f"seconds from the result to its record: {paid}")
    # on time is at most the re-check interval too: under load a notification's dispatch can take longer than
    # the re-check, which then finds the result first (CI once paid 3.0 s for all three)
    assert all(paid[case] <= RECHECK_S + 2 for case in paid), paid


def test_an_agent_silent_longer_than_the_interval_keeps_its_rollout_and_its_notification_ends_it(child):
    """An agent that works 8 s without an LLM call (a tool call) and then writes its result: its task is
    re-checked at 3 s and 6 s of silence (no result yet, the agent within its 12 s silence limit: each re-check
    waits again with a new task token in the session record), and the result's notification, on time, resumes
    the task that waits then: an ordinary rollout, not late, nothing paid. An agent silent past its limit ends
    ``timeout`` (the re-check's ``RolloutSilent``, named ``States.HeartbeatTimeout`` with the cause ``no LLM call
    for 12 s``), as with the heartbeat alone."""
    stack, agent, sm = child
    run_id, batch, items = _run(child, "slow", rollout_heartbeat_seconds=12, rollout_recheck_seconds=RECHECK_S)
    agent.result_delay = 8.0
    try:
        rechecks = _rechecks(stack)
        r = _rollout(child, run_id, batch, items[0], fault=None)
        assert r["status"] == "ok" and not r["late"] and r["paid"] <= RECHECK_S + 2, r
        n = _rechecks(stack) - rechecks
        assert n >= 2 and r["usage"]["state_transitions"] == 3 + 2 * n
        agent.result_delay = 20.0  # past the 12 s silence limit
        r = _rollout(child, run_id, batch, items[1], fault=None, wait_result=False)
        assert r["status"] == "timeout" and r["error"]["error"] == "States.HeartbeatTimeout", r
        assert r["error"]["cause"].startswith("no LLM call for 12 s (rollout_heartbeat_seconds)")
    finally:
        agent.result_delay = 0.0
    assert agent.active_sessions(run_id) == []


def test_a_group_engine_rollout_whose_notification_is_lost_is_found_by_the_recheck_in_its_group_folder(child):
    """admission 'group': the rollout group's own copy of the child states (its inline Map's) re-checks a silent
    rollout too, and the re-check finds the rollout's start in its group's folder: a lost notification costs the
    re-check interval, and the record lands in the group's folder, ``late``. (Before, the re-check looked for the
    start marker in the batch's folder, found none and raised RolloutOverdue: FinishRollout still scored the
    result, but the re-check's own measurement was lost.)"""
    from infra.definition import substitutions
    from local import resources
    from state_machine.definition import PLACEHOLDER_RE, load_group_definition

    from stepwise.layout import prompts_key

    stack, agent, _ = child
    processor = json.loads(load_group_definition())["States"]["Roll out the group"]["ItemProcessor"]
    text = json.dumps({"StartAt": processor["StartAt"], "States": processor["States"]})
    values = substitutions(function_arns=ARNS, bucket_name=BUCKET)
    sm = resources.create_state_machine(stack.moto, "late-group-child", PLACEHOLDER_RE.sub(lambda m: values[m.group(1)], text))
    run_id, batch, items = _run(child, "group", rollout_heartbeat_seconds=0, rollout_recheck_seconds=RECHECK_S)
    group = {**batch, "group": 0, "attempt": 0}  # as AdmitGroups hands a group's rollouts their batch
    prompts = stack.s3.get_object(Bucket=BUCKET, Key=prompts_key(run_id, batch["step"], 0, "train"))["Body"].read()
    stack.s3.put_object(Bucket=BUCKET, Key=prompts_key(run_id, batch["step"], 0, "train", group=0, attempt=0), Body=prompts)
    rechecks = _rechecks(stack)
    r = _rollout(child, run_id, group, items[0], fault=("drop", 0.0), sm=sm)
    assert r["status"] == "ok" and r["late"] is True and r["group"] == 0, r
    assert r["paid"] <= RECHECK_S + 2, r["paid"]
    # the re-check resumed the task itself (its transitions ride in the record): before, it raised, and FinishRollout
    # found the result on the error path, the re-check's measurement lost (2 transitions)
    assert _rechecks(stack) > rechecks and r["usage"]["state_transitions"] == 3 + 2 * (_rechecks(stack) - rechecks)


def _rechecks(stack) -> int:
    """OnRolloutResult calls that were re-checks: the state machine's synchronous-in-kind invocations of its
    waitForTaskToken task, not S3's asynchronous (Event) notifications."""
    return sum(1 for inv in stack.moto.dispatcher.invocations
               if inv.function_name.endswith("OnRolloutResult") and inv.invocation_type != "Event")
