"""The moto seam: the local Step Functions engine and S3, with the Lambda invoke seam.

One moto server (``ThreadedMotoServer``) on a loopback port serves every AWS service the
pipeline uses (S3, Step Functions, Lambda, IAM/STS), so other threads and other processes
(the gateway, the agent apps) reach the same bucket. Step Functions execution is enabled
(moto's ASL interpreter, ported from LocalStack). Every Lambda invocation -- a state
machine ``lambda:invoke`` task and an S3 ``ObjectCreated`` notification alike -- goes
through moto's ``LambdaFunction.invoke(body, request_headers, response_headers)`` (moto 5.2.5,
``moto/awslambda/models.py``); we replace that one method with an in-process call of the
real handler from ``stepwise.functions``. This module is the only place that knows moto's
internals; ``tests/local/test_engine_contract.py`` fails loudly when a moto upgrade moves them.

Its parts of the local stack's other jobs live beside it: the dispatch of each invocation to its handler,
under Lambda's limits and the drills' faults (`local.dispatch`), the S3 requests counted by kind
(`local.s3_requests`), the stack's resources made in this server (`local.resources`). Not emulated:
EventBridge does not deliver to Lambda targets in moto, so the local runner calls Cleanup itself on
abnormal ends. docs/internals.md lists the remaining differences.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import io
import json
import logging
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from botocore.config import Config

from local._proc import EnvChanges
# the dispatch and the request log were parts of this module: their names are still read from here
from local.dispatch import (Handler, InvocationFaults, InvocationRecord, LambdaContext, LambdaDispatcher,  # noqa: F401
                            LambdaThrottled, run_handler)
from local.s3_requests import S3RequestLog, s3_request_kind  # noqa: F401

log = logging.getLogger(__name__)

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"  # moto's default account
#: boto3 service name -> the suffix of its ``AWS_ENDPOINT_URL_*`` variable (botocore's
#: service id, upper-cased, spaces as underscores: Step Functions is ``SFN``). SNS, Secrets Manager and
#: CloudFormation too: the handlers call them when the environment names a topic, a secret or a stack,
#: and the local stack must never reach AWS (`local.no_aws`).
MOTO_SERVICES = {
    "s3": "S3", "stepfunctions": "SFN", "lambda": "LAMBDA", "iam": "IAM", "sts": "STS",
    "events": "EVENTBRIDGE", "cloudwatch": "CLOUDWATCH", "logs": "CLOUDWATCH_LOGS",
    "sns": "SNS", "secretsmanager": "SECRETS_MANAGER", "cloudformation": "CLOUDFORMATION",
}

#: The exact signature of the moto method we replace (moto 5.2.5). If moto changes it, the
#: seam is broken and we refuse to start rather than silently echoing payloads.
_EXPECTED_INVOKE_PARAMS = ("self", "body", "request_headers", "response_headers")


class SeamBroken(RuntimeError):
    """moto's internals no longer match what the local engine patches (pin or port the seam)."""


def moto_invoke_target() -> Any:
    """The moto class whose ``invoke`` we replace (``moto.awslambda.models.LambdaFunction``)."""
    from moto.awslambda import models

    return models.LambdaFunction


