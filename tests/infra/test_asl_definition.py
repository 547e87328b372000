"""The training-loop ASL: valid JSON, JSONPath only, catch-alls to the stop path, placeholders defined."""

from __future__ import annotations

import json
from typing import Any, Iterator

import pytest

from state_machine.definition import load_asl, load_definition, placeholders, render_definition
from stepwise.functions import FUNCTIONS

STOP_ON_FAILURE = "Stop training session after failure"


def _walk(states: dict[str, Any], depth: int = 0) -> Iterator[tuple[str, dict[str, Any], int]]:
    for name, st in states.items():
        yield name, st, depth
        if st.get("Type") == "Map":
            yield from _walk(st["ItemProcessor"]["States"], depth + 1)
        for branch in st.get("Branches", []):
            yield from _walk(branch["States"], depth + 1)


def _all_strings(obj: Any) -> Iterator[str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield k
            yield from _all_strings(v)
    elif isinstance(obj, list):
        for v in obj:
            yield from _all_strings(v)
    elif isinstance(obj, str):
        yield obj


def test_asl_is_jsonpath_only() -> None:
    asl = load_asl()
    assert asl.get("QueryLanguage", "JSONPath") == "JSONPath"
    for name, st, _ in _walk(asl["States"]):
        assert st.get("QueryLanguage", "JSONPath") == "JSONPath", name
        for field in ("Arguments", "Output", "Assign"):
            assert field not in st, f"{name} uses JSONata-only field {field}"
    assert not any(s.strip().startswith("{%") for s in _all_strings(asl)), "JSONata expression found"


def test_every_parent_task_catches_to_the_stop_path() -> None:
    asl = load_asl()
    for name, st, depth in _walk(asl["States"]):
        if depth or st["Type"] not in ("Task", "Map") or name == STOP_ON_FAILURE:
            continue
        catches = st.get("Catch", [])
        assert any("States.ALL" in c["ErrorEquals"] and c["Next"] == STOP_ON_FAILURE for c in catches), name
    stop = asl["States"][STOP_ON_FAILURE]
    assert asl["States"][stop["Next"]]["Type"] == "Fail"
    assert all(c["Next"] == stop["Next"] for c in stop["Catch"])


def test_every_transition_targets_an_existing_state_and_every_state_is_reachable() -> None:
    def check(states: dict[str, Any], start: str) -> None:
        targets = {start}
        for name, st in states.items():
            nexts = [st.get("Next"), st.get("Default")] + [c["Next"] for c in st.get("Choices", []) + st.get("Catch", [])]
            for n in filter(None, nexts):
                assert n in states, f"{name} -> unknown state {n}"
                targets.add(n)
            if st["Type"] == "Map":
                proc = st["ItemProcessor"]
                check(proc["States"], proc["StartAt"])
            for branch in st.get("Branches", []):
                check(branch["States"], branch["StartAt"])
        assert set(states) == targets, f"unreachable: {set(states) - targets}"

    asl = load_asl()
    check(asl["States"], asl["StartAt"])


def test_rollouts_run_as_a_distributed_map_of_standard_callback_children() -> None:
    rollouts = load_asl()["States"]["Roll out generation batch"]
    assert rollouts["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}
    assert rollouts["ItemReader"]["Resource"] == "${StatesS3GetObject}"
    assert rollouts["ResultPath"] is None and "ResultWriter" in rollouts  # nothing of the children reaches the parent
    start = rollouts["ItemProcessor"]["States"]["Start rollout"]
    assert start["Resource"] == "${StatesLambdaInvokeWaitForTaskToken}"
    assert start["TimeoutSecondsPath"]
    retry = start["Retry"][0]
    assert {"AgentRuntimeThrottled", "AgentRuntimeUnavailable"} <= set(retry["ErrorEquals"]) and retry["JitterStrategy"] == "FULL"
    assert start["Catch"][-1]["ErrorEquals"] == ["States.ALL"] and start["Catch"][-1]["Next"] == "Finish rollout"
    # a silence (the heartbeat timeout, at most rollout_recheck_seconds) re-checks the result, in a loop (through a
    # Pass: moto's interpreter cannot loop a Catch to its own state) that ends in Finish rollout; the error it
    # caught stays out of FinishRollout's $.error
    assert start["Catch"][0] == {"ErrorEquals": ["States.HeartbeatTimeout"], "ResultPath": "$.recheck",
                                 "Next": "Rollout silent"}
    assert rollouts["ItemProcessor"]["States"]["Rollout silent"] == {
        "Type": "Pass", "Comment": rollouts["ItemProcessor"]["States"]["Rollout silent"]["Comment"],
        "Next": "Wait for rollout result"}
    wait = rollouts["ItemProcessor"]["States"]["Wait for rollout result"]
    assert wait["Resource"] == "${StatesLambdaInvokeWaitForTaskToken}"
    assert wait["Parameters"]["FunctionName"] == "${OnRolloutResultFunctionArn}"
    assert wait["Parameters"]["Payload"]["recheck"]["task_token.$"] == "$$.Task.Token"
    assert wait["HeartbeatSecondsPath"] == start["HeartbeatSecondsPath"] and wait["TimeoutSecondsPath"] == start["TimeoutSecondsPath"]
    assert wait["Catch"] == [start["Catch"][0], {"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Finish rollout"}]
    assert wait["Next"] == "Finish rollout" and wait["ResultPath"] == start["ResultPath"] == "$.result"


def test_one_child_never_sinks_a_step() -> None:
    """FinishRollout retries like StartRollout (as many attempts, backoff with full jitter, a ceiling);
    a child that still fails records an error rollout, and the Map tolerates a child that fails anyway
    (ComputeAdvantages counts its item as a lost rollout)."""
    states = load_asl()["States"]
    rollouts = states["Roll out generation batch"]
    children = rollouts["ItemProcessor"]["States"]
    start_retry = children["Start rollout"]["Retry"][0]
    finish = children["Finish rollout"]
    [retry] = finish["Retry"]
    assert retry["ErrorEquals"] == ["States.ALL"] and retry["JitterStrategy"] == "FULL"
    for key in ("MaxAttempts", "IntervalSeconds", "BackoffRate", "MaxDelaySeconds"):
        assert retry[key] == start_retry[key], key
    assert finish["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.finish_error", "Next": "Record failed rollout"}]
    record = children["Record failed rollout"]
    assert record["Resource"] == finish["Resource"] and record["Parameters"]["finish_error.$"] == "$.finish_error"
    assert record["Catch"][0]["Next"] == "Rollout lost" and children["Rollout lost"]["Type"] == "Pass"
    ahead = states["Train this step while rolling out the next"]["Branches"][1]["States"]["Roll out the next step's generation batch"]
    assert rollouts["ToleratedFailurePercentage"] == ahead["ToleratedFailurePercentage"] == 100
    assert rollouts["Catch"][0]["Next"] == "Stop training session after failure"  # a Map-level failure still stops the run


def test_placeholders_are_exactly_functions_the_bucket_and_integrations() -> None:
    from infra.definition import INTEGRATION_PLACEHOLDERS, substitutions

    from state_machine.definition import GROUP_STATE_MACHINE_PLACEHOLDER, load_group_definition

    names = {spec.name for spec in FUNCTIONS}
    used = placeholders()
    assert used - {"BucketName", GROUP_STATE_MACHINE_PLACEHOLDER, *INTEGRATION_PLACEHOLDERS} <= {
        f"{n}FunctionArn" for n in names}
    assert "BucketName" in used and GROUP_STATE_MACHINE_PLACEHOLDER in used
    # the rollout group names functions only (and is what the training loop's placeholder stands for)
    assert placeholders(load_group_definition()) - INTEGRATION_PLACEHOLDERS.keys() <= {f"{n}FunctionArn" for n in names}
    # no literal partition: the same text deploys to aws and aws-cn (cdk.json targets both)
    assert "arn:aws" not in load_definition() and "arn:aws" not in load_group_definition()
    arns = {n: f"arn:aws-cn:lambda:cn-north-1:123456789012:function:{n}" for n in names}
    group = "arn:aws-cn:states:cn-north-1:123456789012:stateMachine:group"
    rendered = json.loads(render_definition(substitutions(function_arns=arns, bucket_name="stepwise-runs",
                                                          partition="aws-cn", group_state_machine_arn=group)))
    assert rendered["States"]["Admit groups"]["Parameters"]["group_state_machine_arn"] == group
    assert "${" not in json.dumps(rendered)
    assert rendered["States"]["Roll out generation batch"]["ItemReader"]["Resource"] == "arn:aws-cn:states:::s3:getObject"
    assert rendered["States"]["Initialize run"]["Resource"].endswith(":function:Init")


def test_render_refuses_missing_placeholders() -> None:
    with pytest.raises(KeyError, match="BucketName"):
        render_definition({f"{s.name}FunctionArn": "arn:x" for s in FUNCTIONS})
    assert "${InitFunctionArn}" in load_definition()


def _names(states: dict[str, Any]) -> list[str]:
    """Every state name of a machine, its Parallel branches and Map children included."""
    return [name for name, _, _ in _walk(states)]


def test_overlapped_step_is_a_parallel_of_training_and_the_next_steps_rollouts() -> None:
    """max_staleness 1: one Parallel state, visible in the console graph, trains and rebinds
    this step while the next step's first generation batch rolls out; failures take the stop path."""
    states = load_asl()["States"]
    names = _names(states)
    assert len(names) == len(set(names)), "state names are unique across the machine (asl-validator refuses repeats)"
    enough = states["Enough groups to train?"]
    overlap = enough["Choices"][0]
    assert overlap["Next"] == "Train this step while rolling out the next"
    assert {"Variable": "$.advantages.roll_out_next", "IsPresent": True} in overlap["And"]  # absent = sequential
    assert enough["Choices"][1] == {"Variable": "$.advantages.decision", "StringEquals": "train",
                                    "Next": "Submit training step"}
    par = states["Train this step while rolling out the next"]
    # Where the sampler is rebound is the run's sampler_binding (stepwise.core.sampler_binding): with
    # turn_gate (the default) after both branches join, by the sequential loop's Rebind state, so no rollout
    # samples while the sampler changes; with per_rollout or next_turn inside the training branch, while
    # the next step's rollouts run. The branch's last answer says which happened.
    assert par["Type"] == "Parallel" and par["Next"] == "Rebound while rolling out?"
    assert par["ResultSelector"] == {"rebound.$": "$[0].op.rebound"} and par["ResultPath"] == "$.overlap"
    after = states["Rebound while rolling out?"]
    assert after["Choices"] == [{"Variable": "$.overlap.rebound", "BooleanEquals": True, "Next": "Plan next action"}]
    assert after["Default"] == "Rebind sampler to new weights"
    assert states["Sampler rebound?"]["Choices"][0]["Next"] == "Plan next action"
    assert par["Catch"] == [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": STOP_ON_FAILURE}]
    train, roll = par["Branches"]
    resources = {st.get("Resource") for st in train["States"].values()}
    assert {"${SubmitTrainFunctionArn}", "${PollOperationFunctionArn}", "${RebindFunctionArn}"} <= resources
    assert train["States"]["Rebind in this branch?"]["Choices"] == [
        {"Variable": "$.op.rebind_in_branch", "BooleanEquals": True, "Next": "Rebind sampler while the next step rolls out"}]
    assert train["States"]["Rebind in this branch?"]["Default"] == "This step trained"
    assert "${RebindFunctionArn}" not in json.dumps(roll)
    plan = roll["States"][roll["StartAt"]]
    assert plan["Resource"] == "${PlanStepFunctionArn}" and plan["Parameters"]["ahead_of_step.$"] == "$.advantages.step"
    ahead_map = roll["States"]["Roll out the next step's generation batch"]
    sequential_map = states["Roll out generation batch"]
    # the same rollout children, their states renamed (names are unique machine-wide)
    rename = {"Pace a rollout of the next step": "Pace start", "Start a rollout of the next step": "Start rollout", "Finish a rollout of the next step": "Finish rollout",
              "Record a failed rollout of the next step": "Record failed rollout",
              "A rollout of the next step lost": "Rollout lost",
              "Wait for a rollout result of the next step": "Wait for rollout result",
              "A rollout of the next step silent": "Rollout silent"}
    assert set(ahead_map["ItemProcessor"]["States"]) == set(rename)
    text = json.dumps(ahead_map["ItemProcessor"])
    for old, new in rename.items():
        text = text.replace(f'"{old}"', f'"{new}"')
    ahead_children = json.loads(text)
    assert ahead_children == sequential_map["ItemProcessor"]
    assert ahead_map["ItemReader"] == sequential_map["ItemReader"] and ahead_map["ResultPath"] is None
    # the batch rolled out ahead goes straight to its advantages after the next PlanStep
    assert {"Variable": "$.plan.action", "StringEquals": "rolled_out", "Next": "Train or eval batch?"} in \
        states["What comes next?"]["Choices"]
    for st in [*train["States"].values(), *roll["States"].values()]:
        assert "Catch" not in st, "a branch's failure must reach the Parallel's Catch (the stop path)"


def test_every_training_loop_task_retries_transient_service_errors() -> None:
    """What a handler still raises for throttling, 5xx or a connection error leaves as
    ``TransientServiceError`` (`stepwise.handlers._common.entrypoint`): every task outside the
    rollout children retries it with backoff, beside Lambda's own service errors."""
    from stepwise.handlers._common import TransientServiceError

    asl = load_asl()
    checked = []

    def walk(states: dict[str, Any], in_map: bool) -> None:
        for name, st in states.items():
            if st["Type"] == "Map":
                walk(st["ItemProcessor"]["States"], True)
            for branch in st.get("Branches", []):
                walk(branch["States"], in_map)
            if st["Type"] != "Task" or in_map:
                continue
            retriers = [r for r in st.get("Retry", []) if TransientServiceError.__name__ in r["ErrorEquals"]]
            assert len(retriers) == 1, name
            r = retriers[0]
            assert r["MaxAttempts"] >= 3 and r["BackoffRate"] > 1 and r["JitterStrategy"] == "FULL", name
            checked.append(name)

    walk(asl["States"], False)
    assert {"Initialize run", "Check training session", "Submit training step", "Check training step",
            "Rebind sampler to new weights", "Save checkpoint", "Stop training session"} <= set(checked)


# --- the rollout task's timeouts, as Step Functions resolves its paths ------------------------------

#: Configurations around the boundary the heartbeat is on below: (max_rollout_time, rollout_heartbeat_seconds).
TIMEOUT_CONFIGS = [(1800.0, 300), (1800.0, 0), (120.0, 300), (120.0, 120), (120.0, 119), (119.5, 120), (1.0, 0),
                   (0.001, 5), (28800.0, 0), (28800.0, 28799)]


def test_the_rollout_task_with_its_resolved_timeouts_is_a_valid_task_state() -> None:
    """The callback task of the Map child ("Start rollout") with ``TimeoutSecondsPath`` / ``HeartbeatSecondsPath``
    replaced by the values PlanStep puts there (`stepwise.core.liveness.rollout_timeouts`) for each of
    :data:`TIMEOUT_CONFIGS`: asl-validator accepts every one (its schema: positive integers), and each keeps
    the States Language's rule that asl-validator 4.0 does not check on literal values: HeartbeatSeconds
    smaller than TimeoutSeconds (Step Functions developer guide, "Task workflow state"). Before: the heartbeat
    off, or not below ``max_rollout_time``, gave a HeartbeatSeconds equal to TimeoutSeconds."""
    from infra.definition import substitutions
    from stepwise.core.liveness import rollout_timeouts
    from tests.infra.test_stack_validators import asl_validate

    arns = {spec.name: f"arn:aws:lambda:us-west-2:111122223333:function:stepwise-{spec.name.lower()}" for spec in FUNCTIONS}
    asl = json.loads(render_definition(substitutions(function_arns=arns, bucket_name="stepwise-bucket",
                                                     group_state_machine_arn="arn:aws:states:us-west-2:111122223333:stateMachine:g"),
                                       load_definition()))
    task = asl["States"]["Roll out generation batch"]["ItemProcessor"]["States"]["Start rollout"]
    assert (task["TimeoutSecondsPath"], task["HeartbeatSecondsPath"]) == ("$.batch.timeout_seconds", "$.batch.heartbeat_seconds")
    states = {}
    for i, (max_rollout_time, heartbeat) in enumerate(TIMEOUT_CONFIGS):
        t = rollout_timeouts(max_rollout_time, heartbeat)
        assert 0 < t.heartbeat_seconds < t.timeout_seconds, (max_rollout_time, heartbeat, t)
        state = {k: v for k, v in task.items() if k not in ("TimeoutSecondsPath", "HeartbeatSecondsPath", "Next", "End",
                                                              "Catch")}
        state.update(TimeoutSeconds=t.timeout_seconds, HeartbeatSeconds=t.heartbeat_seconds)
        state.update({"Next": f"config {i + 1}"} if i + 1 < len(TIMEOUT_CONFIGS) else {"End": True})
        states[f"config {i}"] = state
    out = asl_validate(json.dumps({"StartAt": "config 0", "States": states}))
    assert out.returncode == 0, out.stdout + out.stderr
    # the validator does refuse a heartbeat that is no positive integer ("off cannot be 0")
    states["config 0"]["HeartbeatSeconds"] = 0
    assert asl_validate(json.dumps({"StartAt": "config 0", "States": states})).returncode != 0


# ---------------------------------------------------------------------------- the group engine (admission: group)


def test_every_rollout_runs_the_child_states_of_one_source() -> None:
    """The training loop's two Maps and the rollout group's inline Map hold generated copies of
    ``state_machine/rollout_child.json``; a hand edit of one copy is refused here."""
    from state_machine.definition import CHILD_COPIES, child_states, stale_copies, with_child_copies

    assert stale_copies() == [], "run: python -m state_machine.definition --write"
    assert len(CHILD_COPIES) == 3
    path = CHILD_COPIES[2][0]
    edited = json.loads(path.read_text())
    edited["States"]["Roll out the group"]["ItemProcessor"]["States"]["Finish rollout"]["Retry"][0]["MaxAttempts"] = 1
    assert json.loads(with_child_copies(path))["States"]["Roll out the group"]["ItemProcessor"]["States"] == child_states()


def test_the_group_engine_branch_admits_waits_on_a_token_and_trains_the_chosen_groups() -> None:
    from state_machine.definition import load_group_asl

    states = load_asl()["States"]
    assert {"Variable": "$.plan.action", "StringEquals": "groups", "Next": "Admit groups"} in \
        states["What comes next?"]["Choices"]
    assert states["Admit groups"]["Next"] == "Wait for a batch of groups"
    wait = states["Wait for a batch of groups"]
    # a callback, not a polling loop: its timeout (from PlanStep) comes back to itself to re-check
    assert wait["Resource"] == "${StatesLambdaInvokeWaitForTaskToken}" and wait["TimeoutSecondsPath"] == "$.plan.wait_seconds"
    assert wait["Parameters"]["Payload"]["task_token.$"] == "$$.Task.Token"
    assert {"ErrorEquals": ["States.Timeout"], "ResultPath": "$.wait_timeout", "Next": "Wait for a batch of groups"} in wait["Catch"]
    assert wait["Next"] == "Compute advantages on the chosen groups"
    # the groups just taken free room: the next ones start before the step trains
    assert states["Compute advantages on the chosen groups"]["Next"] == "Admit groups while this step trains"
    choice = states["Train the chosen groups?"]["Choices"]
    assert {c["Next"] for c in choice} == {"Submit training step", "Wait for a batch of groups"}
    # the rollout group: every member a child with its task token, then its judge (with a judge), then the record
    group = load_group_asl()
    rollouts = group["States"]["Roll out the group"]
    assert rollouts["ItemProcessor"]["ProcessorConfig"] == {"Mode": "INLINE"} and rollouts["ItemsPath"] == "$.items"
    start = rollouts["ItemProcessor"]["States"]["Start rollout"]
    assert start["Resource"] == "${StatesLambdaInvokeWaitForTaskToken}"
    assert rollouts["Next"] == "Judge the group?"
    assert group["States"]["Judge the group?"]["Default"] == "Record group complete"
    record = group["States"]["Record group complete"]
    assert record["Resource"] == "${RecordGroupCompleteFunctionArn}" and record["End"]
    assert record["Parameters"]["group_state_machine_arn.$"] == "$$.StateMachine.Id"
    assert group.get("QueryLanguage") == "JSONPath"


def test_the_rollout_group_judges_its_group_with_the_training_loop_s_judge_loop_only_when_the_run_has_a_judge() -> None:
    """The group engine's judge: a Choice on the execution's ``judge`` (in the place of main's Pass: a run without a
    judge goes straight to the record, no extra transition), then the training loop's "Judge groups" loop generated
    from one fragment (``judge_loop.json``) for the group's one batch, ending at "Record group complete"."""
    from state_machine.definition import GROUP_JUDGE_NAMES, judge_states, load_group_asl, stale_copies

    assert stale_copies() == []
    group, loop = load_group_asl()["States"], load_asl()["States"]
    choice = group["Judge the group?"]
    assert choice["Type"] == "Choice" and choice["Default"] == "Record group complete"
    (rule,) = choice["Choices"]
    assert rule["Next"] == "Judge the group" and {"Variable": "$.judge", "BooleanEquals": True} in rule["And"]
    judge, done, wait = (group[GROUP_JUDGE_NAMES[n]] for n in ("Judge groups", "Groups judged?", "Wait for the judge"))
    assert judge["Resource"] == loop["Judge groups"]["Resource"] == "${JudgeGroupsFunctionArn}"
    assert judge["Parameters"] == {"run.$": "$.run", "batch.$": "$.batch"} and judge["Retry"] == loop["Judge groups"]["Retry"]
    assert judge["Next"] == "Group judged?" and judge["Catch"][0]["Next"] == "Record group complete"
    assert done["Choices"][0]["Next"] == "Record group complete" and done["Default"] == "Wait for the group's judge"
    assert wait["SecondsPath"] == "$.judge.wait_seconds" and wait["Next"] == "Judge the group"
    # the training loop's copy is the same fragment with its own bindings
    assert loop["Groups judged?"]["Choices"][0]["Next"] == "Compute advantages and filter groups"
    assert loop["Judge groups"]["Parameters"]["batch.$"] == "$.plan.batch"
    with pytest.raises(KeyError, match="<batch>|<failed>|<judged>"):
        judge_states()  # a copy must bind every token of the fragment
