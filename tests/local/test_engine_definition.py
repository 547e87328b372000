"""The local engine runs the very definition the stack deploys (tokens aside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local import engine, resources
from local.stack import local_substitutions

ROOT = Path(__file__).resolve().parents[2]


def _synth_template() -> dict:
    pytest.importorskip("aws_cdk")
    from tests.support.stack import synthesized

    return synthesized()[1]


def test_local_definition_equals_synthesized_one():
    from infra.definition import synthesized_definition, synthesized_substitutions
    from state_machine.definition import placeholders

    from local.stack import create_state_machines
    from state_machine.definition import load_group_definition

    template = _synth_template()
    with engine.MotoServer() as moto:
        arns = resources.create_functions(moto)
        sm, local, group_arn = create_state_machines(moto, arns, "stepwise-local-bucket", "definition-test")
        sfn = moto.client("stepfunctions")
        stored = sfn.describe_state_machine(stateMachineArn=sm)["definition"]
        local_group = sfn.describe_state_machine(stateMachineArn=group_arn)["definition"]

    assert stored == local  # moto runs exactly what we rendered
    # the training loop and the rollout group (admission: group), each as the stack deploys it
    for machine, text, rendered in (("training_loop", None, local),
                                    ("rollout_group", load_group_definition(), local_group)):
        deployed = synthesized_definition(template, machine)
        tokens = synthesized_substitutions(template, machine)
        local_subs = local_substitutions(arns, "stepwise-local-bucket", group_arn)
        used = placeholders(text)
        assert used <= set(tokens), f"placeholders the stack does not substitute: {sorted(used - set(tokens))}"
        # put the stack's tokens where the local values are: the documents must then be identical
        as_tokens = rendered
        for name in sorted(used, key=lambda n: -len(local_subs[n])):
            as_tokens = as_tokens.replace(f'"{local_subs[name]}"', f'"{tokens[name]}"')
        assert json.loads(as_tokens) == json.loads(deployed), machine
        assert as_tokens == deployed, machine
