"""Lambda invocations on the local stack: each runs the real handler of `stepwise.functions`, under Lambda's limits.

`LambdaDispatcher` maps the local functions to their handlers and runs an invocation in a worker process
(`local.workers`) or in this process (`run_handler`), recording each one (`InvocationRecord`); moto reaches it
through the invoke seam `local.engine` installs. Faults a drill injects (`InvocationFaults`,
``dispatcher.faults``): throttle a named function (its next synchronous invocations answer Lambda's 429
TooManyRequestsException, which a ``lambda:invoke`` task reports as ``Lambda.TooManyRequestsException``),
delay or drop its asynchronous invocations (an S3 notification delivered late, or never: S3 event
notifications are at-least-once and may arrive late), and hide new executions from DescribeExecution for
a while (`InvocationFaults.hide_new_executions`: Step Functions' reads are eventually consistent).

Lambda's limits are enforced per invocation (``local/limits.py``, in `run_handler`, in this process and in
the worker processes alike): a handler that runs past its ``FunctionSpec.timeout_s`` or whose memory goes
past its ``memory_mb`` fails the way Lambda fails it (an unhandled error; Step Functions sees
``Lambda.Unknown`` with a message naming the function and the figure).
"""

from __future__ import annotations

import base64
import importlib
import json
import logging
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

from local.limits import LimitMonitor, MemoryMeasure, default_measure, process_monitor

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], Any], Any]


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

    def drain(self, timeout: float = 30.0, *, beside_loop: bool | None = None, while_progressing: float = 0.0) -> None:
        """Wait for asynchronous (Event) invocations still running, at most ``timeout`` seconds in all; with
        ``while_progressing`` (seconds, at most), the ``timeout`` counts from the last invocation that ended
        instead: a queue of Track invocations that each take tens of seconds under load is waited for as long as
        it moves (each one ended gives ``timeout`` more), one that hangs costs ``timeout``.

        ``beside_loop=False`` (default once `abandon_beside_loop` was called, else True): not for the functions beside the loop (`stepwise.functions.FunctionSpec.beside_loop`:
        Track), which are left to end with their worker (`abandon_beside_loop`): run-local rebuilds what they
        produce at a run's end, and waited for them up to a minute (a Track invocation takes 8.5 s idle, about
        a minute under load)."""
        start = time.monotonic()
        deadline = start + timeout
        cap = start + max(timeout, while_progressing)
        beside_loop = not self.beside_loop_abandoned if beside_loop is None else beside_loop
        with self._lock:
            threads = [t for t in self._async_threads if beside_loop or t not in self._beside_loop_threads]
        while threads and time.monotonic() < deadline:
            threads[0].join(max(0.0, min(deadline, cap) - time.monotonic()))
            ended = [t for t in threads if not t.is_alive()]
            if not ended:
                break  # none ended within the time left: what is left is left
            threads = [t for t in threads if t.is_alive()]
            if while_progressing:
                deadline = min(cap, time.monotonic() + timeout)

    def abandon_beside_loop(self) -> bool:
        """Stop the functions beside the loop where they run in a process of their own (`local.workers.WorkerPool`):
        an invocation still running is cut short (a debug line, not a warning) and none ends later, so what is
        read next (the run's ledger, these invocations) holds still. Returns False, abandoning nothing, when they
        run in this process (no worker pool, or none of their own): `drain` then waits for them as before."""
        workers = self.workers
        if workers is None or not hasattr(workers, "stop_beside_loop"):
            return False
        self.beside_loop_abandoned = True
        if not workers.stop_beside_loop():
            self.beside_loop_abandoned = False
            return False
        return True
