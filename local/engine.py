"""The moto seam: the local Step Functions engine, S3 and in-process Lambda dispatch.

One moto server (``ThreadedMotoServer``) on a loopback port serves every AWS service the
pipeline uses (S3, Step Functions, Lambda, IAM/STS), so other threads and other processes
(the gateway, the agent apps) reach the same bucket. Step Functions execution is enabled
(moto's ASL interpreter, ported from LocalStack). Every Lambda invocation -- a state
machine ``lambda:invoke`` task and an S3 ``ObjectCreated`` notification alike -- goes
through moto's ``LambdaFunction.invoke(body, request_headers, response_headers)`` (moto 5.2.5,
``moto/awslambda/models.py``); we replace that one method with an in-process call of the
real handler from ``stepwise.functions``. This module is the only place that knows moto's
internals; ``tests/local/test_engine_contract.py`` fails loudly when a moto upgrade moves them.

Faults a drill injects (`InvocationFaults`, ``dispatcher.faults``): throttle a named function (its next
synchronous invocations answer Lambda's 429 TooManyRequestsException, which a ``lambda:invoke`` task
reports as ``Lambda.TooManyRequestsException``), delay or drop its asynchronous invocations (an S3
notification delivered late, or never: S3 event notifications are at-least-once and may arrive late),
and hide new executions from DescribeExecution for a while (`InvocationFaults.hide_new_executions`:
Step Functions' reads are eventually consistent).

Lambda's limits are enforced per invocation (``local/limits.py``, in `run_handler`, in this
process and in the worker processes alike): a handler that runs past its ``FunctionSpec.timeout_s``
or whose memory goes past its ``memory_mb`` fails the way Lambda fails it (an unhandled error; Step
Functions sees ``Lambda.Unknown`` with a message naming the function and the figure). Not
emulated: EventBridge does not deliver to Lambda targets in moto, so the local runner calls Cleanup
itself on abnormal ends. docs/internals.md lists the remaining differences.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import importlib
import inspect
import io
import json
import logging
import os
import socket
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from botocore.config import Config

from local._proc import restore_env
from local.limits import LimitMonitor, MemoryMeasure, default_measure, process_monitor
from stepwise.layout import RESULTS_PREFIX, RUNS_PREFIX, SUMMARY_NAME, key_kind

log = logging.getLogger(__name__)

REGION = "us-east-1"
ACCOUNT_ID = "123456789012"  # moto's default account
LAMBDA_ROLE_NAME = "stepwise-local-lambda"
STATE_MACHINE_ROLE_NAME = "stepwise-local-states"
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

Handler = Callable[[dict[str, Any], Any], Any]


class SeamBroken(RuntimeError):
    """moto's internals no longer match what the local engine patches (pin or port the seam)."""


# --------------------------------------------------------------------------------------
# The Lambda invoke seam
# --------------------------------------------------------------------------------------


@dataclass
class LambdaContext:
    """The subset of the Lambda context object handlers and Powertools read."""

    function_name: str
    memory_limit_in_mb: int
    invoked_function_arn: str
    timeout_s: int
    aws_request_id: str = field(default_factory=lambda: str(uuid.uuid4()))
    function_version: str = "$LATEST"
    log_group_name: str = ""
    log_stream_name: str = ""
    _started: float = field(default_factory=time.monotonic)

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self.timeout_s - (time.monotonic() - self._started)) * 1000))


@dataclass
class _Registered:
    handler_path: str
    memory_mb: int
    timeout_s: int
    arn: str
    handler: Handler | None = None
    beside_loop: bool = False


@dataclass
class InvocationRecord:
    """One dispatched invocation (kept for tests and the run's timing split).

    ``error`` is the ``errorType`` of a failed invocation (``Lambda.Unknown`` when it broke its
    function's limit); ``peak_mb`` is its measured memory growth (`local.limits`); ``seconds`` is the
    dispatch's wall time, ``handler_seconds`` the handler's own (what Lambda would bill; the cost
    ledger's check compares with it).
    """

    function_name: str
    invocation_type: str
    started: float
    seconds: float
    error: str | None
    peak_mb: float = 0.0
    handler_seconds: float = 0.0  # the handler's own run (in its worker), without the dispatch around it


