"""Every AWS call a handler really makes is allowed by the role the stack gives that function.

Runs a small training run through the real ASL in moto with the real handlers and the SageMaker
simulator (as tests/infra/test_pipeline_asl_moto.py does), records each botocore API call with the
function whose handler made it, and checks the call's IAM action (and, for S3, its key) against
the policies the synthesized stack attaches to that function's role. A permission the stack forgets fails here, not at
deploy time. (The gateway is not exercised: a stand-in agent plays it. moto's EventBridge does
not deliver to Lambda, so the test hands Cleanup the status-change event itself.)
"""

from __future__ import annotations

import contextvars
import fnmatch
import json
import os
import threading
import time
import uuid
from collections import defaultdict

import pytest

os.environ.setdefault("JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION", "1")

from tests.support.pipeline import FakeAgent, Stack  # noqa: E402

pytestmark = pytest.mark.e2e  # two whole (tiny) training runs, the batch and the group engine: about 50 s

BUCKET = "stepwise-iam-coverage"
PREFIX = "iam-cov"
_current_function: contextvars.ContextVar[str | None] = contextvars.ContextVar("stepwise_function", default=None)

#: S3 operation -> IAM actions (the Service Authorization Reference's mapping).
S3_ACTIONS = {
    "GetObject": ["s3:GetObject"], "HeadObject": ["s3:GetObject"], "PutObject": ["s3:PutObject"],
    "ListObjectsV2": ["s3:ListBucket"], "ListObjects": ["s3:ListBucket"], "HeadBucket": ["s3:ListBucket"],
    "DeleteObject": ["s3:DeleteObject"], "CopyObject": ["s3:GetObject", "s3:PutObject"],
    "GetObjectTagging": ["s3:GetObjectTagging"], "PutObjectTagging": ["s3:PutObjectTagging"],
    "CreateBucket": ["s3:CreateBucket"], "GetBucketLocation": ["s3:GetBucketLocation"], "ListBuckets": ["s3:ListAllMyBuckets"],
}
#: Calls that need no IAM permission.
FREE = {("sts", "GetCallerIdentity")}


def iam_actions(signing_name: str, operation: str, params: dict) -> list[str]:
    if signing_name == "s3":
        actions = list(S3_ACTIONS.get(operation, [f"s3:{operation}"]))
        if operation == "PutObject" and params.get("Tagging"):
            actions.append("s3:PutObjectTagging")
        return actions
    return [f"{signing_name}:{operation}"]


