"""`stepwise.concurrency`: bounded parallel work that stops handing out calls at its deadline, and the
client-side pacing of a per-second quota (what a run's clean-up uses: tests/drills/test_run_end_at_scale.py)."""

from __future__ import annotations

import threading
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.concurrency import RateLimiter, run_until


@settings(max_examples=15, deadline=None)
@given(n=st.integers(0, 40), workers=st.integers(1, 8), fail=st.sets(st.integers(0, 39), max_size=5))
def test_every_item_is_yielded_once_with_its_result_or_its_error_at_most_workers_at_once(n, workers, fail):
    running, peak, lock = [0], [0], threading.Lock()

    def call(i: int) -> int:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002)
        with lock:
            running[0] -= 1
        if i in fail:
            raise ValueError(i)
        return i * i

    out = list(run_until(range(n), call, workers=workers, deadline=time.monotonic() + 60))
    assert sorted(o.item for o in out) == list(range(n))
    for o in out:
        assert (o.error is not None) == (o.item in fail) and (o.result == o.item * o.item or o.item in fail)
    assert peak[0] <= workers


def test_at_the_deadline_nothing_more_is_handed_out_and_the_rest_is_reported_by_its_absence():
    started: list[int] = []

    def call(i: int) -> int:
        started.append(i)
        time.sleep(0.1)
        return i

    t0 = time.monotonic()
    out = list(run_until(range(100), call, workers=4, deadline=t0 + 0.35))
    elapsed = time.monotonic() - t0
    assert elapsed < 0.6  # the caller never waits past the deadline for a call in flight
    assert 8 <= len(out) <= 16 and len(started) <= len(out) + 4  # only the 4 in flight are abandoned
    assert sorted(started) == list(range(len(started)))  # handed out in order
    assert {o.item for o in out} <= set(started)


def test_the_rate_limiter_never_lets_more_than_its_rate_through_in_any_second_across_threads():
    # each acquisition's time as the limiter took it (the clock read under its lock, the last one in this thread
    # before acquire returns): a time read after acquire returns can be late by a thread switch under load, and
    # CI once counted 26 such stamps in a second
    last = threading.local()

    def clock() -> float:
        last.now = time.monotonic()
        return last.now

    limiter = RateLimiter(25, clock=clock)
    stamps: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        for _ in range(10):
            limiter.acquire()
            with lock:
                stamps.append(last.now)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stamps.sort()
    assert max(sum(1 for t in stamps if s <= t < s + 1.0) for s in stamps) <= 25
    assert 2.0 <= stamps[-1] - stamps[0] < 4.0  # 80 at 25 a second: a little over 3 s, not serialised further
