"""The group engine (``admission: group``): which groups start, when the trainer may train, which groups it trains.

Pure (no I/O): the handlers read ``runs/{run_id}/buffer.json`` (`stepwise.records.GroupBuffer`), apply one
of these functions and write it back conditionally. The rules, after AReaL (Fu et al. 2025,
arXiv:2505.24298, sec. 5: "staleness-aware" admission, the trainer consuming the oldest data) and
SkyRL's fully-async trainer (capacity ``(d + 1) x batch_size``):

- **The unit is a group** (one prompt's ``responses_per_prompt`` rollouts). Group ``g`` is the prompt the
  synchronous loop would put at position ``g % batch_size`` of step ``g // batch_size``
  (`group_prompt`, `seed_place`): the same prompts in the same order, and the same sampling seeds and
  input ids as that loop, so ``sampling_steps_ahead`` 0 with ``max_staleness`` 0 reproduces it.
- **Staleness** of a rollout = the policy version its update is applied to minus the version that sampled
  its first turn. A group's version (`floor`) is its members' oldest first-turn version once complete,
  else the sampler version it was admitted at, a lower bound (the sampler only moves forward).
- **Admission** (`admission_blocker`): a group may start while the groups admitted and not yet trained
  stay under ``(d + 1) x batch_size`` (capacity), the rollouts in flight plus the group's stay within
  ``max_rollouts_in_flight``, and the group could still be trained in time: with ``u`` the version the
  next update applies to and ``a`` the sampler's version, the groups whose version is at most ``a`` plus
  this one fit in the ``a + k - u + 1`` batches of ``batch_size`` left before ``a`` exceeds ``k``
  (earliest deadline first). With ``k`` 0 that forbids admitting while a step trains; with
  ``k >= d + 1`` it never binds beyond the capacity.
- **Pacing** (`readiness`): before an update to version ``V`` the trainer waits until every group whose
  version is at most ``V - k`` is complete (after this update it would exceed ``k``); then it trains the
  oldest complete groups (by version, then id) until it has ``batch_size``, plus any such group beyond
  (a batch larger than ``batch_size``: counted, ``groups/forced``). Nothing is discarded for staleness.
- **DAPO**: a complete group whose rewards are all equal leaves the buffer at once (`complete_group`),
  counted toward the next step's generation batches: a step has used ``ceil((filtered + trained) /
  batch_size)`` generation batches, and the cap ``max_num_gen_batches`` is reached when more than
  ``(max_num_gen_batches - 1) x batch_size`` groups were filtered for it (fewer than ``batch_size``
  could be informative among ``max_num_gen_batches x batch_size``), as the synchronous loop decides it.
- **Resume** (`rewind`): the groups not consumed at the checkpoint are redone: reused when complete with
  every turn sampled at most ``max_staleness`` versions before the resumed policy and none after it,
  else rolled again (same prompt, next attempt).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from stepwise.records import (BatchItem, Consumption, GroupBuffer, GroupEntry, GroupFrontier, RolloutRecord, RunState,
                              Usage)

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = [
    "CompleteMark", "Knobs", "Readiness", "admission_blocker", "admit", "admit_on", "await_trainer", "complete_group",
    "completion", "consume", "consume_for_step", "floor", "frontier", "generation_batches", "group_items",
    "group_prompt", "groups_per_epoch", "in_flight_rollouts", "may_admit", "new_buffer", "note_ready", "readiness",
    "record_completion", "record_ended", "rewind", "rewind_for_session", "seed_place", "step_metrics",
    "stop_admitting", "total_groups", "untrained",
]


@dataclass(frozen=True)
class Knobs:
    """The group engine's parameters (from `RunConfig`: `Knobs.of`).

    Attributes:
        batch_size: groups one update trains (``batch_size``).
        group_size: rollouts per group (``responses_per_prompt``).
        steps_ahead: ``d`` (``sampling_steps_ahead``): admitted-and-untrained groups stay under ``(d+1) x batch_size``.
        max_staleness: ``k``: no trained rollout lags its update by more.
        max_in_flight: rollouts running at once at most (``max_rollouts_in_flight``).
        dapo: DAPO's dynamic sampling (filter groups with equal rewards).
        max_num_gen_batches: DAPO's cap.
    """

    batch_size: int
    group_size: int
    steps_ahead: int
    max_staleness: int
    max_in_flight: int
    dapo: bool = False
    max_num_gen_batches: int = 1

    @classmethod
    def of(cls, cfg: RunConfig) -> Knobs:
        return cls(batch_size=cfg.batch_size, group_size=cfg.responses_per_prompt, steps_ahead=cfg.steps_ahead,
                   max_staleness=cfg.max_staleness, max_in_flight=cfg.rollouts_in_flight_cap,
                   dapo=cfg.algorithm == "dapo", max_num_gen_batches=cfg.max_num_gen_batches)

    @property
    def capacity(self) -> int:
        """Groups admitted and not yet trained, at most: ``(d + 1) x batch_size``."""
        return (self.steps_ahead + 1) * self.batch_size


# ---------------------------------------------------------------------------- prompts, seeds, items


def groups_per_epoch(rows_used: int, batch_size: int) -> int:
    """Groups of one epoch: the full batches of the rows used (the synchronous loop drops a partial last one)."""
    return (rows_used // batch_size) * batch_size


def total_groups(rows_used: int, batch_size: int, epochs: int) -> int:
    """Groups of the whole run: ``epochs x groups_per_epoch``."""
    return epochs * groups_per_epoch(rows_used, batch_size)


def group_prompt(group: int, per_epoch: int) -> tuple[int, int]:
    """``(epoch, row)`` of group ``group``'s prompt: rows in file order, epoch after epoch.

    Raises:
        ValueError: ``per_epoch`` < 1 (no full batch in the data) or a negative group.
    """
    if per_epoch < 1 or group < 0:
        raise ValueError(f"no prompt for group {group} with {per_epoch} groups per epoch")
    return divmod(group, per_epoch)


def seed_place(group: int, batch_size: int) -> tuple[int, int]:
    """``(step, position)``: where the synchronous loop rolls out group ``group``'s prompt (step
    ``group // batch_size``, position ``group % batch_size`` in its batch). Its rollouts take the seeds
    (`stepwise.core.seeding.rollout_seed` with generation batch 0 and item ``position x group_size +
    member``) and input ids (`stepwise.core.planning.input_id`) of that place."""
    return divmod(group, batch_size)


def group_items(group: int, row: int, knobs: Knobs) -> list[BatchItem]:
    """The group's rollouts as batch items (`seed_place`'s item indices and input id)."""
    from stepwise.core.planning import input_id

    step, position = seed_place(group, knobs.batch_size)
    iid = input_id("train", step, 0, position)
    return [BatchItem(i=position * knobs.group_size + m, input_id=iid, row=row, member=m)
            for m in range(knobs.group_size)]


# ---------------------------------------------------------------------------- the buffer


def new_buffer(run_id: str, total: int, policy_version: int) -> GroupBuffer:
    """An empty buffer for a run of ``total`` groups whose next update applies to ``policy_version``."""
    return GroupBuffer(run_id=run_id, total_groups=total, next_update_version=policy_version)


def floor(entry: GroupEntry) -> int:
    """A group's version: the oldest first-turn version of its members once complete (when one sampled),
    else the sampler version it was admitted at (a lower bound). Queued groups have none (-1)."""
    if entry.status == "complete" and entry.first_turn_version is not None:
        return entry.first_turn_version
    return -1 if entry.admitted_version is None else entry.admitted_version


def untrained(buffer: GroupBuffer) -> list[GroupEntry]:
    """Admitted groups not yet trained (running or complete), in id order."""
    return [g for g in buffer.groups if g.status != "queued"]


def in_flight_rollouts(buffer: GroupBuffer) -> int:
    """Rollouts of the groups running now."""
    return sum(g.members for g in buffer.groups if g.status == "running")


def _data_left(buffer: GroupBuffer) -> bool:
    return buffer.next_group < buffer.total_groups or any(g.status == "queued" for g in buffer.groups)


def admission_blocker(buffer: GroupBuffer, knobs: Knobs, *, sampler_version: int, base_sampler: bool = False) -> str | None:
    """Why no group may start now, or None.

    Args:
        buffer: the buffer as read (conditional writes keep the decision consistent with it).
        knobs: the engine's parameters.
        sampler_version: the version a group starting now samples (``state.policy_version``).
        base_sampler: the sampler is the base model (``""``): no group starts while a step trains, since
            the service may sample "the session's latest checkpoint" for it, which the step replaces
            (`stepwise.core.staleness.roll_out_ahead_blocker`).
    """
    if buffer.stopping:
        return "the run is ending"
    if not _data_left(buffer):
        return "every prompt of the run is admitted"
    admitted = untrained(buffer)
    if len(admitted) >= knobs.capacity:
        return f"{len(admitted)} groups admitted and not trained (capacity (d+1) x batch_size = {knobs.capacity})"
    if in_flight_rollouts(buffer) + knobs.group_size > knobs.max_in_flight:
        return f"{in_flight_rollouts(buffer)} rollouts in flight (max_rollouts_in_flight {knobs.max_in_flight})"
    u, a, k = buffer.next_update_version, sampler_version, knobs.max_staleness
    if base_sampler and u > a:
        return "the sampler is the base model while a step trains"
    batches_left = a + k - u + 1
    due = sum(1 for g in admitted if floor(g) <= a) + 1
    if due > batches_left * knobs.batch_size:
        return (f"a group sampled at version {a} must be trained by version {a + k}: the {due - 1} groups due by then "
                f"already fill the {max(batches_left, 0)} batch(es) before it")
    return None


def admit(buffer: GroupBuffer, knobs: Knobs, *, sampler_version: int, now: float, base_sampler: bool = False,
          limit: int | None = None) -> list[GroupEntry]:
    """Admit groups while `admission_blocker` allows (at most ``limit``): first those queued (lowest id
    first: a resume's groups to roll again), then new ones in id order. Mutates ``buffer``; returns the
    admitted entries (status ``running``, admitted at ``sampler_version`` at ``now``)."""
    out: list[GroupEntry] = []
    while (limit is None or len(out) < limit) and admission_blocker(
            buffer, knobs, sampler_version=sampler_version, base_sampler=base_sampler) is None:
        queued = [g for g in buffer.groups if g.status == "queued"]
        if queued:
            entry = min(queued, key=lambda g: g.id)
        else:
            entry = GroupEntry(id=buffer.next_group, members=knobs.group_size)
            buffer.next_group += 1
            buffer.groups.append(entry)
        entry.status, entry.admitted_version, entry.admitted_at = "running", sampler_version, now
        out.append(entry)
    buffer.groups.sort(key=lambda g: g.id)
    return out


def complete_group(buffer: GroupBuffer, group: int, attempt: int, *, first_turn_version: int | None,
                   durations_s: Sequence[float], informative: bool, knobs: Knobs, now: float) -> str:
    """Record that every member of group ``group`` (attempt ``attempt``) is recorded. Mutates ``buffer``.

    Returns ``"complete"``, ``"filtered"`` (DAPO: equal rewards; the group leaves the buffer and counts
    toward the next step's generation batches) or ``"stale"`` (no such running group: a duplicate call, or
    an attempt a resume has replaced; nothing changes).
    """
    entry = next((g for g in buffer.groups if g.id == group and g.attempt == attempt and g.status == "running"), None)
    if entry is None:
        return "stale"
    if knobs.dapo and not informative:
        buffer.groups.remove(entry)
        buffer.filtered.append((group, attempt))
        return "filtered"
    entry.status, entry.completed_at = "complete", now
    if first_turn_version is not None:
        entry.first_turn_version = max(first_turn_version, entry.admitted_version or 0)
    entry.durations_s = [round(float(d), 3) for d in durations_s]
    return "complete"


# ---------------------------------------------------------------------------- the trainer


@dataclass
class Readiness:
    """What the trainer may do now (`readiness`).

    Attributes:
        status: ``ready`` (train ``chosen``), ``cap`` (DAPO's cap: ``chosen`` are the informative groups so
            far, fewer than ``batch_size``; the run stops), ``wait_data`` (fewer than ``batch_size`` complete),
            ``wait_stale`` (enough complete, but a group that would exceed ``max_staleness`` after this
            update is unfinished), ``exhausted`` (nothing left to train: every group consumed).
        chosen: ``(id, attempt)`` of the groups to train, oldest first.
        forced: how many of them go beyond ``batch_size`` (their version would exceed ``k`` after this update).
        reason: one line for the logs.
    """

    status: Literal["ready", "cap", "wait_data", "wait_stale", "exhausted"]
    chosen: list[tuple[int, int]] = field(default_factory=list)
    forced: int = 0
    reason: str = ""

    @property
    def trainable(self) -> bool:
        return self.status in ("ready", "cap")


def readiness(buffer: GroupBuffer, knobs: Knobs, *, version: int) -> Readiness:
    """Whether the update to policy version ``version`` may be computed now, and on which groups.

    The groups whose version is at most ``version - k`` must be in it (after it they would exceed ``k``),
    so all of them must be complete; then the oldest complete groups are taken until ``batch_size``.
    When no group can be admitted any more (every prompt admitted, or the run ending) and none runs, the
    complete groups left are a last, smaller batch.
    """
    bs, k = knobs.batch_size, knobs.max_staleness
    admitted = untrained(buffer)
    complete = sorted((g for g in admitted if g.status == "complete"), key=lambda g: (floor(g), g.id))
    must = [g for g in admitted if floor(g) <= version - k]
    running_must = [g for g in must if g.status != "complete"]
    if len(complete) >= bs:
        if running_must:
            return Readiness("wait_stale", reason=f"{len(running_must)} group(s) of version <= {version - k} still "
                                                  f"running (max_staleness {k})")
        chosen = complete[:max(bs, len(must))]
        late = _left_late(admitted, chosen, knobs, version)
        if late is not None:
            return Readiness("wait_stale", reason=late)
        return Readiness("ready", [(g.id, g.attempt) for g in chosen], max(0, len(must) - bs),
                         f"{len(chosen)} oldest complete group(s)")
    if knobs.dapo and len(buffer.filtered) > (knobs.max_num_gen_batches - 1) * bs:
        return Readiness("cap", [(g.id, g.attempt) for g in complete], 0,
                         f"{len(buffer.filtered)} groups filtered for equal rewards, {len(complete)} informative "
                         f"(max_num_gen_batches {knobs.max_num_gen_batches} x batch_size {bs})")
    running = [g for g in admitted if g.status == "running"]
    if not running and (buffer.stopping or not _data_left(buffer)):
        if complete:
            return Readiness("ready", [(g.id, g.attempt) for g in complete], 0,
                             f"the last {len(complete)} complete group(s) (no more prompts)")
        return Readiness("exhausted", reason="every group is trained")
    return Readiness("wait_data", reason=f"{len(complete)}/{bs} groups complete, {len(running)} running")


def _left_late(admitted: list[GroupEntry], chosen: list[GroupEntry], knobs: Knobs, version: int) -> str | None:
    """Why training ``chosen`` now would leave more old groups than the batches before their deadlines can
    take (so a later batch would exceed ``batch_size``), when waiting for an older running group would
    not: it then gets trained in place of a younger one. None when training now is fine (or waiting
    cannot help: every group that old is already complete)."""
    taken = {id(g) for g in chosen}
    left = sorted((g for g in admitted if id(g) not in taken), key=floor)
    for n, g in enumerate(left, 1):
        w = floor(g)
        if (n == len(left) or floor(left[n]) > w) and n > (w + knobs.max_staleness - version) * knobs.batch_size:
            if any(x.status == "running" for x in left[:n]):
                return (f"training now would leave {n} group(s) of version <= {w} for the batches before version "
                        f"{w + knobs.max_staleness}: waiting for the older running ones")
            return None
    return None


def consume(buffer: GroupBuffer, ready: Readiness, *, step: int, version: int, decision: str) -> Consumption:
    """Take ``ready.chosen`` out of the buffer for step ``step`` (its update applies to ``version``), with the
    groups DAPO filtered since the last step. ``decision``: ``train`` (the next update then applies to
    ``version + 1``), ``skip`` (no datum: the version stays) or ``cap_reached``. Mutates ``buffer``; a second
    call for the same step returns the first one's `Consumption` unchanged (a retried ComputeAdvantages).
    """
    last = buffer.last_consumption
    if last is not None and last.step == step:
        return last
    # DAPO's cap trains nothing: its informative groups stay (a resumed run may still train them)
    chosen = set(ready.chosen) if decision != "cap_reached" else set()
    buffer.groups = [g for g in buffer.groups if (g.id, g.attempt) not in chosen]
    taken = Consumption(step=step, trained=sorted(chosen, key=ready.chosen.index), filtered=list(buffer.filtered),
                        decision=decision)
    buffer.filtered = []
    buffer.last_consumption = taken
    buffer.next_update_version = version + 1 if decision == "train" else version
    buffer.trainer_token = None
    buffer.waiting_since = buffer.data_ready_at = None
    return taken


def generation_batches(consumption: Consumption, batch_size: int) -> int:
    """DAPO's generation batches a step used: its groups examined (trained and filtered) in batches."""
    return max(1, math.ceil((len(consumption.trained) + len(consumption.filtered)) / batch_size))


# ---------------------------------------------------------------------------- checkpoints and resume


def frontier(buffer: GroupBuffer) -> GroupFrontier:
    """Which groups the run has consumed (for a `Checkpoint`): all below ``next_group`` but those still
    in the buffer, and those DAPO filtered that no step has counted yet (a resume filters them again)."""
    return GroupFrontier(next_group=buffer.next_group,
                         unconsumed=sorted({g.id for g in buffer.groups} | {g for g, _ in buffer.filtered}))


@dataclass(frozen=True)
class CompleteMark:
    """What a group's completion recorded (``groups/{g}/a{n}/complete.json``): its attempt, members,
    the version of every turn its members sampled (first turns' oldest, and the newest of any turn),
    whether DAPO would keep it, its members' durations."""

    attempt: int
    members: int
    first_turn_version: int | None
    last_turn_version: int | None
    informative: bool = True
    durations_s: tuple[float, ...] = ()


def completion(rollouts_G: Sequence[RolloutRecord], cfg: RunConfig, attempt: int) -> CompleteMark:
    """What a group's completion records, from its members' rollout records: the oldest first-turn version
    (`stepwise.core.staleness.sampled_version` of the members that sampled a turn; None when none did), the
    newest version any turn sampled, whether DAPO keeps it (its estimator's rewards differ:
    `stepwise.core.dapo.is_informative_group`, as the synchronous loop's filter decides) and the durations."""
    from stepwise.core.dapo import is_informative_group
    from stepwise.core.steps import estimator_rewards, group_rollouts

    grouped = group_rollouts(list(rollouts_G), cfg)
    informative = bool(grouped) and all(is_informative_group(estimator_rewards(g, cfg)) for g in grouped)
    firsts = [r.first_turn_version for r in rollouts_G if r.first_turn_version is not None]
    lasts = [v for r in rollouts_G for v in (r.last_turn_version, r.first_turn_version) if v is not None]
    return CompleteMark(attempt=attempt, members=len(rollouts_G), first_turn_version=min(firsts) if firsts else None,
                        last_turn_version=max(lasts) if lasts else None, informative=informative,
                        durations_s=tuple(float(r.duration_s or 0.0) for r in rollouts_G))


def _quantiles(name: str, values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    xs = sorted(values)

    def q(p: float) -> float:
        return xs[min(len(xs) - 1, int(p * len(xs)))]

    return {f"{name}_p50": q(0.5), f"{name}_p90": q(0.9), f"{name}_max": xs[-1]}


def step_metrics(before: GroupBuffer, ready: Readiness, knobs: Knobs, *, version: int, now: float) -> dict[str, float]:
    """The group engine's part of a step's summary, from the buffer as the step found it (``before``) and
    what it took (``ready``):

    - ``groups/trained``, ``groups/filtered`` (DAPO, since the last step), ``groups/forced`` (beyond
      ``batch_size``), ``sampling/generation_batches`` and ``sampling/filtered_fraction`` (DAPO, as
      `generation_batches` counts them);
    - ``groups/buffer_depth`` (admitted, not trained, after this step took its batch), ``groups/in_flight``,
      ``rollouts/in_flight``, ``rollouts/discarded`` (the run's total: must stay 0);
    - ``staleness/in_flight_mean|max`` (versions the running groups would lag if trained at the next update,
      counted from their admission) and ``staleness/in_queue_mean|max`` (the complete ones waiting);
    - ``time/trainer_wait`` (seconds the trainer waited for this batch), split into ``time/trainer_wait_data``
      (fewer than ``batch_size`` complete groups) and ``time/trainer_wait_stale`` (enough, but pacing
      waited for a group that would exceed ``max_staleness``);
    - ``rollouts/duration_trained_*`` and ``rollouts/duration_complete_*`` (p50, p90, max seconds): the
      rollouts trained beside every complete rollout the buffer held: slow groups are not starved when
      the two agree.
    """
    chosen = set(ready.chosen)
    taken = [g for g in before.groups if (g.id, g.attempt) in chosen]
    left = [g for g in before.groups if (g.id, g.attempt) not in chosen and g.status != "queued"]
    running = [g for g in left if g.status == "running"]
    waiting = [g for g in left if g.status == "complete"]
    nxt = version + 1
    filtered = len(before.filtered)
    out: dict[str, float] = {
        "groups/trained": float(len(taken)), "groups/filtered": float(filtered), "groups/forced": float(ready.forced),
        "groups/buffer_depth": float(len(left)), "groups/in_flight": float(len(running)),
        "rollouts/in_flight": float(sum(g.members for g in running)),
        "rollouts/discarded": float(before.discarded_rollouts),
    }
    if knobs.dapo:
        examined = len(taken) + filtered
        out["sampling/generation_batches"] = float(max(1, math.ceil(examined / knobs.batch_size)))
        out["sampling/filtered_fraction"] = filtered / examined if examined else 0.0
    for name, gs in (("in_flight", running), ("in_queue", waiting)):
        lags = [nxt - floor(g) for g in gs]
        if lags:
            out[f"staleness/{name}_mean"] = sum(lags) / len(lags)
            out[f"staleness/{name}_max"] = float(max(lags))
    if before.waiting_since is not None:
        wait = max(0.0, now - before.waiting_since)
        stale = max(0.0, now - before.data_ready_at) if before.data_ready_at is not None else 0.0
        out.update({"time/trainer_wait": wait, "time/trainer_wait_stale": min(stale, wait),
                    "time/trainer_wait_data": max(0.0, wait - stale)})
    out.update(_quantiles("rollouts/duration_trained", [d for g in taken for d in g.durations_s]))
    out.update(_quantiles("rollouts/duration_complete", [d for g in [*taken, *waiting] for d in g.durations_s]))
    return out


def rewind(buffer: GroupBuffer, at: GroupFrontier | None, *, version: int, knobs: Knobs,
           marks: Mapping[int, CompleteMark]) -> GroupBuffer:
    """The buffer of a run resumed at a checkpoint with frontier ``at`` (None = the run's start) and policy
    ``version``: every group not consumed then (``at.unconsumed``, and every id from ``at.next_group`` on
    that was admitted since) is redone. Its latest attempt's `CompleteMark` (``marks[id]``) is reused when
    every turn sampled a version in ``[version - k, version]`` (older would exceed ``k``; newer were
    sampled by updates the rewind undid); otherwise the group is queued to be rolled again, its attempt
    one more (its complete rollouts counted in ``discarded_rollouts``). Returns a new buffer.
    """
    at = at or GroupFrontier()
    redo = sorted(set(at.unconsumed) | set(range(at.next_group, buffer.next_group)))
    attempts = {g.id: g.attempt for g in buffer.groups}
    out = GroupBuffer(run_id=buffer.run_id, total_groups=buffer.total_groups,
                      next_group=max(buffer.next_group, at.next_group), next_update_version=version,
                      discarded_rollouts=buffer.discarded_rollouts, stopping=False)
    for gid in redo:
        mark = marks.get(gid)
        attempt = max(attempts.get(gid, 0), mark.attempt if mark else 0)
        k = knobs.max_staleness
        if (mark is not None and mark.attempt == attempt and mark.first_turn_version is not None
                and version - k <= mark.first_turn_version and (mark.last_turn_version or 0) <= version):
            entry = GroupEntry(id=gid, attempt=attempt, status="complete", members=mark.members,
                               admitted_version=mark.first_turn_version, first_turn_version=mark.first_turn_version,
                               durations_s=list(mark.durations_s), reused=True)
            if knobs.dapo and not mark.informative:
                out.filtered.append((gid, attempt))
                continue
            out.groups.append(entry)
            continue
        if mark is not None and mark.attempt == attempt:
            out.discarded_rollouts += mark.members
        out.groups.append(GroupEntry(id=gid, attempt=attempt + 1, status="queued", members=knobs.group_size))
    return out



# ---------------------------------------------------------------------------- the buffer's transitions
#
# Each is what one handler applies in one conditional write of ``buffer.json``
# (`stepwise.aws.runstore.RunStore.update_buffer`, which re-applies it to a fresh read after a conflict):
# it mutates the buffer it is given and returns what the handler acts on after the write.


def may_admit(state: RunState) -> bool:
    """Whether the run may start groups: not ended, nor ending (a stop reason set: final eval, checkpoint)."""
    return not (state.session_stopped or state.finished or state.stop_reason)


def note_ready(buffer: GroupBuffer, knobs: Knobs, at: float) -> str | None:
    """When a trainer waits (its token is in the buffer) and a batch is ready for the version it waits at
    (or the cap is reached, or nothing is left), take its token (returned: the caller sends SendTaskSuccess
    after the write). Also marks when data became enough for a batch (``data_ready_at``, epoch seconds
    ``at``: the trainer's wait then is for stale groups, not for data). Mutates ``buffer``; a second call
    finds no token and returns None (the wake-up is sent once per write that took it)."""
    if buffer.trainer_token is None or buffer.waiting_version is None:
        return None
    ready = readiness(buffer, knobs, version=buffer.waiting_version)
    if ready.status == "wait_data":
        return None
    if buffer.data_ready_at is None:
        buffer.data_ready_at = at
    if ready.status == "wait_stale":
        return None
    token, buffer.trainer_token = buffer.trainer_token, None
    return token


def admit_on(buffer: GroupBuffer, knobs: Knobs, state: RunState, *, group_state_machine_arn: str,
             now: float) -> list[GroupEntry]:
    """AdmitGroups (and a group execution's own admission): remember the rollout-group state machine, then,
    unless the run is ending (`may_admit`), `admit` on ``state``'s sampler (its policy version; the base
    model when it names no package). Returns the entries to start."""
    buffer.group_state_machine_arn = buffer.group_state_machine_arn or group_state_machine_arn
    if not may_admit(state):
        return []
    return admit(buffer, knobs, sampler_version=state.policy_version, now=now,
                 base_sampler=not state.sampler_model_package_arn)


def await_trainer(buffer: GroupBuffer, knobs: Knobs, *, token: str, version: int, now: float) -> str | None:
    """AwaitGroups: the trainer waits at policy ``version`` with task ``token`` (its wait restarts its clock
    when the version moved or it never waited), then `note_ready`: the token returned when a batch is
    ready already (the caller wakes it), else None."""
    buffer.trainer_token = token
    if buffer.waiting_version != version or buffer.waiting_since is None:
        buffer.waiting_since, buffer.data_ready_at = now, None
    buffer.waiting_version = version
    return note_ready(buffer, knobs, now)


def record_completion(buffer: GroupBuffer, knobs: Knobs, state: RunState, *, group: int, attempt: int,
                      mark: CompleteMark, own: Usage, members: Usage, now: float
                      ) -> tuple[str, str | None, list[GroupEntry]]:
    """RecordGroupComplete: `complete_group` with ``mark``; unless that was ``stale`` (a duplicate, or an
    attempt a resume replaced: nothing changes), the group's own ``usage`` waits in the buffer for the
    ledger (with its ``members``' when DAPO filtered it: no step reads their records), the waiting
    trainer's token is taken when a batch is now ready (`note_ready`) and the groups the freed room allows
    are admitted (`admit_on`'s rule, without its state-machine mark). Returns ``(status, token, admitted)``."""
    status = complete_group(buffer, group, attempt, first_turn_version=mark.first_turn_version,
                            durations_s=mark.durations_s, informative=mark.informative, knobs=knobs, now=now)
    if status == "stale":
        return status, None, []
    buffer.pending_usage.add(own)
    if status == "filtered":  # no step reads its records: their usage joins the ledger from here
        buffer.pending_usage.add(members)
    token = note_ready(buffer, knobs, now)
    admitted = (admit(buffer, knobs, sampler_version=state.policy_version, now=now,
                      base_sampler=not state.sampler_model_package_arn) if may_admit(state) else [])
    return status, token, admitted


def record_ended(buffer: GroupBuffer, knobs: Knobs, verdicts: Mapping[tuple[int, int], str], *,
                 now: float) -> str | None:
    """The trainer's wait found running groups whose execution is not running (``verdicts``: ``(id, attempt)``
    -> its Step Functions status, ``GONE`` for one that never started): one never started is queued again
    (next attempt); one that ended without recording the group is recorded complete as it is (its members
    without a record are lost rollouts when ComputeAdvantages reads them). A group no longer running is left
    as it is, so applied twice it changes nothing more. Returns `note_ready`'s token."""
    for g in buffer.groups:
        verdict = verdicts.get((g.id, g.attempt))
        if g.status != "running" or verdict is None:
            continue
        if verdict == "GONE":
            g.status, g.attempt, g.admitted_version, g.admitted_at = "queued", g.attempt + 1, None, None
        else:
            complete_group(buffer, g.id, g.attempt, first_turn_version=None, durations_s=[], informative=True,
                           knobs=knobs, now=now)
    return note_ready(buffer, knobs, now)


def stop_admitting(buffer: GroupBuffer) -> tuple[list[GroupEntry], str]:
    """The run ends: admit nothing more (``stopping``). Returns copies of the running groups (whose
    executions the caller stops) and the rollout-group state machine's ARN. Idempotent."""
    buffer.stopping = True
    return [g.model_copy() for g in buffer.groups if g.status == "running"], buffer.group_state_machine_arn


def consume_for_step(buffer: GroupBuffer, ready: Readiness, knobs: Knobs, *, step: int, version: int, decision: str,
                     now: float, read_usage: Usage) -> tuple[dict[str, float], Consumption]:
    """ComputeAdvantages of a group-engine step: `consume` the groups ``ready`` chose, the usage the step read
    (``read_usage``, what ``take_groups`` saw pending) leaving the buffer for the ledger (the caller adds it with
    the step; not on a retry of the same step, which `consume` answers unchanged), and the engine's
    `step_metrics` measured on the buffer as it was. A group recorded since the step read keeps its usage (its
    own and its judge's) pending for the next step. Returns ``(metrics, consumption)``."""
    before = buffer.model_copy(deep=True)
    consumed = consume(buffer, ready, step=step, version=version, decision=decision)
    if before.last_consumption is None or before.last_consumption.step != step:
        buffer.pending_usage = buffer.pending_usage.minus(read_usage)  # added to the ledger with this step
    return step_metrics(before, ready, knobs, version=version, now=now), consumed


def rewind_for_session(buffer: GroupBuffer, at: GroupFrontier | None, *, version: int, knobs: Knobs,
                       marks: Mapping[int, CompleteMark], session_name: str) -> None:
    """A resume onto session ``session_name``: the buffer becomes its `rewind` (keeping its rollout-group state
    machine) marked as rewound for that session. Mutates ``buffer``; once per session (applied again it
    changes nothing)."""
    if buffer.rewound_for == session_name:
        return
    fresh = rewind(buffer, at, version=version, knobs=knobs, marks=marks)
    fresh.group_state_machine_arn, fresh.rewound_for = buffer.group_state_machine_arn, session_name
    for name in type(buffer).model_fields:
        setattr(buffer, name, getattr(fresh, name))
