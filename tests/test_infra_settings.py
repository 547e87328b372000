"""Context values the stack accepts, and the errors a wrong one gets."""

from __future__ import annotations

import pytest

from infra.settings import SettingsError, StackSettings

RUNTIME_A = "arn:aws:bedrock-agentcore:us-west-2:111122223333:runtime/agent_a-x1"
RUNTIME_B = "arn:aws:bedrock-agentcore:us-west-2:111122223333:runtime/agent_b-y2"


def settings(**context) -> StackSettings:
    return StackSettings.from_context(context.get)


def test_defaults_when_nothing_is_given():
    s = settings()
    assert s == StackSettings()
    assert s.agent_runtime_arns == () and s.bulk_retention_days == 30 and not s.destroy_on_delete


def test_arn_lists_accept_commas_json_and_lists_and_drop_duplicates():
    assert settings(agentRuntimeArns=f"{RUNTIME_A}, {RUNTIME_B},{RUNTIME_A}").agent_runtime_arns == (RUNTIME_A, RUNTIME_B)
    assert settings(agentRuntimeArns=f'["{RUNTIME_B}"]').agent_runtime_arns == (RUNTIME_B,)
    assert settings(agentRuntimeArns=[RUNTIME_A]).agent_runtime_arns == (RUNTIME_A,)


@pytest.mark.parametrize(
    "key, value, fragment",
    [
        ("agentRuntimeArns", "arn:aws:lambda:us-west-2:111122223333:function:x", "agentRuntimeArns"),
        ("sagemakerRoleArns", "my-role", "arn:aws:iam::ACCOUNT:role/NAME"),
        ("notificationTopicArn", "topic", "notificationTopicArn"),
        ("bulkRetentionDays", "0", "outside 1..3650"),
        ("stallMinutes", "soon", "not an integer"),
        ("rolloutFailureRateAlarm", "1.5", "outside (0, 1]"),
        ("destroyOnDelete", "maybe", "true/false"),
    ],
)
def test_malformed_values_are_refused_with_the_key_and_what_is_accepted(key, value, fragment):
    with pytest.raises(SettingsError, match=re_escape(fragment)):
        settings(**{key: value})


def test_numbers_and_flags_from_cli_strings():
    s = settings(bulkRetentionDays="7", stallMinutes="90", rolloutFailureRateAlarm="0.25", destroyOnDelete="true")
    assert (s.bulk_retention_days, s.stall_minutes, s.rollout_failure_rate, s.destroy_on_delete) == (7, 90, 0.25, True)


def re_escape(s: str) -> str:
    import re

    return re.escape(s)
