"""The synthesized CDK stack: the resources the pipeline needs, wired as docs/architecture.md shows.

One synthesis per test session (``tests/support/stack.py``): the default app (with cdk-nag) and one with
every context value set, to check the scoped IAM.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

from aws_cdk import assertions  # noqa: E402

from infra.definition import synthesized_definition, synthesized_substitutions  # noqa: E402
from tests.support.stack import (  # noqa: E402
    ACCOUNT, AGENT_ROLE, DATA_BUCKETS, GATEWAY_CONCURRENCY, JUDGE_MODELS, KMS_KEY, MLFLOW_APP, MLFLOW_SERVER, REGION, RUNTIME,
    SCOPED_CONTEXT, SM_ROLE, WANDB_SECRET,
    TOPIC, resolve, synthesized,
)
from state_machine.definition import load_definition, placeholders, render_definition  # noqa: E402
from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION, by_name  # noqa: E402


@pytest.fixture(scope="module")
def default_app():
    return synthesized()


@pytest.fixture(scope="module")
def scoped_app():
    return synthesized(SCOPED_CONTEXT)


def resources(template: dict, type_: str) -> dict[str, dict]:
    return {lid: r for lid, r in template["Resources"].items() if r["Type"] == type_}


def the_state_machine(template: dict, start_at: str = "Initialize run") -> dict:
    """The training loop's properties (``start_at``: "Roll out the group" for the rollout group's)."""
    (machine,) = [m for m in resources(template, "AWS::StepFunctions::StateMachine").values()
                  if json.loads(m["Properties"]["DefinitionString"])["StartAt"] == start_at]
    return machine["Properties"]


def functions_by_command(template: dict) -> dict[str, tuple[str, dict]]:
    """Handler (image cmd) -> (logical id, properties) of every image function."""
    out = {}
    for lid, r in resources(template, "AWS::Lambda::Function").items():
        cmd = r["Properties"].get("ImageConfig", {}).get("Command")
        if cmd:
            out[cmd[0]] = (lid, r["Properties"])
    return out


def gateway_function(template: dict) -> tuple[str, dict]:
    (url,) = resources(template, "AWS::Lambda::Url").values()
    lid = url["Properties"]["TargetFunctionArn"]["Fn::GetAtt"][0]
    return lid, template["Resources"][lid]["Properties"]


def statements_of_role(template: dict, role_lid: str) -> list[dict]:
    out = []
    for r in resources(template, "AWS::IAM::Policy").values():
        if {"Ref": role_lid} in r["Properties"].get("Roles", []):
            out.extend(r["Properties"]["PolicyDocument"]["Statement"])
    return out


def actions_of(statements: list[dict]) -> set[str]:
    acts = set()
    for s in statements:
        a = s["Action"]
        acts.update([a] if isinstance(a, str) else a)
    return acts


def role_of(props: dict) -> str:
    return props["Role"]["Fn::GetAtt"][0]


# --- the state machine ----------------------------------------------------------------


def test_deployed_definition_is_the_asl_file_verbatim(default_app):
    _, template = default_app
    machine = the_state_machine(template)
    assert machine["DefinitionString"] == load_definition()
    assert machine["StateMachineType"] == "STANDARD"
    assert set(machine["DefinitionSubstitutions"]) == placeholders()


def test_local_rendering_equals_the_synthesized_definition(default_app):
    """What the local stack does (render_definition with the same keys) gives the deployed text."""
    _, template = default_app
    subs = synthesized_substitutions(template)
    assert render_definition(subs) == synthesized_definition(template)
    assert "${" not in synthesized_definition(template)


def test_distributed_map_runs_standard_child_executions(default_app):
    _, template = default_app
    asl = json.loads(the_state_machine(template)["DefinitionString"])
    maps = [s for s in asl["States"].values() if s["Type"] == "Map"]
    assert any(m["ItemProcessor"]["ProcessorConfig"] == {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"} for m in maps)


def test_state_machine_logs_everything_and_traces(default_app):
    _, template = default_app
    machine = the_state_machine(template)
    assert machine["LoggingConfiguration"]["Level"] == "ALL"
    assert machine["TracingConfiguration"] == {"Enabled": True}


def test_each_placeholder_names_the_function_with_that_handler(default_app):
    _, template = default_app
    by_cmd = functions_by_command(template)
    subs = the_state_machine(template)["DefinitionSubstitutions"]
    for spec in FUNCTIONS:
        key = f"{spec.name}FunctionArn"
        if key in subs:
            assert subs[key] == {"Fn::GetAtt": [by_cmd[spec.handler][0], "Arn"]}, spec.name
    assert subs["BucketName"] == {"Ref": _bucket_lid(template)}


def test_state_machine_may_start_and_stop_its_own_children_and_read_items(default_app):
    _, template = default_app
    role_lid = the_state_machine(template)["RoleArn"]["Fn::GetAtt"][0]
    stmts = statements_of_role(template, role_lid)
    acts = actions_of(stmts)
    assert {"states:StartExecution", "states:DescribeExecution", "states:StopExecution", "states:RedriveExecution",
            "s3:GetObject", "lambda:InvokeFunction"} <= acts
    start = [s for s in stmts if "states:StartExecution" in actions_of([s])]
    assert all(s["Resource"] == {"Ref": "TrainingLoopStateMachine3DB5DC99"} or "TrainingLoopStateMachine" in json.dumps(s["Resource"])
               for s in start)
    invoked = {json.dumps(r) for s in stmts if "lambda:InvokeFunction" in actions_of([s]) for r in _as_list(s["Resource"])}
    by_cmd = functions_by_command(template)
    for spec in FUNCTIONS:
        if f"{spec.name}FunctionArn" in placeholders():
            assert json.dumps({"Fn::GetAtt": [by_cmd[spec.handler][0], "Arn"]}) in invoked, spec.name


# --- functions ------------------------------------------------------------------------


def test_every_registered_function_exists_with_its_handler_memory_and_timeout(default_app):
    _, template = default_app
    by_cmd = functions_by_command(template)
    for spec in FUNCTIONS:
        assert spec.handler in by_cmd, f"no image function runs {spec.handler}"
        _, props = by_cmd[spec.handler]
        assert props["PackageType"] == "Image"
        assert props["MemorySize"] == spec.memory_mb and props["Timeout"] == spec.timeout_s, spec.name
        assert props["EphemeralStorage"] == {"Size": spec.ephemeral_mb}, spec.name
        env = props["Environment"]["Variables"]
        assert env["STEPWISE_BUCKET"] == {"Ref": _bucket_lid(template)}
        assert env["POWERTOOLS_METRICS_NAMESPACE"] == "Stepwise"
        assert "FunctionUrl" in json.dumps(env["STEPWISE_GATEWAY_URL"])
        assert props["TracingConfig"] == {"Mode": "Active"}


def test_every_function_is_granted_more_than_its_logs_and_the_run_state(scoped_app):
    """A function added to the registry gets its grants in ``StepwiseStack._grant`` explicitly, not only
    the run state every handler has (with every context value set, each function has one)."""
    _, template = scoped_app
    bucket = {"Fn::GetAtt": [_bucket_lid(template), "Arn"]}
    run_state = [bucket] + [{"Fn::Join": ["", [bucket, f"/{prefix}*"]]} for prefix in ("runs/", "datasets/")]

    def beyond_logs_and_run_state(st: dict) -> bool:
        actions = [st["Action"]] if isinstance(st["Action"], str) else st["Action"]
        resources = st["Resource"] if isinstance(st["Resource"], list) else [st["Resource"]]
        if all(a.startswith(("logs:", "xray:")) for a in actions):
            return False
        return not (all(a.startswith("s3:") for a in actions) and all(r in run_state for r in resources))

    by_function = _role_statements_by_function(template)
    assert set(by_function) == {s.name for s in FUNCTIONS} | {GATEWAY_FUNCTION.name}
    # ComputeAdvantages and RecordEval read rollout records and write datums and summaries, all under
    # runs/: their summaries reach MLflow and W&B through Track, so they need nothing more.
    run_state_only = {"ComputeAdvantages", "RecordEval"}
    missing = [name for name, sts in by_function.items()
               if not any(map(beyond_logs_and_run_state, sts)) and name not in run_state_only]
    assert not missing, f"{missing} hold only their logs and the run state: grant them what they call in StepwiseStack._grant"


def test_gateway_has_a_public_streaming_function_url(default_app):
    _, template = default_app
    (url,) = resources(template, "AWS::Lambda::Url").values()
    assert url["Properties"]["AuthType"] == "NONE"
    assert url["Properties"]["InvokeMode"] == "RESPONSE_STREAM"
    _, props = gateway_function(template)
    env = props["Environment"]["Variables"]
    assert env["AWS_LWA_INVOKE_MODE"] == "response_stream"
    assert props["MemorySize"] == GATEWAY_FUNCTION.memory_mb
    assert template["Outputs"]["GatewayUrl"]["Value"]["Fn::GetAtt"][1] == "FunctionUrl"


def test_agent_results_notify_on_rollout_result_and_summaries_notify_track(default_app):
    _, template = default_app
    (notif,) = resources(template, "Custom::S3BucketNotifications").values()
    cfg, summaries = notif["Properties"]["NotificationConfiguration"]["LambdaFunctionConfigurations"]
    assert cfg["Events"] == summaries["Events"] == ["s3:ObjectCreated:*"]
    assert cfg["Filter"]["Key"]["FilterRules"] == [{"Name": "prefix", "Value": "rollout-results/"}]
    by_cmd = functions_by_command(template)
    on_result = by_cmd[_spec("OnRolloutResult").handler][0]
    assert cfg["LambdaFunctionArn"] == {"Fn::GetAtt": [on_result, "Arn"]}
    # every step, eval and run summary, and nothing else the run writes, runs Track (off the loop)
    rules = {r["Name"].lower(): r["Value"] for r in summaries["Filter"]["Key"]["FilterRules"]}
    assert rules == {"prefix": "runs/", "suffix": "summary.json"}
    assert summaries["LambdaFunctionArn"] == {"Fn::GetAtt": [by_cmd[_spec("Track").handler][0], "Arn"]}
    from stepwise import layout

    def notified(key):
        return key.startswith(rules["prefix"]) and key.endswith(rules["suffix"])

    assert all(notified(k) for k in (layout.summary_key("r", 3), layout.eval_summary_key("r", 0), layout.run_summary_key("r")))
    assert not any(notified(k) for k in (layout.report_key("r"), layout.report_table_key("r", "train", 3),
                                         layout.state_key("r"), layout.rollout_key("r", 3, 0, "sid")))


def test_abnormal_execution_ends_run_cleanup(default_app):
    _, template = default_app
    rules = [r["Properties"] for r in resources(template, "AWS::Events::Rule").values() if "EventPattern" in r["Properties"]]
    (rule,) = [r for r in rules if set(r["EventPattern"]["detail"]["status"]) == {"ABORTED", "TIMED_OUT", "FAILED"}]
    assert rule["EventPattern"]["source"] == ["aws.states"]
    assert rule["EventPattern"]["detail-type"] == ["Step Functions Execution Status Change"]
    assert rule["EventPattern"]["detail"]["stateMachineArn"] == [{"Ref": _sm_lid(template)}]
    cleanup = functions_by_command(template)[_spec("Cleanup").handler][0]
    assert [t["Arn"] for t in rule["Targets"]] == [{"Fn::GetAtt": [cleanup, "Arn"]}]


def test_a_schedule_runs_the_session_sweeper_with_what_it_needs(default_app, scoped_app):
    """EventBridge's execution events are best-effort: a rule on a schedule (``sweepMinutes``, default 5)
    runs SweepSessions, which may list sessions, describe and stop this stack's, and read executions."""
    for app, topic in ((default_app, None), (scoped_app, TOPIC)):
        _, template = app
        rules = [r["Properties"] for r in resources(template, "AWS::Events::Rule").values()
                 if "ScheduleExpression" in r["Properties"]]
        sweeper_lid, props = functions_by_command(template)[_spec("SweepSessions").handler]
        (rule,) = rules
        assert rule["ScheduleExpression"] == "rate(5 minutes)" and rule.get("State", "ENABLED") == "ENABLED"
        assert [t["Arn"] for t in rule["Targets"]] == [{"Fn::GetAtt": [sweeper_lid, "Arn"]}]
        statements = statements_of_role(template, role_of(props))
        assert {"sagemaker:ListTrainingSessions", "sagemaker:DescribeTrainingSession", "sagemaker:StopTrainingSession",
                "states:DescribeExecution", "s3:GetObject", "s3:PutObject", "s3:ListBucket"} <= actions_of(statements)
        stop = [st for st in statements if "sagemaker:StopTrainingSession" in json.dumps(st["Action"])]
        assert all("training-session/stepwise-*" in json.dumps(st["Resource"]) for st in stop)
        env = props["Environment"]["Variables"]
        if topic:
            assert env["STEPWISE_NOTIFICATION_TOPIC_ARN"] == topic
            assert any(st["Action"] == "sns:Publish" and st["Resource"] == topic for st in statements)
        else:
            assert "STEPWISE_NOTIFICATION_TOPIC_ARN" not in env and "sns:Publish" not in actions_of(statements)


