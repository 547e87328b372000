"""Fault and latency injection for drills (settable at start-up and at run time).

A ``Fault`` matches API calls (by botocore operation name, e.g. ``ExecuteTrainingOperation``)
or applied operations (by kind, e.g. ``optim_step``) and fires on the next ``count`` matches,
with probability ``rate`` (seeded, so drills are repeatable), or on every match for ``seconds``
after it was armed ("for a while"):

* ``throttle``    -> the call is refused with ``ThrottlingException`` (HTTP 429 / 400 for the
  ``sagemaker`` control plane), before anything is recorded.
* ``internal``    -> the call is refused with ``InternalServerException`` (HTTP 500).
* ``unavailable`` -> the call is refused with HTTP 503 ``ServiceUnavailableException``: the
  "not ready" answer a runtime gives while it warms up after ``Running`` or binds a checkpoint
  just saved (the SDK retries it as transient: ``exceptions.is_retryable``, status 503).
* ``fail``        -> the *operation* (matched by kind) is accepted, then ends ``Failed`` with
  ``errorDetails`` and is not applied.
* ``expire``      -> the training session the call names moves to ``Expired`` before the call
  is answered (an API call, e.g. ``DescribeTrainingSession`` or ``ExecuteTrainingOperation``).

Spec strings (CLI flags, ``start_simulator(faults=[...])``): ``throttle:ExecuteTrainingOperation:3``
(next 3 calls), ``internal:GetSamplingOperationResult:0.1`` (10% of calls; a value with a ``.``
is a rate), ``unavailable:ExecuteSamplingOperation:4s`` (every call for 4 s from now; a value
ending in ``s``), ``fail:optim_step:1``, ``expire:DescribeTrainingSession:1``.
"""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

KINDS = ("throttle", "internal", "unavailable", "fail", "expire")
#: Kinds that refuse an API call before it is answered (``Simulator.call``).
CALL_KINDS = ("throttle", "internal", "unavailable")
#: Operation kinds counted and matched by ``fail`` faults and latency settings.
OPERATION_KINDS = (
    "forward",
    "forward_backward",
    "optim_step",
    "save_weights",
    "save_state",
    "load_state",
    "sample",
    "compute_logprobs",
    "load_weights_for_sampling",
)


@dataclass
class Fault:
    kind: str
    target: str
    count: int | None = None
    rate: float | None = None
    seconds: float | None = None  # every match within this many seconds of arming
    armed_at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"fault kind {self.kind!r} is not one of {', '.join(KINDS)}")
        if self.kind == "fail" and self.target not in OPERATION_KINDS:
            raise ValueError(f"'fail' faults target an operation kind ({', '.join(OPERATION_KINDS)}), got {self.target!r}")
        if sum(x is not None for x in (self.count, self.rate, self.seconds)) != 1:
            raise ValueError("a fault needs exactly one of count (next N matches), rate (probability) or seconds (a window)")
        if self.rate is not None and not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"fault rate must be in [0, 1], got {self.rate}")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError(f"fault window must be >= 0 seconds, got {self.seconds}")

    @classmethod
    def parse(cls, spec: str) -> "Fault":
        """Parse ``kind:target:N``, ``kind:target:0.25`` or ``kind:target:4s``."""
        parts = spec.split(":")
        if len(parts) != 3:
            raise ValueError(f"fault spec {spec!r} is not kind:target:count-rate-or-seconds "
                             "(e.g. throttle:ExecuteTrainingOperation:2, ...:0.1, ...:4s)")
        kind, target, amount = parts
        if amount.endswith("s"):
            return cls(kind, target, seconds=float(amount[:-1]))
        if "." in amount:
            return cls(kind, target, rate=float(amount))
        return cls(kind, target, count=int(amount))


class FaultPlan:
    """Thread-safe set of armed faults and per-kind latencies."""

    def __init__(self, seed: int = 0) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._latency: dict[str, float] = {}
        self._rng = random.Random(seed)

    def add(self, fault: Fault | str) -> None:
        fault = Fault.parse(fault) if isinstance(fault, str) else fault
        with self._lock:
            self._faults.append(fault)

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
            self._latency.clear()

    def set_latency(self, target: str, seconds: float) -> None:
        """Delay every ``target`` (an operation kind, or an API name) by ``seconds``."""
        if seconds < 0:
            raise ValueError(f"latency must be >= 0 seconds, got {seconds}")
        with self._lock:
            self._latency[target] = float(seconds)

    def latency(self, target: str) -> float:
        with self._lock:
            return self._latency.get(target, 0.0)

    def take(self, kinds: tuple[str, ...], target: str) -> str | None:
        """If an armed fault of one of ``kinds`` matches ``target``, consume it; return its kind."""
        with self._lock:
            for fault in self._faults:
                if fault.kind not in kinds or fault.target != target:
                    continue
                if fault.count is not None:
                    if fault.count > 0:
                        fault.count -= 1
                        return fault.kind
                elif fault.seconds is not None:
                    if time.monotonic() - fault.armed_at < fault.seconds:
                        return fault.kind
                elif self._rng.random() < (fault.rate or 0.0):
                    return fault.kind
        return None

    def describe(self) -> dict:
        with self._lock:
            return {
                "faults": [{k: v for k, v in f.__dict__.items() if k != "armed_at"} for f in self._faults],
                "latency": dict(self._latency),
            }
