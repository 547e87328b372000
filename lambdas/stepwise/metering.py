"""What each Lambda invocation of the stack uses, measured by the invocation itself, and how those
measurements reach the run's cost ledger without S3 requests of their own.

Measuring (per invocation, `begin` / `end`): the handler entrypoint
(`stepwise.handlers._common.entrypoint`) and the gateway's request middleware start a `Meter` with
the function's logical name and its configured memory (the Lambda context's ``memory_limit_in_mb``;
the gateway reads ``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``): its duration (monotonic clock), one request,
and every S3 request its clients send, by price class (`count_s3`, a botocore ``before-send`` hook
that `install_s3_counter` puts on each S3 client: retries are counted, as S3 bills them).

Carrying (`ride`): a measurement rides in the next record the invocation writes anyway. A handler
that writes ``state.json`` adds it to ``state.ledger`` (`stepwise.aws.runstore.RunStore.update_state`);
StartRollout puts it in the gateway session record, the gateway in each captured turn,
OnRolloutResult in its SendTaskSuccess output (and a re-check that waits again in the session record);
FinishRollout sums those into the rollout record, which ComputeAdvantages or RecordEval adds to the
ledger. What an invocation used after its last write (or all of it, when it writes nothing for the run,
or only a record nobody will sum: a StartRollout the state machine retries in a fresh session, an
OnRolloutResult whose task had already ended) stays in this process's `Carry` and rides with the next
record this process writes for the same run, so nothing is counted twice and only the last invocations'
tails of each execution environment are never counted.

A ride is committed only when its record was written (`Ride.commit`); a ride whose write failed
gives its carried measurements back (`Ride.cancel`). No AWS calls, no S3 keys: the bookkeeping of
one process.
"""

from __future__ import annotations

import contextlib
import contextvars
import itertools
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from stepwise.records import Usage

_CURRENT: contextvars.ContextVar[Meter | None] = contextvars.ContextVar("stepwise_meter", default=None)


@dataclass
class Meter:
    """One invocation's measurement: ``function`` (logical name), ``memory_mb`` (configured), the run
    it works for (``run_id``, once known), and what has already ridden in a record."""

    function: str
    memory_mb: int
    started: float = field(default_factory=time.monotonic)
    run_id: str | None = None
    s3_put: int = 0
    s3_get: int = 0
    flushed_at: float = 0.0
    flushed_put: int = 0
    flushed_get: int = 0
    request_flushed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.flushed_at = self.started

    def unflushed(self, now: float) -> tuple[Usage, tuple[float, int, int]]:
        """The usage not yet carried by a record (up to ``now``, monotonic), and the snapshot that
        marks it carried once committed."""
        from stepwise.core.ledger import lambda_usage

        with self.lock:
            put, get = self.s3_put, self.s3_get
            u = lambda_usage(self.function, self.memory_mb, now - self.flushed_at,
                             requests=0 if self.request_flushed else 1)
            u.s3_put_class, u.s3_get_class = put - self.flushed_put, get - self.flushed_get
        return u, (now, put, get)

    def mark_flushed(self, snapshot: tuple[float, int, int]) -> None:
        with self.lock:
            at, put, get = snapshot
            self.flushed_at, self.flushed_put, self.flushed_get = max(self.flushed_at, at), put, get
            self.request_flushed = True


