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
        ("dataBuckets", "s3://my-datasets", "bucket names"),
        ("dataBuckets", "My_Bucket", "dataBuckets"),
        ("kmsKeyArn", "arn:aws:kms:us-west-2:111122223333:alias/mine", "arn:aws:kms:REGION:ACCOUNT:key/KEY_ID"),
        ("mlflowTrackingServerArns", "http://mlflow:5000", "mlflow-tracking-server/NAME"),
        ("gatewayReservedConcurrency", "0", "gatewayReservedConcurrency: 0 is outside"),
        ("wandbApiKeySecretArn", "arn:aws:secretsmanager:us-west-2:111122223333:secret:wandb", "the full ARN"),
        ("gatewayReservedConcurrency", "many", "not an integer"),
    ],
)
def test_malformed_values_are_refused_with_the_key_and_what_is_accepted(key, value, fragment):
    with pytest.raises(SettingsError, match=re_escape(fragment)):
        settings(**{key: value})


def test_numbers_and_flags_from_cli_strings():
    s = settings(bulkRetentionDays="7", stallMinutes="90", rolloutFailureRateAlarm="0.25", destroyOnDelete="true")
    assert (s.bulk_retention_days, s.stall_minutes, s.rollout_failure_rate, s.destroy_on_delete) == (7, 90, 0.25, True)


def test_data_buckets_kms_key_tracking_servers_and_gateway_concurrency():
    key = "arn:aws-cn:kms:cn-north-1:111122223333:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    server = "arn:aws:sagemaker:us-west-2:111122223333:mlflow-tracking-server/stepwise"
    s = settings(dataBuckets="my-datasets, my.outputs", kmsKeyArn=key, mlflowTrackingServerArns=[server],
                 gatewayReservedConcurrency="200")
    assert s.data_buckets == ("my-datasets", "my.outputs")
    assert (s.kms_key_arn, s.mlflow_tracking_server_arns, s.gateway_reserved_concurrency) == (key, (server,), 200)
    assert settings(dataBuckets='["a-bucket"]').data_buckets == ("a-bucket",)
    assert settings().gateway_reserved_concurrency is None and settings().data_buckets == ()


def test_every_context_key_is_documented_in_deploy_md_and_app_py():
    from pathlib import Path

    asked: list[str] = []
    StackSettings.from_context(lambda key: asked.append(key))
    root = Path(__file__).resolve().parents[2]
    table = {line.split("|")[1].strip().strip("`") for line in (root / "docs" / "deploy.md").read_text().splitlines()
             if line.startswith("| `")}
    app_doc = (root / "app.py").read_text().split('"""')[1]
    asked.append("stackName")  # read by app.py itself
    assert len(asked) >= 14
    assert [k for k in asked if k not in table] == []
    assert [k for k in asked if k not in app_doc] == []


def re_escape(s: str) -> str:
    import re

    return re.escape(s)


@pytest.mark.parametrize("key, value, fragment", [
    ("agentRuntimeArns", [RUNTIME_A + "\n"], "agentRuntimeArns"),  # '$' matched before a final newline
    ("agentRuntimeArns", '["' + RUNTIME_A + '\\n"]', "agentRuntimeArns"),
    ("sagemakerRoleArns", ["arn:aws:iam::\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669\u0660\u0661\u0662:role/R"],
     "sagemakerRoleArns"),  # '\d' matched any Unicode digit
    ("dataBuckets", ["my-datasets\n"], "dataBuckets"),
    ("kmsKeyArn", "arn:aws:kms:us-west-2:111122223333:key/abc\n", "kmsKeyArn"),
    ("agentRuntimeArns", '["arn:aws:bedrock', "agentRuntimeArns: not a JSON list"),
    ("stallMinutes", float("inf"), "stallMinutes"),
    ("gatewayReservedConcurrency", float("-inf"), "gatewayReservedConcurrency"),
    pytest.param("rolloutFailureRateAlarm", 10 ** 400, "rolloutFailureRateAlarm", id="rolloutFailureRateAlarm-huge-int"),
])
def test_hostile_context_values_are_settings_errors_not_tracebacks(key, value, fragment):
    with pytest.raises(SettingsError, match=re_escape(fragment)):
        settings(**{key: value})


def test_any_context_value_is_a_setting_or_a_settings_error():
    from hypothesis import given, settings as hsettings, strategies as st

    keys = ["agentRuntimeArns", "sagemakerRoleArns", "agentRoleArns", "notificationTopicArn", "bulkRetentionDays",
            "stallMinutes", "rolloutFailureRateAlarm", "logRetentionDays", "destroyOnDelete", "dataBuckets",
            "kmsKeyArn", "mlflowTrackingServerArns", "gatewayReservedConcurrency", "sessionStartTimeoutSeconds",
            "pollSeconds", "createSageMakerRole", "deployMathAgent"]
    values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20)
                          | st.sampled_from(["[", "[1", '["a"', "[[]]", "[{}]", RUNTIME_A + "\n", "1e999"]),
                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=2),
                          max_leaves=5)

    @hsettings(max_examples=300, deadline=None)
    @given(st.dictionaries(st.sampled_from(keys), values, max_size=4))
    def check(context):
        try:
            s = StackSettings.from_context(context.get)
        except SettingsError:
            return
        for arns in (s.agent_runtime_arns, s.sagemaker_role_arns, s.agent_role_arns, s.data_buckets,
                     s.mlflow_tracking_server_arns):
            assert all(a.isascii() and a.isprintable() and " " not in a for a in arns)

    check()


def test_first_run_options_and_the_loops_timing():
    s = settings(sessionStartTimeoutSeconds="3600", pollSeconds=30, createSageMakerRole="true", deployMathAgent=True)
    assert (s.session_start_timeout_seconds, s.poll_seconds, s.create_sagemaker_role, s.deploy_math_agent) == (
        3600, 30, True, True)
    assert s.function_environment() == {"STEPWISE_SESSION_START_TIMEOUT": "3600", "STEPWISE_POLL_SECONDS": "30"}
    off = settings()
    assert (off.create_sagemaker_role, off.deploy_math_agent, off.function_environment()) == (False, False, {})
    for key, value in (("sessionStartTimeoutSeconds", 59), ("sessionStartTimeoutSeconds", 86_401), ("pollSeconds", 0),
                       ("pollSeconds", "soon"), ("deployMathAgent", "maybe")):
        with pytest.raises(SettingsError, match=key):
            settings(**{key: value})
