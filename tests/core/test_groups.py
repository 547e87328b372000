"""The group engine's rules (`stepwise.core.groups`), as invariants over arbitrary interleavings.

Hypothesis drives the engine as the handlers do (admission after each event, groups completing in any
order with any first-turn version their sampler allows, a trainer that computes a batch when `readiness`
says so, trains, and rebinds), then checks what the issue asks: no trained rollout past ``max_staleness``,
nothing discarded, no group trained twice, none skipped, every admitted group eventually trained or
filtered, the buffer bounded by its capacity and the rollouts in flight by their cap.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepwise.core import groups as eng
from stepwise.core.groups import CompleteMark, Knobs
from stepwise.records import GroupFrontier


def _knobs(draw) -> Knobs:
    bs = draw(st.integers(1, 4))
    size = draw(st.integers(1, 3))
    k = draw(st.integers(0, 4))
    d = draw(st.integers(0, k))
    cap = draw(st.integers(size, size * bs * (d + 2)))
    dapo = draw(st.booleans())
    return Knobs(batch_size=bs, group_size=size, steps_ahead=d, max_staleness=k, max_in_flight=cap, dapo=dapo,
                 max_num_gen_batches=draw(st.integers(1, 4)) if dapo else 1)


class Run:
    """The engine driven as the handlers drive it, with checks after every event."""

    def __init__(self, knobs: Knobs, total: int) -> None:
        self.k = knobs
        self.buffer = eng.new_buffer("r", total, 0)
        self.version = 0  # the trainer's policy version (the sampler's after each rebind)
        self.training = False
        self.trained: dict[int, int] = {}  # group -> the version its update applied to
        self.filtered: list[int] = []
        self.steps: list[int] = []  # groups per trained batch
        self.forced = 0
        self.capped = False

        self.marks: dict[int, CompleteMark] = {}  # what each group's completion recorded (S3)
        self.saved: tuple | None = None

    def checkpoint(self) -> None:
        """A save_state at a step boundary: the frontier and what the run had consumed then."""
        if not self.training:
            self.saved = (eng.frontier(self.buffer), self.version, dict(self.trained), list(self.filtered),
                          list(self.steps))

    def fail_and_resume(self) -> None:
        """The run fails (every execution stopped) and resumes at its last checkpoint (or its start)."""
        at, version, trained, filtered, steps = self.saved or (None, 0, {}, [], [])
        self.buffer = eng.rewind(self.buffer, at, version=version, knobs=self.k, marks=self.marks)
        self.version, self.trained, self.filtered, self.steps = version, dict(trained), list(filtered), list(steps)
        self.training = False
        self.admit()

    def admit(self) -> None:
        if eng.admit(self.buffer, self.k, sampler_version=self.version, now=0.0):
            # (a resume may reuse more complete groups than the capacity; then nothing more is admitted)
            assert len(eng.untrained(self.buffer)) <= self.k.capacity
        assert eng.in_flight_rollouts(self.buffer) <= self.k.max_in_flight

    def complete(self, which: int, lag: int, informative: bool) -> None:
        running = [g for g in self.buffer.groups if g.status == "running"]
        if not running:
            return
        g = running[which % len(running)]
        # its first turn sampled some version between its admission and now (the sampler only moves forward)
        first = min(self.version, g.admitted_version + lag)
        eng.complete_group(self.buffer, g.id, g.attempt, first_turn_version=first, durations_s=[1.0] * g.members,
                           informative=informative, knobs=self.k, now=0.0)
        self.marks[g.id] = CompleteMark(attempt=g.attempt, members=g.members, first_turn_version=first,
                                        last_turn_version=self.version, informative=informative)
        self.admit()

    def trainer(self) -> None:
        if self.training:  # the step trained and the sampler rebinds: the next version samples
            self.training = False
            self.version += 1
            self.admit()
            return
        ready = eng.readiness(self.buffer, self.k, version=self.version)
        if not ready.trainable:
            return
        floors = {g.id: eng.floor(g) for g in self.buffer.groups}
        for gid, _ in ready.chosen:
            assert self.version - floors[gid] <= self.k.max_staleness, "a trained group past max_staleness"
            assert 0 <= self.version - floors[gid], "a group sampled on a version newer than its update"
            assert gid not in self.trained and gid not in self.filtered, f"group {gid} consumed twice"
        decision = "cap_reached" if ready.status == "cap" else "train"
        taken = eng.consume(self.buffer, ready, step=len(self.steps), version=self.version, decision=decision)
        self.filtered.extend(g for g, _ in taken.filtered)
        if decision == "cap_reached":
            self.capped = True
            return
        self.trained.update({g: self.version for g, _ in taken.trained})
        self.steps.append(len(taken.trained))
        self.forced += ready.forced
        self.training = True
        self.admit()

    def drain(self) -> None:
        """Every group completes and the trainer runs until nothing is left (or DAPO's cap ends the run)."""
        for _ in range(10_000):
            if self.capped:
                return
            if any(g.status == "running" for g in self.buffer.groups):
                self.complete(0, 0, True)
            elif eng.readiness(self.buffer, self.k, version=self.version).status == "exhausted" and not self.training:
                return
            self.trainer()
        raise AssertionError("the engine did not drain: a deadlock")


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data(), st.booleans())
def test_no_group_is_trained_past_k_twice_or_never_and_nothing_is_discarded(data: st.DataObject, resumes: bool) -> None:
    """With ``resumes``, the run also saves checkpoints and fails and resumes at arbitrary points: the
    trained lineage still trains every group exactly once (a resume redoes what its checkpoint had not
    consumed, reusing complete groups within k)."""
    knobs = _knobs(data.draw)
    total = data.draw(st.integers(0, 5)) * knobs.batch_size
    run = Run(knobs, total)
    run.admit()
    for event in data.draw(st.lists(st.tuples(st.sampled_from("cccttsf" if resumes else "ct"), st.integers(0, 20), st.integers(0, 3),
                                              st.booleans()), max_size=120)):
        kind, which, lag, informative = event
        if run.capped:
            break
        if kind == "s":
            run.checkpoint()
        elif kind == "f":
            run.fail_and_resume()
        elif kind == "c":
            run.complete(which, lag, informative or not knobs.dapo)
        else:
            run.trainer()
    run.drain()
    # groups filtered after the last trained step stay counted in the buffer (no step takes them)
    consumed = sorted([*run.trained, *run.filtered, *(g for g, _ in run.buffer.filtered)])
    if run.capped:
        # DAPO's cap ends the run: what was consumed is consumed once; the rest stays for nobody
        assert len(consumed) == len(set(consumed))
        return
    assert consumed == list(range(total)), "a group trained twice or skipped"
    assert run.buffer.discarded_rollouts == 0 or resumes
    # every batch but the last holds batch_size groups (more only when forced, which is counted)
    assert all(n >= knobs.batch_size for n in run.steps[:-1])
    assert sum(run.steps) == len(run.trained)
    assert sum(max(0, n - knobs.batch_size) for n in run.steps) == run.forced
    assert run.forced == 0 or resumes  # pacing trains the oldest first and admission keeps their deadlines feasible