def check_seam() -> None:
    """Raise SeamBroken if moto's invoke seam is not the one this module was written against."""
    cls = moto_invoke_target()
    invoke = getattr(cls, "invoke", None)
    if invoke is None:
        raise SeamBroken("moto.awslambda.models.LambdaFunction.invoke is gone")
    original = getattr(invoke, "__stepwise_original__", invoke)
    params = tuple(inspect.signature(original).parameters)
    if params != _EXPECTED_INVOKE_PARAMS:
        raise SeamBroken(
            f"moto LambdaFunction.invoke signature changed: {params}, expected {_EXPECTED_INVOKE_PARAMS}; "
            "port local/engine.py to the new moto"
        )
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    lookup = getattr(DomainDispatcherApplication, "get_backend_for_host", None)
    lookup = getattr(lookup, "__stepwise_original__", lookup)
    if lookup is None or tuple(inspect.signature(lookup).parameters) != ("self", "host"):
        raise SeamBroken("moto's DomainDispatcherApplication.get_backend_for_host(self, host) changed; "
                         "port local/engine.py's cached_backend_lookup")
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    if "boto_client_for(" not in inspect.getsource(lambda_eval_utils._invoke_lambda_function):
        raise SeamBroken("moto's lambda:invoke integration no longer calls boto_client_for; "
                         "port local/engine.py's cached_asl_clients")
    from moto.awslambda.models import LambdaBackend

    if tuple(inspect.signature(LambdaBackend.get_function).parameters)[:3] != ("self", "function_name_or_arn", "qualifier"):
        raise SeamBroken("moto's LambdaBackend.get_function(function_name_or_arn, qualifier) changed; "
                         "port local/engine.py's DirectLambdaClient")
    from moto.stepfunctions.parser import models as sfn_models
    from moto.stepfunctions.parser.asl.eval.callback import callback

    success = getattr(sfn_models.StepFunctionsParserBackend.send_task_success, "__stepwise_original__",
                      sfn_models.StepFunctionsParserBackend.send_task_success)
    heartbeat = getattr(sfn_models.StepFunctionsParserBackend.send_task_heartbeat, "__stepwise_original__",
                        sfn_models.StepFunctionsParserBackend.send_task_heartbeat)
    if ("_get_executions(" not in inspect.getsource(success) or "_get_executions(" not in inspect.getsource(heartbeat)
            or tuple(inspect.signature(callback.CallbackPoolManager.notify).parameters) != ("self", "callback_id", "outcome")
            or tuple(inspect.signature(callback.CallbackPoolManager.heartbeat).parameters) != ("self", "callback_id")):
        raise SeamBroken("moto's send_task_success / CallbackPoolManager changed; port local/engine.py's indexed_task_tokens")
    endpoint = callback.CallbackEndpoint
    setup = getattr(endpoint.setup_heartbeat_endpoint, "__stepwise_original__", endpoint.setup_heartbeat_endpoint)
    beat = getattr(endpoint.notify_heartbeat, "__stepwise_original__", endpoint.notify_heartbeat)
    if (tuple(inspect.signature(setup).parameters) != ("self", "heartbeat_seconds")
            or tuple(inspect.signature(beat).parameters) != ("self",)
            or "self._heartbeat_endpoint" not in inspect.getsource(endpoint.notify)
            or "self._outcome = outcome" not in inspect.getsource(endpoint.notify)):
        raise SeamBroken("moto's CallbackEndpoint (notify, setup_heartbeat_endpoint, notify_heartbeat) changed; "
                         "port local/engine.py's early_task_outcomes")
    from moto.stepfunctions.parser.backend import execution

    stop = getattr(execution.Execution.stop, "__stepwise_original__", execution.Execution.stop)
    reflect = execution.BaseExecutionWorkerCommunication._reflect_execution_status
    reflect = getattr(reflect, "__stepwise_original__", reflect)
    if (tuple(inspect.signature(stop).parameters) != ("self", "stop_date", "error", "cause")
            or "ExecutionStatus.FAILED" not in inspect.getsource(reflect)
            or "self._pool" not in inspect.getsource(callback.CallbackPoolManager.__init__)
            or "def interrupt_all" not in inspect.getsource(endpoint)):
        raise SeamBroken("moto's Execution.stop / CallbackPoolManager / CallbackEndpoint.interrupt_all changed; "
                         "port local/engine.py's stops_wake_callback_tasks")
    from moto.stepfunctions.responses import StepFunctionResponse

    history = getattr(StepFunctionResponse.get_execution_history, "__stepwise_original__",
                      StepFunctionResponse.get_execution_history)
    if "get_execution_history(" not in inspect.getsource(history):
        raise SeamBroken("moto's StepFunctionResponse.get_execution_history changed; port local/engine.py's "
                         "paged_execution_history")
    describe = getattr(StepFunctionResponse.describe_execution, "__stepwise_original__",
                       StepFunctionResponse.describe_execution)
    from moto.stepfunctions import models as sfn_base_models

    from moto.stepfunctions.parser.backend.execution import Execution as ParserExecution

    if ("stepfunction_backend.describe_execution(" not in inspect.getsource(describe)
            or "self.start_date = " not in inspect.getsource(sfn_base_models.Execution.__init__)
            or "start_date" not in inspect.getsource(ParserExecution.__init__)):
        raise SeamBroken("moto's StepFunctionResponse.describe_execution changed; port local/engine.py's "
                         "unseen_new_executions")
    for name in _JSONPATH_MODULES:
        if not callable(getattr(importlib.import_module(name), "parse", None)):
            raise SeamBroken(f"{name} no longer calls jsonpath_ng's parse; port local/engine.py's cached_json_paths")
    from moto.s3 import notifications

    if "func.invoke(" not in inspect.getsource(notifications._invoke_awslambda):
        raise SeamBroken("moto's S3 notifications no longer call LambdaFunction.invoke; port local/engine.py")


@contextlib.contextmanager
def _replaced(owner: Any, name: str, replacement: Callable[..., Any]) -> Iterator[Any]:
    """Set ``owner.name`` to ``replacement`` for the duration (the original kept on it as
    ``__stepwise_original__``, which `check_seam` reads); yields the original."""
    original = getattr(owner, name)
    replacement.__stepwise_original__ = original  # type: ignore[attr-defined]
    setattr(owner, name, replacement)
    try:
        yield original
    finally:
        setattr(owner, name, original)


@contextlib.contextmanager
def patched_lambda_invoke(dispatcher: LambdaDispatcher) -> Iterator[None]:
    """Replace moto's ``LambdaFunction.invoke`` with ``dispatcher`` for the duration."""
    check_seam()

    def invoke(self: Any, body: Any, request_headers: Any, response_headers: Any) -> bytes:
        return dispatcher.invoke_from_moto(self.function_name, body, request_headers, response_headers)

    with _replaced(moto_invoke_target(), "invoke", invoke):
        yield


