"""A step's groups: rollout records in, the groups to train on, their datums and the step's metrics out.

Pure (no S3, no clock): ComputeAdvantages loads the rollout records of the step's generation
batches, calls `compute_step`, and writes what it returns. Following the reference
``train_grpo.py`` step and the DAPO proposal:

- group = the ``responses_per_prompt`` rollouts of one prompt (same ``input_id``), in prompt order,
  members in member order (`group_rollouts`);
- GRPO: every group of the batch; DAPO: informative groups accumulated over the step's generation
  batches until ``batch_size`` are kept (`stepwise.core.dapo.decide_generation_batch`), with the
  optional overlong shaping added to each reward first (`shaped_reward`) (`select_groups`);
- advantages per group from the config's ``advantage_estimator``
  (`stepwise.core.advantages.compute_advantages`), then one datum per TraceRecord
  (`stepwise.core.datums.group_to_datums`; per-turn advantages: `group_to_turn_datums`) (`datums_for`);
- before any datum, every trained rollout must have sampled on a policy at most ``max_staleness``
  versions older than the one the update applies to (`stepwise.core.staleness.check_staleness`).

The checks on a generation batch just rolled out (`missing_items` and the `lost_rollout` that stands
for each, `check_not_all_failed`) and the text a failure shows (`rollout_report`) live here too.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise.core import ledger
from stepwise.core.rewards import preview
from stepwise.records import BatchItem, BatchRef, PlannedBatch, RolloutRecord, RunState, Usage

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = [
    "BatchMismatch",
    "Group",
    "RolloutsFailed",
    "chosen_groups",
    "LOST_ROLLOUT_ERROR",
    "StepOutcome",
    "TOP_CAUSES",
    "lost_rollout",
    "missing_items",
    "check_batch",
    "check_not_all_failed",
    "compute_step",
    "record_step",
    "datums_for",
    "estimator_rewards",
    "group_rollouts",
    "rollout_report",
    "select_groups",
    "shaped_reward",
    "shaped_turn_rewards",
]


class RolloutsFailed(RuntimeError):
    """Every rollout of a generation batch failed to run (status ``error`` or ``timeout``: not a zero
    reward, a rollout that did not complete), which is a broken agent, ARN, permission or result
    delivery rather than a policy to train: fail the run (the catch-all stops the session)."""


#: How many distinct causes a failure message names.
TOP_CAUSES = 3


def rollout_report(rollouts: list[RolloutRecord], top: int = TOP_CAUSES) -> str:
    """What a batch's rollouts reported, for a failure's cause: status counts, rollouts with no
    captured turn, then the ``top`` most common causes with their counts (the error and cause of
    failed rollouts, else the reason a reward was zeroed), e.g.
    ``4 error, 0 timeout, 0 ok; 4 without a captured turn; 4 x AgentError: boom``."""
    statuses = collections.Counter(str(r.status) for r in rollouts)
    causes: collections.Counter[str] = collections.Counter()
    for r in rollouts:
        err = r.error or {}
        if err:
            causes[f"{err.get('error')}: {preview(err.get('cause'), 300)}"] += 1
        elif r.reward_reason:
            causes[preview(r.reward_reason, 300)] += 1
    parts = [", ".join(f"{statuses.get(s, 0)} {s}" for s in ("error", "timeout", "ok"))]
    no_turns = sum(1 for r in rollouts if not r.num_turns)
    if no_turns:
        parts.append(f"{no_turns} without a captured turn")
    if causes:
        shown = causes.most_common(top)
        more = len(causes) - len(shown)
        parts.append("; ".join(f"{n} x {c}" for c, n in shown) + (f"; {more} other cause(s)" if more > 0 else ""))
    return "; ".join(parts)


def check_not_all_failed(rollouts: list[RolloutRecord], batch: BatchRef) -> None:
    """Raise RolloutsFailed when every rollout of the batch has status ``error`` or ``timeout``,
    naming the most common causes with their counts (`rollout_report`)."""
    if rollouts and all(r.status in ("error", "timeout") for r in rollouts):
        raise RolloutsFailed(
            f"all {len(rollouts)} rollouts of the {batch.kind} batch of step {batch.step} (generation batch "
            f"{batch.generation_batch}) failed: {rollout_report(rollouts)}"
        )


#: The error of a rollout whose Map child left no record (the Map tolerates failed children).
LOST_ROLLOUT_ERROR = "RolloutLost"
LOST_ROLLOUT_CAUSE = ("no rollout record: the child execution failed before FinishRollout could write one (the Map "
                      "tolerates failed children; the Map Run lists the failed executions)")


def missing_items(rollouts: list[RolloutRecord], batch: BatchRef, planned: PlannedBatch | None) -> list[int]:
    """The item indices of ``planned`` (``len(rows) x responses_per_prompt`` items) that ``rollouts``
    (one per item) lack; [] without ``planned`` (a batch planned before it was kept in the run state).
    FinishRollout writes a record on every path, and the child's "Record failed rollout" state when
    FinishRollout keeps failing, so an item is missing only when its child failed outside both."""
    if planned is None or not batch.is_planned(planned):
        return []
    expected = len(planned.rows) * planned.responses_per_prompt
    return sorted(set(range(expected)) - {r.i for r in rollouts})


def lost_rollout(item: BatchItem, batch: BatchRef, sid: str | None) -> RolloutRecord:
    """The record of a rollout whose child left none: status ``error``, reward 0.0, error
    `LOST_ROLLOUT_ERROR`. It stays in its group as a failed rollout (the group keeps its size), and a
    batch whose every rollout failed fails the run (`check_not_all_failed`)."""
    return RolloutRecord(sid=sid, i=item.i, input_id=item.input_id, row=item.row, member=item.member, kind=batch.kind,
                         step=batch.step, generation_batch=batch.generation_batch, reward=0.0,
                         reward_reason=f"error: {LOST_ROLLOUT_ERROR}", status="error",
                         error={"error": LOST_ROLLOUT_ERROR, "cause": LOST_ROLLOUT_CAUSE}, group=batch.group,
                         policy_version=batch.policy.policy_version if batch.policy is not None else None)


@dataclass
class Group:
    """One prompt's rollouts: ``rewards_G``, ``records_G`` (TraceRecords per member) and
    ``rollouts_G`` (each member's rollout record without its TraceRecords: status, behaviour counts).
    With per-turn rewards also ``turn_rewards_G`` (per member, one reward per LLM turn) and
    ``turn_spans_G`` (per member, per record, its ``[turn, start, end]`` spans); ``rewards_G`` then
    holds each member's return (the sum of its per-turn rewards)."""

    input_id: str
    rewards_G: list[float] = field(default_factory=list)
    records_G: list[list[Any]] = field(default_factory=list)
    rollouts_G: list[RolloutRecord] = field(default_factory=list)
    empty: int = 0
    zeroed: list[str | None] = field(default_factory=list)
    turn_rewards_G: list[list[float]] = field(default_factory=list)
    turn_spans_G: list[list[list[list[int]]]] = field(default_factory=list)


def shaped_reward(rollout: RolloutRecord, cfg: RunConfig) -> float:
    """The reward, plus DAPO's overlong penalty when ``algorithm == "dapo"`` and a buffer is set."""
    return float(rollout.reward) + _overlong(rollout, cfg)


def _overlong(rollout: RolloutRecord, cfg: RunConfig) -> float:
    if cfg.algorithm == "dapo" and cfg.overlong_buffer_len > 0:
        from stepwise.core.dapo import overlong_penalty

        return overlong_penalty(int(rollout.sampled_tokens), max_len=cfg.max_tokens_per_rollout,
                                buffer_len=cfg.overlong_buffer_len, penalty_factor=cfg.overlong_penalty_factor)
    return 0.0


def shaped_turn_rewards(rollout: RolloutRecord, cfg: RunConfig) -> list[float]:
    """Per-turn rewards (``turn_rewards``, none for a rollout recorded without), DAPO's overlong
    penalty added to the last turn's (the turn that ran long)."""
    rewards_T = [float(r) for r in rollout.turn_rewards or []]
    penalty = _overlong(rollout, cfg)
    if rewards_T and penalty:
        rewards_T[-1] += penalty
    return rewards_T


def group_rollouts(rollouts: list[RolloutRecord], cfg: RunConfig) -> list[Group]:
    """Rollouts -> groups in prompt order, members in member order."""
    from stepwise.core.datums import trace_record_to_datum
    from stepwise.core.replay import record_from_json

    per_turn = cfg.reward_granularity == "per_turn"
    groups: dict[str, Group] = {}
    for r in sorted(rollouts, key=lambda r: (r.i, r.member)):
        g = groups.setdefault(r.input_id, Group(r.input_id))
        g.rewards_G.append(shaped_reward(r, cfg))
        records = [record_from_json(x) for x in r.records]
        g.records_G.append(records)
        g.rollouts_G.append(r.model_copy(update={"records": [], "turn_spans": None}))
        # empty = no trainable datum (the reference's rule: no loss-mask token or no prompt token)
        g.empty += 0 if any(trace_record_to_datum(rec, 0.0) is not None for rec in records) else 1
        g.zeroed.append(r.reward_reason)
        if per_turn:
            g.turn_rewards_G.append(shaped_turn_rewards(r, cfg))
            g.turn_spans_G.append(list(r.turn_spans) if r.turn_spans is not None else [[] for _ in records])
    return list(groups.values())


def estimator_rewards(group: Group, cfg: RunConfig) -> list:
    """What the estimator, the no-signal test (``advantages/zero_groups_fraction``) and DAPO's filter
    all read of a group, so the three agree: per-turn rewards under a per-turn estimator (a group
    carries a signal when some turn index's reward-to-go differs between members), else ``rewards_G``
    (with ``reward_granularity: per_turn``, each member's return)."""
    from stepwise.core.advantages import PER_TURN_ESTIMATORS

    if cfg.reward_granularity == "per_turn" and cfg.advantage_estimator in PER_TURN_ESTIMATORS:
        return group.turn_rewards_G
    return group.rewards_G


def datums_for(groups: list[Group], cfg: RunConfig | None = None, *, counts_P: list[int] | None = None
               ) -> tuple[list[dict[str, Any]], list[list]]:
    """``(datums, advantages_P)``: the config's estimator's advantages for the groups
    (`stepwise.core.advantages.compute_advantages`; GRPO without a config), then one datum per
    TraceRecord: every token of a rollout gets its advantage, or, with a per-turn estimator, each
    turn's tokens get that turn's (`stepwise.core.datums.group_to_turn_datums`). ``counts_P``, when
    given, receives how many datums each group gave (they are contiguous, in group order)."""
    from stepwise.core.advantages import PER_TURN_ESTIMATORS, compute_advantages
    from stepwise.core.datums import group_to_datums, group_to_turn_datums

    estimator = cfg.advantage_estimator if cfg is not None else "grpo"
    rewards_P = [estimator_rewards(g, cfg) if cfg is not None else g.rewards_G for g in groups]
    advantages_P = compute_advantages(estimator, rewards_P)
    datums: list[dict[str, Any]] = []
    for g, advantages_G in zip(groups, advantages_P, strict=True):
        before = len(datums)
        if estimator in PER_TURN_ESTIMATORS:
            datums.extend(group_to_turn_datums(g.records_G, g.turn_spans_G, advantages_G))
        else:
            datums.extend(group_to_datums(g.records_G, advantages_G))
        if counts_P is not None:
            counts_P.append(len(datums) - before)
    return datums, advantages_P


def select_groups(batches: Sequence[Sequence[RolloutRecord]], cfg: RunConfig
                  ) -> tuple[str, list[Group], list[Group], dict[str, float]]:
    """``(status, groups to train on, every group rolled out this step, sampling metrics)``.

    Args:
        batches: the rollout records of the step's generation batches 0..g, in order (GRPO: one).
        cfg: the run config (``algorithm``, ``batch_size``, ``max_num_gen_batches``, shaping).

    GRPO (one generation batch, every group kept) reports the same ``sampling/`` metrics as DAPO,
    so its empty rollouts are counted the same way. ``status`` is ``ready`` | ``need_more`` |
    ``cap_reached`` (`stepwise.core.dapo.GenerationBatchDecision`).
    """
    from stepwise.core.dapo import decide_generation_batch, sampling_metrics

    if cfg.algorithm != "dapo":
        groups = group_rollouts(list(batches[-1]), cfg)
        metrics_ = sampling_metrics(gen_batches=1, groups_rolled_out=len(groups), groups_kept=len(groups),
                                    empty_rollouts=sum(grp.empty for grp in groups))
        return "ready", groups, groups, metrics_
    kept: list[Group] = []
    everything: list[Group] = []
    decision = None
    for g, rollouts in enumerate(batches):
        new = group_rollouts(list(rollouts), cfg)
        everything.extend(new)
        decision = decide_generation_batch(kept, new, batch_size=cfg.batch_size, gen_batches_used=g + 1,
                                           max_num_gen_batches=cfg.max_num_gen_batches,
                                           rewards_of=lambda grp: estimator_rewards(grp, cfg))
        kept = list(decision.keep)
    assert decision is not None
    metrics_ = sampling_metrics(gen_batches=len(batches), groups_rolled_out=len(everything),
                                groups_kept=len(kept), empty_rollouts=sum(grp.empty for grp in everything),
                                surplus_groups=decision.surplus)
    return decision.status, kept, everything, metrics_


@dataclass
class StepOutcome:
    """What `compute_step` decided for a step.

    Attributes:
        status: ``ready`` (train on ``datums``) | ``need_more`` | ``cap_reached``.
        train_groups: the groups trained on (DAPO: those kept so far).
        all_groups: every group rolled out this step (all generation batches).
        rollouts: every rollout of the step, without its TraceRecords.
        metrics: ``sampler/*`` reward metrics, the behaviour metrics and ``sampling/*``.
        train_metrics: when ``ready``: ``staleness/*``, ``sampler/num_datums`` and ``advantages/*``.
        datums: when ``ready``: the forward_backward datums (possibly none: the step is skipped).
        advantages_P: when ``ready``: the advantages the datums carry, one ``advantages_G`` per group of
            ``train_groups`` (per member, or per member and turn under a per-turn estimator): what a
            person reads of a trained rollout (`stepwise.views`) is this, never a recomputation.
        datum_staleness: with ``chosen`` (the group engine), each datum's staleness (its group's: the
            version the update applies to minus its oldest member's first turn), for the service's
            per-datum loss outputs by staleness (`stepwise.core.staleness.loss_outputs_by_staleness`).
    """

    status: str
    train_groups: list[Group]
    all_groups: list[Group]
    rollouts: list[RolloutRecord]
    metrics: dict[str, Any]
    train_metrics: dict[str, Any] = field(default_factory=dict)
    datums: list[dict[str, Any]] = field(default_factory=list)
    advantages_P: list[list] = field(default_factory=list)
    datum_staleness: list[int] = field(default_factory=list)


def chosen_groups(groups: Sequence[Sequence[RolloutRecord]], cfg: RunConfig
                  ) -> tuple[str, list[Group], list[Group], dict[str, float]]:
    """`select_groups` for the group engine (``admission: group``): ``groups`` are the rollouts of the groups
    it chose (`stepwise.core.groups.readiness`), one sequence per group in the order chosen (oldest first);
    every one is trained (DAPO filtered the others as they completed). The ``sampling/`` metrics count
    these groups; the engine's own (generation batches, filtered) come from its consumption."""
    from stepwise.core.dapo import sampling_metrics

    out = [grp for rollouts in groups for grp in group_rollouts(list(rollouts), cfg)]
    metrics_ = sampling_metrics(gen_batches=1, groups_rolled_out=len(out), groups_kept=len(out),
                                empty_rollouts=sum(grp.empty for grp in out))
    return "ready", out, out, metrics_


def compute_step(batches: Sequence[Sequence[RolloutRecord]], cfg: RunConfig, *, policy_version: int,
                 where: str = "", chosen: bool = False) -> StepOutcome:
    """The step's decision, datums and metrics from its rollout records (one pure function).

    Args:
        batches: the rollout records of generation batches 0..g of the step, each in item order; with
            ``chosen``, the rollouts of each group the group engine chose, one sequence per group.
        cfg: the run config.
        policy_version: the version the update would apply to (the run state's ``policy_version``).
        where: names the step in a staleness error (``"step 3"``).
        chosen: the group engine's step (`chosen_groups`): every group is trained, and staleness past
            ``max_staleness`` is counted (``staleness/past_k``), never raised: pacing keeps it at 0 and
            nothing is discarded for it.

    Staleness is counted from each rollout's first turn (`stepwise.core.staleness.sampled_version`).

    Raises:
        StalenessExceeded: the batch engine only: a rollout to train on sampled more than ``max_staleness``
            versions ago.
    """
    from stepwise.core.advantages import advantage_metrics
    from stepwise.core.behaviour import behaviour_metrics
    from stepwise.core.rewards import reward_metrics
    from stepwise.core.staleness import check_staleness, sampled_version, staleness_histogram, staleness_metrics

    status, train_groups, all_groups, sampling = (chosen_groups if chosen else select_groups)(batches, cfg)
    rollouts = [r for g in all_groups for r in g.rollouts_G]
    all_rewards = [r for g in all_groups for r in g.rewards_G]
    metrics_: dict[str, Any] = {}
    metrics_.update(reward_metrics(all_rewards, [z for g in all_groups for z in g.zeroed]))
    metrics_.update(behaviour_metrics([r.model_dump() for r in rollouts]))
    metrics_.update(sampling)
    outcome = StepOutcome(status, train_groups, all_groups, rollouts, metrics_)
    if status != "ready":
        return outcome
    # No batch is trained on rollouts more than max_staleness policy versions old.
    sampled_versions = [sampled_version(r) for g in train_groups for r in g.rollouts_G]
    if chosen:
        outcome.train_metrics.update(staleness_histogram(sampled_versions, policy_version, cfg.max_staleness))
    else:
        check_staleness(sampled_versions, policy_version, cfg.max_staleness, where=where)
    outcome.train_metrics.update(staleness_metrics(sampled_versions, policy_version))
    counts_P: list[int] = []
    datums, advantages_P = datums_for(train_groups, cfg, counts_P=counts_P)
    if chosen:
        for g, n in zip(train_groups, counts_P, strict=True):
            versions = [v for v in (sampled_version(r) for r in g.rollouts_G) if v is not None]
            outcome.datum_staleness.extend([policy_version - min(versions, default=policy_version)] * n)
    outcome.train_metrics["sampler/num_datums"] = len(datums)
    outcome.train_metrics.update(advantage_metrics(advantages_P, [estimator_rewards(g, cfg) for g in train_groups]))
    outcome.datums = datums
    outcome.advantages_P = advantages_P
    return outcome


# ---------------------------------------------------------------------------- the step's decision in the run state


class BatchMismatch(RuntimeError):
    """The batch handed in is not the run's planned batch (names both)."""


def check_batch(state: RunState, batch: BatchRef) -> None:
    """Refuse a batch that is not ``state``'s planned one (``current_batch``).

    Raises:
        BatchMismatch: naming both.
    """
    cur = state.current_batch
    if not batch.is_planned(cur):
        raise BatchMismatch(f"batch {batch.kind} step {batch.step} gen {batch.generation_batch} is not the planned batch "
                            f"{cur.model_dump() if cur is not None else None}")


#: ComputeAdvantages' decisions (``result["decision"]``): the run state's move for each is `record_step`'s.
STEP_DECISIONS = ("train", "need_more", "cap_reached", "skip")


def record_step(state: RunState, cfg: RunConfig, batch: BatchRef, *, decision: str, result: dict[str, Any],
                usage: Usage, epoch: int, at: float, outcome: StepOutcome, step_metrics: dict[str, Any],
                chunk_sizes: Sequence[int], cap_reason: str) -> None:
    """ComputeAdvantages' transition of the run state (mutated), for ``decision`` (`STEP_DECISIONS`):
    the planned batch is done (``last_decision`` keeps ``result``, what a retry returns), ``usage`` joins
    the ledger, the run is at ``epoch``; then
    - ``train``: the step's datum chunks (``chunk_sizes``), their staleness, kept groups and ``step_metrics``
      wait for the update (the step ends at its Rebind); the empty-step count restarts;
    - ``need_more``: the next generation batch of the step;
    - ``cap_reached``: the run stops with ``cap_reason`` (checkpoint and finish);
    - ``skip``: no datum: the next step, one more empty step (with its rollouts' report).
    A skipped or capped step's cost is closed in the ledger at ``at`` (epoch seconds). Not idempotent:
    a retry is answered from ``last_decision`` before it is applied again (the batch is no longer planned).

    Raises:
        BatchMismatch: ``batch`` is not the planned batch (`check_batch`).
    """
    check_batch(state, batch)
    state.current_batch = None
    state.last_decision = {"batch": batch.model_dump(), "result": result}
    state.ledger.usage.add(usage)
    state.epoch = epoch
    if decision in ("skip", "cap_reached"):  # the step ends here (a trained step ends at its Rebind)
        ledger.close_step(state, cfg, at, batch.step)
    if decision == "train":
        state.datum_chunks = list(chunk_sizes)
        state.datum_staleness = list(outcome.datum_staleness)
        state.kept_groups = len(outcome.train_groups)
        state.step_metrics = dict(step_metrics)  # the summary is written once the step is trained (Rebind)
        state.empty_steps, state.empty_steps_report = 0, ""
    elif decision == "need_more":
        state.generation_batch += 1
    elif decision == "cap_reached":
        state.stop_reason = cap_reason
        state.generation_batch = 0
    elif decision == "skip":
        state.step += 1
        state.generation_batch = 0
        state.empty_steps += 1
        state.empty_steps_report = f"step {batch.step}'s {len(outcome.rollouts)} rollouts: {rollout_report(outcome.rollouts)}"
