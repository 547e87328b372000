"""Bounded parallel work with a deadline, for clean-up that grows with a run (the rollouts a stop
abandons, the model packages retention deletes): many small independent service calls, each
idempotent, done by a few threads, with the results handled in the caller's thread as they come
(so the caller records each one), and never past the invocation's deadline.

Only the calls run on the worker threads; whatever the caller does with a result (recording it in
S3) runs on its own thread, in completion order. At the deadline the caller stops waiting: calls
still running finish on their threads, their results are dropped, and the items not handed out are
reported as not done (the caller leaves them to the next pass: the work is idempotent). On Lambda a
returned invocation freezes its threads, so a dropped call may complete in a later invocation of the
container; nothing is recorded from it.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Generic, TypeVar

#: Longest single wait for a completion (a finite timeout for an infinite deadline).
MAX_WAIT_S = 3600.0

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Outcome(Generic[T, R]):
    """One item's call: its ``result``, or the ``error`` it raised (then ``result`` is None)."""

    item: T
    result: R | None = None
    error: BaseException | None = None


def run_until(items: Iterable[T], call: Callable[[T], R], *, workers: int, deadline: float,
              clock: Callable[[], float] = time.monotonic) -> Iterator[Outcome[T, R]]:
    """``call(item)`` for each item on at most ``workers`` threads, yielding each `Outcome` in the
    caller's thread as it completes, until every item is done or ``clock()`` reaches ``deadline``
    (``time.monotonic`` seconds). Items are handed out only while time is left, ``workers`` at a
    time, so at the deadline at most ``workers`` calls are abandoned in flight. The items never
    yielded are the ones not done.

    Exceptions of ``call`` are yielded, never raised; closing the generator early abandons the rest.
    """
    pending = list(items)
    pending.reverse()  # pop() from the end hands items out in their order
    if not pending:
        return
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="stepwise-bounded")
    running: dict[Future[R], T] = {}
    try:
        while pending or running:
            while pending and len(running) < workers and clock() < deadline:
                item = pending.pop()
                running[pool.submit(call, item)] = item
            left = deadline - clock()
            if left <= 0 or not running:
                return
            done, _ = wait(list(running), timeout=min(left, MAX_WAIT_S), return_when=FIRST_COMPLETED)
            for future in done:
                item = running.pop(future)
                error = future.exception()
                yield Outcome(item, None if error else future.result(), error)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


class RateLimiter:
    """At most ``per_second`` acquisitions in any one-second window, across threads (a sliding window,
    as a service counts a per-second request quota: ACR's, and the local ACR emulator's): the client
    side of a quota parallel callers share, so none is refused by it. ``per_second`` <= 0: no limit."""

    def __init__(self, per_second: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.rate = int(per_second)
        self._clock, self._sleep = clock, sleep
        self._sent: collections.deque[float] = collections.deque()
        self._lock = threading.Lock()

    def acquire(self) -> None:
        """Wait until a request may be sent (the window's oldest is a second old)."""
        if self.rate <= 0:
            return
        while True:
            with self._lock:
                now = self._clock()
                while self._sent and now - self._sent[0] >= 1.0:
                    self._sent.popleft()
                if len(self._sent) < self.rate:
                    self._sent.append(now)
                    return
                wait_s = 1.0 - (now - self._sent[0])
            self._sleep(max(wait_s, 0.001))