# --- storage --------------------------------------------------------------------------


def test_bucket_is_encrypted_private_tls_only_and_expires_bulky_data(default_app):
    _, template = default_app
    props = template["Resources"][_bucket_lid(template)]["Properties"]
    assert props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0]["ServerSideEncryptionByDefault"]["SSEAlgorithm"] == "AES256"
    assert all(props["PublicAccessBlockConfiguration"][k] for k in
               ("BlockPublicAcls", "BlockPublicPolicy", "IgnorePublicAcls", "RestrictPublicBuckets"))
    assert "LoggingConfiguration" in props
    rules = {r["Id"]: r for r in props["LifecycleConfiguration"]["Rules"]}
    assert rules["expire-bulky-step-data"]["TagFilters"] == [{"Key": "stepwise-class", "Value": "bulk"}]
    assert rules["expire-bulky-step-data"]["ExpirationInDays"] == 30
    assert rules["expire-agent-results"]["Prefix"] == "rollout-results/"
    assert rules["expire-map-results"]["Prefix"] == "map-results/"
    policies = [r["Properties"] for r in resources(template, "AWS::S3::BucketPolicy").values()
                if r["Properties"]["Bucket"] == {"Ref": _bucket_lid(template)}]
    denies = [s for p in policies for s in p["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
    assert any(s["Condition"] == {"Bool": {"aws:SecureTransport": "false"}} for s in denies)


# --- IAM ------------------------------------------------------------------------------

#: Actions that support no resource-level permissions, so '*' is the narrowest resource.
NO_RESOURCE_LEVEL = {
    "xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets",
    "logs:CreateLogDelivery", "logs:GetLogDelivery", "logs:UpdateLogDelivery", "logs:DeleteLogDelivery",
    "logs:ListLogDeliveries", "logs:PutResourcePolicy", "logs:DescribeResourcePolicies", "logs:DescribeLogGroups",
    "s3:PutBucketNotification",  # CDK's notification custom resource (its bucket is only known at run time)
    "s3:ListAllMyBuckets",  # Init: the SageMaker SDK's default-bucket lookup
    "sagemaker:ListTrainingSessions",  # SweepSessions: a List action names no resource type (as ListTrainingJobs)
    # OnRolloutResult: the task token is the authorization (tests/infra/test_stack_validators.py checks all of
    # these against the Service Authorization Reference's data)
    "states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat",
}


def test_no_wildcard_resource_where_a_narrower_one_exists(default_app):
    _, template = default_app
    offenders = []
    for lid, r in resources(template, "AWS::IAM::Policy").items():
        for s in r["Properties"]["PolicyDocument"]["Statement"]:
            if s["Effect"] == "Allow" and "*" in _as_list(s["Resource"]):
                extra = actions_of([s]) - NO_RESOURCE_LEVEL
                if extra:
                    offenders.append((lid, sorted(extra)))
            for a in actions_of([s]):
                if a.endswith(":*") or a == "*":
                    offenders.append((lid, a))
    assert not offenders


def test_only_start_rollout_invokes_agents_and_only_init_passes_roles(default_app):
    _, template = default_app
    holders: dict[str, set[str]] = {}
    for handler, (lid, props) in functions_by_command(template).items():
        holders[handler] = actions_of(statements_of_role(template, role_of(props)))
    invokers = {h for h, a in holders.items() if "bedrock-agentcore:InvokeAgentRuntime" in a}
    passers = {h for h, a in holders.items() if "iam:PassRole" in a}
    creators = {h for h, a in holders.items() if "sagemaker:CreateTrainingSession" in a}
    responders = {h for h, a in holders.items() if "states:SendTaskSuccess" in a}
    assert invokers == {_spec("StartRollout").handler}
    assert passers == creators == {_spec("Init").handler}
    assert responders == {_spec(n).handler for n in ("OnRolloutResult", "AwaitGroups", "RecordGroupComplete")}
    _, gw = gateway_function(template)
    gw_actions = actions_of(statements_of_role(template, role_of(gw)))
    assert {"sagemaker:ExecuteSamplingOperation", "sagemaker:GetSamplingOperationResult"} <= gw_actions
    assert not {a for a in gw_actions if a.startswith("sagemaker:") and "Sampling" not in a}


def test_pass_role_only_to_sagemaker(default_app):
    _, template = default_app
    stmts = [s for r in resources(template, "AWS::IAM::Policy").values() for s in r["Properties"]["PolicyDocument"]["Statement"]
             if "iam:PassRole" in actions_of([s])]
    assert stmts and all(s["Condition"] == {"StringEquals": {"iam:PassedToService": "sagemaker.amazonaws.com"}} for s in stmts)


def test_context_values_scope_agent_invoke_and_pass_role(scoped_app):
    _, template = scoped_app
    stmts = [s for r in resources(template, "AWS::IAM::Policy").values() for s in r["Properties"]["PolicyDocument"]["Statement"]]
    invoke = [s for s in stmts if "bedrock-agentcore:InvokeAgentRuntime" in actions_of([s])]
    # the allow-list, and the example math agent's runtime the stack creates (deployMathAgent) joins it
    agent = resolve({"Fn::GetAtt": [_only(template, "AWS::BedrockAgentCore::Runtime"), "AgentRuntimeArn"]}, template)
    assert [sorted(resolve(_as_list(s["Resource"]), template)) for s in invoke] == [
        sorted([RUNTIME, f"{RUNTIME}/runtime-endpoint/*", agent, f"{agent}/runtime-endpoint/*"])]
    pass_role = [s for s in stmts if "iam:PassRole" in actions_of([s])]
    # the listed role, and the sessions' role the stack creates (createSageMakerRole)
    created = resolve({"Fn::GetAtt": [_only(template, "AWS::IAM::Role", "SageMakerSessionRole"), "Arn"]}, template)
    assert [resolve(s["Resource"], template) for s in pass_role] == [[SM_ROLE, created]]
    bucket_stmts = [s for r in resources(template, "AWS::S3::BucketPolicy").values()
                    for s in r["Properties"]["PolicyDocument"]["Statement"]]
    agent_put = [s for s in bucket_stmts if s.get("Principal") == {"AWS": AGENT_ROLE}]
    assert agent_put and agent_put[0]["Action"] == "s3:PutObject"
    assert "rollout-results/*" in json.dumps(agent_put[0]["Resource"])


def _only(template: dict, kind: str, prefix: str = "") -> str:
    """The logical id of the one resource of ``kind`` (whose id starts with ``prefix``)."""
    (lid,) = [lid for lid in resources(template, kind) if lid.startswith(prefix)]
    return lid


def _notify_rule(template: dict) -> dict:
    rules = [r["Properties"] for r in resources(template, "AWS::Events::Rule").values()
             if any(t["Arn"] == TOPIC for t in r["Properties"].get("Targets", []))]
    assert len(rules) == 1
    return rules[0]


def test_topic_hears_run_ends_and_alarms(scoped_app):
    _, template = scoped_app
    notify = _notify_rule(template)
    statuses = {s for branch in notify["EventPattern"]["detail"]["$or"] for s in branch["status"]}
    assert statuses == {"SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED"}
    alarms = resources(template, "AWS::CloudWatch::Alarm").values()
    assert alarms and all(a["Properties"]["AlarmActions"] == [TOPIC] for a in alarms)


def test_the_run_end_notification_leaves_continue_as_new_hand_overs_out(scoped_app):
    """A hand-over ends SUCCEEDED too, with ``{"handed_over_to": ...}`` as its output (the ASL's
    "Handed over to the next execution"): the rule's pattern, matched by moto's EventBridge pattern
    matcher on the events a run's executions send, announces the run's end once, and every failure."""
    from moto.events.models import EventPattern

    from state_machine.definition import load_asl
    from stepwise.executions import HANDED_OVER_KEY

    _, template = scoped_app
    pattern = json.loads(json.dumps(_notify_rule(template)["EventPattern"]).replace(
        json.dumps({"Ref": _sm_lid(template)}), json.dumps("arn:sm")))
    handover = load_asl()["States"]["Handed over to the next execution"]
    assert handover["Type"] == "Pass" and handover.get("End") and HANDED_OVER_KEY + ".$" in handover["Parameters"]

    def event(status: str, output: dict | None, sm: str = "arn:sm") -> dict:
        return {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
                "detail": {"executionArn": "arn:x", "stateMachineArn": sm, "status": status, "name": "run",
                           "input": "{}", "output": None if output is None else json.dumps(output)}}

    handed = {HANDED_OVER_KEY: "arn:aws:states:us-west-2:111122223333:execution:sm:run--1", "run": {"run_id": "run"}}
    finished = {"run": {"run_id": "run"}, "stopped": {"stopped": True, "checkpoints": []}}
    matcher = EventPattern(None, pattern)
    assert not matcher.matches_event(event("SUCCEEDED", handed))
    assert matcher.matches_event(event("SUCCEEDED", finished))
    for status in ("FAILED", "TIMED_OUT", "ABORTED"):
        assert matcher.matches_event(event(status, None)), status
    assert not matcher.matches_event(event("FAILED", None, sm="arn:another-state-machine"))
    assert not matcher.matches_event(event("RUNNING", None))


def _role_statements_by_function(template: dict) -> dict[str, list[dict]]:
    by_cmd = functions_by_command(template)
    out = {spec.name: statements_of_role(template, role_of(by_cmd[spec.handler][1])) for spec in FUNCTIONS}
    out[GATEWAY_FUNCTION.name] = statements_of_role(template, role_of(gateway_function(template)[1]))
    return out


def test_task_token_responses_are_granted_on_star_as_documented(default_app):
    """SendTask* take no resource-level permission (Service Authorization Reference): a grant naming the
    state machine would deny the tokens of Distributed Map child executions. OnRolloutResult resumes the
    task; the gateway only heartbeats it."""
    _, template = default_app
    holders = {}
    for name, stmts in _role_statements_by_function(template).items():
        for st in stmts:
            if {"states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"} & actions_of([st]):
                holders.setdefault(name, []).append(st)
    # the group engine's AwaitGroups and RecordGroupComplete resume the trainer's wait for a batch of groups
    assert set(holders) == {"OnRolloutResult", "Gateway", "AwaitGroups", "RecordGroupComplete"}
    for name in ("OnRolloutResult", "AwaitGroups", "RecordGroupComplete"):
        (st,) = holders[name]  # minimizePolicies merges it with X-Ray's '*' statement
        assert {"states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat"} <= actions_of([st])
        assert st["Resource"] == "*" and st["Effect"] == "Allow"
    # the gateway heartbeats a rollout's task on its agent's LLM calls: the heartbeat only, never a result
    (st,) = holders["Gateway"]
    assert {a for a in actions_of([st]) if a.startswith("states:")} == {"states:SendTaskHeartbeat"}
    assert st["Resource"] == "*" and st["Effect"] == "Allow"


def test_a_kms_key_grants_init_what_create_training_session_needs_only_via_sagemaker(default_app, scoped_app):
    from infra.permissions import KMS_SESSION_ACTIONS

    kms = {n: [s for s in stmts if any(a.startswith("kms:") for a in actions_of([s]))]
           for n, stmts in _role_statements_by_function(scoped_app[1]).items()}
    assert {n for n, v in kms.items() if v} == {"Init"}
    (st,) = kms["Init"]
    assert actions_of([st]) == set(KMS_SESSION_ACTIONS) >= {"kms:CreateGrant", "kms:GenerateDataKey", "kms:Decrypt"}
    assert st["Resource"] == KMS_KEY
    via = st["Condition"]["StringEquals"]["kms:ViaService"]
    assert json.dumps(via).count("AWS::Region") == 1 and "AWS::URLSuffix" in json.dumps(via)
    assert not [s for stmts in _role_statements_by_function(default_app[1]).values() for s in stmts
                if any(a.startswith("kms:") for a in actions_of([s]))]


def test_a_tracking_server_is_granted_to_every_function_that_logs(default_app, scoped_app):
    """Tracking servers by the ``sagemaker-mlflow`` actions MLflow's client calls, MLflow apps by
    ``sagemaker:CallMlflowAppApi`` on the app (its calls are signed as ``sagemaker``): every function
    that logs gets both, through the one grant (`infra.permissions.TrackingServers.grant_tracking`)."""
    from infra.permissions import MLFLOW_ACTIONS, MLFLOW_APP_ACTIONS

    by_function = _role_statements_by_function(scoped_app[1])
    granted = {n: [s for s in stmts if any(a.startswith("sagemaker-mlflow:") for a in actions_of([s]))]
               for n, stmts in by_function.items()}
    apps = {n: [s for s in stmts if "sagemaker:CallMlflowAppApi" in actions_of([s])] for n, stmts in by_function.items()}
    # Track logs every summary and ends the runs (beside the loop); no function of the loop logs
    loggers = {"Track"}
    assert {n for n, v in granted.items() if v} == loggers == {n for n, v in apps.items() if v}
    for name in loggers:
        for st in granted[name]:
            assert actions_of([st]) == set(MLFLOW_ACTIONS) and st["Resource"] == MLFLOW_SERVER, name
        for st in apps[name]:
            assert actions_of([st]) == set(MLFLOW_APP_ACTIONS) and st["Resource"] == MLFLOW_APP, name
    assert "sagemaker-mlflow" not in json.dumps(default_app[1]) and "CallMlflowAppApi" not in json.dumps(default_app[1])


def test_the_wandb_key_secret_is_readable_by_track_alone(default_app, scoped_app):
    from stepwise.settings import ENV_WANDB_API_KEY_SECRET
    from tests.support.stack import WANDB_SECRET

    granted = {n: [s for s in stmts if "secretsmanager:GetSecretValue" in actions_of([s])]
               for n, stmts in _role_statements_by_function(scoped_app[1]).items()}
    assert {n for n, v in granted.items() if v} == {"Track"}
    (st,) = granted["Track"]
    assert actions_of([st]) == {"secretsmanager:GetSecretValue"} and st["Resource"] == WANDB_SECRET
    for _, props in functions_by_command(scoped_app[1]).values():
        assert props["Environment"]["Variables"][ENV_WANDB_API_KEY_SECRET] == WANDB_SECRET
    assert "secretsmanager" not in json.dumps(default_app[1])


def test_data_buckets_are_granted_and_named_in_the_environment(default_app, scoped_app):
    from stepwise.settings import ENV_AGENT_RUNTIME_ARNS, ENV_DATA_BUCKETS

    stmts = _role_statements_by_function(scoped_app[1])
    objects = {json.dumps(r) for st in stmts["Init"] if {"s3:GetObject", "s3:PutObject"} <= actions_of([st])
               for r in _as_list(st["Resource"])}
    for b in DATA_BUCKETS:
        assert json.dumps({"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":s3:::{b}/*"]]}) in objects
    plan = {json.dumps(r) for st in stmts["PlanStep"] if "s3:GetObject" in actions_of([st]) for r in _as_list(st["Resource"])}
    assert all(any(f":s3:::{b}/*" in r for r in plan) for b in DATA_BUCKETS)
    assert not [st for st in stmts["PlanStep"] if "s3:PutObject" in actions_of([st])
                and any(b in json.dumps(st["Resource"]) for b in DATA_BUCKETS)]
    for template, buckets, runtimes in ((scoped_app[1], ",".join(DATA_BUCKETS), RUNTIME), (default_app[1], "", "")):
        for _, props in functions_by_command(template).values():
            env = props["Environment"]["Variables"]
            assert (env[ENV_DATA_BUCKETS], resolve(env[ENV_AGENT_RUNTIME_ARNS], template).split(",")[0]) == (
                buckets, runtimes)


def test_no_arn_has_a_literal_partition(default_app, scoped_app):
    """cdk.json targets aws and aws-cn: every ARN the stack builds uses AWS::Partition."""
    for _, template in (default_app, scoped_app):
        text = json.dumps({k: v for k, v in template.items()})
        literal = {a.replace(',"', '"') for a in re.findall(r'"arn:aws[a-z\-]*:[^"]*"', text)}  # "A,": a joined list
        # the only literal ARNs are the context values this test gave (the user's own resources)
        assert literal <= {json.dumps(a) for a in (RUNTIME, f"{RUNTIME}/runtime-endpoint/*", SM_ROLE, AGENT_ROLE, TOPIC,
                                                    KMS_KEY, MLFLOW_SERVER, MLFLOW_APP, WANDB_SECRET)}, literal
    assert "arn:aws" not in json.dumps(default_app[1])


def test_gateway_reserved_concurrency_is_a_stack_option(default_app, scoped_app):
    assert "ReservedConcurrentExecutions" not in gateway_function(default_app[1])[1]
    assert gateway_function(scoped_app[1])[1]["ReservedConcurrentExecutions"] == GATEWAY_CONCURRENCY
    # Init refuses a group-engine run whose rollouts in flight the reservation cannot serve (stepwise.core.preflight)
    _, init = functions_by_command(scoped_app[1])[_spec("Init").handler]
    assert init["Environment"]["Variables"]["STEPWISE_GATEWAY_CONCURRENCY"] == str(GATEWAY_CONCURRENCY)
    _, init = functions_by_command(default_app[1])[_spec("Init").handler]
    assert "STEPWISE_GATEWAY_CONCURRENCY" not in init["Environment"]["Variables"]


def test_context_arns_pin_the_deploy_region(scoped_app, monkeypatch):
    from app import build_app
    from infra.settings import SettingsError

    rule = scoped_app[1]["Rules"]["DeployRegionMatchesContextArns"]
    (assertion,) = rule["Assertions"]
    assert assertion["Assert"] == {"Fn::Equals": [{"Ref": "AWS::Region"}, REGION]}
    assert REGION in assertion["AssertDescription"]
    monkeypatch.setenv("CDK_DEFAULT_ACCOUNT", "111122223333")
    monkeypatch.setenv("CDK_DEFAULT_REGION", "eu-west-1")
    with pytest.raises(SettingsError, match="name region us-west-2 but the stack deploys to eu-west-1"):
        build_app({"agentRuntimeArns": RUNTIME})
    with pytest.raises(SettingsError, match="several regions"):
        build_app({"agentRuntimeArns": RUNTIME, "kmsKeyArn": KMS_KEY.replace(REGION, "eu-west-1")})


# --- nag, monitoring, outputs ---------------------------------------------------------


@pytest.mark.parametrize("app", ["default_app", "scoped_app"])
def test_cdk_nag_reports_no_unsuppressed_error_and_every_suppression_has_a_reason(app, request):
    """Both templates: the scoped one sets every context value, the first-run resources included (the fresh-clone
    walk's `cdk synth -c createSageMakerRole=true ...` found the session role's wildcards unsuppressed)."""
    stack, template = request.getfixturevalue(app)
    errors = assertions.Annotations.from_stack(stack).find_error("*", assertions.Match.string_like_regexp("AwsSolutions-.*"))
    assert [(e.id, str(e.entry.data)[:200]) for e in errors] == []
    reasons = [s["reason"] for r in template["Resources"].values()
               for s in r.get("Metadata", {}).get("cdk_nag", {}).get("rules_to_suppress", [])]
    assert reasons and all(len(reason) >= 30 for reason in reasons)


def test_dashboard_shows_training_gateway_and_sagemaker_metrics(default_app):
    _, template = default_app
    (dash,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dash["Properties"]["DashboardBody"])
    for needle in ("sampler/mean_reward", "eval/accuracy", "sampler/num_datums", "time/rollout", "time/train",
                   "sampler/zeroed_rollouts", "rollouts/failed", "UrlRequestLatency", "Url4xxCount", "Url5xxCount"):
        assert needle in body, needle


def test_dashboard_graphs_every_behaviour_metric_the_handlers_emit(default_app):
    from stepwise.core.behaviour import behaviour_metrics
    from stepwise.core.rewards import reward_metrics

    _, template = default_app
    (dash,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dash["Properties"]["DashboardBody"])
    emitted = set(behaviour_metrics([{"status": "ok", "num_turns": 1, "duration_s": 1.0}]))
    emitted |= {k for k in reward_metrics([1.0]) if k.endswith(("_min", "_max"))}
    emitted.add("advantages/zero_groups_fraction")  # core.advantages.advantage_metrics
    assert len(emitted) == 13 and [name for name in sorted(emitted) if name not in body] == []


def test_dashboard_graphs_the_staleness_and_session_time_the_handlers_emit(default_app):
    from stepwise.core.staleness import session_time_metrics, staleness_metrics

    _, template = default_app
    (dash,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dash["Properties"]["DashboardBody"])
    emitted = set(staleness_metrics([3, 2], 3)) | set(session_time_metrics(train_started_at=1.0, rebound_at=2.0,
                                                                              previous_end=0.0))
    graphed = {name for name in emitted if name in body}
    assert graphed == {"staleness/mean", "staleness/max", "time/session_busy", "time/session_idle",
                       "session/busy_fraction"}, graphed
    for name in ("time/trainer_wait_data", "time/trainer_wait_stale", "staleness/past_k", "rollouts/discarded"):
        assert name in body, name  # deep asynchrony (admission group)


def test_dashboard_graphs_the_cost_ledger_the_handlers_emit(default_app):
    from stepwise.core import ledger
    from tests.support.planning import cfg, state

    _, template = default_app
    (dash,) = resources(template, "AWS::CloudWatch::Dashboard").values()
    body = json.dumps(dash["Properties"]["DashboardBody"])
    s = state(session_created_at=1.0)
    emitted = set(ledger.close_step(s, cfg(session_usd_per_hour=1.0), 10.0, 0))
    graphed = {name for name in emitted if name in body}
    assert graphed == {"cost/total_usd", "cost/session_hours", "cost/session_usd", "cost/agent_usd", "cost/lambda_usd",
                       "cost/step_functions_usd", "cost/s3_usd"}, graphed


def test_alarms_for_stalled_runs_and_rollout_failures(default_app):
    _, template = default_app
    alarms = [a["Properties"] for a in resources(template, "AWS::CloudWatch::Alarm").values()]
    assert len(alarms) == 2
    by_expr = {m["Expression"]: a for a in alarms for m in a["Metrics"] if m.get("ReturnData", True) and "Expression" in m}
    stalled = next(a for e, a in by_expr.items() if e.startswith("IF(") and "steps" in e)
    submit = functions_by_command(template)[_spec("SubmitTrain").handler][0]
    assert submit in json.dumps(stalled["Metrics"]) and stalled["Threshold"] == 1
    failing = next(a for e, a in by_expr.items() if "failed" in e and "finished" in e)
    assert failing["Threshold"] == 0.5
    assert "rollouts/failed" in json.dumps(failing["Metrics"])
    filters = {f["Properties"]["MetricTransformations"][0]["MetricName"]: f["Properties"]
               for f in resources(template, "AWS::Logs::MetricFilter").values()}
    assert set(filters) == {"rollouts/failed", "sessions/swept"}
    logs_of = lambda name: functions_by_command(template)[_spec(name).handler][1]["LoggingConfig"]["LogGroup"]  # noqa: E731
    assert filters["rollouts/failed"]["LogGroupName"] == logs_of("FinishRollout")
    assert filters["sessions/swept"]["LogGroupName"] == logs_of("SweepSessions")
    assert '"training session swept"' in filters["sessions/swept"]["FilterPattern"]


def test_swept_sessions_filter_matches_what_the_sweeper_logs():
    from infra.monitoring import SWEPT_SESSION_MESSAGE
    from stepwise.handlers.sweeper import SWEPT_MESSAGE

    assert SWEPT_SESSION_MESSAGE == SWEPT_MESSAGE


def test_failed_rollout_filter_matches_what_finish_rollout_logs():
    """The metric filter counts FinishRollout's warnings; pin them to the handler's source."""
    from pathlib import Path

    from infra.monitoring import FAILED_ROLLOUT_MESSAGES

    source = (Path(__file__).resolve().parents[2] / "lambdas/stepwise/handlers/rollout.py").read_text()
    for pattern in FAILED_ROLLOUT_MESSAGES:
        assert f'logger.warning("{pattern.rstrip("*")}' in source, pattern


def test_outputs_are_the_ones_the_cli_looks_up(default_app):
    from stepwise import stackinfo

    stack, template = default_app
    assert set(template["Outputs"]) >= {stackinfo.OUTPUT_BUCKET, stackinfo.OUTPUT_STATE_MACHINE,
                                        stackinfo.OUTPUT_GATEWAY_URL, stackinfo.OUTPUT_DASHBOARD}
    assert stack.stack_name == stackinfo.DEFAULT_STACK_NAME
    assert template["Outputs"]["StateMachineArn"]["Value"] == {"Ref": _sm_lid(template)}


# --- helpers --------------------------------------------------------------------------


def _as_list(x: Any) -> list:
    return x if isinstance(x, list) else [x]


def _spec(name: str):
    return next(s for s in FUNCTIONS if s.name == name)


def _bucket_lid(template: dict) -> str:
    return next(lid for lid in resources(template, "AWS::S3::Bucket") if re.match(r"StorageBucket[0-9A-F]{8}$", lid))


def _sm_lid(template: dict, start_at: str = "Initialize run") -> str:
    """The training loop's logical id (``start_at`` "Roll out the group": the rollout group's)."""
    (lid,) = [lid for lid, m in resources(template, "AWS::StepFunctions::StateMachine").items()
              if json.loads(m["Properties"]["DefinitionString"])["StartAt"] == start_at]
    return lid


def test_the_session_start_timeout_and_poll_interval_are_context_values(default_app, scoped_app):
    """``sessionStartTimeoutSeconds`` / ``pollSeconds`` reach every handler as the variables the handlers read
    (docs/troubleshooting.md tells users to tune them); unset, the handlers keep their defaults."""
    from stepwise.settings import ENV_POLL_SECONDS, ENV_SESSION_START_TIMEOUT, Settings

    for (_, template), expected in ((scoped_app, {ENV_SESSION_START_TIMEOUT: "3600", ENV_POLL_SECONDS: "30"}),
                                    (default_app, {})):
        for cmd, (_, props) in functions_by_command(template).items():
            env = props["Environment"]["Variables"]
            assert {k: env[k] for k in (ENV_SESSION_START_TIMEOUT, ENV_POLL_SECONDS) if k in env} == expected, cmd
    settings = Settings.from_env({ENV_SESSION_START_TIMEOUT: "3600", ENV_POLL_SECONDS: "30"})
    assert (settings.session_start_timeout, settings.poll_seconds) == (3600.0, 30)


def test_the_first_run_resources_are_off_by_default_and_least_privilege_when_asked(default_app, scoped_app):
    """createSageMakerRole: a role only SageMaker may assume for this account, with the session's needs on this
    stack's resources; deployMathAgent: the math agent's runtime from an arm64 image, its role trusted by
    AgentCore Runtime for this account's runtimes only, writing only its results; both as stack outputs."""
    default, scoped = default_app[1], scoped_app[1]
    assert not resources(default, "AWS::BedrockAgentCore::Runtime")
    assert not [lid for lid in resources(default, "AWS::IAM::Role") if lid.startswith(("SageMakerSessionRole", "MathAgent"))]
    assert {"SageMakerRoleArn", "MathAgentRuntimeArn"} & set(default["Outputs"]) == set()

    role = resources(scoped, "AWS::IAM::Role")[_only(scoped, "AWS::IAM::Role", "SageMakerSessionRole")]["Properties"]
    (trust,) = role["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "sagemaker.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"] == {"StringEquals": {"aws:SourceAccount": {"Ref": "AWS::AccountId"}}}
    session = statements_of_role(scoped, _only(scoped, "AWS::IAM::Role", "SageMakerSessionRole"))
    assert set(actions_of(session)) == {
        "s3:GetObject", "s3:PutObject", "s3:DeleteObject", "s3:AbortMultipartUpload", "s3:ListBucket",
        "s3:GetBucketLocation", "sagemaker:DescribeHubContent", "sagemaker:ListHubContents",
        "sagemaker:CreateModelPackage", "sagemaker:DescribeModelPackage", "sagemaker:DescribeModelPackageGroup",
        "kms:GenerateDataKey", "kms:Decrypt", "kms:DescribeKey"}
    writes = [st for st in session if "s3:PutObject" in actions_of([st])]
    assert "sagemaker-output/*" in json.dumps(writes) and "runs/" not in json.dumps(writes)

    (runtime,) = resources(scoped, "AWS::BedrockAgentCore::Runtime").values()
    props = runtime["Properties"]
    assert props["NetworkConfiguration"] == {"NetworkMode": "PUBLIC"} and props["ProtocolConfiguration"] == "HTTP"
    agent_role = props["RoleArn"]["Fn::GetAtt"][0]
    (trust,) = resources(scoped, "AWS::IAM::Role")[agent_role]["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert trust["Principal"] == {"Service": "bedrock-agentcore.amazonaws.com"}
    assert set(trust["Condition"]) == {"StringEquals", "ArnLike"}
    agent = statements_of_role(scoped, agent_role)
    # the execution role AgentCore Runtime documents (infra.agent_runtime.AGENT_RUNTIME_STATEMENTS), no more
    from infra.agent_runtime import AGENT_RUNTIME_STATEMENTS

    assert set(actions_of(agent)) == {a for actions in AGENT_RUNTIME_STATEMENTS.values() for a in actions}
    (put,) = [st for st in agent if actions_of([st]) == {"s3:PutObject"}]
    assert "rollout-results/*" in json.dumps(put["Resource"])
    assert {"SageMakerRoleArn", "MathAgentRuntimeArn"} <= set(scoped["Outputs"])

    stack = scoped_app[0]
    assembly = stack.node.root.synth()
    manifest = json.loads(open(f"{assembly.directory}/{stack.artifact_id}.assets.json").read())
    platforms = {i["source"].get("dockerBuildArgs", {}).get("ENTRYPOINT", "lambda"): i["source"].get("platform")
                 for i in manifest["dockerImages"].values()}
    # AgentCore Runtime runs arm64 containers; the Lambda images stay x86_64
    assert platforms == {"local.agents.math_agent:app": "linux/arm64", "lambda": "linux/amd64"}


# --- the group judge (infra/judge.py, context judgeModelIds) ---------------------------------
# Nothing Bedrock without judgeModelIds; with it, bedrock:InvokeModel (what Converse is authorized by) for
# JudgeGroups on exactly the configured models, a cross-Region inference profile's foundation model only through
# that profile, and Init's lookups. cfn-lint and the IAM checks (test_stack_validators.py) run on the same template.


def judge_function_statements(template: dict, name: str) -> tuple[dict, list[dict]]:
    """(the function's environment, the statements of its role's policies, resolved) of the handler ``name``."""
    handler = by_name(name).handler
    (props,) = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::Lambda::Function"
                and r["Properties"].get("ImageConfig", {}).get("Command") == [handler]]
    role = props["Role"]["Fn::GetAtt"][0]
    statements = [resolve(s, template) for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
                  and {"Ref": role} in r["Properties"]["Roles"] for s in r["Properties"]["PolicyDocument"]["Statement"]]
    return props.get("Environment", {}).get("Variables", {}), statements


def bedrock_grants(statements: list[dict]) -> list[tuple[str, list[str], dict | None]]:
    out = []
    for s in statements:
        actions = [s["Action"]] if isinstance(s["Action"], str) else s["Action"]
        for a in actions:
            if a.startswith("bedrock:"):
                out.append((a, s["Resource"] if isinstance(s["Resource"], list) else [s["Resource"]], s.get("Condition")))
    return out


def test_without_judge_models_no_function_may_call_bedrock(default_app):
    _, template = default_app
    text = json.dumps([r for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"])
    assert '"bedrock:' not in text
    env, statements = judge_function_statements(template, "JudgeGroups")
    assert env.get("STEPWISE_JUDGE_MODEL_IDS", "") == "" and bedrock_grants(statements) == []


def test_judge_groups_may_invoke_exactly_the_configured_models(scoped_app):
    _, template = scoped_app
    env, statements = judge_function_statements(template, "JudgeGroups")
    assert env["STEPWISE_JUDGE_MODEL_IDS"] == ",".join(JUDGE_MODELS)
    profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/us.amazon.nova-micro-v1:0"
    grants = bedrock_grants(statements)
    assert {a for a, _, _ in grants} == {"bedrock:InvokeModel"}
    assert sorted(r for _, rs, c in grants if c is None for r in rs) == sorted(
        [profile, f"arn:aws:bedrock:{REGION}::foundation-model/amazon.nova-lite-v1:0"])
    conditional = [(rs, c) for _, rs, c in grants if c is not None]
    assert conditional == [(["arn:aws:bedrock:*::foundation-model/amazon.nova-micro-v1:0"],
                            {"StringEquals": {"bedrock:InferenceProfileArn": profile}})]


def test_only_judge_groups_invokes_and_only_init_looks_models_up(scoped_app):
    _, template = scoped_app
    holders = {spec.name: {a for a, _, _ in bedrock_grants(judge_function_statements(template, spec.name)[1])}
               for spec in FUNCTIONS}
    assert {n for n, a in holders.items() if a} == {"JudgeGroups", "Init"}
    assert holders["Init"] == {"bedrock:GetInferenceProfile", "bedrock:GetFoundationModel"}
    _, init = judge_function_statements(template, "Init")
    lookups = {a: rs for a, rs, _ in bedrock_grants(init)}
    profile = f"arn:aws:bedrock:{REGION}:{ACCOUNT}:inference-profile/us.amazon.nova-micro-v1:0"
    assert lookups == {"bedrock:GetInferenceProfile": [profile],
                       "bedrock:GetFoundationModel": [f"arn:aws:bedrock:{REGION}::foundation-model/amazon.nova-lite-v1:0"]}


@pytest.mark.parametrize("value", ["nova micro", "arn:aws:bedrock:us-west-2:111122223333:agent/x"])
def test_a_malformed_judge_model_context_value_is_refused_at_synth(value):
    from infra.settings import SettingsError, StackSettings

    with pytest.raises(SettingsError, match="judgeModelIds"):
        StackSettings.from_context(lambda k: value if k == "judgeModelIds" else None)