@settings(max_examples=200, deadline=None)
@given(bs=st.integers(1, 4), size=st.integers(1, 3), steps=st.integers(1, 5))
def test_d0_k0_is_the_synchronous_loop(bs: int, size: int, steps: int) -> None:
    """sampling_steps_ahead 0, max_staleness 0: each step admits exactly its batch's groups on its own
    version, trains them all, admits nothing while it trains: the synchronous loop's batches."""
    knobs = Knobs(batch_size=bs, group_size=size, steps_ahead=0, max_staleness=0, max_in_flight=bs * size * 4)
    run = Run(knobs, steps * bs)
    run.admit()
    for step in range(steps):
        assert sorted(g.id for g in run.buffer.groups) == list(range(step * bs, (step + 1) * bs))
        assert {g.admitted_version for g in run.buffer.groups} == {step}
        while any(g.status == "running" for g in run.buffer.groups):
            assert eng.readiness(run.buffer, knobs, version=step).status in ("wait_data", "wait_stale")
            run.complete(step, 0, True)
        run.trainer()
        assert run.training and eng.untrained(run.buffer) == []  # nothing admitted while the step trains
        run.trainer()
    assert run.trained == {g: g // bs for g in range(steps * bs)}


def test_seeds_and_input_ids_are_the_synchronous_loops() -> None:
    from stepwise.core.planning import Decision, build_items

    knobs = Knobs(batch_size=3, group_size=2, steps_ahead=1, max_staleness=2, max_in_flight=12)
    sync = build_items(Decision("rollout", "", "train", 4, 0, [12, 13, 14], 2), {12: {}, 13: {}, 14: {}})[0]
    ours = [it for g in (12, 13, 14) for it in eng.group_items(g, g, knobs)]
    assert [(i.i, i.input_id, i.row, i.member) for i in ours] == [(i.i, i.input_id, i.row, i.member) for i in sync]
    assert eng.group_prompt(13, 9) == (1, 4) and eng.seed_place(13, 3) == (4, 1)


def test_pacing_waits_for_a_group_that_would_exceed_k_and_trains_the_oldest_first() -> None:
    knobs = Knobs(batch_size=2, group_size=1, steps_ahead=1, max_staleness=1, max_in_flight=10)
    buffer = eng.new_buffer("r", 10, 0)
    eng.admit(buffer, knobs, sampler_version=0, now=0)
    assert [g.id for g in buffer.groups] == [0, 1, 2, 3]
    for gid in (1, 2, 3):
        eng.complete_group(buffer, gid, 0, first_turn_version=0, durations_s=[1], informative=True, knobs=knobs, now=1)
    # version 1: group 0 (version 0) would be 2 versions old after this update: wait for it
    assert eng.readiness(buffer, knobs, version=1).status == "wait_stale"
    # version 0: nothing is stale yet; the two oldest complete, by version then id
    assert eng.readiness(buffer, knobs, version=0).chosen == [(1, 0), (2, 0)]
    eng.complete_group(buffer, 0, 0, first_turn_version=0, durations_s=[9], informative=True, knobs=knobs, now=2)
    ready = eng.readiness(buffer, knobs, version=1)
    assert ready.status == "ready" and ready.chosen == [(0, 0), (1, 0), (2, 0), (3, 0)] and ready.forced == 2


def test_admission_respects_capacity_in_flight_and_the_staleness_deadline() -> None:
    knobs = Knobs(batch_size=2, group_size=2, steps_ahead=1, max_staleness=1, max_in_flight=6)
    buffer = eng.new_buffer("r", 100, 0)
    assert len(eng.admit(buffer, knobs, sampler_version=0, now=0)) == 3  # 6 rollouts in flight
    assert "in flight" in eng.admission_blocker(buffer, knobs, sampler_version=0)
    eng.complete_group(buffer, 0, 0, first_turn_version=0, durations_s=[1, 1], informative=True, knobs=knobs, now=1)
    assert len(eng.admit(buffer, knobs, sampler_version=0, now=1)) == 1  # capacity (1+1) x 2
    assert "capacity" in eng.admission_blocker(buffer, knobs, sampler_version=0)
    # a step trains version 0 -> 1 (next update 1): with d = k = 1, a group admitted now at version 0 would
    # be due at version 1 with the two groups left: no room before its deadline
    for g in (1, 2, 3):
        eng.complete_group(buffer, g, 0, first_turn_version=0, durations_s=[1, 1], informative=True, knobs=knobs, now=2)
    eng.consume(buffer, eng.readiness(buffer, knobs, version=0), step=0, version=0, decision="train")
    assert "must be trained by version 1" in eng.admission_blocker(buffer, knobs, sampler_version=0)
    assert eng.admission_blocker(buffer, knobs, sampler_version=1) is None  # after the rebind
    # with k = 2 the same moment admits
    deeper = Knobs(batch_size=2, group_size=2, steps_ahead=1, max_staleness=2, max_in_flight=6)
    assert eng.admission_blocker(buffer, deeper, sampler_version=0) is None
    assert eng.admission_blocker(buffer, deeper, sampler_version=0, base_sampler=True) is not None


def test_dapo_filters_at_once_counts_generation_batches_and_caps() -> None:
    knobs = Knobs(batch_size=2, group_size=2, steps_ahead=0, max_staleness=0, max_in_flight=8, dapo=True,
                  max_num_gen_batches=2)
    buffer = eng.new_buffer("r", 100, 0)
    eng.admit(buffer, knobs, sampler_version=0, now=0)
    assert eng.complete_group(buffer, 0, 0, first_turn_version=0, durations_s=[1, 1], informative=False,
                              knobs=knobs, now=1) == "filtered"
    assert [g.id for g in buffer.groups] == [1] and buffer.filtered == [(0, 0)]
    eng.admit(buffer, knobs, sampler_version=0, now=1)  # the filtered group's slot is free at once
    assert [g.id for g in buffer.groups] == [1, 2]
    for g in (1, 2):
        eng.complete_group(buffer, g, 0, first_turn_version=0, durations_s=[1, 1], informative=g == 2, knobs=knobs,
                           now=2)
    assert eng.readiness(buffer, knobs, version=0).status == "wait_data"  # 2 filtered = (2-1) x 2: not yet
    eng.admit(buffer, knobs, sampler_version=0, now=2)
    eng.complete_group(buffer, 3, 0, first_turn_version=0, durations_s=[1, 1], informative=False, knobs=knobs, now=3)
    ready = eng.readiness(buffer, knobs, version=0)
    assert ready.status == "cap" and ready.chosen == [(2, 0)]
    taken = eng.consume(buffer, ready, step=0, version=0, decision="cap_reached")
    assert eng.generation_batches(taken, 2) == 2 and taken.filtered == [(0, 0), (1, 0), (3, 0)]


def test_a_retried_consumption_takes_the_same_groups() -> None:
    knobs = Knobs(batch_size=1, group_size=1, steps_ahead=1, max_staleness=1, max_in_flight=4)
    buffer = eng.new_buffer("r", 10, 0)
    eng.admit(buffer, knobs, sampler_version=0, now=0)
    for g in (0, 1):
        eng.complete_group(buffer, g, 0, first_turn_version=0, durations_s=[1], informative=True, knobs=knobs, now=1)
    first = eng.consume(buffer, eng.readiness(buffer, knobs, version=0), step=0, version=0, decision="train")
    again = eng.consume(buffer, eng.readiness(buffer, knobs, version=0), step=0, version=0, decision="train")
    assert first == again and first.trained == [(0, 0)] and [g.id for g in buffer.groups] == [1]


def test_rewind_reuses_complete_groups_within_k_and_rolls_the_rest_again() -> None:
    knobs = Knobs(batch_size=2, group_size=2, steps_ahead=2, max_staleness=2, max_in_flight=20)
    buffer = eng.new_buffer("r", 40, 0)
    buffer.next_group = 12
    # the checkpoint (policy version 5) had consumed everything below 8 but 6 and 7
    at = GroupFrontier(next_group=8, unconsumed=[6, 7])
    marks = {
        6: CompleteMark(attempt=0, members=2, first_turn_version=3, last_turn_version=4),  # within k of 5: reused
        7: CompleteMark(attempt=0, members=2, first_turn_version=2, last_turn_version=3),  # 3 versions old: again
        8: CompleteMark(attempt=0, members=2, first_turn_version=5, last_turn_version=6),  # sampled an undone version
        9: CompleteMark(attempt=0, members=2, first_turn_version=5, last_turn_version=5),
    }
    out = eng.rewind(buffer, at, version=5, knobs=knobs, marks=marks)
    assert [(g.id, g.attempt, g.status) for g in out.groups] == [
        (6, 0, "complete"), (7, 1, "queued"), (8, 1, "queued"), (9, 0, "complete"), (10, 1, "queued"), (11, 1, "queued")]
    assert out.discarded_rollouts == 4 and out.next_group == 12 and out.next_update_version == 5
    # the queued groups are admitted first, lowest id first, before any new prompt
    admitted = eng.admit(out, knobs, sampler_version=5, now=0)
    assert [g.id for g in admitted][:4] == [7, 8, 10, 11]


@pytest.mark.parametrize("status", ["complete", "running"])
def test_a_stale_completion_changes_nothing(status: str) -> None:
    knobs = Knobs(batch_size=1, group_size=1, steps_ahead=0, max_staleness=0, max_in_flight=1)
    buffer = eng.new_buffer("r", 3, 0)
    eng.admit(buffer, knobs, sampler_version=0, now=0)
    if status == "complete":
        eng.complete_group(buffer, 0, 0, first_turn_version=0, durations_s=[1], informative=True, knobs=knobs, now=1)
    before = buffer.model_copy(deep=True)
    assert eng.complete_group(buffer, 0, 1, first_turn_version=0, durations_s=[1], informative=True, knobs=knobs,
                              now=2) == "stale"
    assert buffer == before