@contextlib.contextmanager
def cached_backend_lookup() -> Iterator[None]:
    """Memoize moto's per-request backend lookup (``DomainDispatcherApplication.get_backend_for_host``).

    moto's server resolves every request's backend under one process-wide lock, and the lookup
    lists moto's package directory (``list_of_moto_modules``: a listdir plus an isdir per module)
    and tries every service URL pattern: ~1-3 ms idle, ~10 ms on a loaded 2-core machine, so the
    whole local stack (S3, Step Functions, Lambda) was capped near 100 requests/s. The answer
    depends only on the host string, so it is cached per host for the server's life.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.get_backend_for_host
    cache: dict[Any, Any] = {}

    def get_backend_for_host(self: Any, host: Any) -> Any:
        try:
            return cache[host]
        except KeyError:
            backend = cache[host] = original(self, host)
            return backend

    with _replaced(DomainDispatcherApplication, "get_backend_for_host", get_backend_for_host):
        yield


@contextlib.contextmanager
def atomic_object_writes() -> Iterator[None]:
    """Make moto's PutObject one step, as S3's is: its ``If-Match`` / ``If-None-Match`` check and the
    write happen under one lock (S3 user guide, "conditional writes": the write fails with 412 when
    the object changed), and the new object's ETag is read before another PUT of the key replaces it.

    moto's ``S3Response.put_object`` checks the condition, then writes, then reads the new object's
    ETag for the response, on the threaded server's request threads: two writers of ``state.json``
    holding the same ETag could both pass the check (a lost update the conditional write exists to
    prevent), and a second PUT of a key closes the first one's buffer before its ETag is read
    (``ValueError: I/O operation on closed file``, HTTP 500, on concurrent writes of a run's report page).
    """
    from moto.s3.responses import S3Response

    original = S3Response.put_object
    if tuple(inspect.signature(original).parameters) != ("self",):
        raise SeamBroken("moto's S3Response.put_object(self) changed; port local/engine.py's atomic_object_writes")
    lock = threading.Lock()

    def put_object(self: Any) -> Any:
        with lock:
            return original(self)

    with _replaced(S3Response, "put_object", put_object):
        yield


@contextlib.contextmanager
def paged_execution_history() -> Iterator[None]:
    """Make moto's GetExecutionHistory honour ``reverseOrder`` and ``maxResults`` as Step Functions does.

    moto 5.2.5 ignores both (it always answers every event, oldest first, with no ``nextToken``);
    PlanStep reads the history's length as the newest event's id with ``reverseOrder=True,
    maxResults=1``, one small call on AWS. Without this the local answer is correct (PlanStep takes
    the largest id it is given) but grows with the history.
    """
    from moto.core.responses import ActionResult
    from moto.stepfunctions.responses import StepFunctionResponse

    original = StepFunctionResponse.get_execution_history

    def get_execution_history(self: Any) -> Any:
        result = original(self)
        history = dict(result.result)
        events = list(history.get("events") or [])
        if self._get_param("reverseOrder"):
            events.reverse()
        limit = self._get_int_param("maxResults")
        if limit:
            events = events[:limit]
        history["events"] = events
        return ActionResult(history)

    with _replaced(StepFunctionResponse, "get_execution_history", get_execution_history):
        yield


@contextlib.contextmanager
def unseen_new_executions(faults: InvocationFaults) -> Iterator[None]:
    """Let a drill make DescribeExecution eventually consistent (`InvocationFaults.hide_new_executions`):
    an execution younger than the armed window answers ExecutionDoesNotExist, as Step Functions may
    answer for an execution just started. moto always sees its executions at once; with nothing armed
    this changes nothing."""
    import datetime

    from moto.core.utils import utcnow
    from moto.stepfunctions.exceptions import ExecutionDoesNotExist
    from moto.stepfunctions.responses import StepFunctionResponse

    original = StepFunctionResponse.describe_execution

    def describe_execution(self: Any) -> Any:
        arn = self._get_param("executionArn")
        hidden = faults.hidden_for(arn)
        if hidden > 0:
            execution = self.stepfunction_backend.describe_execution(arn)  # one that really does not exist raises
            started = execution.start_date  # aware in the ASL interpreter's executions, naive in moto's own
            if (utcnow() - started.replace(tzinfo=None) if started.tzinfo is None
                    else datetime.datetime.now(datetime.timezone.utc) - started).total_seconds() < hidden:
                faults.count_unseen()
                raise ExecutionDoesNotExist(f"Execution Does Not Exist: '{arn}'")
        return original(self)

    with _replaced(StepFunctionResponse, "describe_execution", describe_execution):
        yield


#: Lambda's limit on a synchronous invocation's response payload (moto's LambdaResponse checks the same).
_MAX_SYNC_PAYLOAD = 6_000_000


class DirectLambdaClient:
    """The Lambda client moto's ASL interpreter gets: ``invoke`` calls the function's (patched)
    ``LambdaFunction.invoke`` in this process instead of a signed HTTP request to this same server.

    Over HTTP each ``lambda:invoke`` task cost botocore's serialization and SigV4 signing, a werkzeug
    request thread, Flask routing and moto's response parsing, all in the run-local process, twice
    per rollout (StartRollout, FinishRollout). The answer is the one boto3 would parse from moto's
    response: ``StatusCode`` 200, ``Payload`` (a stream of the handler's bytes), ``FunctionError``
    when the handler failed, a payload over 6 MB replaced by moto's ``Function.ResponseSizeTooLarge``
    error. A function moto does not know, a qualifier, or any other call goes to ``client`` (a real
    boto3 Lambda client), so its errors are moto's own.
    """

    def __init__(self, client: Any, region: str) -> None:
        self.client = client
        self.region = region
        self.meta = client.meta

    def invoke(self, **params: Any) -> dict[str, Any]:
        import io

        from moto.awslambda.models import lambda_backends

        name = str(params.get("FunctionName", ""))
        if set(params) - {"FunctionName", "Payload", "InvocationType"} or \
                params.get("InvocationType", "RequestResponse") != "RequestResponse":
            return self.client.invoke(**params)
        parts = name.split(":")
        account = parts[4] if name.startswith("arn:") and len(parts) > 4 else ACCOUNT_ID
        region = parts[3] if name.startswith("arn:") and len(parts) > 3 else self.region
        try:
            function = lambda_backends[account][region].get_function(name, None)
        except Exception:  # unknown function or bad name: moto's own answer, over HTTP
            return self.client.invoke(**params)
        body = params.get("Payload") or b""
        headers: dict[str, str] = {}
        try:
            payload = function.invoke(body.decode() if isinstance(body, bytes) else body,
                                      {"x-amz-invocation-type": "RequestResponse"}, headers)
        except LambdaThrottled as exc:  # Lambda's answer to a throttled Invoke
            from botocore.exceptions import ClientError

            raise ClientError({"Error": {"Code": "TooManyRequestsException", "Message": str(exc)},
                               "ResponseMetadata": {"HTTPStatusCode": 429, "RequestId": str(uuid.uuid4())}},
                              "Invoke") from None
        payload = payload if isinstance(payload, bytes) else str(payload).encode()
        response: dict[str, Any] = {"StatusCode": 200}
        if len(payload) > _MAX_SYNC_PAYLOAD:
            headers["x-amz-function-error"] = "Unhandled"
            payload = json.dumps({"errorMessage": "Response payload size exceeded maximum allowed payload size "
                                  "(6291556 bytes).", "errorType": "Function.ResponseSizeTooLarge"}).encode()
        if headers.get("x-amz-function-error"):
            response["FunctionError"] = headers["x-amz-function-error"]
        response["Payload"] = io.BytesIO(payload)
        return response

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


@contextlib.contextmanager
def cached_asl_clients() -> Iterator[None]:
    """One client per region and service for moto's ASL interpreter; Lambda's invokes in-process
    (`DirectLambdaClient`).

    moto's ``lambda:invoke`` task integration builds a new boto3 client for every task, and the
    Distributed Map's S3 ItemReader and ResultWriter one per read or write (``boto_client_for``; it
    ignores the state's credentials and uses fixed dummy ones): the Lambda clients cost ~6% of this
    process's GIL time at 64 rollouts per step, the ItemReader's S3 clients ~3% of its CPU samples
    (py-spy). boto3 clients are thread-safe, so the interpreter's task threads share one per region
    and service; the Lambda client's ``invoke`` skips the HTTP round trip.
    """
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.item_reader.eval import (
        resource_eval_s3 as item_reader_s3,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_map.result_writer.resource_eval import (
        resource_eval_s3 as result_writer_s3,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task import lambda_eval_utils

    modules = (lambda_eval_utils, item_reader_s3, result_writer_s3)
    originals = [m.boto_client_for for m in modules]
    original = originals[0]
    if any(o is not original for o in originals):
        raise SeamBroken("moto's ASL modules no longer share asl.utils.boto_client.boto_client_for")
    clients: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()

    def boto_client_for(region: str, service: str, state_credentials: Any = None) -> Any:
        with lock:
            key = (region, service)
            if key not in clients:
                client = with_pool(original(region=region, service=service, state_credentials=state_credentials))
                clients[key] = DirectLambdaClient(client, region) if service == "lambda" else client
            return clients[key]

    for m in modules:
        m.boto_client_for = boto_client_for
    try:
        yield
    finally:
        for m in modules:
            m.boto_client_for = original


@contextlib.contextmanager
def indexed_task_tokens() -> Iterator[None]:
    """``SendTaskSuccess`` and ``SendTaskHeartbeat`` by an index of task tokens instead of a scan of
    every execution.

    moto 5.2.5's ``StepFunctionsParserBackend.send_task_success`` (and ``send_task_heartbeat``) lists
    every execution of every state machine ever started in the process (``_get_executions``), keeps
    the running ones and asks each one's ``CallbackPoolManager`` for the token: linear in executions
    per call, on every rollout's critical path (and on every heartbeat the gateway sends). Here
    ``CallbackPoolManager.add`` also records token -> manager, and the execution owning a manager is
    found once (the first token of that manager); the call then notifies that one manager, with moto's
    own outcome and errors. A token the index does not know (or whose execution is no longer running)
    takes moto's own path, so its answer is unchanged. A second SendTaskSuccess for a task that already
    has its outcome is refused with ``TaskTimedOut``, as AWS answers (moto 5.2.5 accepts it and drops the
    output). The upstream fix: keep a ``{callback_id:
    execution}`` dict in the backend, filled where the callback endpoint is added, and look the token
    up in it in send_task_success/failure/heartbeat.
    """
    import weakref

    from moto.stepfunctions.parser import models
    from moto.stepfunctions.parser.asl.eval.callback import callback

    manager_cls, backend_cls = callback.CallbackPoolManager, models.StepFunctionsParserBackend
    original_add, original_success = manager_cls.add, backend_cls.send_task_success
    original_heartbeat = backend_cls.send_task_heartbeat
    managers: "weakref.WeakValueDictionary[str, Any]" = weakref.WeakValueDictionary()
    owners: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
    closing = threading.Lock()  # a task's first outcome wins, a second is refused (send_task_success)

    def add(self: Any, callback_id: str) -> Any:
        endpoint = original_add(self, callback_id)
        managers[callback_id] = self
        return endpoint

    def running_manager(backend: Any, task_token: str) -> Any:
        """The callback manager of the running execution that owns ``task_token``; None: ask moto."""
        manager = managers.get(task_token)
        execution = owners.get(manager) if manager is not None else None
        if manager is not None and execution is None:
            for ex in backend._get_executions():
                worker = ex.exec_worker
                if worker is not None and worker.env.callback_pool_manager is manager:
                    execution = owners[manager] = ex
                    break
        if execution is None or execution.status != models.ExecutionStatus.RUNNING:
            return None
        return manager

    def closed(kind: str) -> Exception:
        # moto 5.2.5's own TaskTimedOut() / TaskDoesNotExist() cannot be raised (their base class needs a
        # message and takes the error type from a TYPE they lack: a 500 reaches the client); the same
        # error as AWS names it
        from moto.core.exceptions import AWSError

        message = {"TaskTimedOut": "Task Timed Out: the task associated with the token has already been closed",
                   "TaskDoesNotExist": "Task Does Not Exist"}[kind]
        return AWSError(message, exception_type=kind, status=400)

    def answered(call: Callable[[], bool]) -> bool:
        try:
            return call()
        except models.CallbackNotifyConsumerError as consumer_error:
            if isinstance(consumer_error, models.CallbackConsumerTimeout):
                raise closed("TaskTimedOut") from None
            raise closed("TaskDoesNotExist") from None

    def send_task_success(self: Any, task_token: str, outcome: str) -> Any:
        manager = running_manager(self, task_token)
        if manager is not None:
            with closing:
                endpoint = manager.get(task_token)
                if endpoint is not None and endpoint.get_outcome() is not None:
                    # AWS: TaskTimedOut, "the task associated with the token has already been closed";
                    # moto takes the second outcome and drops it (a duplicate S3 notification's
                    # SendTaskSuccess would look delivered while its output reaches nobody)
                    raise closed("TaskTimedOut")
                if answered(lambda: manager.notify(callback_id=task_token, outcome=models.CallbackOutcomeSuccess(
                        callback_id=task_token, output=outcome))):
                    return None
        return original_success(self, task_token, outcome)

    def send_task_heartbeat(self: Any, task_token: str) -> Any:
        manager = running_manager(self, task_token)
        if manager is not None and answered(lambda: manager.heartbeat(callback_id=task_token)):
            return None
        return original_heartbeat(self, task_token)

    send_task_success.__stepwise_original__ = original_success  # type: ignore[attr-defined]
    send_task_heartbeat.__stepwise_original__ = original_heartbeat  # type: ignore[attr-defined]
    manager_cls.add, backend_cls.send_task_success = add, send_task_success
    backend_cls.send_task_heartbeat = send_task_heartbeat
    try:
        yield
    finally:
        manager_cls.add, backend_cls.send_task_success = original_add, original_success
        backend_cls.send_task_heartbeat = original_heartbeat


@contextlib.contextmanager
def early_task_outcomes() -> Iterator[None]:
    """A task-token outcome or heartbeat that arrives before the interpreter waits for it ends (or
    extends) the task at once, as on AWS.

    moto 5.2.5's callback task (``StateTaskServiceCallback._eval_integration_pattern``) makes the
    task's ``HeartbeatEndpoint`` only after the task's Lambda has returned. A SendTaskSuccess or
    SendTaskFailure that lands before that (the agent answered while StartRollout was still
    returning) stores its outcome on the ``CallbackEndpoint`` and wakes nobody: the new heartbeat
    endpoint starts unset, so the task then waits for a heartbeat that never comes and ends with its
    timeout (``States.Timeout``). A SendTaskHeartbeat in that window finds no heartbeat endpoint and
    is refused as ``InvalidToken``. Here the endpoint, when it is made, is notified at once if an
    outcome or a heartbeat came first, and an early heartbeat is taken (AWS takes a heartbeat for any
    running task). Either order of the two threads notifies: ``notify`` stores the outcome before it
    reads ``_heartbeat_endpoint``, and the endpoint is stored before the outcome is read here.

    The upstream fix (moto's ``CallbackEndpoint``): in ``setup_heartbeat_endpoint``, set the new
    endpoint's event when ``_outcome`` is already set (or a heartbeat was recorded), and let
    ``notify_heartbeat`` record a heartbeat that comes before the endpoint exists.
    """
    from moto.stepfunctions.parser.asl.eval.callback import callback

    endpoint_cls = callback.CallbackEndpoint
    original_setup, original_beat = endpoint_cls.setup_heartbeat_endpoint, endpoint_cls.notify_heartbeat

    def setup_heartbeat_endpoint(self: Any, heartbeat_seconds: int) -> Any:
        endpoint = original_setup(self, heartbeat_seconds)
        if self.get_outcome() is not None or getattr(self, "_stepwise_early_heartbeat", False):
            endpoint.notify()
        return endpoint

    def notify_heartbeat(self: Any) -> bool:
        if original_beat(self):
            return True
        self._stepwise_early_heartbeat = True
        if self._heartbeat_endpoint is not None:  # made meanwhile: it may have missed the flag
            self._heartbeat_endpoint.notify()
        return True

    setup_heartbeat_endpoint.__stepwise_original__ = original_setup  # type: ignore[attr-defined]
    notify_heartbeat.__stepwise_original__ = original_beat  # type: ignore[attr-defined]
    endpoint_cls.setup_heartbeat_endpoint, endpoint_cls.notify_heartbeat = setup_heartbeat_endpoint, notify_heartbeat
    try:
        yield
    finally:
        endpoint_cls.setup_heartbeat_endpoint, endpoint_cls.notify_heartbeat = original_setup, original_beat


@contextlib.contextmanager
def stops_wake_callback_tasks() -> Iterator[None]:
    """StopExecution ends an execution at once, as on AWS, also while its tasks wait for a task token.

    moto 5.2.5's ``Execution.stop`` marks the program stopped and waits for the interpreter's thread to
    notice; a ``.waitForTaskToken`` task inside an inline Map iteration waits on its ``CallbackEndpoint``
    until its timeout, and the Map waits for its iterations, so the stopped execution reads ``RUNNING``
    for up to the task's timeout (the rollout-group executions of the group engine: their rollouts wait
    for their agents). Here a stop also interrupts every callback endpoint of the execution
    (``CallbackEndpoint.interrupt_all``, what moto itself does when a task ends), so the waits return and
    the execution ends ``ABORTED``. A Distributed Map's children are not waited for on a stop, so they
    never showed it. Upstream: ``Execution.stop`` could call ``interrupt_all`` on its pool's endpoints.
    """
    from moto.stepfunctions.parser.api import ExecutionStatus
    from moto.stepfunctions.parser.backend import execution

    cls, comm = execution.Execution, execution.BaseExecutionWorkerCommunication
    original, original_reflect = cls.stop, comm._reflect_execution_status

    def stop(self: Any, stop_date: Any, error: Any, cause: Any) -> Any:
        self._stepwise_stopped = True
        out = original(self, stop_date, error, cause)
        worker = getattr(self, "exec_worker", None)
        pool = getattr(getattr(worker, "env", None), "callback_pool_manager", None)
        for endpoint in list(getattr(pool, "_pool", {}).values()):
            endpoint.interrupt_all()
        return out

    def reflect(self: Any) -> Any:
        # the interrupted waits end their iterations with an error after the stop: still a stop
        out = original_reflect(self)
        if getattr(self.execution, "_stepwise_stopped", False) and self.execution.exec_status == ExecutionStatus.FAILED:
            self.execution.exec_status = ExecutionStatus.ABORTED
            self.execution.error = self.execution.cause = None
        return out

    stop.__stepwise_original__ = original  # type: ignore[attr-defined]
    reflect.__stepwise_original__ = original_reflect  # type: ignore[attr-defined]
    cls.stop, comm._reflect_execution_status = stop, reflect
    try:
        yield
    finally:
        cls.stop, comm._reflect_execution_status = original, original_reflect


@contextlib.contextmanager
def aws_error_names() -> Iterator[None]:
    """The error names AWS reports where moto 5.2.5 reports others.

    - A callback task whose heartbeat stopped fails with ``States.HeartbeatTimeout`` (the Step
      Functions developer guide, "Error names"); moto reports ``States.Timeout`` for both timeouts.
      Its ``HeartbeatSecondsPath`` and ``SendTaskHeartbeat`` are otherwise moto's own (they work).
    - A Lambda task (``Resource`` a function ARN) that Lambda refuses reports ``Lambda.<error code>``
      (``Lambda.TooManyRequestsException`` for throttling), as the ``lambda:invoke`` integration does
      in moto; moto reports ``Exception`` there.
    """
    from botocore.exceptions import ClientError
    from moto.stepfunctions.parser.api import (
        HistoryEventType,
        LambdaFunctionFailedEventDetails,
        TaskTimedOutEventDetails,
    )
    from moto.stepfunctions.parser.asl.component.common.error_name.custom_error_name import CustomErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.failure_event import FailureEvent
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name import StatesErrorName
    from moto.stepfunctions.parser.asl.component.common.error_name.states_error_name_type import StatesErrorNameType
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.service.state_task_service_callback import (
        StateTaskServiceCallback,
    )
    from moto.stepfunctions.parser.asl.component.state.exec.state_task.state_task_lambda import StateTaskLambda
    from moto.stepfunctions.parser.asl.eval.callback.callback import HeartbeatTimeoutError
    from moto.stepfunctions.parser.asl.eval.event.event_detail import EventDetails

    callback_from_error, lambda_from_error = StateTaskServiceCallback._from_error, StateTaskLambda._from_error
    heartbeat = StatesErrorNameType.StatesHeartbeatTimeout

    def callback_error(self: Any, env: Any, ex: Exception) -> Any:
        if isinstance(ex, HeartbeatTimeoutError):
            return FailureEvent(env=env, error_name=StatesErrorName(typ=heartbeat), event_type=HistoryEventType.TaskTimedOut,
                                event_details=EventDetails(taskTimedOutEventDetails=TaskTimedOutEventDetails(
                                    resourceType=self._get_sfn_resource_type(), resource=self._get_sfn_resource(),
                                    error=heartbeat.to_name())))
        return callback_from_error(self, env, ex)

    def lambda_error(self: Any, env: Any, ex: Exception) -> Any:
        if isinstance(ex, ClientError):
            error = f"Lambda.{ex.response['Error']['Code']}"
            return FailureEvent(env=env, error_name=CustomErrorName(error), event_type=HistoryEventType.LambdaFunctionFailed,
                                event_details=EventDetails(lambdaFunctionFailedEventDetails=LambdaFunctionFailedEventDetails(
                                    error=error, cause=ex.response["Error"].get("Message", ""))))
        return lambda_from_error(self, env, ex)

    with _replaced(StateTaskServiceCallback, "_from_error", callback_error), \
            _replaced(StateTaskLambda, "_from_error", lambda_error):
        yield


#: moto modules of the ASL interpreter that call ``jsonpath_ng`` ``parse`` per evaluation.
_JSONPATH_MODULES = ("moto.stepfunctions.parser.asl.utils.json_path",
                     "moto.stepfunctions.parser.asl.component.common.path.result_path")


@contextlib.contextmanager
def cached_json_paths() -> Iterator[None]:
    """Parse each JSONPath of the state machine once, not on every evaluation.

    moto's ASL interpreter calls ``jsonpath_ng`` ``parse(path)`` for every ``$.x`` it evaluates
    (``extract_json``, ``ResultPath``), and ``parse`` builds a new PLY parser each time (``yacc()``
    re-reading its tables): 27% of the run-local process's GIL time at 64 rollouts per step
    (py-spy --gil). A parsed path is an immutable expression tree (``find`` and
    ``update_or_create`` change the data, not the tree), so the trees are shared, per module.
    """
    patched = []
    for name in _JSONPATH_MODULES:
        module = importlib.import_module(name)
        original = module.parse
        module.parse = functools.lru_cache(maxsize=4096)(original)
        patched.append((module, original))
    try:
        yield
    finally:
        for module, original in patched:
            module.parse = original


class _RequestBody(io.RawIOBase):
    """The ``Content-Length`` bytes of one request on a kept-alive connection, and not one byte more.

    Werkzeug hands the connection's reader itself to the app (``wsgi.input``) and, after the
    response, reads whatever else the socket holds to discard it: right for a connection it closes,
    but on a kept-alive one that would read the client's next request. Reading through this, the app
    and that discard both stop at the body's end; `kept_alive_connections`' handler reads what the
    app left of it (`discard_rest`) before the next request line.
    """

    def __init__(self, raw: Any, length: int) -> None:
        super().__init__()
        self._raw, self.left, self.eof = raw, length, False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.left <= 0:
            return 0
        data = self._raw.read(min(len(buffer), self.left))
        if not data:  # the client went away mid-body
            self.left, self.eof = 0, True
            return 0
        buffer[: len(data)] = data
        self.left -= len(data)
        return len(data)

    def discard_rest(self) -> None:
        while self.left > 0 and self.readinto(bytearray(min(self.left, 1 << 16))):
            pass


@dataclass
class ServerConnections:
    """The moto server's client connections: those open now, and how many it accepted in all."""

    open: set[Any] = field(default_factory=set)
    accepted: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def close_all(self, timeout_s: float = 2.0) -> None:
        """Shut every open connection (each idle kept-alive one holds a server thread) and wait up
        to ``timeout_s`` for their threads to finish."""
        with self.lock:
            conns = list(self.open)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        deadline = time.monotonic() + timeout_s
        while self.open and time.monotonic() < deadline:  # their threads see EOF and finish
            time.sleep(0.01)


@contextlib.contextmanager
def kept_alive_connections(connections: ServerConnections) -> Iterator[None]:
    """moto's HTTP server with HTTP/1.1 keep-alive, for requests that carry a ``Content-Length``.

    Werkzeug's development server, which ``ThreadedMotoServer`` runs, answers every request with
    ``Connection: close``: each of the ~15 requests per rollout (handlers, gateway, agents) opened a
    new TCP connection, and the server started a new thread for it. In one process, 500 S3 requests
    each way (``benchmarks/README.md`` section 5) cost 2.3-3.4 ms of CPU per request with a new
    connection each and 1.7-2.5 ms kept alive. Requests without a length (chunked) keep werkzeug's
    behaviour (closed after the answer). ``TCP_NODELAY``: werkzeug writes an answer's headers and body
    separately, and on a kept-alive connection Nagle's algorithm held the body ~40 ms for the
    client's delayed ACK. ``connections`` counts them and holds the open ones, for `MotoServer.stop`
    to close (an idle kept-alive connection otherwise holds its server thread until its client closes it).
    """
    from moto.moto_server import threaded_moto_server

    base = threaded_moto_server.MotoRequestHandler
    if not hasattr(base, "run_wsgi") or not hasattr(base, "send_header"):
        raise SeamBroken("moto's MotoRequestHandler is no longer werkzeug's WSGIRequestHandler; "
                         "port local/engine.py's kept_alive_connections")

    class KeepAliveRequestHandler(base):  # type: ignore[misc, valid-type]
        _body: _RequestBody | None = None

        def setup(self) -> None:
            super().setup()
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with connections.lock:
                connections.open.add(self.connection)
                connections.accepted += 1

        def finish(self) -> None:
            with connections.lock:
                connections.open.discard(self.connection)
            super().finish()

        def run_wsgi(self) -> None:
            length = (self.headers.get("Content-Length") or "0").strip()
            chunked = "chunked" in (self.headers.get("Transfer-Encoding") or "").lower()
            if chunked or not length.isdigit():
                self._body = None
                return super().run_wsgi()  # closed after the answer, as werkzeug does
            raw = self.rfile
            self._body = body = _RequestBody(raw, int(length))
            self.rfile = body
            try:
                super().run_wsgi()
            finally:
                self.rfile = raw
                body.discard_rest()
                if body.eof:
                    self.close_connection = True

        def send_header(self, keyword: str, value: str) -> None:
            if self._body is not None and keyword.lower() == "connection" and value.lower() == "close":
                return  # werkzeug's "always close": this request's body is delimited, keep the connection
            super().send_header(keyword, value)

    threaded_moto_server.MotoRequestHandler = KeepAliveRequestHandler
    try:
        yield
    finally:
        threaded_moto_server.MotoRequestHandler = base


def without_flask_debug(dispatcher_app: Any) -> None:
    """Build moto's per-service Flask apps with ``debug`` off.

    moto's ``create_backend_app`` sets ``debug = True``, and in debug mode Flask's
    ``Request._load_form_data`` (every S3 PUT) defines a new ``files`` multidict subclass per request
    (``flask.debughelpers.attach_enctype_error_multidict``): ~10% of the run-local process's GIL time
    at 64 rollouts per step (py-spy --gil). Errors still answer 500 without debug.
    """
    create_app = getattr(dispatcher_app, "create_app", None)
    if create_app is None:
        raise SeamBroken("moto's DomainDispatcherApplication no longer builds apps with create_app; "
                         "port local/engine.py's without_flask_debug")

    def create_app_without_debug(service: Any) -> Any:
        app = create_app(service)
        app.debug = False
        return app

    dispatcher_app.create_app = create_app_without_debug


def with_pool(client: Any) -> Any:
    """``client`` rebuilt with its own settings but `stepwise.aws.clients.client_config`'s pool: every
    task of every running Map shares the one client, so moto's 10 connections overflowed."""
    import boto3

    from stepwise.aws.clients import max_pool_connections

    meta = client.meta
    creds = client._request_signer._credentials  # moto's fixed dummy credentials
    return boto3.client(meta.service_model.service_name, region_name=meta.region_name,
                        endpoint_url=meta.endpoint_url, aws_access_key_id=creds.access_key,
                        aws_secret_access_key=creds.secret_key, aws_session_token=creds.token,
                        config=meta.config.merge(Config(max_pool_connections=max_pool_connections())))


def endpoint_env(endpoint: str) -> dict[str, str]:
    """Environment that points boto3 (in any process) at the moto server for MOTO_SERVICES (and makes
    botocore honour the variables even where the user's shared config says to ignore them)."""
    from local.no_aws import IGNORE_ENDPOINTS_VARIABLE

    env = {f"AWS_ENDPOINT_URL_{suffix}": endpoint for suffix in MOTO_SERVICES.values()}
    env.update(
        {
            IGNORE_ENDPOINTS_VARIABLE: "false",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_SESSION_TOKEN": "testing",
            "AWS_DEFAULT_REGION": REGION,
            "AWS_REGION": REGION,
        }
    )
    return env


class MotoServer:
    """moto on a loopback port with Step Functions execution enabled and the invoke seam installed.

    ``start()`` sets ``os.environ`` (endpoints, dummy credentials, ``MOTO_PORT`` -- the port
    moto's ASL interpreter calls Lambda on) and ``stop()`` restores it. While it runs, no botocore
    client of this process (the in-process handlers included) reaches AWS (`local.no_aws.refusing_aws`).
    """

    def __init__(self) -> None:
        self.dispatcher = LambdaDispatcher()
        self._server: Any = None
        self._patch: contextlib.ExitStack | None = None
        self.s3_requests: S3RequestLog | None = None
        self.connections = ServerConnections()
        self._env = EnvChanges()
        self._saved_config: bool | None = None
        self.endpoint = ""

    def start(self) -> "MotoServer":
        from moto.core.config import default_user_config
        from moto.server import ThreadedMotoServer

        from local.no_aws import refusing_aws

        self._patch = contextlib.ExitStack()
        self._patch.enter_context(refusing_aws())
        self._patch.enter_context(patched_lambda_invoke(self.dispatcher))
        self._patch.enter_context(cached_backend_lookup())
        self._patch.enter_context(cached_asl_clients())
        self._patch.enter_context(indexed_task_tokens())
        self._patch.enter_context(early_task_outcomes())
        self._patch.enter_context(stops_wake_callback_tasks())
        self._patch.enter_context(cached_json_paths())
        self._patch.enter_context(paged_execution_history())
        self._patch.enter_context(unseen_new_executions(self.dispatcher.faults))
        self._patch.enter_context(atomic_object_writes())
        self._patch.enter_context(aws_error_names())
        self._patch.enter_context(kept_alive_connections(self.connections))
        sfn_config = default_user_config.setdefault("stepfunctions", {})
        self._saved_config = sfn_config.get("execute_state_machine", False)
        sfn_config["execute_state_machine"] = True
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per AWS call
        self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._server.start()
        # werkzeug's request handler reads ``server.app`` per request: wrap it before any request.
        wsgi = getattr(self._server, "_server", None)
        if wsgi is None or not hasattr(wsgi, "app"):
            raise SeamBroken("moto's ThreadedMotoServer no longer keeps its werkzeug server as _server; "
                             "port local/engine.py's S3RequestLog")
        without_flask_debug(wsgi.app)
        self.s3_requests = wsgi.app = S3RequestLog(wsgi.app)
        host, port = self._server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.set_env({**endpoint_env(self.endpoint), "MOTO_PORT": str(port)})
        return self

    def set_env(self, env: dict[str, str]) -> None:
        """Set process environment variables, put back by ``stop()`` (`local._proc.EnvChanges`)."""
        self._env.set(env)

    def stop(self) -> None:
        from moto.core.config import default_user_config

        self.dispatcher.drain(timeout=10)
        self.dispatcher.stop_limits()
        if self._server is not None:
            self._server.stop()
            self._server = None
        self.connections.close_all()
        if self._patch is not None:
            self._patch.close()
            self._patch = None
        if self._saved_config is not None:
            default_user_config["stepfunctions"]["execute_state_machine"] = self._saved_config
        self._env.restore()

    def __enter__(self) -> "MotoServer":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def client(self, service: str) -> Any:
        import boto3

        return boto3.client(service, region_name=REGION, endpoint_url=self.endpoint)

    def objects(self, bucket: str, prefix: str) -> Iterator[tuple[str, bytes]]:
        """(key, body) of every object under ``prefix`` of ``bucket`` (its newest version), read from this
        process's moto S3 backend without a request: for copying a run's objects out at its end (thousands of
        GETs through the server, each parsed on both sides under this process's GIL, took 19 s of a toy run).

        Raises:
            SeamBroken: moto's S3 backend no longer keeps buckets and keys where this reads them.
        """
        from moto.s3.models import s3_backends

        try:
            keys = s3_backends[ACCOUNT_ID]["aws"].buckets[bucket].keys
            items = list(keys.items())  # moto copies the key store first: safe beside writers
        except (KeyError, AttributeError) as exc:
            raise SeamBroken(f"moto's S3 backend has no bucket {bucket!r} at s3_backends[account]['aws'].buckets "
                             f"({exc!r}); port local/engine.py's MotoServer.objects") from exc
        for key, obj in sorted(items):
            if key.startswith(prefix):
                yield key, obj.value