def run_handler(function_name: str, handler: Handler, event: Any, ctx: LambdaContext,
                monitor: LimitMonitor | None = None) -> tuple[bytes, str | None, float]:
    """Run ``handler(event, ctx)`` under the function's limits; returns (payload bytes, ``"Unhandled"``
    or None, measured peak MB) like Lambda's Invoke: an exception becomes the ``errorType`` /
    ``errorMessage`` / ``stackTrace`` payload, and an invocation past ``ctx.timeout_s`` or
    ``ctx.memory_limit_in_mb`` is stopped and answers ``Lambda.Unknown`` (the name Step Functions
    gives Lambda timeouts and out-of-memory kills) with a message naming the function and the figure.

    ``monitor``: the `local.limits.LimitMonitor` to run under (default: this process's).
    """
    monitor = monitor or process_monitor()
    out = monitor.run(function_name, lambda: handler(event, ctx), memory_mb=ctx.memory_limit_in_mb,
                      timeout_s=ctx.timeout_s)
    peak = out.invocation.peak_mb
    if out.violation is not None:
        log.warning("Lambda %s stopped: %s", function_name, out.violation)
        return json.dumps({"errorType": "Lambda.Unknown", "errorMessage": f"RequestId: {ctx.aws_request_id} "
                           f"Error: {out.violation}"}).encode(), "Unhandled", peak
    if out.error is not None:  # Lambda reports an unhandled error as a payload, not a crash
        exc = out.error
        error = type(exc).__name__
        log.warning("Lambda %s raised %s: %s", function_name, error, exc)
        return json.dumps({"errorType": error, "errorMessage": str(exc),
                           "stackTrace": traceback.format_exception(exc)}).encode(), "Unhandled", peak
    try:
        return json.dumps(out.result, default=str).encode(), None, peak
    except (TypeError, ValueError) as exc:
        return json.dumps({"errorType": type(exc).__name__, "errorMessage": f"result not JSON: {exc}"}).encode(), \
            "Unhandled", peak


class LambdaThrottled(Exception):
    """A synchronous invocation `InvocationFaults` throttles (`DirectLambdaClient` answers it as Lambda's
    429 TooManyRequestsException)."""


@dataclass
class _Fault:
    function: str  # a function name, or its logical name (the part after ``{prefix}-``)
    remaining: int
    match: Callable[[Any], bool] | None = None
    seconds: float = 0.0

    def applies(self, function_name: str, event: Any) -> bool:
        if self.remaining <= 0:
            return False
        if function_name != self.function and not function_name.endswith(f"-{self.function}"):
            return False
        try:
            return self.match is None or bool(self.match(event))
        except Exception:  # a predicate that cannot read this event does not match it
            return False


