"""ComputeAdvantages and RecordEval: turn a rolled-out generation batch into a decision.

ComputeAdvantages (train batches), following the reference `train_grpo.py` step and the DAPO
proposal (shared/seeds/002):
- group = the ``responses_per_prompt`` rollouts of one prompt (same ``input_id``), in prompt order;
- GRPO: every group of the batch; DAPO: informative groups accumulated over the step's generation
  batches until ``batch_size`` are kept (`stepwise.core.dapo.decide_generation_batch`), with the
  optional overlong shaping added to each reward first;
- advantages per group (`core.advantages.compute_grpo_advantages`), datums per TraceRecord
  (`core.datums.group_to_datums`), chunked as the SDK chunks (`stepwise.core.operations.datum_chunks`) and
  written to ``steps/{step}/datums/``; a step with no datums is skipped (reference);
- the decision: ``train`` | ``need_more`` (another generation batch) | ``cap_reached`` (finish with
  a reason: checkpoint and stop) | ``skip``; metrics go to ``steps/{step}/summary.json`` and EMF:
  rewards, advantages, DAPO sampling and the behaviour metrics of every rollout of the step
  (`stepwise.core.behaviour.behaviour_metrics`: turns, tokens, truncated and ill-formed turns,
  tool calls, rollout duration p50/p95, status counts);
- ``max_staleness`` (issue 17): before any datum is written, every trained rollout must have sampled
  on a policy at most ``max_staleness`` versions older than the one the update applies to
  (`stepwise.core.staleness.check_staleness`, else ``StalenessExceeded`` fails the run); the summary
  reports ``staleness/*``, and with ``max_staleness`` 1 a ``train`` result carries
  ``roll_out_next``, which sends the state machine into its Parallel state (train this step, roll
  out the next).

RecordEval: mean reward of an eval batch -> ``eval/accuracy`` (reference ``run_eval``).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise.core.operations import datum_chunks
from stepwise.core.planning import NoTrainingSignal
from stepwise.core.rewards import preview
from stepwise.core.staleness import check_staleness, staleness_metrics
from stepwise.events import BatchEvent
from stepwise.handlers._common import bind, emit, entrypoint, logger, now, run_config, store, write_summary
from stepwise.layout import datums_key, eval_summary_key, rollouts_prefix, start_marker_key
from stepwise.records import BatchRef, PlannedBatch, RolloutRecord, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig


class BatchMismatch(RuntimeError):
    """The batch handed in is not the run's planned batch (names both)."""


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


class RolloutsMissing(RuntimeError):
    """The Map completed but rollout records of planned items are absent (a child that never ran or
    a record that was never written): training on the rest would silently shrink their groups."""


def check_complete(rollouts: list[RolloutRecord], batch: BatchRef, planned: PlannedBatch | None) -> None:
    """Raise RolloutsMissing when ``rollouts`` (one per item, `current_rollouts`) do not cover the
    ``len(rows) x responses_per_prompt`` items of ``planned``, naming the missing item indices.
    A failed or timed-out rollout has a record (FinishRollout writes one on every path), so only a
    lost one is missing. No check without ``planned`` (a batch planned before this check)."""
    if planned is None or not batch.is_planned(planned):
        return
    expected = len(planned.rows) * planned.responses_per_prompt
    missing = sorted(set(range(expected)) - {r.i for r in rollouts})
    if missing:
        raise RolloutsMissing(
            f"{len(missing)} of {expected} rollouts of the {batch.kind} batch of step {batch.step} (generation batch "
            f"{batch.generation_batch}) have no record although the Map completed: items {missing[:20]}"
            f"{' ...' if len(missing) > 20 else ''}")


@dataclass
class Group:
    """One prompt's rollouts: ``rewards_G``, ``records_G`` (TraceRecords per member) and
    ``rollouts_G`` (each member's rollout record without its TraceRecords: status, behaviour counts)."""

    input_id: str
    rewards_G: list[float] = field(default_factory=list)
    records_G: list[list[Any]] = field(default_factory=list)
    rollouts_G: list[RolloutRecord] = field(default_factory=list)
    empty: int = 0
    zeroed: list[str | None] = field(default_factory=list)


