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
    from state_machine.definition import placeholders, render_definition

    template = _synth_template()
    deployed = synthesized_definition(template)
    tokens = synthesized_substitutions(template)

    with engine.MotoServer() as moto:
        arns = resources.create_functions(moto)
        local_subs = local_substitutions(arns, "stepwise-local-bucket")
        local = render_definition(local_subs)
        sm = resources.create_state_machine(moto, "definition-test", local)
        stored = moto.client("stepfunctions").describe_state_machine(stateMachineArn=sm)["definition"]

    assert stored == local  # moto runs exactly what we rendered
    used = placeholders()
    assert used <= set(tokens), f"placeholders the stack does not substitute: {sorted(used - set(tokens))}"
    # put the stack's tokens where the local values are: the documents must then be identical
    as_tokens = local
    for name in sorted(used, key=lambda n: -len(local_subs[n])):
        as_tokens = as_tokens.replace(f'"{local_subs[name]}"', f'"{tokens[name]}"')
    assert json.loads(as_tokens) == json.loads(deployed)
    assert as_tokens == deployed