class InvocationFaults:
    """Faults armed for the next invocations of named functions (the drills' "Lambda misbehaves").

    ``function`` is a function name or its logical name (``FinishRollout`` matches
    ``stepwise-local-FinishRollout``); ``match`` (optional) picks invocations by their event.
    Counters of what fired: ``throttled``, ``delayed``, ``dropped``, ``unseen`` (DescribeExecution
    answers of `hide_new_executions`: Step Functions' reads are eventually consistent too).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._throttles: list[_Fault] = []
        self._delays: list[_Fault] = []
        self._drops: list[_Fault] = []
        self._unseen: list[tuple[float, Callable[[str], bool] | None]] = []
        self.throttled = 0
        self.delayed = 0
        self.dropped = 0
        self.unseen = 0

    def throttle(self, function: str, n: int = 1, *, match: Callable[[Any], bool] | None = None) -> None:
        """The next ``n`` synchronous invocations of ``function`` (those ``match`` accepts) answer
        TooManyRequestsException (429) and do not run."""
        with self._lock:
            self._throttles.append(_Fault(function, n, match))

    def delay_events(self, function: str, seconds: float, n: int = 1, *, match: Callable[[Any], bool] | None = None) -> None:
        """The next ``n`` asynchronous (Event) invocations of ``function`` run ``seconds`` late (an S3
        notification delivered after its rollout's task timed out, say)."""
        with self._lock:
            self._delays.append(_Fault(function, n, match, seconds))

    def drop_events(self, function: str, n: int = 1, *, match: Callable[[Any], bool] | None = None) -> None:
        """The next ``n`` asynchronous (Event) invocations of ``function`` never run."""
        with self._lock:
            self._drops.append(_Fault(function, n, match))

    def hide_new_executions(self, seconds: float, *, match: Callable[[str], bool] | None = None) -> None:
        """From now on, DescribeExecution answers ExecutionDoesNotExist for an execution (those whose ARN
        ``match`` accepts) until it is ``seconds`` old: Step Functions' eventual consistency, under which
        an execution just started (a continue-as-new successor) can read as not existing for a while."""
        with self._lock:
            self._unseen.append((float(seconds), match))

    def show_new_executions(self) -> None:
        """Disarm every `hide_new_executions`: DescribeExecution sees each execution at once again."""
        with self._lock:
            self._unseen.clear()

    def hidden_for(self, execution_arn: str) -> float:
        """How many seconds after its start execution ``execution_arn`` reads as not existing (0 = seen)."""
        with self._lock:
            return max((s for s, m in self._unseen if m is None or m(execution_arn)), default=0.0)

    def count_unseen(self) -> None:
        with self._lock:
            self.unseen += 1

    def _take(self, faults: list[_Fault], function_name: str, event: Any) -> _Fault | None:
        with self._lock:
            for fault in faults:
                if fault.applies(function_name, event):
                    fault.remaining -= 1
                    return fault
        return None

    def take_throttle(self, function_name: str, event: Any) -> bool:
        fired = self._take(self._throttles, function_name, event) is not None
        if fired:
            with self._lock:
                self.throttled += 1
        return fired

    def take_event_fault(self, function_name: str, event: Any) -> tuple[str, float] | None:
        """``("drop", 0)`` or ``("delay", seconds)`` for an asynchronous invocation, or None."""
        if self._take(self._drops, function_name, event) is not None:
            with self._lock:
                self.dropped += 1
            return "drop", 0.0
        fault = self._take(self._delays, function_name, event)
        if fault is not None:
            with self._lock:
                self.delayed += 1
            return "delay", fault.seconds
        return None


class LambdaDispatcher:
    """Maps moto function names to real handlers and runs them in-process, or in worker processes.

    ``invocations`` records every call (function name, wall seconds, error type or None, peak MB).
    ``workers``: a `local.workers.WorkerPool`; handlers registered by path then run there (off
    moto's GIL), handlers registered as callables (tests) still run in this process. Both run under
    Lambda's limits (`run_handler`); ``measure`` is how this process measures per-invocation memory
    (`local.limits`; default ``STEPWISE_LOCAL_MEMORY_MEASURE`` or ``rss``), its monitor runs
    between the first call and `stop_limits` (`MotoServer.stop`).
    """

    def __init__(self, workers: Any = None, measure: MemoryMeasure | None = None) -> None:
        self._functions: dict[str, _Registered] = {}
        self._lock = threading.Lock()
        self.invocations: list[InvocationRecord] = []
        self._async_threads: list[threading.Thread] = []
        self._beside_loop_threads: set[threading.Thread] = set()
        self.beside_loop_abandoned = False
        self.workers = workers
        self.faults = InvocationFaults()
        #: When a list (drills set it): every invocation's (function name, event JSON, payload bytes) -- the
        #: inputs and outputs the executions' histories hold for Lambda tasks.
        self.payloads: list[tuple[str, str, bytes]] | None = None
        self.limits = LimitMonitor(measure or default_measure())
        self._limits_started = False

    def _monitor(self) -> LimitMonitor:
        with self._lock:
            if not self._limits_started:
                self.limits.start()
                self._limits_started = True
        return self.limits

    def stop_limits(self) -> None:
        if self._limits_started:
            self.limits.stop()
            self._limits_started = False

    def register(self, function_name: str, *, handler_path: str, memory_mb: int, timeout_s: int, arn: str,
                 handler: Handler | None = None, beside_loop: bool = False) -> None:
        """Route invocations of ``function_name`` to ``handler_path`` (``module.function``) or ``handler``;
        ``beside_loop`` (`stepwise.functions.FunctionSpec.beside_loop`): to the workers' low-priority process."""
        self._functions[function_name] = _Registered(handler_path, memory_mb, timeout_s, arn, handler, beside_loop)

    def _resolve(self, name: str) -> tuple[_Registered, Handler]:
        reg = self._functions.get(name)
        if reg is None:
            raise KeyError(f"no local handler registered for Lambda function {name!r}; known: {sorted(self._functions)}")
        if reg.handler is None:
            module_name, _, attr = reg.handler_path.rpartition(".")
            reg.handler = getattr(importlib.import_module(module_name), attr)
        return reg, reg.handler

    def call(self, function_name: str, event: Any, invocation_type: str) -> tuple[bytes, str | None]:
        """Run the handler; returns (payload bytes, function error kind or None) like Lambda's Invoke."""
        started = time.time()
        t0 = time.monotonic()
        reg = self._functions.get(function_name)
        if self.workers is not None and reg is not None and reg.handler_path and reg.handler is None:
            context = {"function_name": function_name, "memory_limit_in_mb": reg.memory_mb,
                       "invoked_function_arn": reg.arn, "timeout_s": reg.timeout_s}
            payload, kind, peak, handler_seconds = self.workers.call(reg.handler_path, event, context, reg.timeout_s,
                                                                     beside_loop=reg.beside_loop)
        else:
            reg, handler = self._resolve(function_name)
            ctx = LambdaContext(function_name, reg.memory_mb, reg.arn, reg.timeout_s)
            t_handler = time.monotonic()
            payload, kind, peak = run_handler(function_name, handler, event, ctx, self._monitor())
            handler_seconds = time.monotonic() - t_handler
        error = None
        if kind:
            try:
                error = str(json.loads(payload).get("errorType") or kind)
            except (ValueError, AttributeError):
                error = kind
        with self._lock:
            self.invocations.append(InvocationRecord(function_name, invocation_type, started,
                                                     time.monotonic() - t0, error, peak, handler_seconds))
            if self.payloads is not None:
                self.payloads.append((function_name, json.dumps(event, default=str), payload))
        return payload, kind

    def invoke_from_moto(self, function_name: str, body: Any, request_headers: Any, response_headers: Any) -> bytes:
        """The body of the patched ``LambdaFunction.invoke``.

        An S3 notification calls with empty headers and (like AWS) is asynchronous: the
        handler runs on its own thread so the agent's PutObject returns at once.
        """
        event = json.loads(body) if isinstance(body, (str, bytes)) and body else {}
        inv_type = (request_headers or {}).get("x-amz-invocation-type") or ("Event" if not request_headers else "RequestResponse")
        if inv_type == "Event":
            fault = self.faults.take_event_fault(function_name, event)
            if fault is not None and fault[0] == "drop":
                log.warning("Lambda %s: asynchronous invocation dropped (injected fault)", function_name)
                return b""
            delay = fault[1] if fault is not None else 0.0

            def run_later() -> None:
                if delay:
                    time.sleep(delay)
                try:
                    self.call(function_name, event, "Event")
                except OSError as exc:  # its worker process is gone (a Ctrl-C reached the process group)
                    if self.beside_loop_abandoned and threading.current_thread() in self._beside_loop_threads:
                        log.debug("Lambda %s: left unfinished at the run's end (beside the loop): %s", function_name, exc)
                        return
                    log.warning("Lambda %s: asynchronous invocation dropped, its worker process did not answer: %s",
                                function_name, exc)

            t = threading.Thread(target=run_later, name=f"lambda-{function_name}", daemon=True)
            t.start()
            beside = reg.beside_loop if (reg := self._functions.get(function_name)) is not None else False
            with self._lock:
                self._async_threads = [x for x in self._async_threads if x.is_alive()] + [t]
                if beside:
                    self._beside_loop_threads = {x for x in self._beside_loop_threads if x.is_alive()} | {t}
            return b""
        if self.faults.take_throttle(function_name, event):
            raise LambdaThrottled(f"Rate Exceeded. (function {function_name}: injected throttling)")
        payload, error = self.call(function_name, event, inv_type)
        if error:
            response_headers["x-amz-function-error"] = error
        response_headers["x-amz-log-result"] = base64.b64encode(b"").decode()
        return payload

    def drain(self, timeout: float = 30.0, *, beside_loop: bool | None = None) -> None:
        """Wait for asynchronous (Event) invocations still running, at most ``timeout`` seconds in all.

        ``beside_loop=False`` (default once `abandon_beside_loop` was called, else True): not for the functions beside the loop (`stepwise.functions.FunctionSpec.beside_loop`:
        Track), which are left to end with their worker (`abandon_beside_loop`): run-local rebuilds what they
        produce at a run's end, and waited for them up to a minute (a Track invocation takes 8.5 s idle, about
        a minute under load)."""
        deadline = time.monotonic() + timeout
        beside_loop = not self.beside_loop_abandoned if beside_loop is None else beside_loop
        with self._lock:
            threads = [t for t in self._async_threads if beside_loop or t not in self._beside_loop_threads]
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def abandon_beside_loop(self) -> None:
        """From now on a beside-the-loop invocation cut short by its worker's end is a debug line, not a warning:
        the caller has chosen not to wait for them (`drain` with ``beside_loop=False``)."""
        self.beside_loop_abandoned = True


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


# --------------------------------------------------------------------------------------
# S3 request log (what a rollout costs in requests, by kind)
# --------------------------------------------------------------------------------------

def s3_request_kind(method: str, path: str, query: str) -> tuple[str, str]:
    """``(operation, object kind)`` of one path-style S3 request.

    Operation: ``GET``, ``PUT``, ``HEAD``, ``DELETE``, ``POST`` or ``LIST`` (a GET of the bucket
    itself); object kind: the layout's kind of the key it touches (`stepwise.layout.key_kind`: ``state``, ``session``, ``turn``, ...;
    ``bucket`` for bucket-level calls, ``other`` for keys outside the layout). For a LIST the kind
    is the one of its ``prefix`` (``turn`` for a session's turns).
    """
    from urllib.parse import parse_qs, unquote

    parts = unquote(path).lstrip("/").split("/", 1)
    key = parts[1] if len(parts) > 1 else ""
    op = method.upper()
    if not key:
        if op != "GET":
            return op, "bucket"
        prefix = parse_qs(query).get("prefix", [""])[0]
        op, key = "LIST", prefix
        if not key:
            return op, "bucket"
    return op, key_kind(key)


class S3RequestLog:
    """Counts the S3 requests a moto server answers, by ``(operation, object kind)``.

    Installed around moto's WSGI app (every process's S3 client reaches the same server: the
    handlers, the gateway, the agents), so the figure is the whole run's, as S3 would bill it.
    A request is S3 when its SigV4 credential scope names ``s3``.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if "/s3/aws4_request" in environ.get("HTTP_AUTHORIZATION", ""):
            kind = s3_request_kind(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""),
                                   environ.get("QUERY_STRING", ""))
            with self._lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1
        return self.app(environ, start_response)

    def snapshot(self) -> dict[str, int]:
        """``{"OP kind": count}``, sorted by key (JSON-ready)."""
        with self._lock:
            return {f"{op} {kind}": n for (op, kind), n in sorted(self.counts.items())}


# --------------------------------------------------------------------------------------
# The moto server
# --------------------------------------------------------------------------------------


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
        self._saved_env: dict[str, str | None] = {}
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
        """Set process environment variables, remembering the old values for ``stop()``."""
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

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
        restore_env(self._saved_env)

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


# --------------------------------------------------------------------------------------
# Resources: the same ones the stack creates
# --------------------------------------------------------------------------------------


@dataclass
class LocalResources:
    """What ``create_resources`` made: names and ARNs the runner needs."""

    bucket: str
    state_machine_arn: str
    function_arns: dict[str, str]
    definition: str


def _ensure_role(iam: Any, name: str, service: str) -> str:
    doc = json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Principal": {"Service": service}, "Action": "sts:AssumeRole"}]})
    try:
        return iam.create_role(RoleName=name, AssumeRolePolicyDocument=doc)["Role"]["Arn"]
    except iam.exceptions.EntityAlreadyExistsException:
        return iam.get_role(RoleName=name)["Role"]["Arn"]


def local_function_name(prefix: str, logical: str) -> str:
    return f"{prefix}-{logical}"


def create_functions(moto: MotoServer, *, prefix: str = "stepwise-local") -> dict[str, str]:
    """Create one moto Lambda per ``stepwise.functions.FUNCTIONS`` entry, routed in-process.

    Returns logical name -> function ARN. The environment is the one the stack gives
    (``functions.environment``), set on the moto function and in this process's environment
    (restored by ``MotoServer.stop``).
    """
    from stepwise import functions, settings

    lam = moto.client("lambda")
    role = _ensure_role(moto.client("iam"), LAMBDA_ROLE_NAME, "lambda.amazonaws.com")
    env = functions.environment(bucket=os.environ.get("STEPWISE_BUCKET", ""),
                                gateway_url=os.environ.get("STEPWISE_GATEWAY_URL", ""),
                                data_buckets=os.environ.get(settings.ENV_DATA_BUCKETS, ""),
                                agent_runtime_arns=os.environ.get(settings.ENV_AGENT_RUNTIME_ARNS, ""),
                                judge_model_ids=os.environ.get(settings.ENV_JUDGE_MODEL_IDS, ""))
    # Handlers run in this process: they see the stack's environment (plus the local endpoints
    # already set here). Every function gets the same one, so the process env can carry it.
    moto.set_env(env)
    arns: dict[str, str] = {}
    for spec in functions.FUNCTIONS:
        name = local_function_name(prefix, spec.name)
        try:
            arn = lam.create_function(
                FunctionName=name,
                Role=role,
                PackageType="Image",
                Code={"ImageUri": f"{ACCOUNT_ID}.dkr.ecr.{REGION}.amazonaws.com/stepwise:local"},
                ImageConfig={"Command": [spec.handler]},
                MemorySize=spec.memory_mb,
                Timeout=spec.timeout_s,
                Description=spec.description[:256],
                Environment={"Variables": env},
            )["FunctionArn"]
        except lam.exceptions.ResourceConflictException:
            # moto's backends outlive a server in this process: a function left by an earlier
            # local stack must take this stack's environment, not keep the old one.
            arn = lam.update_function_configuration(
                FunctionName=name, MemorySize=spec.memory_mb, Timeout=spec.timeout_s,
                Environment={"Variables": env},
            )["FunctionArn"]
        moto.dispatcher.register(name, handler_path=spec.handler, memory_mb=spec.memory_mb,
                                 timeout_s=spec.timeout_s, arn=arn, beside_loop=spec.beside_loop)
        arns[spec.name] = arn
    return arns


def create_bucket(moto: MotoServer, bucket: str, *, result_function_arn: str | None,
                  track_function_arn: str | None = None) -> None:
    """The run bucket, with the stack's ObjectCreated notifications: ``rollout-results/`` ->
    OnRolloutResult, and (when given) ``runs/`` + suffix ``summary.json`` -> Track."""
    s3 = moto.client("s3")
    with contextlib.suppress(s3.exceptions.BucketAlreadyOwnedByYou):
        s3.create_bucket(Bucket=bucket)
    configs = []
    if result_function_arn:
        configs.append({
            "Id": "rollout-results",
            "LambdaFunctionArn": result_function_arn,
            "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": RESULTS_PREFIX}]}},
        })
    if track_function_arn:
        configs.append({
            "Id": "summaries",
            "LambdaFunctionArn": track_function_arn,
            "Events": ["s3:ObjectCreated:*"],
            "Filter": {"Key": {"FilterRules": [{"Name": "prefix", "Value": RUNS_PREFIX},
                                               {"Name": "suffix", "Value": SUMMARY_NAME}]}},
        })
    if configs:
        s3.put_bucket_notification_configuration(Bucket=bucket,
                                                 NotificationConfiguration={"LambdaFunctionConfigurations": configs})


def create_state_machine(moto: MotoServer, name: str, definition: str) -> str:
    """A STANDARD state machine with ``definition`` (already substituted). Returns its ARN."""
    sfn = moto.client("stepfunctions")
    role = _ensure_role(moto.client("iam"), STATE_MACHINE_ROLE_NAME, "states.amazonaws.com")
    for sm in sfn.list_state_machines()["stateMachines"]:
        if sm["name"] == name:
            sfn.update_state_machine(stateMachineArn=sm["stateMachineArn"], definition=definition)
            return sm["stateMachineArn"]
    return sfn.create_state_machine(name=name, definition=definition, roleArn=role, type="STANDARD")["stateMachineArn"]


def state_machine_arn_for(name: str) -> str:
    return f"arn:aws:states:{REGION}:{ACCOUNT_ID}:stateMachine:{name}"