class Carry:
    """Measurements of this process waiting for a record of their run (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_run: dict[str, dict[int, Usage]] = {}
        self._ids = itertools.count()

    def put(self, run_id: str, usage: Usage) -> None:
        if usage.is_empty():
            return
        with self._lock:
            self._by_run.setdefault(run_id, {})[next(self._ids)] = usage

    def take(self, run_id: str) -> dict[int, Usage]:
        with self._lock:
            return self._by_run.pop(run_id, {})

    def give_back(self, run_id: str, entries: dict[int, Usage]) -> None:
        if entries:
            with self._lock:
                self._by_run.setdefault(run_id, {}).update(entries)

    def pending(self, run_id: str) -> Usage:
        """What waits for ``run_id`` (a copy; tests, and the local report of what was never written)."""
        with self._lock:
            out = Usage()
            for u in self._by_run.get(run_id, {}).values():
                out.add(u)
            return out

    def clear(self) -> None:
        with self._lock:
            self._by_run.clear()


#: This process's carry (one per execution environment on Lambda).
CARRY = Carry()


# ---------------------------------------------------------------------------- the invocation


def begin(function: str, memory_mb: int) -> contextvars.Token:
    """Start measuring an invocation of ``function`` (logical name) with ``memory_mb`` configured."""
    return _CURRENT.set(Meter(function=function, memory_mb=int(memory_mb)))


def end(token: contextvars.Token) -> Usage | None:
    """Stop measuring: what the invocation used since its last ride goes to `CARRY` under its run
    (dropped when it never learned its run: it worked for none). Returns that remainder."""
    meter = _CURRENT.get()
    _CURRENT.reset(token)
    if meter is None:
        return None
    rest, _ = meter.unflushed(time.monotonic())
    if meter.run_id:
        CARRY.put(meter.run_id, rest)
    return rest


def current() -> Meter | None:
    """The meter of the invocation running in this context, or None (outside an invocation)."""
    return _CURRENT.get()


def bind_run(run_id: str | None) -> None:
    """The invocation works for ``run_id`` (its remainder is carried for that run)."""
    meter = _CURRENT.get()
    if meter is not None and run_id:
        meter.run_id = run_id


@contextlib.contextmanager
def measuring(function: str, memory_mb: int, run_id: str | None = None) -> Iterator[Meter]:
    """`begin` ... `end` as a block (the gateway's requests)."""
    token = begin(function, memory_mb)
    meter = _CURRENT.get()
    assert meter is not None
    meter.run_id = run_id
    try:
        yield meter
    finally:
        end(token)


# ---------------------------------------------------------------------------- S3 requests


def count_s3(operation: str) -> None:
    """Count one S3 request of ``operation`` (botocore's operation name) for the current invocation."""
    from stepwise.core.prices import s3_request_class

    meter = _CURRENT.get()
    if meter is None:
        return
    kind = s3_request_class(operation)
    if kind is None:
        return
    with meter.lock:
        if kind == "put":
            meter.s3_put += 1
        else:
            meter.s3_get += 1


def _before_send(event_name: str = "", **kwargs: Any) -> None:
    # botocore emits "before-send.{service}.{Operation}" once per HTTP attempt (botocore/endpoint.py)
    op = event_name.rsplit(".", 1)[-1]
    if op and op != "s3":
        count_s3(op)


def install_s3_counter(client: Any) -> Any:
    """Count every request ``client`` (a boto3 S3 client) sends, once per HTTP attempt; idempotent.
    Returns the client."""
    events = getattr(getattr(client, "meta", None), "events", None)
    if events is not None:
        events.register("before-send.s3", _before_send, unique_id="stepwise-metering-s3")
    return client


# ---------------------------------------------------------------------------- riding in a record


@dataclass
class Ride:
    """The usage to write with a record now: the current invocation's since its last ride plus what
    this process carries for the run. `commit` once the record is written, `cancel` if it was not."""

    run_id: str
    usage: Usage
    _meter: Meter | None = None
    _snapshot: tuple[float, int, int] | None = None
    _carried: dict[int, Usage] = field(default_factory=dict)
    _done: bool = False

    def commit(self) -> None:
        if self._done:
            return
        self._done = True
        if self._meter is not None and self._snapshot is not None:
            self._meter.mark_flushed(self._snapshot)

    def cancel(self) -> None:
        if self._done:
            return
        self._done = True
        CARRY.give_back(self.run_id, self._carried)


def ride(run_id: str) -> Ride:
    """What rides in a record of ``run_id`` written now (see the module doc). Also binds the current
    invocation to ``run_id``."""
    meter = _CURRENT.get()
    usage, snapshot = Usage(), None
    if meter is not None:
        meter.run_id = meter.run_id or run_id
        if meter.run_id == run_id:
            usage, snapshot = meter.unflushed(time.monotonic())
    carried = CARRY.take(run_id)
    for u in carried.values():
        usage.add(u)
    return Ride(run_id=run_id, usage=usage, _meter=meter if snapshot else None, _snapshot=snapshot, _carried=carried)


@contextlib.contextmanager
def riding(run_id: str) -> Iterator[Usage]:
    """``with riding(run_id) as usage: write a record holding usage``: committed when the block ends,
    given back when it raises."""
    r = ride(run_id)
    try:
        yield r.usage
    except BaseException:
        r.cancel()
        raise
    r.commit()
