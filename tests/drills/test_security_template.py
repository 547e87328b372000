"""Security items that tests/infra/test_stack_template.py does not already pin: payload logging
is off by default (no execution data in the state machine's logs, no Lambda logs its event), and
no function's environment carries a credential. (Encryption, TLS-only, public access block, no
wildcard resource where a narrower one exists and cdk-nag are asserted there.)"""

from __future__ import annotations

import os
import re

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

from tests.support.stack import synthesized  # noqa: E402

SECRET_NAME = re.compile(r"(SECRET|PASSWORD|TOKEN|API_KEY|ACCESS_KEY|CREDENTIAL)", re.I)


@pytest.fixture(scope="module")
def template() -> dict:
    return synthesized()[1]


def _of_type(template: dict, type_: str) -> dict[str, dict]:
    return {k: v for k, v in template["Resources"].items() if v["Type"] == type_}


def test_the_state_machines_log_no_execution_data(template):
    machines = _of_type(template, "AWS::StepFunctions::StateMachine")
    assert len(machines) == 2  # the training loop and the rollout group (admission: group)
    for lid, machine in machines.items():
        # Inputs and outputs carry task tokens and rollout ids: they stay out of CloudWatch Logs.
        assert machine["Properties"]["LoggingConfiguration"]["IncludeExecutionData"] is False, lid


def test_no_function_logs_its_event_or_holds_a_credential(template):
    functions = _of_type(template, "AWS::Lambda::Function")
    assert functions
    for lid, fn in functions.items():
        env = (fn["Properties"].get("Environment") or {}).get("Variables", {})
        assert str(env.get("POWERTOOLS_LOGGER_LOG_EVENT", "false")).lower() == "false", lid
        assert env.get("POWERTOOLS_LOG_LEVEL", env.get("LOG_LEVEL", "INFO")) != "DEBUG", lid
        assert not [k for k in env if SECRET_NAME.search(k)], (lid, sorted(env))


def test_no_handler_asks_powertools_to_log_its_event():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "lambdas" / "stepwise"
    offenders = [str(p) for p in root.rglob("*.py") if "log_event=True" in p.read_text()]
    assert offenders == []