def load_rollouts(run_id: str, batch: BatchRef, generation_batch: int | None = None) -> list[RolloutRecord]:
    """The rollout records of a generation batch, in item order."""
    rs = store()
    g = batch.generation_batch if generation_batch is None else generation_batch
    prefix = rollouts_prefix(run_id, batch.step, g, batch.kind)
    rollouts = [RolloutRecord.model_validate(rs.get_json(k)) for k in rs.list_keys(prefix) if k.endswith(".json")]
    return sorted(current_rollouts(rs, run_id, batch, g, rollouts), key=lambda r: r.i)


def current_rollouts(rs: Any, run_id: str, batch: BatchRef, generation_batch: int,
                     rollouts: list[RolloutRecord]) -> list[RolloutRecord]:
    """One record per item: when an item has several (a resumed run re-doing a step after a
    rewind, a re-run Map child), keep the one whose sid its start marker names (the newest start)."""
    by_i: dict[int, list[RolloutRecord]] = {}
    for r in rollouts:
        by_i.setdefault(r.i, []).append(r)
    out = []
    for i, records in by_i.items():
        if len(records) > 1:
            sid = (rs.get_json_or(start_marker_key(run_id, batch.step, generation_batch, batch.kind, i)) or {}).get("sid")
            records = [r for r in records if r.sid == sid] or records[-1:]
        out.append(records[0])
    return out


def shaped_reward(rollout: RolloutRecord, cfg: RunConfig) -> float:
    """The reward, plus DAPO's overlong penalty when ``algorithm == "dapo"`` and a buffer is set."""
    reward = float(rollout.reward)
    if cfg.algorithm == "dapo" and cfg.overlong_buffer_len > 0:
        from stepwise.core.dapo import overlong_penalty

        reward += overlong_penalty(int(rollout.sampled_tokens), max_len=cfg.max_tokens_per_rollout,
                                   buffer_len=cfg.overlong_buffer_len, penalty_factor=cfg.overlong_penalty_factor)
    return reward


def group_rollouts(rollouts: list[RolloutRecord], cfg: RunConfig) -> list[Group]:
    """Rollouts -> groups in prompt order, members in member order."""
    from stepwise.core.datums import trace_record_to_datum
    from stepwise.core.replay import record_from_json

    groups: dict[str, Group] = {}
    for r in sorted(rollouts, key=lambda r: (r.i, r.member)):
        g = groups.setdefault(r.input_id, Group(r.input_id))
        g.rewards_G.append(shaped_reward(r, cfg))
        records = [record_from_json(x) for x in r.records]
        g.records_G.append(records)
        g.rollouts_G.append(r.model_copy(update={"records": []}))
        # empty = no trainable datum (the reference's rule: no loss-mask token or no prompt token)
        g.empty += 0 if any(trace_record_to_datum(rec, 0.0) is not None for rec in records) else 1
        g.zeroed.append(r.reward_reason)
    return list(groups.values())


def datums_for(groups: list[Group]) -> tuple[list[dict[str, Any]], list[list[float]]]:
    """``(datums, advantages_P)``: GRPO advantages per group, then one datum per TraceRecord."""
    from stepwise.core.advantages import compute_grpo_advantages
    from stepwise.core.datums import group_to_datums

    datums: list[dict[str, Any]] = []
    advantages_P: list[list[float]] = []
    for g in groups:
        advantages_G = compute_grpo_advantages(g.rewards_G)
        advantages_P.append(advantages_G)
        datums.extend(group_to_datums(g.records_G, advantages_G))
    return datums, advantages_P


