"""A discrete-event model of the pipeline's step time: what asynchrony is worth on a config, before a run.

It replays a run's timeline with the durations a config's assumptions give: every rollout lasts its own
lognormal time (heavy-tailed, seeded by its prompt and member, so every engine sees the same durations),
a group ends with its slowest member, and the training session trains, saves and rebinds in fixed times.
Three engines, as the training loop runs them:

- ``sync`` (``max_staleness`` 0): a step rolls out its batch, waits for its slowest rollout, then trains;
- ``overlap`` (``admission: batch``, ``max_staleness`` 1): the next step's batch rolls out while this
  step trains; the sampler is rebound after both (the state machine's Parallel state);
- ``group`` (``admission: group``, d and k): the very rules of `stepwise.core.groups` (admission by
  capacity, in-flight cap and staleness deadline; pacing; the oldest complete groups first), driven by
  the events of rollouts ending and of the trainer.

The figure of merit is the session's busy fraction: the session bills for wall time, and it is busy only
while it trains and rebinds. `stepwise cost` prints this model's table for a config
(`stepwise_cli.cost.async_table`); ``benchmarks/async_depth.py`` sets it beside what the local stack
measures. Pure Python, no I/O.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from stepwise.core import groups as engine

__all__ = ["Timing", "SimResult", "lognormal_durations", "simulate"]


@dataclass(frozen=True)
class Timing:
    """The fixed times of a step, in seconds: training (forward_backward, optim_step, save_weights),
    the sampler's rebind (load_weights_for_sampling), and the orchestration between them (planning,
    advantages, state transitions)."""

    train_s: float
    rebind_s: float
    orchestration_s: float = 5.0


@dataclass
class SimResult:
    """What a simulated run measured: each step's wall seconds (from the previous step's end, the first
    from the run's start), the session's busy seconds (training and rebind) and the staleness of every
    trained rollout group (versions), the trainer's wait for data."""

    engine: str
    step_seconds: list[float] = field(default_factory=list)
    busy_seconds: float = 0.0
    wall_seconds: float = 0.0
    staleness_G: list[int] = field(default_factory=list)

    @property
    def s_per_step(self) -> float:
        """Mean wall seconds per step, the first step (a cold start for every engine) left out when there are others."""
        xs = self.step_seconds[1:] or self.step_seconds
        return sum(xs) / len(xs) if xs else 0.0

    @property
    def busy_fraction(self) -> float:
        return self.busy_seconds / self.wall_seconds if self.wall_seconds > 0 else 0.0


def lognormal_durations(*, mean_s: float, sigma: float, seed: int = 0, group_size: int) -> Callable[[int], list[float]]:
    """``durations(group)``: its members' seconds, lognormal with mean ``mean_s`` and log-sd ``sigma``, a
    function of (seed, group, member) only (the same group gets the same durations in every engine)."""
    mu = math.log(max(mean_s, 1e-9)) - sigma * sigma / 2

    def durations(group: int) -> list[float]:
        out = []
        for m in range(group_size):
            digest = hashlib.sha256(f"asyncmodel/{seed}/{group}/{m}".encode()).digest()
            rng = random.Random(int.from_bytes(digest[:8], "big"))
            out.append(math.exp(rng.gauss(mu, sigma)))
        return out

    return durations


def simulate(kind: str, *, steps: int, batch_size: int, group_size: int, durations: Callable[[int], list[float]],
             timing: Timing, steps_ahead: int = 0, max_staleness: int = 0, max_in_flight: int | None = None) -> SimResult:
    """Simulate ``steps`` steps of engine ``kind`` (``sync``, ``overlap``, ``group``) and return what they took.

    ``durations(g)`` gives group ``g``'s members' rollout seconds. ``steps_ahead`` / ``max_staleness`` /
    ``max_in_flight`` are the group engine's d, k and cap (default: no cap)."""
    if kind == "sync":
        return _sync(steps, batch_size, durations, timing)
    if kind == "overlap":
        return _overlap(steps, batch_size, durations, timing)
    if kind == "group":
        return _group(steps, batch_size, group_size, durations, timing, steps_ahead, max_staleness,
                      max_in_flight or 10**9)
    raise ValueError(f"unknown engine {kind!r}: sync, overlap or group")


