"""The stack derives the state machine's permissions from the ASL, and refuses what it cannot grant."""

from __future__ import annotations

import json

import pytest

from infra.definition import substitutions, used_substitutions
from infra.state_machine import asl_needs
from state_machine.definition import load_definition, placeholders
from stepwise.functions import FUNCTIONS


def _asl(states: dict) -> str:
    return json.dumps({"StartAt": next(iter(states)), "States": states})


def test_training_loop_needs_lambda_invokes_a_distributed_map_and_its_s3_access():
    needs = asl_needs(load_definition())
    assert needs.invoked_placeholders == {p for p in placeholders() if p.endswith("FunctionArn")}
    assert needs.distributed_map and needs.item_reader
    assert needs.result_writer_prefixes <= {"map-results/"}


def test_both_lambda_task_forms_are_recognised():
    text = _asl({
        "A": {"Type": "Task", "Resource": "${InitFunctionArn}", "Next": "B"},
        "B": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
              "Parameters": {"FunctionName": "${PlanStepFunctionArn}"}, "End": True},
    })
    assert asl_needs(text).invoked_placeholders == {"InitFunctionArn", "PlanStepFunctionArn"}


@pytest.mark.parametrize(
    "state, message",
    [
        ({"Type": "Task", "Resource": "arn:aws:states:::dynamodb:putItem", "End": True}, "dynamodb:putItem"),
        ({"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
          "Parameters": {"FunctionName": "arn:aws:lambda:us-east-1:1:function:x"}, "End": True}, "placeholder"),
    ],
)
def test_an_integration_the_stack_cannot_grant_is_refused_by_name(state, message):
    with pytest.raises(ValueError, match=message):
        asl_needs(_asl({"Odd state": state}))


def test_substitutions_cover_every_function_and_refuse_unknown_ones():
    arns = {s.name: f"arn:aws:lambda:us-east-1:123456789012:function:{s.name}" for s in FUNCTIONS}
    subs = substitutions(function_arns=arns, bucket_name="stepwise-bucket",
                         group_state_machine_arn="arn:aws:states:us-east-1:123456789012:stateMachine:g")
    assert placeholders() <= set(subs)
    assert used_substitutions(load_definition(), subs).keys() == placeholders()
    with pytest.raises(ValueError, match="missing"):
        substitutions(function_arns={k: v for k, v in arns.items() if k != "Init"}, bucket_name="b")
    with pytest.raises(ValueError, match="unknown"):
        substitutions(function_arns={**arns, "Nope": "x"}, bucket_name="b")
    with pytest.raises(ValueError, match="nobody defines"):
        used_substitutions('{"Resource": "${MysteryFunctionArn}"}', subs)
