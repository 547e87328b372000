"""`stepwise resume`: redrive where Step Functions allows it, else a new execution of the same run."""

from __future__ import annotations

import json

import pytest
from tests.support.cli import run_state, wait_status

from stepwise_cli.main import main
from stepwise_cli.commands._runs import CommandError
from stepwise_cli.commands.resume import continuation_input, next_segment_name, plan_resume
from stepwise.executions import continuation_name, resolve_run
from stepwise.layout import state_key

ARN = "arn:aws:states:us-east-1:123456789012:execution:loop:r"


def _failed(status="FAILED", redrive="REDRIVABLE"):
    return {"executionArn": ARN, "name": "r", "status": status, "redriveStatus": redrive}


@pytest.mark.parametrize("status", ["FAILED", "ABORTED", "TIMED_OUT"])
def test_redrive_only_when_redrivable_and_session_live(status):
    live = run_state("r", ARN)
    assert plan_resume("r", _failed(status), live).action == "redrive"
    assert plan_resume("r", _failed(status, "NOT_REDRIVABLE"), live).action == "new_execution"
    stopped = run_state("r", ARN, session_stopped=True)
    plan = plan_resume("r", _failed(status), stopped)
    assert plan.action == "new_execution" and "training session stopped" in plan.reason
    assert plan_resume("r", _failed(status), live, allow_redrive=False).action == "new_execution"


@pytest.mark.parametrize("newest,state,message", [
    ({"executionArn": ARN, "status": "RUNNING"}, run_state("r", ARN), "is running"),
    ({"executionArn": ARN, "status": "SUCCEEDED"}, run_state("r", ARN, finished=True), "finished"),
    (_failed(), None, "no state.json"),
    (None, None, "no run"),
])
def test_refusals(newest, state, message):
    with pytest.raises(CommandError, match=message):
        plan_resume("r", newest, state)


def test_continuation_names_and_input_match_the_pipeline():
    state = run_state("r", ARN, segment=2)
    name, segment = next_segment_name("r", state, ["r", "r--1", "r--2"])
    assert (name, segment) == (continuation_name("r", 3), 3)
    name, segment = next_segment_name("r", state, ["r", "r--7"])  # a name can never be reused
    assert segment == 8
    long_id = "x" * 70
    assert next_segment_name(long_id, run_state(long_id, ARN), [])[0] == continuation_name(long_id, 1)
    body = continuation_input("r", state, 3)
    assert resolve_run(name, json.dumps(body)) == ("r", body["continuation"])
    assert body["continuation"]["parent_execution_arn"] == ARN and body["continuation"]["resume"] is True


def test_resume_failed_run_starts_owned_continuation(moto_dep, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="r",
                                       input=json.dumps({"fail": True}))["executionArn"]
    assert wait_status(moto_dep.sfn, arn, ("FAILED",))["status"] == "FAILED"
    moto_dep.put_json(state_key("r"), run_state("r", arn, step=4, session_stopped=True))
    assert main(["resume", "r", *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    assert "started a new execution of run r" in out and "stepwise watch r" in out
    execs = {e["name"]: e for e in moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"]}
    assert set(execs) == {"r", "r--1"}
    sent = json.loads(moto_dep.sfn.describe_execution(executionArn=execs["r--1"]["executionArn"])["input"])
    assert sent == {"continuation": {"run_id": "r", "parent_execution_arn": arn, "segment": 1, "resume": True}}
    # now the continuation runs: a second resume is refused
    assert main(["resume", "r", *moto_dep.flags]) == 1
    assert "is running" in capsys.readouterr().err


def test_resume_finished_run_is_refused(moto_dep, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="done",
                                       input=json.dumps({"fail": True}))["executionArn"]
    wait_status(moto_dep.sfn, arn, ("FAILED",))
    moto_dep.put_json(state_key("done"), run_state("done", arn, finished=True))
    assert main(["resume", "done", *moto_dep.flags]) == 1
    assert "finished" in capsys.readouterr().err