def select_groups(run_id: str, batch: BatchRef, cfg: RunConfig,
                  planned: PlannedBatch | None = None) -> tuple[str, list[Group], list[Group], dict[str, float]]:
    """``(status, groups to train on, every group rolled out this step, sampling metrics)``. GRPO reports the same ``sampling/`` metrics as DAPO (one
    generation batch, every group kept, so its empty rollouts are counted the same way).

    Raises:
        RolloutsFailed: every rollout of the batch just rolled out failed (`check_not_all_failed`).
        RolloutsMissing: the batch just rolled out lacks records of ``planned``'s items (`check_complete`).
    """
    from stepwise.core.dapo import decide_generation_batch, sampling_metrics

    if cfg.algorithm != "dapo":
        rollouts = load_rollouts(run_id, batch)
        check_complete(rollouts, batch, planned)
        check_not_all_failed(rollouts, batch)
        groups = group_rollouts(rollouts, cfg)
        metrics_ = sampling_metrics(gen_batches=1, groups_rolled_out=len(groups), groups_kept=len(groups),
                                    empty_rollouts=sum(grp.empty for grp in groups))
        return "ready", groups, groups, metrics_
    kept: list[Group] = []
    everything: list[Group] = []
    decision = None
    for g in range(batch.generation_batch + 1):
        rollouts = load_rollouts(run_id, batch, g)
        if g == batch.generation_batch:
            check_complete(rollouts, batch, planned)
            check_not_all_failed(rollouts, batch)
        new = group_rollouts(rollouts, cfg)
        everything.extend(new)
        decision = decide_generation_batch(kept, new, batch_size=cfg.batch_size, gen_batches_used=g + 1,
                                           max_num_gen_batches=cfg.max_num_gen_batches,
                                           rewards_of=lambda grp: grp.rewards_G)
        kept = list(decision.keep)
    assert decision is not None
    metrics_ = sampling_metrics(gen_batches=batch.generation_batch + 1, groups_rolled_out=len(everything),
                                groups_kept=len(kept), empty_rollouts=sum(grp.empty for grp in everything),
                                surplus_groups=decision.surplus)
    return decision.status, kept, everything, metrics_


def _check_batch(state: RunState, batch: BatchRef) -> None:
    cur = state.current_batch
    if not batch.is_planned(cur):
        raise BatchMismatch(f"batch {batch.kind} step {batch.step} gen {batch.generation_batch} is not the planned batch "
                            f"{cur.model_dump() if cur is not None else None}")


