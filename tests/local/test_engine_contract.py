"""The moto seam: Step Functions tasks and S3 notifications reach real handlers in-process.

If a moto upgrade moves ``LambdaFunction.invoke`` or stops routing S3 notifications
through it, these tests fail loudly (instead of moto silently echoing payloads).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import time
from pathlib import Path
from urllib.parse import unquote_plus

import boto3
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from local import engine, resources
from tests.support.pipeline import wait_execution

BUCKET = "stepwise-engine-test"


def _echo(event, ctx):
    return {"echo": event, "function": ctx.function_name, "remaining_ms": ctx.get_remaining_time_in_millis()}


def _start(event, ctx):
    s3 = boto3.client("s3")
    s3.put_object(Bucket=BUCKET, Key="tokens/t.json", Body=event["token"].encode())
    # a key with characters S3 URL-encodes in the notification event
    s3.put_object(Bucket=BUCKET, Key="rollout-results/run 1/0/sid=1.json", Body=b"{}")
    return {"started": True}


def _on_result(event, ctx):
    key = event["Records"][0]["s3"]["object"]["key"]
    token = boto3.client("s3").get_object(Bucket=BUCKET, Key="tokens/t.json")["Body"].read().decode()
    boto3.client("stepfunctions").send_task_success(taskToken=token, output=json.dumps({"key": key}))


def _boom(event, ctx):
    raise ValueError("bad thing in handler")


def test_seam_matches_installed_moto():
    engine.check_seam()  # raises SeamBroken on a moto whose internals moved


def test_seam_check_fails_loudly_on_signature_drift(monkeypatch):
    cls = engine.moto_invoke_target()
    monkeypatch.setattr(cls, "invoke", lambda self, body, headers: b"")
    with pytest.raises(engine.SeamBroken, match="signature changed"):
        engine.check_seam()


def test_patch_is_removed_on_exit():
    cls = engine.moto_invoke_target()
    original = cls.invoke
    with engine.patched_lambda_invoke(engine.LambdaDispatcher()):
        assert cls.invoke is not original
    assert cls.invoke is original


def test_tasks_and_s3_notifications_dispatch_to_handlers():
    with engine.MotoServer() as moto:
        lam, iam = moto.client("lambda"), moto.client("iam")
        role = iam.create_role(RoleName="r", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        arns = {}
        for name, fn in [("echo", _echo), ("start", _start), ("on-result", _on_result), ("boom", _boom)]:
            arns[name] = lam.create_function(
                FunctionName=name, Role=role, PackageType="Image",
                Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}, Timeout=30,
            )["FunctionArn"]
            moto.dispatcher.register(name, handler_path="", memory_mb=128, timeout_s=30, arn=arns[name], handler=fn)
        resources.create_bucket(moto, BUCKET, result_function_arn=arns["on-result"])
        definition = {
            "StartAt": "Echo",
            "States": {
                "Echo": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                         "Parameters": {"FunctionName": arns["echo"], "Payload.$": "$"},
                         "ResultSelector": {"p.$": "$.Payload"}, "ResultPath": "$.echo", "Next": "Wait"},
                "Wait": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                         "TimeoutSeconds": 20, "Parameters": {"FunctionName": arns["start"],
                                                              "Payload": {"token.$": "$$.Task.Token"}},
                         "ResultPath": "$.result", "Next": "Boom"},
                "Boom": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                         "Parameters": {"FunctionName": arns["boom"]}, "ResultPath": None,
                         "Catch": [{"ErrorEquals": ["ValueError"], "ResultPath": "$.error", "Next": "Done"}],
                         "Next": "Done"},
                "Done": {"Type": "Pass", "End": True},
            },
        }
        sm = resources.create_state_machine(moto, "engine-test", json.dumps(definition))
        sfn = moto.client("stepfunctions")
        arn = sfn.start_execution(stateMachineArn=sm, name="run-1", input=json.dumps({"a": 1}))["executionArn"]
        desc = wait_execution(sfn, arn, timeout=30)
        assert desc["status"] == "SUCCEEDED", desc
        out = json.loads(desc["output"])
        assert out["echo"]["p"]["echo"] == {"a": 1}
        assert out["echo"]["p"]["function"] == "echo"
        assert out["echo"]["p"]["remaining_ms"] > 0
        # S3 delivers the key URL-encoded (moto also encodes "/"; AWS does not): unquote_plus fits both
        assert out["result"]["key"] != "rollout-results/run 1/0/sid=1.json"
        assert unquote_plus(out["result"]["key"]) == "rollout-results/run 1/0/sid=1.json"
        assert out["error"]["Error"] == "ValueError"
        assert "bad thing in handler" in out["error"]["Cause"]
        calls = [(r.function_name, r.invocation_type, r.error) for r in moto.dispatcher.invocations]
        assert ("on-result", "Event", None) in calls
        assert ("boom", "RequestResponse", "ValueError") in calls


def test_functions_are_created_with_the_stack_environment(monkeypatch):
    from stepwise import functions, settings

    monkeypatch.setenv("STEPWISE_BUCKET", "stepwise-env-test")
    monkeypatch.setenv("STEPWISE_GATEWAY_URL", "http://127.0.0.1:1")
    monkeypatch.setenv(settings.ENV_DATA_BUCKETS, "my-datasets,my-outputs")
    monkeypatch.delenv(settings.ENV_AGENT_RUNTIME_ARNS, raising=False)
    monkeypatch.delenv(settings.ENV_JUDGE_MODEL_IDS, raising=False)
    monkeypatch.delenv("POWERTOOLS_SERVICE_NAME", raising=False)
    expected = functions.environment(bucket="stepwise-env-test", gateway_url="http://127.0.0.1:1",
                                     data_buckets="my-datasets,my-outputs")
    assert expected[settings.ENV_DATA_BUCKETS] == "my-datasets,my-outputs" and expected[settings.ENV_AGENT_RUNTIME_ARNS] == ""
    with engine.MotoServer() as moto:
        arns = resources.create_functions(moto)
        assert set(arns) == {spec.name for spec in functions.FUNCTIONS}
        lam = moto.client("lambda")
        for spec in functions.FUNCTIONS:
            conf = lam.get_function_configuration(FunctionName=arns[spec.name])
            assert conf["Environment"]["Variables"] == expected
            assert conf["MemorySize"] == spec.memory_mb and conf["Timeout"] == spec.timeout_s
        # the in-process handlers see the same environment
        assert {k: os.environ.get(k) for k in expected} == expected
    assert "POWERTOOLS_SERVICE_NAME" not in os.environ


_VALUES = st.one_of(st.none(), st.sampled_from(["a", "b", "c"]))


@settings(max_examples=200, deadline=None)
@given(initial=_VALUES, patched=st.sampled_from(["a", "b", "c"]), service=st.sampled_from(["a", "b", "c"]),
       service_first=st.booleans(), undo_first=st.booleans())
def test_a_service_s_environment_and_a_monkeypatch_end_as_they_began_in_either_stop_order(initial, patched, service,
                                                                                          service_first, undo_first):
    """A variable a local service sets (`local._proc.EnvChanges`: MotoServer, LocalStack) and a test's
    MonkeyPatch sets too ends with its value from before both, whichever stops first, when the service set it
    last (``create_functions`` sets the stack's variables after the pipeline stack's monkeypatch: CI once saw
    ``STEPWISE_JUDGE_MODEL_IDS`` outlive its module that way), and when the service set it first and is stopped
    last (LIFO). Not decidable from values alone, so outside the property: a service that sets exactly the value
    the variable had before the monkeypatch changed it, and is stopped after the monkeypatch (hypothesis found
    it; tests/conftest.py's ``environment_per_module`` puts back what such a case leaves)."""
    from hypothesis import assume

    from local._proc import EnvChanges

    assume(service_first or not undo_first or service != initial)

    key = "STEPWISE_TEST_ENV_CHANGES"
    mp, changes = pytest.MonkeyPatch(), EnvChanges()
    try:
        if initial is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = initial
        if service_first:
            changes.set({key: service})
            mp.setenv(key, patched)
            stops = [mp.undo, changes.restore]  # LIFO: the only order a MonkeyPatch set last can be undone in
        else:
            mp.setenv(key, patched)
            changes.set({key: service})
            stops = [mp.undo, changes.restore] if undo_first else [changes.restore, mp.undo]
        for stop in stops:
            stop()
        assert os.environ.get(key) == initial
    finally:
        os.environ.pop(key, None)


def test_s3_request_log_counts_every_process_s_requests_by_operation_and_key_kind():
    # its own bucket: moto's backends outlive a MotoServer, and BUCKET keeps the first test's
    # notification, which would send this PUT to an on-result no dispatcher here registers
    bucket = "stepwise-engine-request-log"
    with engine.MotoServer() as moto:
        s3 = moto.client("s3")
        s3.create_bucket(Bucket=bucket)
        s3.put_object(Bucket=bucket, Key="runs/r1/state.json", Body=b"{}")
        s3.put_object(Bucket=bucket, Key="runs/r1/sessions/s1/turns/0001.json", Body=b"{}")
        s3.get_object(Bucket=bucket, Key="runs/r1/state.json")
        s3.head_object(Bucket=bucket, Key="runs/r1/state.json")
        s3.list_objects_v2(Bucket=bucket, Prefix="runs/r1/sessions/s1/turns/")
        s3.put_object(Bucket=bucket, Key="rollout-results/r1/0/s1.json", Body=b"{}")
        moto.client("stepfunctions").list_state_machines()  # not S3: not counted
        counts = moto.s3_requests.snapshot()
        apps = moto.s3_requests.app.app_instances  # moto's Flask app per service, built on first use
        assert apps and not any(app.debug for app in apps.values())  # engine.without_flask_debug
    assert counts == {"GET state": 1, "HEAD state": 1, "LIST turn": 1, "PUT bucket": 1, "PUT result": 1,
                      "PUT state": 1, "PUT turn": 1}


def test_a_run_s_objects_are_copied_out_from_moto_s_memory_as_the_requests_would_copy_them(tmp_path):
    """run-local's mirror of the run folder reads moto's S3 backend in this process (`MotoServer.objects`), not
    a GET per object: the same keys and newest bodies as ListObjectsV2 and GetObject give, no request made."""
    from local.report import mirror_run_objects

    bucket = "stepwise-engine-objects"
    with engine.MotoServer() as moto:
        s3 = moto.client("s3")
        s3.create_bucket(Bucket=bucket)
        for key, body in [("runs/r1/state.json", b"old"), ("runs/r1/state.json", b"{}"), ("runs/r1/steps/0/s.json", b"1"),
                          ("runs/r10/state.json", b"x"), ("rollout-results/r1/0/a.json", b"2"), ("other/r1", b"3")]:
            s3.put_object(Bucket=bucket, Key=key, Body=body)
        before = moto.s3_requests.snapshot()
        n = mirror_run_objects(s3, bucket, "r1", tmp_path / "memory", objects=moto.objects)
        assert moto.s3_requests.snapshot() == before
        assert n == mirror_run_objects(s3, bucket, "r1", tmp_path / "requests") == 3
        with pytest.raises(engine.SeamBroken, match="no bucket"):
            list(moto.objects("no-such-bucket", "runs/"))
    files = {p.relative_to(tmp_path / "memory"): p.read_bytes() for p in (tmp_path / "memory").rglob("*") if p.is_file()}
    assert files == {p.relative_to(tmp_path / "requests"): p.read_bytes()
                     for p in (tmp_path / "requests").rglob("*") if p.is_file()}
    assert files[Path("runs/r1/state.json")] == b"{}" and Path("runs/r10/state.json") not in files


def test_send_task_success_answers_as_moto_does_for_live_unknown_and_ended_tasks():
    """SendTaskSuccess goes through the token index (engine.indexed_task_tokens): a live token
    resumes its task, an unknown one is InvalidToken, a second success for an ended task is refused."""
    wait = {"StartAt": "W", "States": {"W": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken",
                                             "Parameters": {"FunctionName": "start-tok", "Payload": {"token.$": "$$.Task.Token"}},
                                             "End": True}}}
    with engine.MotoServer() as moto:
        lam, iam, sfn = moto.client("lambda"), moto.client("iam"), moto.client("stepfunctions")
        role = iam.create_role(RoleName="r-tok", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        tokens: list[str] = []
        moto.dispatcher.register("start-tok", handler_path="", memory_mb=128, timeout_s=30, arn="",
                                 handler=lambda event, ctx: tokens.append(event["token"]))
        wait["States"]["W"]["Parameters"]["FunctionName"] = lam.create_function(
            FunctionName="start-tok", Role=role, PackageType="Image", Timeout=30,
            Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"})["FunctionArn"]
        sm = resources.create_state_machine(moto, "tok", json.dumps(wait))
        arns = [sfn.start_execution(stateMachineArn=sm, name=f"tok-{i}", input="{}")["executionArn"] for i in range(3)]
        deadline = time.monotonic() + 30
        while len(tokens) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(tokens) == 3
        for i, token in enumerate(tokens):
            sfn.send_task_success(taskToken=token, output=json.dumps({"n": i}))
        outputs = sorted(json.loads(wait_execution(sfn, arn, timeout=30)["output"])["n"] for arn in arns)
        assert outputs == [0, 1, 2]
        with pytest.raises(sfn.exceptions.InvalidToken):
            sfn.send_task_success(taskToken="no-such-token", output="{}")
        with pytest.raises(sfn.exceptions.InvalidToken):  # its execution ended: moto's own answer
            sfn.send_task_success(taskToken=tokens[0], output="{}")


def test_a_second_success_for_a_task_that_has_its_outcome_is_refused_as_on_aws():
    """A duplicate S3 notification's SendTaskSuccess, while the execution still runs (a Distributed Map's
    other children keep it running): AWS refuses it (TaskTimedOut: "the task associated with the token has
    already been closed"), so OnRolloutResult knows its output reaches nobody; moto 5.2.5 accepts it and drops
    the output. The first outcome is the task's."""
    tokens: dict[int, str] = {}
    child = {"StartAt": "W", "States": {"W": {
        "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken", "TimeoutSeconds": 30,
        "Parameters": {"FunctionName": "", "Payload": {"token.$": "$$.Task.Token", "i.$": "$.i"}}, "End": True}}}
    machine = {"StartAt": "M", "States": {"M": {"Type": "Map", "ItemsPath": "$.items", "End": True, "ItemProcessor": {
        **child, "ProcessorConfig": {"Mode": "DISTRIBUTED", "ExecutionType": "STANDARD"}}}}}
    with engine.MotoServer() as moto:
        lam, iam, sfn = moto.client("lambda"), moto.client("iam"), moto.client("stepfunctions")
        role = iam.create_role(RoleName="r-dup", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
        moto.dispatcher.register("start-dup", handler_path="", memory_mb=128, timeout_s=30, arn="",
                                 handler=lambda event, ctx: tokens.__setitem__(event["i"], event["token"]))
        child["States"]["W"]["Parameters"]["FunctionName"] = lam.create_function(
            FunctionName="start-dup", Role=role, PackageType="Image", Timeout=30,
            Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"})["FunctionArn"]
        sm = resources.create_state_machine(moto, "dup", json.dumps(machine))
        arn = sfn.start_execution(stateMachineArn=sm, name="dup-1", input=json.dumps({"items": [{"i": 0}, {"i": 1}]}))[
            "executionArn"]
        deadline = time.monotonic() + 30
        while len(tokens) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        sfn.send_task_success(taskToken=tokens[0], output=json.dumps({"n": "first"}))
        with pytest.raises(sfn.exceptions.TaskTimedOut):
            sfn.send_task_success(taskToken=tokens[0], output=json.dumps({"n": "second"}))
        sfn.send_task_success(taskToken=tokens[1], output=json.dumps({"n": "other"}))
        desc = wait_execution(sfn, arn, timeout=30)
    assert desc["status"] == "SUCCEEDED"
    assert sorted(x["n"] for x in json.loads(desc["output"])) == ["first", "other"]


def _where(event, ctx):
    if event.get("boom"):
        raise ValueError("bad thing in a worker")
    return {"pid": os.getpid(), "function": ctx.function_name, "bucket": os.environ.get("STEPWISE_BUCKET")}


def test_handlers_registered_by_path_run_in_worker_processes_with_the_parent_s_environment(monkeypatch):
    from local.workers import WorkerPool

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with engine.MotoServer() as moto:
        moto.dispatcher.workers = pool = WorkerPool(1)
        try:
            lam, iam = moto.client("lambda"), moto.client("iam")
            role = iam.create_role(RoleName="r-workers", AssumeRolePolicyDocument="{}")["Role"]["Arn"]
            arn = lam.create_function(FunctionName="where", Role=role, PackageType="Image", Timeout=30,
                                      Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"})["FunctionArn"]
            moto.dispatcher.register("where", handler_path="test_engine_contract._where", memory_mb=128,
                                     timeout_s=30, arn=arn)
            monkeypatch.setenv("STEPWISE_BUCKET", "set-after-the-worker-started")
            definition = {"StartAt": "Where", "States": {
                "Where": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                          "Parameters": {"FunctionName": arn, "Payload.$": "$"}, "ResultSelector": {"p.$": "$.Payload"},
                          "Catch": [{"ErrorEquals": ["ValueError"], "ResultPath": "$.error", "Next": "Done"}],
                          "Next": "Done"},
                "Done": {"Type": "Pass", "End": True}}}
            sm = resources.create_state_machine(moto, "workers-test", json.dumps(definition))
            sfn = moto.client("stepfunctions")
            ok = wait_execution(sfn, sfn.start_execution(stateMachineArn=sm, name="w-ok", input="{}")["executionArn"], timeout=30)
            out = json.loads(ok["output"])["p"]
            assert out["pid"] != os.getpid() and out["function"] == "where"
            assert out["bucket"] == "set-after-the-worker-started"
            failed = wait_execution(sfn, sfn.start_execution(stateMachineArn=sm, name="w-boom", input='{"boom": true}')["executionArn"], timeout=30)
            err = json.loads(failed["output"])["error"]
            assert err["Error"] == "ValueError" and "bad thing in a worker" in err["Cause"]
            assert [(r.function_name, r.error) for r in moto.dispatcher.invocations] == [("where", None), ("where", "ValueError")]
        finally:
            pool.stop()


# ---------------------------------------------------------------------------------------------
# Lambda's limits: memory_mb and timeout_s per invocation (local/limits.py)

_hogs: list[bytes] = []
_ticks: list[float] = []


def _hog(event, ctx):
    import mmap

    size = event["mb"] << 20
    block = b"x" * size  # a Python object: tracemalloc traces it
    # and fresh pages of the same size, written: the process's RSS grows by them even when malloc
    # serves the bytes from memory an earlier test freed but kept resident. Late in a full test run
    # the rss measure twice saw no growth at 200 MB (CI): it counts the whole process, so memory
    # other threads free meanwhile (earlier tests' executions, a garbage collection) offsets the
    # hog's (local/limits.py). Hence also 400 MB, and no garbage collection during the call.
    fresh = mmap.mmap(-1, size)
    for offset in range(0, size, mmap.PAGESIZE):
        fresh[offset] = 1
    _hogs.extend([block, fresh])
    try:
        # held for many ticks: rss samples once a tick (tracemalloc keeps the peak anyway), and on a
        # busy machine the monitor thread may wait for the GIL. An invocation over its memory is
        # stopped by the monitor inside this loop, as Lambda kills the container; one under it returns.
        deadline = time.monotonic() + event.get("hold_s", 0.1)
        while time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        _hogs.clear()
        fresh.close()
    return {"allocated_mb": event["mb"]}


@contextlib.contextmanager
def _no_gc():
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def _slow(event, ctx):
    try:
        while True:  # a polling loop that never ends: Lambda stops it at timeout_s
            _ticks.append(time.monotonic())
            time.sleep(0.02)
    finally:
        _ticks.append(-1.0)  # finally blocks run, as the runtime unwinds


@pytest.mark.parametrize("measure", ["tracemalloc", "rss"])
def test_an_invocation_over_its_memory_fails_naming_the_function_and_the_figure(measure):
    d = engine.LambdaDispatcher(measure=measure)
    d.register("hog", handler_path="", memory_mb=160, timeout_s=30, arn="arn:hog", handler=_hog)
    try:
        payload, error = d.call("hog", {"mb": 8}, "RequestResponse")  # 100 MB runtime + 8 < 160
        assert error is None and json.loads(payload) == {"allocated_mb": 8}
        with _no_gc():
            payload, error = d.call("hog", {"mb": 400, "hold_s": 5}, "RequestResponse")
    finally:
        d.stop_limits()
    body = json.loads(payload)
    assert error == "Unhandled" and body["errorType"] == "Lambda.Unknown"
    assert "Runtime.OutOfMemory: function hog used" in body["errorMessage"]
    assert "of its memory_mb 160" in body["errorMessage"] and measure in body["errorMessage"]
    used = int(body["errorMessage"].split(" used ")[1].split(" MB")[0].replace(",", ""))
    assert 160 < used
    records = [(r.function_name, r.error) for r in d.invocations]
    assert records == [("hog", None), ("hog", "Lambda.Unknown")]
    assert d.invocations[0].peak_mb < 60 and d.invocations[1].peak_mb >= 60


def test_an_invocation_past_its_timeout_is_stopped_and_fails_naming_the_function_and_the_figure():
    d = engine.LambdaDispatcher(measure="off")
    d.register("slow", handler_path="", memory_mb=128, timeout_s=1, arn="arn:slow", handler=_slow)
    _ticks.clear()
    t0 = time.monotonic()
    try:
        payload, error = d.call("slow", {}, "RequestResponse")
    finally:
        d.stop_limits()
    took = time.monotonic() - t0
    body = json.loads(payload)
    assert error == "Unhandled" and body["errorType"] == "Lambda.Unknown"
    assert "Task timed out after 1.0" in body["errorMessage"] and "function slow has timeout_s 1" in body["errorMessage"]
    assert 1.0 <= took < 1.5
    time.sleep(0.2)
    assert _ticks[-1] == -1.0  # the handler was stopped (its finally ran), not left running
    assert d.invocations[-1].error == "Lambda.Unknown"


def test_step_functions_sees_a_broken_limit_as_lambda_unknown_naming_the_function():
    with engine.MotoServer() as moto:
        lam, iam = moto.client("lambda"), moto.client("iam")
        role = resources._ensure_role(iam, "limits-test", "lambda.amazonaws.com")
        arns = {}
        for name, fn, memory_mb, timeout_s in [("hog", _hog, 160, 30), ("slow", _slow, 128, 1)]:
            arns[name] = lam.create_function(
                FunctionName=name, Role=role, PackageType="Image",
                Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}, Timeout=timeout_s,
            )["FunctionArn"]
            moto.dispatcher.register(name, handler_path="", memory_mb=memory_mb, timeout_s=timeout_s,
                                     arn=arns[name], handler=fn)
        states = {}
        for name, nxt, payload in [("hog", "slow", {"mb": 400, "hold_s": 5}), ("slow", "Done", {})]:
            states[name] = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke",
                            "Parameters": {"FunctionName": arns[name], "Payload": payload}, "ResultPath": None,
                            "Catch": [{"ErrorEquals": ["Lambda.Unknown"], "ResultPath": f"$.{name}", "Next": nxt}],
                            "Next": nxt}
        states["Done"] = {"Type": "Pass", "End": True}
        sm = resources.create_state_machine(moto, "limits-test", json.dumps({"StartAt": "hog", "States": states}))
        sfn = moto.client("stepfunctions")
        with _no_gc():
            arn = sfn.start_execution(stateMachineArn=sm, name="limits-1", input="{}")["executionArn"]
            desc = wait_execution(sfn, arn, timeout=30)
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    assert "hog" in out and "slow" in out, (out, moto.dispatcher.invocations)
    assert out["hog"]["Error"] == out["slow"]["Error"] == "Lambda.Unknown"
    assert "function hog used" in out["hog"]["Cause"] and "memory_mb 160" in out["hog"]["Cause"]
    assert "function slow has timeout_s 1" in out["slow"]["Cause"]


def test_execution_history_newest_first_one_event_is_the_history_length():
    """PlanStep's history-budget read: GetExecutionHistory(reverseOrder=True, maxResults=1) answers the
    newest event, whose id is the history's length (moto ignores both parameters; the seam adds them)."""
    with engine.MotoServer() as moto:
        definition = {"StartAt": "A", "States": {"A": {"Type": "Pass", "Next": "B"}, "B": {"Type": "Pass", "End": True}}}
        sm = resources.create_state_machine(moto, "history-test", json.dumps(definition))
        sfn = moto.client("stepfunctions")
        arn = sfn.start_execution(stateMachineArn=sm, name="h-1", input="{}")["executionArn"]
        wait_execution(sfn, arn, timeout=30)
        every = sfn.get_execution_history(executionArn=arn)["events"]
        newest = sfn.get_execution_history(executionArn=arn, reverseOrder=True, maxResults=1)["events"]
    assert [e["id"] for e in every] == list(range(1, len(every) + 1)) and len(every) >= 5
    assert len(newest) == 1 and newest[0]["id"] == len(every) and newest[0]["type"] == "ExecutionSucceeded"


def test_a_worker_process_enforces_the_limits_of_the_handlers_it_runs(monkeypatch):
    """run-local's handlers run in worker processes: the same limits hold there (each worker measures
    its own RSS, which holds only its handlers, not moto or the simulator)."""
    from local.workers import WorkerPool

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    d = engine.LambdaDispatcher(workers=WorkerPool(1))
    try:
        d.register("hog", handler_path="test_engine_contract._hog", memory_mb=160, timeout_s=30, arn="arn:hog")
        d.register("slow", handler_path="test_engine_contract._slow", memory_mb=256, timeout_s=1, arn="arn:slow")
        ok, error = d.call("hog", {"mb": 8}, "RequestResponse")
        assert error is None and json.loads(ok) == {"allocated_mb": 8}
        hog, hog_error = d.call("hog", {"mb": 200}, "RequestResponse")
        slow, slow_error = d.call("slow", {}, "RequestResponse")
    finally:
        d.workers.stop()
        d.stop_limits()
    assert hog_error == slow_error == "Unhandled"
    assert "function hog used" in json.loads(hog)["errorMessage"] and "memory_mb 160" in json.loads(hog)["errorMessage"]
    assert "function slow has timeout_s 1" in json.loads(slow)["errorMessage"]
    assert [r.error for r in d.invocations] == [None, "Lambda.Unknown", "Lambda.Unknown"]
    assert d.invocations[1].peak_mb >= 60  # the worker's figure, sent back with the payload
    # and the handler's own seconds in the worker (the cost ledger's check), within the dispatch's
    assert 0 < d.invocations[0].handler_seconds <= d.invocations[0].seconds
    assert 1.0 <= d.invocations[2].handler_seconds <= d.invocations[2].seconds  # stopped at its timeout_s


def test_json_paths_are_parsed_once_while_the_server_runs():
    from moto.stepfunctions.parser.asl.utils import json_path

    original = json_path.parse
    with engine.MotoServer():
        assert json_path.parse("$.batch.timeout_seconds") is json_path.parse("$.batch.timeout_seconds")
        assert json_path.extract_json("$.a[1]", {"a": [1, 2]}) == 2  # moto's own evaluation, unchanged
    assert json_path.parse is original


def _big(event, ctx):
    return {"x": "a" * 6_100_000}


def _answer(resp):
    """What moto's interpreter reads of an Invoke answer (lambda_eval_utils): all but the metadata."""
    out = {k: v for k, v in resp.items() if k != "ResponseMetadata"}
    out["Payload"] = out["Payload"].read()
    return out


def test_the_interpreter_s_lambda_client_answers_as_moto_does_over_http_without_a_request():
    with engine.MotoServer() as moto:
        lam, iam = moto.client("lambda"), moto.client("iam")
        role = resources._ensure_role(iam, "direct-test", "lambda.amazonaws.com")
        arns = {}
        for name, fn in [("echo", _echo), ("boom", _boom), ("big", _big)]:
            arns[name] = lam.create_function(
                FunctionName=f"direct-{name}", Role=role, PackageType="Image",
                Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}, Timeout=30,
            )["FunctionArn"]
            moto.dispatcher.register(f"direct-{name}", handler_path="", memory_mb=128, timeout_s=30, arn=arns[name],
                                     handler=fn)
        from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

        direct = lambda_eval_utils.boto_client_for(region=engine.REGION, service="lambda", state_credentials=None)
        assert isinstance(direct, engine.DirectLambdaClient)
        for name in ("echo", "boom", "big"):
            for function in (arns[name], f"direct-{name}"):
                payload = json.dumps({"a": 1}).encode()
                over_http = _answer(direct.client.invoke(FunctionName=function, Payload=payload))
                before = len(moto.dispatcher.invocations)
                got = _answer(direct.invoke(FunctionName=function, Payload=payload))
                assert len(moto.dispatcher.invocations) == before + 1  # it ran the handler, once
                if name == "echo":  # remaining_ms differs from call to call
                    assert json.loads(got["Payload"])["echo"] == json.loads(over_http["Payload"])["echo"] == {"a": 1}
                    got["Payload"] = over_http["Payload"] = b""
                if name == "boom":  # the stack trace's line numbers are the same, its ids too: compare the fields
                    g, h = json.loads(got.pop("Payload")), json.loads(over_http.pop("Payload"))
                    assert (g["errorType"], g["errorMessage"]) == (h["errorType"], h["errorMessage"]) == \
                        ("ValueError", "bad thing in handler")
                assert got == over_http, name
        assert got == {"StatusCode": 200, "FunctionError": "Unhandled",
                       "Payload": over_http["Payload"]} and b"Function.ResponseSizeTooLarge" in got["Payload"]
        # an unknown function: moto's own error, as over HTTP
        with pytest.raises(lam.exceptions.ResourceNotFoundException):
            direct.invoke(FunctionName="nope", Payload=b"{}")
        # a state machine task takes the direct path: the HTTP client is not asked
        def no_http(**params):
            raise AssertionError(f"Invoke over HTTP: {params}")

        direct.client.invoke = no_http
        definition = {"StartAt": "Echo", "States": {"Echo": {
            "Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "End": True,
            "Parameters": {"FunctionName": arns["echo"], "Payload.$": "$"}, "OutputPath": "$.Payload"}}}
        sm = resources.create_state_machine(moto, "direct-test", json.dumps(definition))
        sfn = moto.client("stepfunctions")
        desc = wait_execution(sfn, sfn.start_execution(stateMachineArn=sm, input=json.dumps({"b": 2}))["executionArn"], timeout=30)
        assert desc["status"] == "SUCCEEDED", desc
        assert json.loads(desc["output"])["echo"] == {"b": 2}


# ---------------------------------------------------------------------------------------------
# moto's server keeps connections alive (engine.kept_alive_connections)


def _http(moto):
    import http.client

    host, port = moto.endpoint.removeprefix("http://").split(":")
    return http.client.HTTPConnection(host, int(port), timeout=10)


def test_boto3_requests_share_kept_alive_connections_and_each_answer_is_moto_s():
    bucket = "stepwise-keep-alive"
    with engine.MotoServer() as moto:
        s3 = moto.client("s3")
        s3.create_bucket(Bucket=bucket)
        before = moto.connections.accepted
        for i in range(40):
            s3.put_object(Bucket=bucket, Key=f"k/{i}.json", Body=json.dumps({"i": i}).encode())
            assert json.loads(s3.get_object(Bucket=bucket, Key=f"k/{i}.json")["Body"].read()) == {"i": i}
        listed = s3.list_objects_v2(Bucket=bucket, Prefix="k/")["KeyCount"]
        with pytest.raises(s3.exceptions.NoSuchKey):
            s3.get_object(Bucket=bucket, Key="k/absent.json")
        accepted = moto.connections.accepted - before
        assert listed == 40
        assert accepted <= 2, f"81 sequential requests opened {accepted} connections"  # werkzeug alone: 82
    assert not moto.connections.open  # stop() shut the idle ones


def test_a_body_the_app_does_not_read_is_discarded_before_the_next_request_on_the_connection():
    with engine.MotoServer() as moto:
        conn = _http(moto)
        body = b"x" * (256 << 10)
        # no such bucket: moto answers before reading the body; its bytes must not become a request line
        conn.request("PUT", "/stepwise-no-such-bucket/k", body=body, headers={"Content-Length": str(len(body))})
        first = conn.getresponse()
        first.read()
        conn.request("PUT", "/stepwise-keep-alive-2", headers={"Content-Length": "0"})
        second = conn.getresponse()
        second.read()
        conn.request("GET", "/stepwise-keep-alive-2?list-type=2")
        third = conn.getresponse()
        listing = third.read()
        conn.close()
    assert first.status == 404 and first.getheader("Connection") != "close"
    assert second.status == 200 and third.status == 200 and b"<ListBucketResult" in listing


def test_a_chunked_request_keeps_werkzeug_s_close():
    with engine.MotoServer() as moto:
        conn = _http(moto)
        conn.request("PUT", "/stepwise-chunked")  # makes the bucket
        conn.getresponse().read()
        conn.request("PUT", "/stepwise-chunked/k", body=iter([b"ab", b"cd"]), encode_chunked=True,
                     headers={"Transfer-Encoding": "chunked"})
        answer = conn.getresponse()
        answer.read()
        conn.close()
        got = moto.client("s3").get_object(Bucket="stepwise-chunked", Key="k")["Body"].read()
    assert answer.status == 200 and answer.getheader("Connection") == "close"
    assert got == b"abcd"


def test_moto_s_asl_interpreter_shares_one_client_per_region_and_service():
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import (
        resource_eval_s3 as item_reader_s3,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval import (
        resource_eval_s3 as result_writer_s3,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    original = item_reader_s3.boto_client_for
    with engine.MotoServer():
        a = item_reader_s3.boto_client_for(region="us-east-1", service="s3")
        b = result_writer_s3.boto_client_for(region="us-east-1", service="s3", state_credentials=None)
        lam = lambda_eval_utils.boto_client_for(region="us-east-1", service="lambda")
        assert a is b and lam is not a
        assert isinstance(lam, engine.DirectLambdaClient)
    assert item_reader_s3.boto_client_for is original is result_writer_s3.boto_client_for


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=4096), following=st.binary(max_size=64),
       reads=st.lists(st.integers(min_value=1, max_value=5000), max_size=8), truncate=st.booleans())
def test_a_kept_alive_request_body_yields_exactly_its_length_and_leaves_the_next_request(body, following, reads,
                                                                                          truncate):
    """`engine._RequestBody` over arbitrary bodies, read in arbitrary sizes: the app gets a prefix of
    the body, never a byte past it; after `discard_rest` the connection's reader is at the next request,
    and a client that went away mid-body (``truncate``) marks the body ``eof``."""
    import io

    sent = body[: len(body) // 2] if truncate and body else body
    raw = io.BufferedReader(io.BytesIO(sent + (b"" if truncate and body else following)))
    reader = engine._RequestBody(raw, len(body))
    got = b"".join(reader.read(n) for n in reads)
    assert body.startswith(got)
    reader.discard_rest()
    assert reader.left == 0 and reader.read(10) == b""
    if truncate and body:
        assert reader.eof
    else:
        assert not reader.eof and raw.read() == following


def _beat(event, ctx):
    """Heartbeat the task ``event["beats"]`` times, 0.4 s apart, then resume it unless ``resume`` is false
    (from a thread, as the gateway beats)."""
    import threading

    token, beats = event["token"], event["beats"]

    def later():
        sfn = boto3.client("stepfunctions")
        for _ in range(beats):
            time.sleep(0.4)
            sfn.send_task_heartbeat(taskToken=token)
        if event.get("resume", True):
            time.sleep(0.4)
            sfn.send_task_success(taskToken=token, output=json.dumps({"beats": beats}))

    threading.Thread(target=later, daemon=True).start()
    return {}


def _start_result(event, ctx):
    s3 = boto3.client("s3")
    s3.put_object(Bucket=BUCKET, Key=f"tokens/{event['n']}.json", Body=event["token"].encode())
    s3.put_object(Bucket=BUCKET, Key=f"rollout-results/r/{event['n']}/s.json", Body=b"{}")
    return {}


def _resume(event, ctx):
    key = unquote_plus(event["Records"][0]["s3"]["object"]["key"])
    n = key.split("/")[2]
    token = boto3.client("s3").get_object(Bucket=BUCKET, Key=f"tokens/{n}.json")["Body"].read().decode()
    boto3.client("stepfunctions").send_task_success(taskToken=token, output=json.dumps({"n": n}))


def test_injected_throttling_delays_and_drops_and_heartbeats_answer_as_aws_would():
    """The drills' Lambda faults and the callback heartbeat, through moto's interpreter: a throttled
    function fails its task with Lambda.TooManyRequestsException (a lambda:invoke task and a task on the
    function's ARN alike) and runs nothing; a delayed S3 notification resumes its task late, a dropped
    one never (the task times out); a task whose heartbeats stop fails with States.HeartbeatTimeout,
    one that keeps beating outlives its HeartbeatSeconds."""
    with engine.MotoServer() as moto:
        lam, iam = moto.client("lambda"), moto.client("iam")
        role = resources._ensure_role(iam, "faults-test", "lambda.amazonaws.com")
        arns = {}
        for name, fn in [("echo", _echo), ("beat", _beat), ("start-result", _start_result), ("resume", _resume)]:
            arns[name] = lam.create_function(
                FunctionName=f"faults-{name}", Role=role, PackageType="Image",
                Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"}, Timeout=30,
            )["FunctionArn"]
            moto.dispatcher.register(f"faults-{name}", handler_path="", memory_mb=128, timeout_s=30, arn=arns[name],
                                     handler=fn)
        resources.create_bucket(moto, BUCKET, result_function_arn=arns["resume"])
        catch = [{"ErrorEquals": ["States.ALL"], "ResultPath": "$.error", "Next": "Done"}]
        wait = "arn:aws:states:::lambda:invoke.waitForTaskToken"
        states = {
            "Integration": {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke", "ResultPath": "$.a",
                            "Parameters": {"FunctionName": arns["echo"], "Payload": {"x": 1}},
                            "Catch": [{**catch[0], "ResultPath": "$.integration", "Next": "Direct"}], "Next": "Direct"},
            "Direct": {"Type": "Task", "Resource": arns["echo"], "ResultPath": "$.b", "Parameters": {"x": 2},
                       "Catch": [{**catch[0], "ResultPath": "$.direct", "Next": "Beating"}], "Next": "Beating"},
            "Beating": {"Type": "Task", "Resource": wait, "TimeoutSeconds": 20, "HeartbeatSecondsPath": "$.hb",
                        "Parameters": {"FunctionName": arns["beat"], "Payload": {"token.$": "$$.Task.Token", "beats": 4}},
                        "ResultPath": "$.beating", "Next": "Silent"},
            "Silent": {"Type": "Task", "Resource": wait, "TimeoutSeconds": 20, "HeartbeatSecondsPath": "$.hb",
                       "Parameters": {"FunctionName": arns["beat"], "Payload": {"token.$": "$$.Task.Token", "beats": 0, "resume": False}},
                       "ResultPath": "$.silent", "Catch": [{**catch[0], "ResultPath": "$.silent", "Next": "Late"}],
                       "Next": "Late"},
            "Late": {"Type": "Task", "Resource": wait, "TimeoutSeconds": 20,
                     "Parameters": {"FunctionName": arns["start-result"], "Payload": {"token.$": "$$.Task.Token", "n": "1"}},
                     "ResultPath": "$.late", "Next": "Lost"},
            "Lost": {"Type": "Task", "Resource": wait, "TimeoutSeconds": 2,
                     "Parameters": {"FunctionName": arns["start-result"], "Payload": {"token.$": "$$.Task.Token", "n": "2"}},
                     "ResultPath": "$.lost", "Catch": [{**catch[0], "ResultPath": "$.lost"}], "Next": "Done"},
            "Done": {"Type": "Pass", "End": True},
        }
        sm = resources.create_state_machine(moto, "faults-test", json.dumps({"StartAt": "Integration", "States": states}))
        faults = moto.dispatcher.faults
        faults.throttle("echo", 2)
        faults.delay_events("resume", 1.5, match=lambda e: "/1/" in unquote_plus(e["Records"][0]["s3"]["object"]["key"]))
        faults.drop_events("resume", match=lambda e: "/2/" in unquote_plus(e["Records"][0]["s3"]["object"]["key"]))
        sfn = moto.client("stepfunctions")
        arn = sfn.start_execution(stateMachineArn=sm, name="faults-1", input=json.dumps({"hb": 1}))["executionArn"]
        desc = wait_execution(sfn, arn, timeout=60)
    assert desc["status"] == "SUCCEEDED", desc
    out = json.loads(desc["output"])
    assert out["integration"]["Error"] == out["direct"]["Error"] == "Lambda.TooManyRequestsException"
    assert "a" not in out and "b" not in out
    assert faults.throttled == 2 and not [r for r in moto.dispatcher.invocations if r.function_name == "faults-echo"]
    assert out["beating"] == {"beats": 4}  # 2 s of beats every 0.4 s outlived HeartbeatSeconds 1
    assert out["silent"]["Error"] == "States.HeartbeatTimeout", out
    assert out["late"] == {"n": "1"} and faults.delayed == 1
    assert out["lost"]["Error"] == "States.Timeout" and faults.dropped == 1


def test_conditional_puts_of_one_key_are_atomic_as_on_s3(monkeypatch):
    """Two writers holding the same ETag: S3 lets one PutObject ``If-Match`` through and answers the other
    412 (a lost update is what the run state's conditional writes prevent). moto checks, then writes:
    `engine.atomic_object_writes` makes it one step. The write is slowed so both checks would pass first."""
    import threading

    from botocore.exceptions import ClientError
    from moto.s3.models import S3Backend

    bucket = "stepwise-engine-atomic-puts"
    original = S3Backend.put_object

    def slow_put(self, *args, **kwargs):
        time.sleep(0.3)
        return original(self, *args, **kwargs)

    with engine.MotoServer() as moto:
        s3 = moto.client("s3")
        s3.create_bucket(Bucket=bucket)
        etag = s3.put_object(Bucket=bucket, Key="runs/r/state.json", Body=b'{"v": 0}')["ETag"]
        monkeypatch.setattr(S3Backend, "put_object", slow_put)
        outcomes: list[str] = []

        def write(value: int) -> None:
            try:
                moto.client("s3").put_object(Bucket=bucket, Key="runs/r/state.json", Body=b'{"v": %d}' % value,
                                             IfMatch=etag)
                outcomes.append("written")
            except ClientError as e:
                outcomes.append(e.response["Error"]["Code"])

        writers = [threading.Thread(target=write, args=(v,)) for v in (1, 2)]
        for t in writers:
            t.start()
        for t in writers:
            t.join()
    assert sorted(outcomes) == ["PreconditionFailed", "written"]


def _answer_before_returning(event, ctx):
    """Send the task's outcome (success, failure) or a heartbeat, then success, before this Lambda returns,
    as an agent that finishes while StartRollout is still returning does."""
    sfn = boto3.client("stepfunctions")
    token = event["token"]
    if event["how"] == "failure":
        sfn.send_task_failure(taskToken=token, error="AgentFailed", cause="before the task waited")
    elif event["how"] == "heartbeat":  # taken at once, then the outcome from a thread, later
        import threading

        sfn.send_task_heartbeat(taskToken=token)
        threading.Timer(0.5, lambda: sfn.send_task_success(taskToken=token, output='{"how": "heartbeat"}')).start()
    else:
        sfn.send_task_success(taskToken=token, output=json.dumps({"how": event["how"]}))
    return {}


def _early_answer_machine(moto, name):
    lam, iam = moto.client("lambda"), moto.client("iam")
    role = resources._ensure_role(iam, "early-test", "lambda.amazonaws.com")
    arn = lam.create_function(FunctionName=name, Role=role, PackageType="Image", Timeout=30,
                              Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"})["FunctionArn"]
    moto.dispatcher.register(name, handler_path="", memory_mb=128, timeout_s=30, arn=arn,
                             handler=_answer_before_returning)
    wait = "arn:aws:states:::lambda:invoke.waitForTaskToken"

    def task(how, nxt):
        return {"Type": "Task", "Resource": wait, "TimeoutSeconds": 6, "HeartbeatSeconds": 4,
                "Parameters": {"FunctionName": arn, "Payload": {"token.$": "$$.Task.Token", "how": how}},
                "ResultPath": f"$.{how}", "Next": nxt,
                "Catch": [{"ErrorEquals": ["States.ALL"], "ResultPath": f"$.{how}", "Next": nxt}]}

    states = {"Success": task("success", "Failure"), "Failure": task("failure", "Heartbeat"),
              "Heartbeat": task("heartbeat", "Done"), "Done": {"Type": "Pass", "End": True}}
    return resources.create_state_machine(moto, name, json.dumps({"StartAt": "Success", "States": states}))


def test_an_outcome_sent_before_the_task_waits_ends_the_task_at_once():
    """The local engine never loses a wake-up (engine.early_task_outcomes): a callback task with a heartbeat
    whose Lambda sends SendTaskSuccess or SendTaskFailure before it returns ends with that outcome at once, as
    on AWS (moto 5.2.5 alone stores it, makes the heartbeat wait after, and ends the task with States.Timeout
    at its TimeoutSeconds); an early SendTaskHeartbeat is taken, not refused as InvalidToken."""
    with engine.MotoServer() as moto:
        sfn = moto.client("stepfunctions")
        sm = _early_answer_machine(moto, "early-answer")
        started = time.monotonic()
        desc = wait_execution(sfn, sfn.start_execution(stateMachineArn=sm, name="early-1", input="{}")["executionArn"],
                              timeout=60)
        took = time.monotonic() - started
    out = json.loads(desc["output"])
    assert out["success"] == {"how": "success"}, out
    assert out["failure"]["Error"] == "AgentFailed", out
    assert out["heartbeat"] == {"how": "heartbeat"}, out
    assert took < 4, f"an answered task waited {took:.1f} s (its heartbeat is 4 s, its timeout 6 s)"


def test_without_the_fix_moto_loses_the_early_outcome():
    """The moto behaviour `early_task_outcomes` exists for: with it undone, the same answered task ends with
    its timeout. If this fails, moto fixed it upstream: drop the patch (and this test)."""
    from moto.stepfunctions.parser.asl.eval.callback import callback

    with engine.MotoServer() as moto:
        endpoint = callback.CallbackEndpoint
        patched = endpoint.setup_heartbeat_endpoint, endpoint.notify_heartbeat
        endpoint.setup_heartbeat_endpoint = patched[0].__stepwise_original__
        endpoint.notify_heartbeat = patched[1].__stepwise_original__
        try:
            sfn = moto.client("stepfunctions")
            sm = _early_answer_machine(moto, "early-lost")
            desc = wait_execution(sfn, sfn.start_execution(stateMachineArn=sm, name="lost-1", input="{}")["executionArn"],
                                  timeout=60)
        finally:
            endpoint.setup_heartbeat_endpoint, endpoint.notify_heartbeat = patched
    out = json.loads(desc["output"])
    assert out["success"]["Error"] in ("States.Timeout", "States.HeartbeatTimeout"), out
    assert "InvalidToken" in json.dumps(out["heartbeat"]), out


def test_a_new_execution_can_read_as_not_existing_for_a_while_as_step_functions_eventual_reads_allow():
    """`InvocationFaults.hide_new_executions`: DescribeExecution of an execution younger than the window
    answers ExecutionDoesNotExist (boto3's modelled error, as Step Functions answers), then its real
    status; an execution outside ``match``, and one that does not exist at all, answer as moto does."""
    with engine.MotoServer() as moto:
        sm = resources.create_state_machine(moto, "unseen-test", json.dumps(
            {"StartAt": "Wait", "States": {"Wait": {"Type": "Wait", "Seconds": 30, "End": True}}}))
        sfn = moto.client("stepfunctions")
        moto.dispatcher.faults.hide_new_executions(1.5, match=lambda arn: arn.endswith("--1"))
        hidden = sfn.start_execution(stateMachineArn=sm, name="run--1")["executionArn"]
        seen = sfn.start_execution(stateMachineArn=sm, name="run")["executionArn"]
        with pytest.raises(sfn.exceptions.ExecutionDoesNotExist):
            sfn.describe_execution(executionArn=hidden)
        assert sfn.describe_execution(executionArn=seen)["status"] == "RUNNING"
        with pytest.raises(sfn.exceptions.ExecutionDoesNotExist):
            sfn.describe_execution(executionArn=hidden.replace("run--1", "never-started"))
        time.sleep(1.6)
        assert sfn.describe_execution(executionArn=hidden)["status"] == "RUNNING"
        assert moto.dispatcher.faults.unseen == 1
        for arn in (hidden, seen):
            sfn.stop_execution(executionArn=arn)


def _never_answered(event, ctx):
    return {}  # the task waits for a token nobody sends (an agent still working)


def _inline_wait_machine(moto, name):
    """An inline Map whose iterations wait for a task token (the rollout group's shape)."""
    lam, iam = moto.client("lambda"), moto.client("iam")
    role = resources._ensure_role(iam, "stop-test", "lambda.amazonaws.com")
    arn = lam.create_function(FunctionName=name, Role=role, PackageType="Image", Timeout=30,
                              Code={"ImageUri": "123456789012.dkr.ecr.us-east-1.amazonaws.com/x:1"})["FunctionArn"]
    moto.dispatcher.register(name, handler_path="", memory_mb=128, timeout_s=30, arn=arn, handler=_never_answered)
    wait = {"Type": "Task", "Resource": "arn:aws:states:::lambda:invoke.waitForTaskToken", "TimeoutSeconds": 30,
            "Parameters": {"FunctionName": arn, "Payload": {"token.$": "$$.Task.Token"}},
            "Catch": [{"ErrorEquals": ["States.ALL"], "Next": "Done"}], "Next": "Done"}
    definition = {"StartAt": "Map", "States": {"Map": {
        "Type": "Map", "ItemsPath": "$.items", "End": True,
        "ItemProcessor": {"ProcessorConfig": {"Mode": "INLINE"}, "StartAt": "Wait",
                          "States": {"Wait": wait, "Done": {"Type": "Pass", "End": True}}}}}}
    return resources.create_state_machine(moto, name, json.dumps(definition))


def _stop_and_time(moto, sm: str, name: str) -> tuple[str, float]:
    sfn = moto.client("stepfunctions")
    arn = sfn.start_execution(stateMachineArn=sm, name=name, input='{"items": [1, 2]}')["executionArn"]
    time.sleep(1.0)  # both iterations wait for their token
    sfn.stop_execution(executionArn=arn, error="Stopped", cause="test")
    started = time.monotonic()
    while time.monotonic() - started < 8 and sfn.describe_execution(executionArn=arn)["status"] == "RUNNING":
        time.sleep(0.1)
    return sfn.describe_execution(executionArn=arn)["status"], time.monotonic() - started


def test_a_stopped_execution_whose_inline_map_waits_for_task_tokens_ends_aborted_at_once():
    """engine.stops_wake_callback_tasks: StopExecution of an execution waiting for task tokens in an inline
    Map (a rollout group of the group engine) ends it ABORTED at once, as on AWS."""
    with engine.MotoServer() as moto:
        status, took = _stop_and_time(moto, _inline_wait_machine(moto, "inline-stop"), "stop-1")
    assert (status, took < 5) == ("ABORTED", True), (status, took)


def test_without_the_fix_moto_keeps_a_stopped_inline_map_running_until_its_tasks_time_out():
    """The moto behaviour `stops_wake_callback_tasks` exists for. If this fails, moto fixed it upstream:
    drop the patch (and this test)."""
    from moto.stepfunctions.parser.backend import execution

    with engine.MotoServer() as moto:
        cls, comm = execution.Execution, execution.BaseExecutionWorkerCommunication
        patched = cls.stop, comm._reflect_execution_status
        cls.stop, comm._reflect_execution_status = (patched[0].__stepwise_original__,
                                                    patched[1].__stepwise_original__)
        try:
            status, _ = _stop_and_time(moto, _inline_wait_machine(moto, "inline-stop-plain"), "stop-2")
        finally:
            cls.stop, comm._reflect_execution_status = patched
    assert status == "RUNNING"
