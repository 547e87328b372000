"""Lambda's memory and time limits for handlers that the local engine runs in-process.

On AWS an invocation that runs past its function's timeout is stopped ("Task timed out after N
seconds"), and one whose container goes past its memory size is killed (``Runtime.OutOfMemory``);
Step Functions reports both as ``Lambda.Unknown`` with the Lambda's message as the cause. Locally
every handler runs on a thread of one process, so :class:`LimitMonitor` watches each invocation
from one monitor thread and, on a violation, raises :class:`LambdaTimedOut` or
:class:`LambdaOutOfMemory` *in the handler's thread* (``PyThreadState_SetAsyncExc``): the handler
stops at its next Python bytecode (a handler blocked in a C call, e.g. a socket read, stops when
that call returns), its ``finally`` blocks run, and the dispatcher answers the way Lambda does.
Both derive from ``BaseException`` so a handler's ``except Exception`` cannot swallow them.

Memory of one invocation, in-process (measured choice; benchmarks/README.md section 8):

- ``rss`` (default): the growth of the process's resident set (``/proc/self/statm``, one read per
  tick) over the invocation. It sees every allocation (Python, numpy, Arrow, C libraries), as
  Lambda's "Max Memory Used" does, and costs nothing measurable (toy run, 3 steps of 64 rollouts:
  17.8 s/step against 13.9 s with ``off``, within this loaded machine's run-to-run noise of
  11.4-16.5 s). It misses a spike shorter than a tick (20 ms) and memory the allocator reuses from
  an earlier invocation, and it cannot tell threads apart: what concurrent invocations (and the
  in-process moto, simulator and gateway) allocate meanwhile counts too.
- ``tracemalloc``: the growth of the traced Python heap (numpy included) plus Arrow's pool, from
  the peak ``tracemalloc`` keeps between ticks, so no spike is missed; same blindness to threads,
  and blind to other C allocations. It traces every allocation of the whole process: the same toy
  run took 38.5 s/step, 2.8x. Use it to find where a handler's Python memory goes.
- ``off``: only the timeout is enforced.

Either measure adds :data:`RUNTIME_MB` for what a Lambda process holds before the handler
allocates anything. Choose with ``STEPWISE_LOCAL_MEMORY_MEASURE``.
"""

from __future__ import annotations

import contextvars
import ctypes
import os
import sys
import threading
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any, Callable, Literal

MemoryMeasure = Literal["tracemalloc", "rss", "off"]
#: What a warm Lambda container of these handlers holds before an invocation allocates anything:
#: the interpreter and the handler's imports, pyarrow and a boto3 client included
#: (``benchmarks/dataset_memory.py`` measures a whole PlanStep process at 100 MB).
RUNTIME_MB = 100
#: Seconds between the monitor's checks.
TICK_S = 0.02
_PAGE = os.sysconf("SC_PAGE_SIZE")


class LambdaLimitExceeded(BaseException):
    """An invocation broke its function's limit (raised into the handler's thread)."""


class LambdaTimedOut(LambdaLimitExceeded):
    """The invocation ran past its function's ``timeout_s``."""


class LambdaOutOfMemory(LambdaLimitExceeded):
    """The invocation's memory went past its function's ``memory_mb`` (with :data:`RUNTIME_MB`)."""


def default_measure() -> MemoryMeasure:
    """``STEPWISE_LOCAL_MEMORY_MEASURE`` (``rss`` | ``tracemalloc`` | ``off``), default ``rss``."""
    value = os.environ.get("STEPWISE_LOCAL_MEMORY_MEASURE", "rss")
    if value not in ("tracemalloc", "rss", "off"):
        raise ValueError(f"STEPWISE_LOCAL_MEMORY_MEASURE={value!r}: expected tracemalloc, rss or off")
    return value  # type: ignore[return-value]


def _rss_bytes() -> int:
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * _PAGE


def _arrow_bytes() -> int:
    pa = sys.modules.get("pyarrow")  # never import it: only count it once a handler did
    return int(pa.total_allocated_bytes()) if pa is not None else 0


@dataclass
class Invocation:
    """One invocation the monitor watches; ``peak_bytes`` is its measured growth so far."""

    function_name: str
    memory_mb: int
    timeout_s: float
    started: float
    start_bytes: int
    thread_id: int = 0
    peak_bytes: int = 0
    violation: str | None = None  # Lambda's message when a limit was broken
    finished: bool = False  # the handler's thread is done: never raise into it again
    ended: float | None = None  # monotonic time the handler returned or raised
    raised: bool = False

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / 2**20


@dataclass
class Outcome:
    """What one limited call produced: the handler's result or exception, or the broken limit."""

    invocation: Invocation
    result: Any = None
    error: BaseException | None = None

    @property
    def violation(self) -> str | None:
        return self.invocation.violation


