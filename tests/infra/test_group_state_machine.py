"""The rollout group state machine in the synthesized stack (admission: group): deployed verbatim beside the
training loop, invoking only its rollouts', its judge's and its record's functions; only AdmitGroups and
RecordGroupComplete start groups, and a run's end (StopSession, Cleanup) and the trainer's wait may stop them."""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

from state_machine.definition import load_group_definition, placeholders  # noqa: E402
from stepwise.functions import FUNCTIONS  # noqa: E402
from tests.infra.test_stack_template import (  # noqa: E402
    _role_statements_by_function, _sm_lid, actions_of, resources, statements_of_role, the_state_machine,
)
from tests.support.stack import synthesized  # noqa: E402

GROUP = "Roll out the group"


@pytest.fixture(scope="module")
def template():
    return synthesized()[1]


def test_the_rollout_group_is_deployed_verbatim_and_the_training_loop_names_it(template):
    group = the_state_machine(template, GROUP)
    assert group["DefinitionString"] == load_group_definition()
    assert set(group["DefinitionSubstitutions"]) == placeholders(load_group_definition())
    assert group["StateMachineType"] == "STANDARD" and group["LoggingConfiguration"]["Level"] == "ALL"
    loop = the_state_machine(template)
    assert loop["DefinitionSubstitutions"]["RolloutGroupStateMachineArn"] == {"Ref": _sm_lid(template, GROUP)}


def test_the_rollout_group_invokes_only_its_rollouts_and_its_record(template):
    role = the_state_machine(template, GROUP)["RoleArn"]["Fn::GetAtt"][0]
    stmts = statements_of_role(template, role)
    invoked = {json.dumps(r) for s in stmts if "lambda:InvokeFunction" in actions_of([s])
               for r in (s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]])}
    by_name = {}
    for lid, r in resources(template, "AWS::Lambda::Function").items():
        cmd = r["Properties"].get("ImageConfig", {}).get("Command")
        spec = next((f for f in FUNCTIONS if cmd and f.handler == cmd[0]), None)
        if spec:
            by_name[spec.name] = lid
    named = {n for n, lid in by_name.items() if any(lid in x for x in invoked)}
    # OnRolloutResult: a silent rollout's re-check of its result (the rollout child states' "Wait for rollout result");
    # JudgeGroups: the group's judge ("Judge the group", only with a judge)
    assert named == {"StartRollout", "OnRolloutResult", "FinishRollout", "JudgeGroups", "RecordGroupComplete"}
    # it starts nothing itself (the functions do: moto runs no states:startExecution task, nor does this)
    assert not {"states:StartExecution", "states:StopExecution"} & actions_of(stmts)


def test_only_the_group_engine_starts_groups_and_only_a_run_end_or_the_wait_stops_them(template):
    group_lid = _sm_lid(template, GROUP)
    starters, stoppers = set(), set()
    for name, stmts in _role_statements_by_function(template).items():
        for st in stmts:
            text = json.dumps(st["Resource"])
            if group_lid not in text:
                continue
            if "states:StartExecution" in actions_of([st]):
                starters.add(name)
            if "states:StopExecution" in actions_of([st]):
                stoppers.add(name)
    assert starters == {"AdmitGroups", "RecordGroupComplete"}
    # SweepSessions: the leftovers of a run's end it finishes may name stopped groups still running
    assert stoppers == {"AwaitGroups", "StopSession", "Cleanup", "SweepSessions"}
