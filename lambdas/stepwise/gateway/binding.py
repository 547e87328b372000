"""Which sampler a turn samples with: the session record's ``sampler_binding`` applied per turn.

The rules are `stepwise.core.sampler_binding`; the objects `stepwise.aws.sampler_gate`. Per turn:

- ``per_rollout``: the session record's package; no request.
- ``next_turn``: the run's current sampler (``runs/{run_id}/sampler/current.json``) when it is newer
  than the record's; a container reuses what it read for ``CURRENT_SAMPLER_MAX_AGE_SECONDS`` (at most
  one GET per turn). A turn the service refuses is retried once on a newer sampler (`retry_record`):
  a service that serves only the package it loaded last refuses the older one from the end of the
  load, a little before Rebind rewrites the current sampler.
- ``turn_gate``: the turn writes its lease (deadline in its key), *then* reads the gate fresh: a turn
  that saw the gate open is in the listing Rebind makes after closing it, and one that reads it after
  sees it closed (S3 is strongly consistent for both). Closed, the turn drops its lease and waits,
  polling the gate, until it opens (or its deadline passes); held longer than ``HOLD_LIMIT_SECONDS``
  it is answered 503 (the agent's client retries). While the turn samples, its lease is renewed
  every ``LEASE_RENEW_SECONDS``; it is deleted when the turn ends. A gateway that dies mid-turn holds
  the gate until its lease's deadline only.

`SamplerBindings.turn` is the one entry point: an async context manager yielding a `TurnBinding`: the
session record to serve the turn with (its ``sampler_model_package_arn`` and ``policy_version`` replaced
by the sampler chosen, so the sampling seam and the turn recorder both see the package actually
sampled), and ``release()``, which the gateway awaits beside the captured turn's PUT once the sample is
done (the lease guards the sample, not the write): the lease's DELETE adds no round trip to the turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from stepwise.aws import sampler_gate
from stepwise.aws.runstore import RunStore
from stepwise.core import sampler_binding as rules
from stepwise.records import RunSampler, SamplerPolicy, SessionRecord

logger = logging.getLogger(__name__)


@dataclass
class TurnBinding:
    """The record a turn samples with, and the release of its lease (a no-op but for ``turn_gate``;
    idempotent, never raises: a lease left behind expires at its deadline)."""

    record: SessionRecord
    _release: Callable[[], Awaitable[None]] | None = None

    async def release(self) -> None:
        release, self._release = self._release, None
        if release is not None:
            await release()


class GateHeld(RuntimeError):
    """A turn waited at a closed gate longer than ``HOLD_LIMIT_SECONDS`` (the gateway answers 503)."""


def policy_of(record: SessionRecord) -> SamplerPolicy:
    return SamplerPolicy(training_session_name=record.training_session_name,
                         sampler_model_package_arn=record.sampler_model_package_arn,
                         policy_version=record.policy_version)


def with_sampler(record: SessionRecord, sampler: SamplerPolicy) -> SessionRecord:
    """``record`` sampling ``sampler`` (the same object when nothing changes)."""
    if (sampler.sampler_model_package_arn, sampler.policy_version) == (record.sampler_model_package_arn,
                                                                       record.policy_version):
        return record
    return record.model_copy(update={"sampler_model_package_arn": sampler.sampler_model_package_arn,
                                     "policy_version": sampler.policy_version})


@dataclass
class BindingStats:
    """What the bindings cost this container (for tests and the benchmark): turns by binding, turns held at
    a closed gate and the seconds they waited, lease renewals, and turns retried on a newer sampler."""

    turns: dict[str, int] = field(default_factory=dict)
    held: int = 0
    held_seconds: float = 0.0
    renewals: int = 0
    retried: int = 0


class SamplerBindings:
    """The gateway's per-turn sampler choice (module docstring).

    Args:
        store: the run bucket (`RunStore` over the gateway's S3 client).
        clock: epoch seconds (lease and gate deadlines).
        sleep: awaited between two looks at a closed gate.
        max_age_s: how long a container reuses a current sampler it read (``next_turn``).
    """

    def __init__(self, store: RunStore, *, clock: Callable[[], float] = time.time,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                 max_age_s: float = rules.CURRENT_SAMPLER_MAX_AGE_SECONDS,
                 lease_s: float = rules.LEASE_SECONDS, renew_s: float = rules.LEASE_RENEW_SECONDS,
                 hold_poll_s: float = rules.HOLD_POLL_SECONDS, hold_limit_s: float = rules.HOLD_LIMIT_SECONDS) -> None:
        self.store = store
        self.clock = clock
        self.sleep = sleep
        self.max_age_s = max_age_s
        self.lease_s, self.renew_s = lease_s, renew_s
        self.hold_poll_s, self.hold_limit_s = hold_poll_s, hold_limit_s
        self.stats = BindingStats()
        self._cached: dict[str, tuple[float, RunSampler | None]] = {}

    async def current(self, run_id: str, *, fresh: bool = False) -> RunSampler | None:
        """The run's current sampler: read from S3, or (``fresh=False``) this container's copy if younger than ``max_age_s``."""
        now = time.monotonic()
        hit = self._cached.get(run_id)
        if not fresh and hit is not None and now - hit[0] < self.max_age_s:
            return hit[1]
        sampler = await asyncio.to_thread(sampler_gate.read_current, self.store, run_id)
        self._cached[run_id] = (time.monotonic(), sampler)
        if len(self._cached) > 256:  # runs served by one container: a handful
            self._cached.pop(next(iter(self._cached)))
        return sampler

    @contextlib.asynccontextmanager
    async def turn(self, record: SessionRecord, holder: str = "") -> AsyncIterator[TurnBinding]:
        """Serve one turn of ``record``'s session: yields the record to sample with (and the lease's
        release). Raises `GateHeld`."""
        binding = record.sampler_binding
        self.stats.turns[binding] = self.stats.turns.get(binding, 0) + 1
        if binding == "per_rollout":
            yield TurnBinding(record)
            return
        if binding == "next_turn":
            current = await self.current(record.run_id)
            yield TurnBinding(with_sampler(record, rules.turn_sampler(binding, policy_of(record), current)))
            return
        async with self._gated(record.run_id, holder) as (current, release):
            bound = TurnBinding(with_sampler(record, rules.turn_sampler(binding, policy_of(record), current)), release)
            try:
                yield bound
            finally:
                await _uncancellable(bound.release())

    async def retry_record(self, record: SessionRecord) -> SessionRecord | None:
        """``next_turn``: the record to retry a refused turn with (a newer sampler), or None."""
        if record.sampler_binding != "next_turn":
            return None
        target = rules.retry_sampler(policy_of(record), await self.current(record.run_id, fresh=True))
        if target is None:
            return None
        self.stats.retried += 1
        return with_sampler(record, target)

    @contextlib.asynccontextmanager
    async def _gated(self, run_id: str, holder: str) -> AsyncIterator[tuple[RunSampler | None, Callable[[], Awaitable[None]]]]:
        started = self.clock()
        lease_id = uuid.uuid4().hex
        held_since: float | None = None
        while True:
            key = await asyncio.to_thread(sampler_gate.put_lease, self.store, run_id, self.clock() + self.lease_s,
                                          lease_id, holder)
            current = await self.current(run_id, fresh=True)  # after the lease: the protocol's order
            if rules.gate_is_open(current, self.clock()):
                break
            await asyncio.to_thread(sampler_gate.drop_lease, self.store, key)
            if held_since is None:
                held_since = self.clock()
                self.stats.held += 1
            while not rules.gate_is_open(current, self.clock()):
                if self.clock() - started > self.hold_limit_s:
                    self.stats.held_seconds += self.clock() - held_since
                    raise GateHeld(f"the run's sampler gate stayed closed for {self.hold_limit_s:.0f} s "
                                   "(new weights loading); retry the request")
                await self.sleep(self.hold_poll_s)
                current = await self.current(run_id, fresh=True)
        if held_since is not None:
            self.stats.held_seconds += self.clock() - held_since
        lease = [key]
        released: list[bool] = []
        lock = asyncio.Lock()  # a renewal (PUT, swap, DELETE) is never cut by the release: no orphaned lease
        renewer = asyncio.create_task(self._renew(run_id, lease_id, holder, lease, lock, released))

        async def release() -> None:
            async with lock:
                if released:
                    return
                released.append(True)
                renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await renewer
            try:
                await asyncio.to_thread(sampler_gate.drop_lease, self.store, lease[0])
            except Exception as e:  # it expires at its deadline: Rebind waits that long at most
                logger.warning("turn lease not deleted", extra={"error": type(e).__name__, "detail": str(e)[:200]})

        try:
            yield current, release
        finally:
            await _uncancellable(release())

    async def _renew(self, run_id: str, lease_id: str, holder: str, lease: list[str], lock: asyncio.Lock,
                     released: list[bool]) -> None:
        """Every ``renew_s``: a lease with a new deadline, then the old one deleted (``lease[0]``: the live key)."""
        while True:
            await self.sleep(self.renew_s)
            try:
                # Under the lock, which the release takes before it cancels this task: a cancelled
                # to_thread whose work item had not started yet never runs, and its lease would outlive the turn.
                async with lock:
                    if released:
                        return
                    key = await asyncio.to_thread(sampler_gate.put_lease, self.store, run_id,
                                                  self.clock() + self.lease_s, lease_id, holder)
                    old, lease[0] = lease[0], key
                    self.stats.renewals += 1
                    await asyncio.to_thread(sampler_gate.drop_lease, self.store, old)
            except Exception as e:  # the next renewal tries again; the live lease still holds until its deadline
                logger.warning("turn lease not renewed", extra={"error": type(e).__name__, "detail": str(e)[:200]})


async def _uncancellable(coro: Awaitable[None]) -> None:
    """Finish ``coro`` even if the turn is cancelled meanwhile (a lease must not outlive its turn), then re-raise."""
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        await task
        raise