class LimitMonitor:
    """Enforces ``timeout_s`` and ``memory_mb`` on the calls it runs (see module doc).

    Args:
        measure: how memory is measured (``tracemalloc`` | ``rss`` | ``off``).
        runtime_mb: added to every invocation's growth before comparing with ``memory_mb``.
        tick_s: seconds between checks.
    """

    def __init__(self, measure: MemoryMeasure = "rss", *, runtime_mb: int = RUNTIME_MB,
                 tick_s: float = TICK_S) -> None:
        self.measure = measure
        self.runtime_mb = runtime_mb
        self.tick_s = tick_s
        self._lock = threading.Lock()
        self._active: dict[int, Invocation] = {}
        self._next_id = 0
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._started_tracemalloc = False
        self.ticks = 0

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "LimitMonitor":
        if self.measure == "tracemalloc" and not tracemalloc.is_tracing():
            tracemalloc.start(1)  # one frame per trace: the cheapest tracing there is
            self._started_tracemalloc = True
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="lambda-limits", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._started_tracemalloc:
            tracemalloc.stop()
            self._started_tracemalloc = False

    # ------------------------------------------------------------------ measuring

    def _current(self) -> tuple[int, int]:
        """``(current, peak since the last reset)`` bytes of the measure (caller holds the lock)."""
        if self.measure == "tracemalloc":
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.reset_peak()
            arrow = _arrow_bytes()
            return current + arrow, peak + arrow
        if self.measure == "rss":
            rss = _rss_bytes()
            return rss, rss
        return 0, 0

    def _check(self) -> None:
        """One tick: update every active invocation's peak; raise into those past a limit (lock held)."""
        _, peak = self._current()
        now = time.monotonic()
        for inv in self._active.values():
            inv.peak_bytes = max(inv.peak_bytes, peak - inv.start_bytes)
            if inv.violation is None:
                inv.violation = self._violation(inv, (inv.ended or now) - inv.started)
            if inv.violation is not None and not inv.finished and not inv.raised:
                inv.raised = True
                kind = LambdaTimedOut if inv.violation.startswith("Task timed out") else LambdaOutOfMemory
                _raise_in(inv.thread_id, kind)

    def _violation(self, inv: Invocation, elapsed: float) -> str | None:
        if elapsed > inv.timeout_s:
            return (f"Task timed out after {elapsed:.2f} seconds: function {inv.function_name} "
                    f"has timeout_s {inv.timeout_s:g}")
        if self.measure != "off" and self.runtime_mb + inv.peak_mb > inv.memory_mb:
            return (f"Runtime.OutOfMemory: function {inv.function_name} used "
                    f"{self.runtime_mb + inv.peak_mb:,.0f} MB ({self.runtime_mb} MB runtime + "
                    f"{inv.peak_mb:,.0f} MB measured by {self.measure}) of its memory_mb {inv.memory_mb:,}")
        return None

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            with self._lock:
                self.ticks += 1
                if self._active:
                    self._check()

    # ------------------------------------------------------------------ calls

    def run(self, function_name: str, fn: Callable[[], Any], *, memory_mb: int, timeout_s: float) -> Outcome:
        """Run ``fn()`` on a thread of its own, under the function's limits; never raises.

        Returns as soon as ``fn`` returns, or at ``timeout_s`` (plus one second of grace for a
        handler blocked in a C call) with the timeout as ``violation``, like Lambda; a handler still
        blocked then gets `LambdaTimedOut` when it next runs Python code. The limit exceptions are
        only ever raised in that thread, so the caller's own code cannot be interrupted.
        """
        box: dict[str, Any] = {}
        with self._lock:
            start, _ = self._current()
            inv = Invocation(function_name, memory_mb, timeout_s, time.monotonic(), start)
            key = self._next_id
            self._next_id += 1

        def work() -> None:
            try:
                try:
                    box["result"] = fn()
                except BaseException as exc:  # the handler's own error, or the limit raised into it
                    box["error"] = exc
                finally:
                    with self._lock:
                        inv.finished = True
                        inv.ended = time.monotonic()
            except LambdaLimitExceeded:  # fired during the bookkeeping above: inv.violation says why
                pass

        # The caller's context variables go along (as if the handler ran on the caller's thread).
        thread = threading.Thread(target=contextvars.copy_context().run, args=(work,),
                                  name=f"lambda-{function_name}", daemon=True)
        with self._lock:
            thread.start()
            inv.thread_id = thread.ident or 0
            self._active[key] = inv
        thread.join(timeout_s + 1.0)
        with self._lock:
            inv.finished = True
            self._check()  # the peak up to the handler's return (never raises: finished)
            del self._active[key]
        if inv.violation is None and thread.is_alive():  # cannot happen unless the monitor is stopped
            inv.violation = self._violation(inv, timeout_s + 1.0)
        return Outcome(inv, box.get("result"), box.get("error"))


def _raise_in(thread_id: int, exc: type[BaseException]) -> None:
    """Raise ``exc`` in thread ``thread_id`` when it next runs Python code."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc))


_PROCESS_MONITOR: LimitMonitor | None = None
_PROCESS_LOCK = threading.Lock()


def process_monitor() -> LimitMonitor:
    """This process's monitor, started on first use with `default_measure` (a Lambda worker process
    of `local.workers` has one; its RSS is only its own handlers')."""
    global _PROCESS_MONITOR
    with _PROCESS_LOCK:
        if _PROCESS_MONITOR is None:
            _PROCESS_MONITOR = LimitMonitor(default_measure()).start()
        return _PROCESS_MONITOR