def granted() -> dict[str, list[tuple[set[str], list[str]]]]:
    """Function name -> [(actions, S3 key patterns or ['*'] for non-object resources)]: every statement
    of every policy the synthesized stack (``cdk.json``'s context) attaches to that function's role."""
    from tests.support.stack import synthesized
    from stepwise.functions import FUNCTIONS

    stack, template = synthesized()
    policies = [r["Properties"] for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"]
    out: dict[str, list[tuple[set[str], list[str]]]] = {}
    for spec in FUNCTIONS:
        role = stack.resolve(stack.functions.functions[spec.name].role.role_arn)["Fn::GetAtt"][0]
        rules = []
        for policy in policies:
            if {"Ref": role} not in policy["Roles"]:
                continue
            for j in policy["PolicyDocument"]["Statement"]:
                acts = {j["Action"]} if isinstance(j["Action"], str) else set(j["Action"])
                res = j["Resource"] if isinstance(j["Resource"], list) else [j["Resource"]]
                keys = []
                for r in res:
                    joined = r.get("Fn::Join", [None, []])[1] if isinstance(r, dict) else None
                    keys.append(joined[-1].lstrip("/") if joined and isinstance(joined[-1], str) and joined[-1].startswith("/")
                                else "*")
                rules.append((acts, keys))
        out[spec.name] = rules
    return out


def allowed(rules: list[tuple[set[str], list[str]]], action: str, key: str | None) -> bool:
    for acts, keys in rules:
        if action in acts and (key is None or "*" in keys or any(fnmatch.fnmatchcase(key, k) for k in keys)):
            return True
    return False


@pytest.fixture(scope="module")
def recorded_calls():
    import botocore.client

    from local import engine, resources
    from stepwise.functions import FUNCTIONS

    calls: list[tuple[str, str, str, dict]] = []
    lock = threading.Lock()
    by_local_name = {resources.local_function_name(PREFIX, s.name): s.name for s in FUNCTIONS}
    original_call = engine.LambdaDispatcher.call
    original_api = botocore.client.BaseClient._make_api_call

    def call(self, function_name, event, invocation_type):
        token = _current_function.set(by_local_name.get(function_name, function_name))
        try:
            return original_call(self, function_name, event, invocation_type)
        finally:
            _current_function.reset(token)

    def make_api_call(self, operation_name, api_params):
        fn = _current_function.get()
        if fn is not None:
            model = self.meta.service_model
            with lock:
                calls.append((fn, model.signing_name or model.endpoint_prefix, operation_name,
                              {k: api_params.get(k) for k in ("Bucket", "Key", "Tagging", "Prefix") if k in api_params}))
        return original_api(self, operation_name, api_params)

    engine.LambdaDispatcher.call = call
    botocore.client.BaseClient._make_api_call = make_api_call
    # A session that takes a moment to start sends the loop through PollSession (a session
    # already Running at Init skips the Wait state).
    stack = Stack(bucket=BUCKET, session_start_seconds=4.0)
    moto = stack.moto
    agent = FakeAgent()
    try:
        _arns, sm_arn = stack.deploy(agent, PREFIX, name="iam-coverage", track=True)
        rows = [{"prompt": f"p{i}", "answer": str(i)} for i in range(4)]
        config = stack.config(
            dataset_path=stack.put_dataset("datasets/iam/train.jsonl", rows),
            eval_dataset_path=stack.put_dataset("datasets/iam/eval.jsonl", [{"prompt": "e0", "answer": "0"}]),
            max_rollout_time=20, steps_per_execution=1,
            keep_model_packages="best_and_last")  # StopSession deletes intermediate packages: its grant is checked
        sfn = moto.client("stepfunctions")
        run_id = f"iam-{uuid.uuid4().hex[:6]}"
        first = sfn.start_execution(stateMachineArn=sm_arn, name=run_id, input=json.dumps(config))["executionArn"]
        last = None
        deadline = time.monotonic() + 240
        for arn in (first, first.replace(f":{run_id}", f":{run_id}--1")):
            while time.monotonic() < deadline:
                try:
                    last = sfn.describe_execution(executionArn=arn)
                except sfn.exceptions.ExecutionDoesNotExist:
                    last = None
                if last and last["status"] != "RUNNING":
                    break
                time.sleep(0.3)
            assert last and last["status"] == "SUCCEEDED", last
        # the group engine (admission group): its handlers and the rollout group state machine
        group_run = f"iam-group-{uuid.uuid4().hex[:6]}"
        group_cfg = {**config, "admission": "group", "max_staleness": 1, "sampling_steps_ahead": 1,
                     "steps_per_execution": 20, "eval_dataset_path": ""}
        group_arn = sfn.start_execution(stateMachineArn=sm_arn, name=group_run, input=json.dumps(group_cfg))["executionArn"]
        while time.monotonic() < deadline and sfn.describe_execution(executionArn=group_arn)["status"] == "RUNNING":
            time.sleep(0.3)
        assert sfn.describe_execution(executionArn=group_arn)["status"] == "SUCCEEDED"
        # moto's EventBridge never calls Cleanup: deliver the status-change event it would get.
        event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
                 "detail": {"executionArn": last["executionArn"], "stateMachineArn": sm_arn, "name": last["name"],
                            "status": "ABORTED", "input": last.get("input")}}
        moto.dispatcher.call(resources.local_function_name(PREFIX, "Cleanup"), event, "Event")
        # An execution that ended without any stop (its events never delivered): the schedule's
        # sweeper stops its session (the local stack invokes it; moto delivers no schedule).
        orphan = f"iam-orphan-{uuid.uuid4().hex[:6]}"
        orphan_arn = sm_arn.replace(":stateMachine:", ":execution:") + f":{orphan}"  # never started: GONE
        moto.dispatcher.call(resources.local_function_name(PREFIX, "Init"),
                             {"input": config, "execution_arn": orphan_arn, "execution_name": orphan}, "RequestResponse")
        swept, error = moto.dispatcher.call(resources.local_function_name(PREFIX, "SweepSessions"), {}, "RequestResponse")
        assert error is None and orphan in swept.decode(), swept
        moto.dispatcher.drain(timeout=120)  # Track publishing the summaries and the run's end
        yield calls
    finally:
        botocore.client.BaseClient._make_api_call = original_api
        engine.LambdaDispatcher.call = original_call
        agent.stop()
        stack.stop()


def test_the_run_exercised_most_functions(recorded_calls):
    seen = {fn for fn, *_ in recorded_calls}
    assert {"Init", "PollSession", "PlanStep", "StartRollout", "OnRolloutResult", "FinishRollout",
            "ComputeAdvantages", "SubmitTrain", "Rebind", "ContinueRun", "StopSession", "Cleanup", "SweepSessions", "Track",
            "AdmitGroups", "AwaitGroups", "RecordGroupComplete"} <= seen


def test_every_call_a_handler_made_is_allowed_by_its_role(recorded_calls):
    rules = granted()
    denied = defaultdict(set)
    for fn, service, op, params in recorded_calls:
        if (service, op) in FREE:
            continue
        key = params.get("Key") if params.get("Bucket") == BUCKET else None
        if service == "s3" and params.get("Bucket") not in (BUCKET, None):
            continue  # the simulator's own output bucket stands in for the user's, not the stack's
        for action in iam_actions(service, op, params):
            if not allowed(rules[fn], action, key):
                denied[fn].add(f"{action} {key or ''}".strip())
    assert not denied, {fn: sorted(v) for fn, v in denied.items()}