def _batch_time(step: int, batch_size: int, durations: Callable[[int], list[float]]) -> float:
    return max(max(durations(g)) for g in range(step * batch_size, (step + 1) * batch_size))


def _sync(steps: int, bs: int, durations: Callable[[int], list[float]], t: Timing) -> SimResult:
    out = SimResult("sync")
    for n in range(steps):
        wall = _batch_time(n, bs, durations) + t.orchestration_s + t.train_s + t.rebind_s
        out.step_seconds.append(wall)
        out.busy_seconds += t.train_s + t.rebind_s
        out.staleness_G.extend([0] * bs)
    out.wall_seconds = sum(out.step_seconds)
    return out


def _overlap(steps: int, bs: int, durations: Callable[[int], list[float]], t: Timing) -> SimResult:
    """Step 0 rolls out alone (its sampler is the base model); from then on step n+1's batch starts with
    step n's training, and the rebind waits for both."""
    out = SimResult("overlap")
    now, ahead_done = 0.0, None
    for n in range(steps):
        start = now
        rolled = ahead_done if ahead_done is not None else now + _batch_time(n, bs, durations)
        train_start = max(now, rolled) + t.orchestration_s
        train_end = train_start + t.train_s
        if n + 1 < steps and n > 0:
            ahead_done = train_start + _batch_time(n + 1, bs, durations)
            join = max(train_end, ahead_done)
        else:
            ahead_done, join = None, train_end
        now = join + t.rebind_s
        out.step_seconds.append(now - start)
        out.busy_seconds += t.train_s + t.rebind_s
        out.staleness_G.extend([1 if n > 1 else 0] * bs)
    out.wall_seconds = now
    return out


def _group(steps: int, bs: int, size: int, durations: Callable[[int], list[float]], t: Timing, d: int, k: int,
           cap: int) -> SimResult:
    knobs = engine.Knobs(batch_size=bs, group_size=size, steps_ahead=d, max_staleness=k, max_in_flight=cap)
    buffer = engine.new_buffer("model", steps * bs + knobs.capacity, 0)
    out = SimResult(f"group d{d} k{k}")
    events: list[tuple[float, int, int]] = []  # (time, kind 0 = group done / 1 = trainer, group id)
    version, now = 0, 0.0
    trainer_free_at = 0.0
    step_start, trained = 0.0, 0

    def admit(at: float) -> None:
        for entry in engine.admit(buffer, knobs, sampler_version=version, now=at):
            heapq.heappush(events, (at + max(durations(entry.id)), 0, entry.id))

    admit(0.0)
    training = False
    heapq.heappush(events, (0.0, 1, -1))
    while trained < steps and events:
        now, kind, gid = heapq.heappop(events)
        if kind == 0:
            engine.complete_group(buffer, gid, 0, first_turn_version=None, durations_s=[], informative=True,
                                  knobs=knobs, now=now)
            admit(now)
        elif training:  # the step trained and rebound: the next version samples
            training = False
            version += 1
            trained += 1
            out.step_seconds.append(now - step_start)
            step_start = now
            admit(now)
        if training or now < trainer_free_at:
            continue
        ready = engine.readiness(buffer, knobs, version=version)
        if ready.status not in ("ready",):
            continue
        floors = {g.id: engine.floor(g) for g in buffer.groups}
        out.staleness_G.extend(version - floors[g] for g, _ in ready.chosen)
        engine.consume(buffer, ready, step=trained, version=version, decision="train")
        training = True
        admit(now + t.orchestration_s)  # "Admit groups while this step trains"
        done = now + t.orchestration_s + t.train_s + t.rebind_s
        out.busy_seconds += t.train_s + t.rebind_s
        trainer_free_at = done
        heapq.heappush(events, (done, 1, -1))
    out.wall_seconds = sum(out.step_seconds)
    return out