def compute(event: BatchEvent) -> dict[str, Any]:
    from stepwise.core.advantages import advantage_metrics
    from stepwise.core.behaviour import behaviour_metrics
    from stepwise.core.rewards import reward_metrics

    rs = store()
    run, batch = event.run, event.batch
    bind(run_id=run.run_id, step=batch.step)
    state = rs.owned_state(run.run_id, run.execution_arn)
    if state.current_batch is None and state.last_decision and state.last_decision.get("batch") == batch.model_dump():
        return dict(state.last_decision["result"])  # a retry after the state was already written
    _check_batch(state, batch)
    cfg = run_config(run.run_id)
    status, train_groups, all_groups, sampling = select_groups(run.run_id, batch, cfg, state.current_batch)
    rollouts = [r for g in all_groups for r in g.rollouts_G]  # every rollout of the step
    all_rewards = [r for g in all_groups for r in g.rewards_G]
    metrics_: dict[str, Any] = {"step": batch.step, "epoch": state.epoch}
    metrics_.update(reward_metrics(all_rewards, [z for g in all_groups for z in g.zeroed]))
    metrics_.update(behaviour_metrics([r.model_dump() for r in rollouts]))
    metrics_.update(sampling)
    if state.step_started_at:
        metrics_["time/rollout"] = now() - state.step_started_at

    chunk_sizes: list[int] = []
    decision = {"ready": "train", "need_more": "need_more", "cap_reached": "cap_reached"}[status]
    if decision == "train":
        # No batch is trained on rollouts more than max_staleness policy versions old (issue 17).
        sampled_versions = [r.policy_version for g in train_groups for r in g.rollouts_G]
        check_staleness(sampled_versions, state.policy_version, cfg.max_staleness, where=f"step {batch.step}")
        metrics_.update(staleness_metrics(sampled_versions, state.policy_version))
        datums, advantages_P = datums_for(train_groups)
        metrics_["sampler/num_datums"] = len(datums)
        metrics_.update(advantage_metrics(advantages_P, [g.rewards_G for g in train_groups]))
        if not datums:
            decision = "skip"
            logger.warning("no valid datums; skipping the update (reference behaviour)")
        else:
            for i, chunk in enumerate(datum_chunks(datums, cfg.loss)):
                rs.put_json(datums_key(run.run_id, batch.step, i), chunk, bulk=True)
                chunk_sizes.append(len(chunk))
    result = {"decision": decision, "step": batch.step, "generation_batch": batch.generation_batch,
              "num_datums": int(metrics_.get("sampler/num_datums", 0)),
              "mean_reward": metrics_["sampler/mean_reward"]}
    # True: the state machine trains this step while the next one rolls out (its Parallel state).
    # Always present, so the Choice's IsPresent guard (for results cached before the field) finds it.
    result["roll_out_next"] = decision == "train" and cfg.max_staleness >= 1

    cap_reason = (f"max_num_gen_batches ({cfg.max_num_gen_batches}) reached at step {batch.step} "
                  f"with {len(train_groups)}/{cfg.batch_size} informative groups")

    def change(s: RunState) -> None:
        _check_batch(s, batch)
        s.current_batch = None
        s.last_decision = {"batch": batch.model_dump(), "result": result}
        if decision == "train":
            s.datum_chunks = chunk_sizes
            s.kept_groups = len(train_groups)
            s.step_metrics = dict(metrics_)  # the summary is written once the step is trained (Rebind)
            s.empty_steps, s.empty_steps_report = 0, ""
        elif decision == "need_more":
            s.generation_batch += 1
        elif decision == "cap_reached":
            s.stop_reason = cap_reason
            s.generation_batch = 0
        elif decision == "skip":
            s.step += 1
            s.generation_batch = 0
            s.empty_steps += 1
            s.empty_steps_report = f"step {batch.step}'s {len(rollouts)} rollouts: {rollout_report(rollouts)}"

    if decision in ("skip", "cap_reached"):
        reason = {"stop_reason": cap_reason} if decision == "cap_reached" else {}
        write_summary(run.run_id, batch.step, metrics_ | {"decision": decision} | reason)
    if decision in ("train", "skip", "cap_reached"):
        emit({k: v for k, v in metrics_.items() if k not in ("step", "epoch")}, run_id=run.run_id)
    if decision == "skip" and state.empty_steps + 1 >= cfg.max_consecutive_empty_steps:
        # Raised before the state moves on: a resumed run re-plans this step (on a fixed agent).
        n = state.empty_steps + 1
        raise NoTrainingSignal(
            f"{n} consecutive step(s) ({batch.step - n + 1} to {batch.step}) produced no trainable datum "
            f"(max_consecutive_empty_steps {cfg.max_consecutive_empty_steps}); step {batch.step}'s "
            f"{len(rollouts)} rollouts: {rollout_report(rollouts)}"
        )
    rs.update_state(run.run_id, change, execution_arn=run.execution_arn)
    if sampling and decision != "need_more":
        # the seed's per-step "sampling:" line (DAPO; GRPO logs the same with one generation batch)
        logger.info("sampling", extra={k.removeprefix("sampling/"): v for k, v in sampling.items()}
                    | {"decision": decision})
    if decision == "cap_reached":
        logger.warning("DAPO cap reached: saving a checkpoint and stopping the run",
                       extra={"stop_reason": cap_reason})
    logger.info("advantages computed", extra=result)
    return result


def record_eval(event: BatchEvent) -> dict[str, Any]:
    rs = store()
    run, batch = event.run, event.batch
    bind(run_id=run.run_id, step=batch.step)
    state = rs.owned_state(run.run_id, run.execution_arn)
    if state.current_batch is None and state.last_eval_step == batch.step:
        return rs.get_json(eval_summary_key(run.run_id, batch.step))
    _check_batch(state, batch)
    rollouts = load_rollouts(run.run_id, batch)
    check_not_all_failed(rollouts, batch)
    scores = [float(r.reward) for r in rollouts]
    accuracy = sum(scores) / len(scores) if scores else 0.0
    summary = {"step": batch.step, "eval/accuracy": accuracy, "eval/n": len(scores), "final": batch.final,
               "eval/failed_rollouts": sum(1 for r in rollouts if r.status != "ok")}
    write_summary(run.run_id, batch.step, summary, kind="eval")

    def change(s: RunState) -> None:
        _check_batch(s, batch)
        s.current_batch = None
        s.last_eval_step = batch.step
        s.eval_steps = sorted({*s.eval_steps, batch.step})
        if batch.final:
            s.final_eval_done = True

    rs.update_state(run.run_id, change, execution_arn=run.execution_arn)
    emit({"eval/accuracy": accuracy, "eval/n": len(scores)}, run_id=run.run_id)
    logger.info("eval recorded", extra=summary)
    return summary


handler = entrypoint(BatchEvent, compute)
eval_handler = entrypoint(BatchEvent, record_eval)
