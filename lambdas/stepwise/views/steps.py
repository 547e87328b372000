"""A step as a person reads it: its groups, each rollout's shaped reward and advantage, and which
groups were trained, filtered or cut, exactly as ComputeAdvantages decided them.

Pure (no I/O). `step_view` never re-derives a group, a shaped reward or an advantage: it calls
`stepwise.core.steps.compute_step`, the one function ComputeAdvantages trains with, on the step's
typed rollout records, and reads its `StepOutcome`:

- ``all_groups``: every group rolled out this step (DAPO: every generation batch), in order; a group's
  ``rewards_G`` are the shaped rewards the estimator and DAPO's filter saw;
- ``train_groups`` and ``advantages_P``: the groups whose datums went to forward_backward, and the
  advantages those datums carry (per member, or per member and turn under a per-turn estimator).

Each group is marked (`Selection`): ``trained``; ``filtered`` (DAPO dropped it: its rewards carry no
signal, `stepwise.core.advantages.carries_no_signal`); ``surplus`` (DAPO: informative, cut by the
truncation to ``batch_size``); ``untrained`` (selected, but the step trained nothing: skipped for
want of a datum, DAPO's cap reached, the run failed at it, or still in progress); ``eval`` (an eval
batch: never trained). Only a trained group shows advantages; the rest show ``-``.

With a group judge, the records are first merged with the judge's records of their groups exactly as
ComputeAdvantages merges them (`stepwise.core.judge.apply_judgements`), so the rewards shown are the ones
trained on, each beside the judge's score, the agent's own reward and the judge's reason.

Adding a rollout column (the policy version of each turn) is one line in
`stepwise.views.columns.ROLLOUT_COLUMNS`: a `RolloutView` keeps its whole typed record.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stepwise.records import JudgeRecord, RolloutRecord
from stepwise.views.rollout import failure_cause

if TYPE_CHECKING:
    from stepwise.config import RunConfig
    from stepwise.core.steps import Group

__all__ = ["PICKS", "GroupView", "RolloutView", "SELECTIONS", "Selection", "StepView", "group_step_view",
           "pick_groups", "sample_groups", "step_view"]

Selection = Literal["trained", "filtered", "surplus", "untrained", "eval", "unknown"]
#: Every mark a group can carry, in the order a legend lists them (``unknown``: the records could not be
#: read as ComputeAdvantages reads them, so nothing is claimed about the group).
SELECTIONS: tuple[str, ...] = ("trained", "filtered", "surplus", "untrained", "eval", "unknown")

#: How `pick_groups` orders groups: best mean reward first, worst first, most informative (largest
#: reward spread) first, or prompt order.
PICKS = ("best", "worst", "informative", "all")
Pick = Literal["best", "worst", "informative", "all"]


@dataclass
class RolloutView:
    """One rollout as a row: its typed record and what the step made of it.

    Attributes:
        record: the rollout record as stored (`stepwise.records.RolloutRecord`, TraceRecords included); with a
            group judge, as ComputeAdvantages merged it (`stepwise.core.judge.apply_judgements`): its ``reward``
            the judge's combination with the agent's own (``agent_reward``), ``judge_score`` and
            ``judge_reason`` (or its group's fallback).
        reward: the shaped reward the estimator saw (the record's reward plus DAPO's overlong penalty;
            the return under per-turn rewards); without a judge the record's ``reward`` is the agent's own.
        advantage: the advantage its datums carry (with a per-turn estimator, its first turn's); None
            when its group was not trained (an eval, a filtered or surplus group, a step that trained
            nothing).
        turn_advantages: per LLM turn, under a per-turn estimator (trained groups only).
        selection: its group's `Selection`.
        cause: why it failed or scored zero (`stepwise.views.rollout.failure_cause`).
        staleness: policy versions between the one its first turn sampled with and the one its update applied
            to (`stepwise.core.staleness.sampled_version`); a trained rollout of the group engine whose step's
            update version is known, else None.
    """

    record: RolloutRecord
    reward: float
    advantage: float | None
    selection: str
    cause: str | None
    turn_advantages: list[float] | None = None
    staleness: int | None = None

    @property
    def sid(self) -> str | None:
        return self.record.sid

    @property
    def member(self) -> int:
        return self.record.member

    @property
    def status(self) -> str:
        return str(self.record.status)

    @property
    def trained(self) -> bool:
        """Its group was trained and it has a TraceRecord (a datum may still be dropped for an empty loss mask)."""
        return self.selection == "trained" and bool(self.record.records)

    def to_json(self) -> dict[str, Any]:
        """The record's fields (without its TraceRecords, turn spans and usage) and the view's; ``agent_reward`` is
        the agent's own reward (the record's, or with a judge the one merged beside the judge's score)."""
        out = self.record.model_dump(mode="json", exclude={"records", "turn_spans", "usage"})
        agent = self.record.agent_reward if self.record.agent_reward is not None else self.record.reward
        out.update(agent_reward=agent, reward=self.reward, advantage=self.advantage,
                   turn_advantages=self.turn_advantages, selection=self.selection, cause=self.cause,
                   trained=self.trained, staleness=self.staleness)
        return out


@dataclass
class GroupView:
    """One prompt's rollouts (members in member order) with the rewards the estimator saw
    (``rewards_G``, shaped), what the no-signal test read (``signal_G``: ``rewards_G``, or per-turn
    rewards under a per-turn estimator), its ``advantages_G`` (empty unless trained) and its mark; in the
    group engine (``admission: group``) its ``group`` id and ``attempt`` (None otherwise)."""

    input_id: str
    generation_batch: int
    selection: str
    rollouts: list[RolloutView] = field(default_factory=list)
    rewards_G: list[float] = field(default_factory=list)
    signal_G: list = field(default_factory=list)
    advantages_G: list = field(default_factory=list)
    group: int | None = None
    attempt: int | None = None

    @property
    def mean_reward(self) -> float:
        return math.fsum(self.rewards_G) / len(self.rewards_G) if self.rewards_G else 0.0

    @property
    def reward_std(self) -> float:
        """Population std of ``rewards_G`` (GRPO's denominator)."""
        if not self.rewards_G:
            return 0.0
        import numpy as np

        with np.errstate(all="ignore"):  # rewards near float's range spread to inf, never raise
            return float(np.asarray(self.rewards_G, dtype=np.float64).std())

    @property
    def informative(self) -> bool:
        """The group carries a learning signal (`stepwise.core.advantages.carries_no_signal`, the test
        the estimators, ``advantages/zero_groups_fraction`` and DAPO's filter share)."""
        from stepwise.core.advantages import carries_no_signal

        return not carries_no_signal(self.signal_G or self.rewards_G)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {} if self.group is None else {"group": self.group, "attempt": self.attempt}
        return out | {"input_id": self.input_id, "generation_batch": self.generation_batch, "selection": self.selection,
                "mean_reward": self.mean_reward, "reward_std": self.reward_std, "informative": self.informative,
                "rewards_G": list(self.rewards_G), "advantages_G": list(self.advantages_G),
                "rollouts": [r.to_json() for r in self.rollouts]}


@dataclass
class StepView:
    """A step (or eval) as a person reads it.

    Attributes:
        kind, step: the batch (``train`` | ``eval``).
        groups: its groups in the order ComputeAdvantages formed them (generation batch, prompt).
        decision: what the step did (its summary's ``decision``: ``train`` | ``skip`` |
            ``cap_reached``; None: no summary yet, i.e. in progress or the run failed at it).
        status: `stepwise.core.steps.compute_step`'s status on these records (``ready`` |
            ``need_more`` | ``cap_reached``; ``eval`` for an eval).
        num_datums: the datums compute_step made (0 unless ``ready``).
        note: why no group is trained, when none is ('' otherwise).
    """

    kind: str
    step: int
    groups: list[GroupView]
    decision: str | None = None
    status: str = ""
    num_datums: int = 0
    note: str = ""

    @property
    def rollouts(self) -> list[RolloutView]:
        return [r for g in self.groups for r in g.rollouts]

    def counts(self) -> dict[str, int]:
        """Groups per `Selection` mark (marks with none left out)."""
        out: dict[str, int] = {}
        for g in self.groups:
            out[g.selection] = out.get(g.selection, 0) + 1
        return {k: out[k] for k in SELECTIONS if k in out}

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "step": self.step, "decision": self.decision, "status": self.status,
                "num_datums": self.num_datums, "note": self.note, "selection": self.counts(),
                "groups": [g.to_json() for g in self.groups]}


def _batches(records: Iterable[RolloutRecord]) -> list[list[RolloutRecord]]:
    """The records as ComputeAdvantages loads them: one list per generation batch 0..g, in item order."""
    by_gen: dict[int, list[RolloutRecord]] = {}
    for r in records:
        by_gen.setdefault(r.generation_batch, []).append(r)
    if not by_gen:
        return []
    return [sorted(by_gen.get(g, []), key=lambda r: r.i) for g in range(max(by_gen) + 1)]


def step_view(records: Iterable[RolloutRecord], cfg: RunConfig, *, kind: str = "train", step: int | None = None,
              decision: str | None = None,
              judgements: Mapping[int, Mapping[str, JudgeRecord]] | None = None) -> StepView:
    """The step's groups and marks from its current rollout records (one per item, every generation batch).

    Args:
        records: the step's rollout records (`stepwise.views.store.step_records`), TraceRecords included.
        cfg: the run's config (estimator, algorithm, shaping, ``batch_size``: what compute_step reads).
        kind: ``train`` (groups, shaping and advantages from `stepwise.core.steps.compute_step`) or
            ``eval`` (groups of the raw rewards; nothing trained).
        step: the step (default: the records').
        decision: the step summary's ``decision`` (None: no summary).
        judgements: with ``cfg.judge``, the group judge's records by generation batch and input id
            (`stepwise.views.store.step_judgements`), merged into each generation batch's records as
            ComputeAdvantages merges them (`stepwise.core.judge.apply_judgements`: the reward the estimator
            read, ``judge_score``, ``judge_reason``, ``agent_reward``); a group without a record shows the
            fallback it would get. Ignored for a run without a judge and for an eval.

    Returns:
        A `StepView`; a train step's trained groups carry exactly the advantages of their datums.
    """
    records = list(records)
    step = step if step is not None else (records[0].step if records else 0)
    if kind != "train":
        return _eval_view(records, step)
    batches = _batches(records)
    if not batches:
        return StepView(kind, step, [], decision, "", 0, "no rollout record")
    if cfg.judge is not None:
        from stepwise.core.judge import apply_judgements

        batches = [apply_judgements(b, (judgements or {}).get(g, {}), cfg) for g, b in enumerate(batches)]
        records = [r for b in batches for r in b]
    try:
        outcome = _outcome(batches, cfg)
    except Exception as e:  # records ComputeAdvantages could not have read either: show them, claim nothing
        view = _eval_view(records, step, selection="unknown")
        view.kind, view.decision, view.status = kind, decision, "unknown"
        view.note = f"the step's records could not be read as ComputeAdvantages reads them ({type(e).__name__}: " \
                    f"{str(e)[:300]}): no group is marked and no advantage shown"
        return view
    full = {(r.group, r.generation_batch, r.i): r for r in records}
    trains = decision == "train" or (decision is None and outcome.status == "ready" and bool(outcome.datums))
    advantages = {id(g): a for g, a in zip(outcome.train_groups, outcome.advantages_P, strict=False)}
    kept = {id(g) for g in outcome.train_groups}
    groups = []
    for g in outcome.all_groups:
        selection = _selection(g, kept, trains, outcome.status, cfg)
        advantages_G = list(advantages.get(id(g), [])) if selection == "trained" else []
        groups.append(_group_view(g, selection, advantages_G, full, cfg))
    note = "" if trains else _why_untrained(decision, outcome.status, outcome.datums)
    return StepView(kind, step, groups, decision, outcome.status, len(outcome.datums), note)


def group_step_view(groups_rollouts: Sequence[Sequence[RolloutRecord]],
                    filtered_rollouts: Sequence[Sequence[RolloutRecord]], cfg: RunConfig, *, step: int,
                    decision: str | None = None, groups: Sequence[tuple[int, int]] = (),
                    filtered: Sequence[tuple[int, int]] = (), update_version: int | None = None,
                    judgements: Sequence[Mapping[str, JudgeRecord]] | None = None,
                    filtered_judgements: Sequence[Mapping[str, JudgeRecord]] | None = None,
                    pending: bool = False) -> StepView:
    """A group-engine train step (``admission: group``) from the rollout records of the groups it consumed.

    The groups it trained are computed as ComputeAdvantages computed them: each merged with its group judge's
    record (`stepwise.core.judge.apply_judgements`, with ``cfg.judge``), then `stepwise.core.steps.compute_step`
    with ``chosen=True`` on them in the order chosen; the groups DAPO filtered for the step (all-equal rewards
    when they completed) are shown ``filtered``, their rewards shaped as the filter saw them.

    Args:
        groups_rollouts: each trained group's records (`stepwise.views.store.group_records`), in the order chosen.
        filtered_rollouts: each filtered group's records.
        cfg: the run's config.
        step: the training step.
        decision: the summary's ``decision`` (None: the step is training, no summary yet).
        groups, filtered: the ``(group, attempt)`` of each, in the same orders (shown beside each group).
        update_version: the policy version the update applied to (each trained rollout's staleness is counted
            from it; None: not known, and none is shown).
        judgements, filtered_judgements: with ``cfg.judge``, each group's judge records by input id
            (`stepwise.views.store.group_judgements`), in the same orders.
        pending: the groups are waiting in the buffer, no step consumed them (the step the run is at, or ended
            at): every group is shown ``untrained`` (the filtered ones ``filtered``), with no advantage.

    Returns:
        A `StepView`: the trained groups carry exactly the advantages of their datums.
    """
    from stepwise.core.steps import compute_step, group_rollouts

    trained = [list(b) for b in groups_rollouts]
    dropped = [list(b) for b in filtered_rollouts]
    if cfg.judge is not None:
        from stepwise.core.judge import apply_judgements

        trained = [apply_judgements(b, (judgements or [])[k] if k < len(judgements or []) else {}, cfg)
                   for k, b in enumerate(trained)]
        dropped = [apply_judgements(b, (filtered_judgements or [])[k] if k < len(filtered_judgements or []) else {},
                                    cfg) for k, b in enumerate(dropped)]
    records = [r for b in trained + dropped for r in b]
    if not records:
        return StepView("train", step, [], decision, "", 0, "no rollout record in the groups this step consumed")
    full = {(r.group, r.generation_batch, r.i): r for r in records}
    versions = [r.policy_version for b in trained for r in b if r.policy_version is not None]
    version = update_version if update_version is not None else max(versions, default=0)  # feeds staleness only
    out: list[GroupView] = []
    try:
        outcome = compute_step(trained, cfg, policy_version=version, where=f"step {step}", chosen=True)
        dropped_groups = [group_rollouts(b, cfg) for b in dropped]
    except Exception as e:  # records ComputeAdvantages could not have read either: show them, claim nothing
        view = _eval_view(records, step, selection="unknown")
        view.kind, view.decision, view.status = "train", decision, "unknown"
        view.note = f"the step's records could not be read as ComputeAdvantages reads them ({type(e).__name__}: " \
                    f"{str(e)[:300]}): no group is marked and no advantage shown"
        return view
    trains = not pending and (decision == "train" or (decision is None and bool(outcome.datums)))
    formed = [group_rollouts(b, cfg) for b in trained]  # chosen_groups forms each group's list the same way
    k = 0
    for ref, found in zip(list(groups) + [None] * len(formed), formed):
        for _ in found:
            g = outcome.train_groups[k]
            advantages_G = list(outcome.advantages_P[k]) if trains and k < len(outcome.advantages_P) else []
            view = _group_view(g, "trained" if trains else "untrained", advantages_G, full, cfg,
                               update_version if trains else None)
            view.group, view.attempt = ref if ref is not None else (None, None)
            out.append(view)
            k += 1
    for ref, found in zip(list(filtered) + [None] * len(dropped_groups), dropped_groups):
        for g in found:
            view = _group_view(g, "filtered", [], full, cfg)
            view.group, view.attempt = ref if ref is not None else (None, None)
            out.append(view)
    note = "" if trains else _why_untrained(decision, outcome.status, outcome.datums)
    if pending:
        note = ("no step has consumed these groups yet: the complete groups waiting in the run's buffer (the step "
                "trains the oldest of them once it has a batch; a run that ended here never trained them)")
    return StepView("train", step, out, decision, outcome.status, len(outcome.datums) if trains else 0, note)


def _outcome(batches: list[list[RolloutRecord]], cfg: RunConfig) -> Any:
    """`compute_step` of the records. The update's policy version only feeds the staleness check
    (the step passed it when it trained, and a step that failed it trained nothing): the newest
    sampled version is passed, and a breach is shown as the decision the step reached otherwise."""
    from stepwise.core.staleness import StalenessExceeded
    from stepwise.core.steps import compute_step

    versions = [r.policy_version for b in batches for r in b if r.policy_version is not None]
    try:
        return compute_step(batches, cfg, policy_version=max(versions, default=0))
    except StalenessExceeded:
        return compute_step(batches, cfg.model_copy(update={"max_staleness": 10**6}),
                            policy_version=max(versions, default=0))


def _selection(g: Group, kept: set[int], trains: bool, status: str, cfg: RunConfig) -> str:
    from stepwise.core.advantages import carries_no_signal
    from stepwise.core.steps import estimator_rewards

    if id(g) in kept:
        return "trained" if trains else "untrained"
    if carries_no_signal(estimator_rewards(g, cfg)):
        return "filtered"
    return "surplus" if status == "ready" else "untrained"


def _why_untrained(decision: str | None, status: str, datums: list) -> str:
    if decision is None:
        return "no summary for this step: it is in progress, or the run ended at it (nothing of it was trained)"
    if decision == "skip" or (status == "ready" and not datums):
        return "the step was skipped: no trainable datum (the reference skips the update)"
    if decision == "cap_reached" or status == "cap_reached":
        return "DAPO's max_num_gen_batches was reached before batch_size informative groups: the run stopped"
    return f"decision {decision}: nothing trained"


def _group_view(g: Group, selection: str, advantages_G: list, full: dict[tuple[int | None, int, int], RolloutRecord],
                cfg: RunConfig, update_version: int | None = None) -> GroupView:
    from stepwise.core.steps import estimator_rewards

    views = []
    for k, stripped in enumerate(g.rollouts_G):
        record = full.get((stripped.group, stripped.generation_batch, stripped.i), stripped)
        adv = advantages_G[k] if advantages_G else None
        turn_advantages = [float(a) for a in adv] if isinstance(adv, (list, tuple)) else None
        if turn_advantages is not None:
            adv = turn_advantages[0] if turn_advantages else 0.0
        stale = None
        if update_version is not None and selection == "trained":
            from stepwise.core.staleness import sampled_version

            sampled = sampled_version(record)
            stale = None if sampled is None else update_version - sampled
        views.append(RolloutView(record, float(g.rewards_G[k]), None if adv is None else float(adv), selection,
                                 failure_cause(record.model_dump()), turn_advantages, stale))
    gen = g.rollouts_G[0].generation_batch if g.rollouts_G else 0
    return GroupView(g.input_id, gen, selection, views, list(g.rewards_G), list(estimator_rewards(g, cfg)),
                     advantages_G)


def _eval_view(records: list[RolloutRecord], step: int, selection: str = "eval") -> StepView:
    groups: dict[tuple[int, str], list[RolloutRecord]] = {}
    for r in sorted(records, key=lambda r: (r.generation_batch, r.i, r.member)):
        groups.setdefault((r.generation_batch, r.input_id), []).append(r)
    out = []
    for (gen, input_id), members in groups.items():
        members.sort(key=lambda r: (r.member, r.i))
        rewards = [float(r.reward) for r in members]
        views = [RolloutView(r, float(r.reward), None, selection, failure_cause(r.model_dump())) for r in members]
        out.append(GroupView(input_id, gen, selection, views, rewards, rewards, []))
    return StepView("eval", step, out, "eval", "eval", 0, "")


# ---------------------------------------------------------------------------- picking groups


def pick_groups(groups: Sequence[GroupView], which: Pick = "all", n: int | None = None) -> list[GroupView]:
    """``n`` groups (all when None) ordered by ``which`` (`PICKS`): ``best`` highest mean reward,
    ``worst`` lowest, ``informative`` largest reward spread (the groups a step learns from), ``all``
    in prompt order. Ties keep prompt order. Raises ValueError for another ``which``."""
    if which not in PICKS:
        raise ValueError(f"which must be one of {PICKS}, got {which!r}")
    order = list(range(len(groups)))
    if which == "best":
        order.sort(key=lambda k: -groups[k].mean_reward)
    elif which == "worst":
        order.sort(key=lambda k: groups[k].mean_reward)
    elif which == "informative":
        order.sort(key=lambda k: -groups[k].reward_std)
    picked = [groups[k] for k in order]
    return picked if n is None else picked[:max(0, n)]


def sample_groups(groups: Sequence[GroupView]) -> list[tuple[str, GroupView]]:
    """A report's sample of a step, distinct groups: ``best`` (highest mean reward) and ``worst``
    (lowest) when their means differ, else one ``sample`` (every group's mean is the same: neither is
    better); then ``mixed``, the remaining group with the largest reward spread, when it carries a
    signal. Picked among the trained groups when the step trained any (what it learned from), else among all."""
    if not groups:
        return []
    trained = [g for g in groups if g.selection == "trained"]
    pool = trained or list(groups)
    best, worst = pick_groups(pool, "best")[0], pick_groups(pool, "worst")[0]
    out: list[tuple[str, GroupView]] = []
    if best.mean_reward > worst.mean_reward:
        out += [("best", best), ("worst", worst)]
    else:
        out.append(("sample", pool[0]))
    used = {id(g) for _, g in out}
    for g in pick_groups(pool, "informative"):
        if id(g) not in used and g.informative:
            out.append(("mixed", g))
            break
    return out
