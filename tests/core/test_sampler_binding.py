"""What a turn samples while new weights load, and which binding is safe against which service
(`stepwise.core.sampler_binding`): the rule, the gateway's choice per turn, and the gate's protocol
played out in every interleaving hypothesis finds."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core import sampler_binding as sb
from stepwise.records import RunSampler, SamplerPolicy

A = SamplerPolicy(training_session_name="s", sampler_model_package_arn="arn:pkg/1", policy_version=1)
B = SamplerPolicy(training_session_name="s", sampler_model_package_arn="arn:pkg/2", policy_version=2)


def test_each_behaviour_has_its_safe_bindings_and_the_recommendation_pauses_least():
    assert {b: sb.recommended_binding(b) for b in sb.BEHAVIOURS} == {
        "several": "per_rollout", "latest": "next_turn", "switching": "turn_gate", "disturbing": "turn_gate",
        "unknown": "turn_gate"}
    # the gate is safe against everything; per_rollout only against a service serving several packages
    assert all(sb.is_safe("turn_gate", b) for b in sb.BEHAVIOURS)
    assert [b for b in sb.BEHAVIOURS if sb.is_safe("per_rollout", b)] == ["several"]
    assert [b for b in sb.BEHAVIOURS if sb.is_safe("next_turn", b)] == ["several", "latest"]
    assert sb.DEFAULT_BINDING == "turn_gate" and sb.BINDINGS == ("per_rollout", "next_turn", "turn_gate")


@pytest.mark.parametrize(("older", "across", "behaviour"), [
    ("served", "clean", "several"), ("refused", "clean", "latest"), ("switched", "clean", "switching"),
    ("served", "disturbed", "disturbing"), ("garbage", "clean", "disturbing"), ("garbage", None, "disturbing"),
    ("served", None, "unknown"), (None, "clean", "unknown"), (None, None, "unknown"),
])
def test_the_probes_observations_name_one_behaviour(older, across, behaviour):
    assert sb.classify_service(older, across) == behaviour


def test_loads_overlap_rollouts_only_when_overlapped_and_not_gated():
    assert not sb.rebind_during_rollouts("per_rollout", 0)
    assert sb.rebind_during_rollouts("per_rollout", 1) and sb.rebind_during_rollouts("next_turn", 1)
    assert not sb.rebind_during_rollouts("turn_gate", 1)  # rebinds after the join: nothing in flight
    assert all(sb.rebind_during_rollouts(b, 2) for b in sb.BINDINGS)  # deep asynchrony: always in flight
    # the group engine admits groups while a step trains from max_staleness 1 on: they run through its Rebind
    assert all(sb.rebind_during_rollouts(b, 1, "group") for b in sb.BINDINGS)
    assert not any(sb.rebind_during_rollouts(b, 0, "group") for b in sb.BINDINGS)
    # the gateway then enforces the run's binding; with no load during the rollout, the free per_rollout
    assert sb.session_binding("next_turn", loads_during_rollouts=True) == "next_turn"
    assert sb.session_binding("turn_gate", loads_during_rollouts=False) == "per_rollout"


def test_a_turn_samples_its_record_or_the_newer_current_sampler_of_the_same_session():
    current = RunSampler(**B.model_dump())
    assert sb.turn_sampler("per_rollout", A, current) == A
    assert sb.turn_sampler("next_turn", A, current) == B
    assert sb.turn_sampler("turn_gate", A, current) == B
    assert sb.turn_sampler("next_turn", A, None) == A  # Rebind never wrote one yet
    assert sb.turn_sampler("next_turn", B, RunSampler(**A.model_dump())) == B  # started after the last load
    resumed = RunSampler(**B.model_dump() | {"training_session_name": "other"})
    assert sb.turn_sampler("next_turn", A, resumed) == A  # a resumed run's new session: the record's


def test_a_refused_turn_retries_on_the_newer_sampler_or_the_package_being_loaded():
    assert sb.retry_sampler(A, RunSampler(**B.model_dump())) == B
    loading = sb.announce_load(A, B, now=10.0)
    assert sb.retry_sampler(A, loading) == B  # the load ended, Rebind has not rewritten the sampler yet
    assert sb.retry_sampler(B, loading) is None  # nothing newer to try
    assert sb.retry_sampler(A, RunSampler(**A.model_dump())) is None
    assert sb.retry_sampler(A, None) is None


def test_a_closed_gate_holds_turns_until_it_opens_or_its_deadline_passes():
    closed = sb.close_gate(None, A, B, now=100.0)
    assert (closed.gate, closed.closed_at, closed.gate_deadline) == ("closed", 100.0, 100.0 + sb.GATE_SECONDS)
    assert not sb.gate_is_open(closed, 101.0)
    assert sb.gate_is_open(closed, 100.0 + sb.GATE_SECONDS + 1)  # Rebind died: the gate reopens by itself
    renewed = sb.close_gate(closed.model_copy(update={"turns_at_load": 2}), A, B, now=150.0)
    assert (renewed.closed_at, renewed.gate_deadline, renewed.turns_at_load) == (100.0, 150.0 + sb.GATE_SECONDS, 2)
    # a gate left closed by an earlier, abandoned load is a new closing
    stale = sb.close_gate(closed, A, B, now=100.0 + sb.GATE_SECONDS + 5)
    assert stale.closed_at == 100.0 + sb.GATE_SECONDS + 5
    opened = sb.open_gate(B, 160.0, renewed)
    assert sb.gate_is_open(opened, 161.0) and opened.sampler_model_package_arn == B.sampler_model_package_arn
    assert sb.gate_metrics(opened) == {"time/gate_closed": 60.0, "sampler/gate_turns_at_load": 2.0}
    assert sb.gate_metrics(sb.open_gate(B, 160.0)) == {} and sb.gate_is_open(None, 0.0)


def test_the_drain_waits_for_live_leases_ignores_dead_ones_and_has_a_bound():
    assert sb.drain_verdict(100.0, [], 101.0).ready
    live = sb.drain_verdict(100.0, [150.0, 90.0], 101.0)
    assert (live.ready, live.in_flight) == (False, 1)  # the lease of a gateway that crashed at 30 s is dead
    assert sb.drain_verdict(100.0, [100.0 + sb.DRAIN_BOUND_SECONDS + 60], 100.0 + sb.DRAIN_BOUND_SECONDS).ready
    assert not sb.drain_verdict(100.0, [104.0], 108.0).ready  # within the clock skew: still live
    assert sb.drain_verdict(100.0, [104.0], 104.0 + sb.CLOCK_SKEW_SECONDS + 0.1).ready


# ---------------------------------------------------------------------------- the protocol, every interleaving


@dataclass
class World:
    """Leases, the gate, and what samples; the turns and Rebind below move through it one action at a time."""

    gate: RunSampler | None = None
    leases: dict[int, float] = field(default_factory=dict)
    sampling: set[int] = field(default_factory=set)
    loading: bool = False
    violations: list[str] = field(default_factory=list)
    now: float = 1000.0


def turn(world: World, i: int):
    """A gateway turn (`stepwise.gateway.binding.TurnGate`): lease, then read the gate; sample if open."""
    while True:
        world.leases[i] = world.now + sb.LEASE_SECONDS
        yield
        if sb.gate_is_open(world.gate, world.now):
            break
        del world.leases[i]
        yield
        while not sb.gate_is_open(world.gate, world.now):  # held: polls the gate, holding no lease
            yield
    world.sampling.add(i)
    if world.loading:
        world.violations.append(f"turn {i} started sampling during the load")
    yield
    if world.loading:
        world.violations.append(f"turn {i} was sampling when the load ended")
    world.sampling.discard(i)
    del world.leases[i]
    yield


def rebind(world: World):
    """Rebind (`stepwise.handlers.train.rebind`): close, list until drained, load, open."""
    world.gate = sb.close_gate(world.gate, A, B, world.now)
    yield
    while not sb.drain_verdict(world.gate.closed_at or 0.0, list(world.leases.values()), world.now,
                               bound_s=float("inf")).ready:
        yield
    world.loading = True
    if world.sampling:
        world.violations.append(f"the load started with turns {sorted(world.sampling)} sampling")
    yield
    world.loading = False
    world.gate = sb.open_gate(B, world.now, world.gate)
    yield


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 5), st.lists(st.integers(0, 10), min_size=1, max_size=400))
def test_no_sample_is_in_flight_during_a_gated_load_in_any_interleaving(n_turns: int, schedule: list[int]):
    world = World()
    actors = {i: turn(world, i) for i in range(n_turns)}
    actors[n_turns] = rebind(world)
    for pick in schedule:
        if not actors:
            break
        key = sorted(actors)[pick % len(actors)]
        try:
            next(actors[key])
        except StopIteration:
            del actors[key]
    # whatever is left runs to its end in order (Rebind waits for the turns it must)
    while actors:
        for key in sorted(actors):
            try:
                next(actors[key])
            except StopIteration:
                del actors[key]
    assert world.violations == []
    assert world.gate is not None and world.gate.gate == "open" and not world.leases
