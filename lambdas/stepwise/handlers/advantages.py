"""ComputeAdvantages and RecordEval: turn a rolled-out generation batch into a decision.

ComputeAdvantages (train batches) is a thin shell over `stepwise.core.steps.compute_step` (grouping,
GRPO/DAPO group selection, advantages, datums, the step's metrics, the ``max_staleness`` check): it
loads the rollout records of the step's generation batches (an item of the batch just rolled out
without a record counts as a failed rollout; a batch whose every rollout failed fails the run), writes the datums chunked as the SDK chunks them
(`stepwise.core.operations.datum_chunks`) to ``steps/{step}/datums/`` and moves the run state:
- the decision: ``train`` | ``need_more`` (another generation batch) | ``cap_reached`` (finish with
  a reason: checkpoint and stop) | ``skip`` (no datum: the reference skips the update); metrics go
  to ``steps/{step}/summary.json`` and EMF: rewards, advantages, DAPO sampling, staleness and the
  behaviour metrics of every rollout of the step;
- with ``max_staleness`` 1 a ``train`` result carries ``roll_out_next``, which sends the state
  machine into its Parallel state (train this step, roll out the next).

RecordEval: an eval batch -> ``eval/accuracy`` (mean reward, reference ``run_eval``), pass@k, mean@n
and the group outcomes of each eval set, and every prompt's results (`stepwise.core.evals`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepwise.core import ledger
from stepwise.core.operations import datum_chunks
from stepwise.core.planning import NoTrainingSignal
from stepwise.core.steps import (  # noqa: F401  (RolloutsFailed, BatchMismatch: the errors this handler raises)
    BatchMismatch,
    RolloutsFailed,
    check_batch,
    check_not_all_failed,
    compute_step,
    lost_rollout,
    missing_items,
    record_step,
    rollout_report,
)
from stepwise.events import BatchEvent, GroupEvent
from stepwise.handlers._common import bind, emit, entrypoint, logger, now, run_config, store, write_summary
from stepwise.layout import (datums_key, eval_results_key, eval_summary_key, group_complete_key, items_key,
                             prompts_key, rollout_key, start_marker_key)
from stepwise.records import BatchItem, BatchRef, PlannedBatch, RolloutRecord, RunState, Usage

if TYPE_CHECKING:
    from stepwise.config import RunConfig


def load_rollouts(run_id: str, batch: BatchRef, generation_batch: int | None = None) -> list[RolloutRecord]:
    """The rollout records of a generation batch, in item order, one per item (`RunStore.batch_rollouts`)."""
    g = batch.generation_batch if generation_batch is None else generation_batch
    return store().batch_rollouts(run_id, batch.step, g, batch.kind, **batch.folder)


def record_lost_rollouts(run_id: str, batch: BatchRef, missing: list[int]) -> list[RolloutRecord]:
    """Write (and return) a `stepwise.core.steps.lost_rollout` for each missing item (``rollouts/lost-{i}.json``).
    Idempotent: a retried ComputeAdvantages rewrites the same records."""
    if not missing:
        return []
    rs = store()
    items = {int(it["i"]): BatchItem.model_validate(it)
             for it in rs.get_json(items_key(run_id, batch.step, batch.generation_batch, batch.kind, **batch.folder))}
    out = []
    for i in missing:
        sid = (rs.get_json_or(start_marker_key(run_id, batch.step, batch.generation_batch, batch.kind, i,
                                               **batch.folder)) or {}).get("sid")
        record = lost_rollout(items[i], batch, sid)
        rs.put_json(rollout_key(run_id, batch.step, batch.generation_batch, f"lost-{i}", batch.kind, **batch.folder),
                    record.model_dump(), bulk=True)
        out.append(record)
    logger.warning("rollouts without a record counted as failed", extra={"items": missing[:20], "lost": len(missing)})
    return out


def completed_rollouts(run_id: str, batch: BatchRef, planned: PlannedBatch | None,
                       generation_batch: int | None = None) -> list[RolloutRecord]:
    """`load_rollouts`, plus a lost rollout (`record_lost_rollouts`) for each item of the batch just rolled
    out (``planned``) without a record: the Map tolerates failed children, the step goes on."""
    rollouts = load_rollouts(run_id, batch, generation_batch)
    lost = record_lost_rollouts(run_id, batch, missing_items(rollouts, batch, planned))
    return sorted(rollouts + lost, key=lambda r: r.i)


def load_step_batches(run_id: str, batch: BatchRef, cfg: RunConfig,
                      planned: PlannedBatch | None = None) -> list[list[RolloutRecord]]:
    """The rollout records `compute_step` reads: DAPO's generation batches 0..g of the step, GRPO's
    one (the batch handed in), each in item order.

    Items of the batch just rolled out without a record count as failed rollouts (`completed_rollouts`).

    Raises:
        RolloutsFailed: every rollout of the batch just rolled out failed (`check_not_all_failed`).
    """
    gens = range(batch.generation_batch + 1) if cfg.algorithm == "dapo" else [batch.generation_batch]
    batches = [load_rollouts(run_id, batch, g) for g in gens[:-1]] + [completed_rollouts(run_id, batch, planned)]
    check_not_all_failed(batches[-1], batch)
    return batches


def group_rollouts_of(run_id: str, batch: BatchRef) -> list[RolloutRecord]:
    """A group's rollout records (``batch.group``'s folder), one per member in item order, a lost rollout
    (`record_lost_rollouts`) for each member of its ``items.json`` without one."""
    rs = store()
    rollouts = load_rollouts(run_id, batch)
    items = rs.get_json(items_key(run_id, batch.step, batch.generation_batch, batch.kind, **batch.folder))
    missing = sorted({int(it["i"]) for it in items} - {r.i for r in rollouts})
    return sorted(rollouts + record_lost_rollouts(run_id, batch, missing), key=lambda r: r.i)


#: Parallel reads of the chosen groups' rollout records.
GROUP_READ_WORKERS = 8


def chosen_group_refs(cfg: RunConfig, chosen: list[tuple[int, int]]) -> list[BatchRef]:
    """The batches of the groups a step takes (``(group, attempt)``, in the order chosen): their folders."""
    from stepwise.core.groups import seed_place

    return [BatchRef(kind="train", step=seed_place(g, cfg.batch_size)[0], group=g, attempt=a) for g, a in chosen]


def chosen_group_rollouts(run_id: str, refs: list[BatchRef]) -> list[list[RolloutRecord]]:
    """The rollout records of the groups a step takes (`chosen_group_refs`), in the order chosen."""
    from concurrent.futures import ThreadPoolExecutor

    if not refs:
        return []
    with ThreadPoolExecutor(max_workers=min(GROUP_READ_WORKERS, len(refs))) as pool:
        return list(pool.map(lambda ref: group_rollouts_of(run_id, ref), refs))


def compute(event: BatchEvent) -> dict[str, Any]:
    rs = store()
    run, batch = event.run, event.batch
    bind(run_id=run.run_id, step=batch.step)
    state = rs.owned_state(run.run_id, run.execution_arn)
    if state.current_batch is None and state.last_decision and state.last_decision.get("batch") == batch.model_dump():
        return dict(state.last_decision["result"])  # a retry after the state was already written
    check_batch(state, batch)
    cfg = run_config(run.run_id)
    taken: TakenGroups | None = None
    judge_metrics: dict[str, float] = {}
    if cfg.admission == "group":
        taken = take_groups(run.run_id, batch, state, cfg)
        if taken.waiting is not None:
            if taken.waiting["decision"] == "exhausted":  # nothing left: the planner ends the run
                rs.update_state(run.run_id, lambda s: setattr(s, "current_batch", None), execution_arn=run.execution_arn)
            return taken.waiting
        batches = taken.rollouts
        batch_usage = ledger.batch_usage([r for b in batches for r in b]).minus(ledger.batch_usage([]))
        if cfg.judge is not None:  # each group's judge record merged in, as the batch path merges a batch's
            from stepwise.judging import judged_groups

            batches, judge_metrics = judged_groups(rs, run.run_id, taken.refs, batches, cfg)
        batch_usage.add(taken.pending_usage)  # DAPO's filtered groups and the groups' own transitions
        outcome = compute_step(batches, cfg, policy_version=state.policy_version, where=f"step {batch.step}",
                               chosen=True)
        if taken.cap:
            outcome.status = "cap_reached"
    else:
        batches = load_step_batches(run.run_id, batch, cfg, state.current_batch)
        batch_usage = ledger.batch_usage(batches[-1])  # the generation batch just rolled out (the cost ledger)
        if cfg.judge is not None:  # the group judge's records merged in: the rewards the estimator reads
            from stepwise.judging import judged_batches

            gens = list(range(batch.generation_batch + 1)) if cfg.algorithm == "dapo" else [batch.generation_batch]
            batches, judge_metrics, judge_usage = judged_batches(rs, run.run_id, batch.step, gens, batches, cfg)
            batch_usage.add(judge_usage)
        outcome = compute_step(batches, cfg, policy_version=state.policy_version, where=f"step {batch.step}")
    status, train_groups, rollouts = outcome.status, outcome.train_groups, outcome.rollouts
    sampling = {k: v for k, v in outcome.metrics.items() if k.startswith("sampling/")}
    metrics_: dict[str, Any] = {"step": batch.step, "epoch": state.epoch, **outcome.metrics, **judge_metrics}
    if state.step_started_at:
        metrics_["time/rollout"] = now() - state.step_started_at

    chunk_sizes: list[int] = []
    decision = {"ready": "train", "need_more": "need_more", "cap_reached": "cap_reached"}[status]
    if decision == "train":
        datums = outcome.datums
        metrics_.update(outcome.train_metrics)
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
    result["roll_out_next"] = decision == "train" and cfg.max_staleness >= 1 and taken is None
    epoch = state.epoch
    if taken is not None:
        # the groups leave the buffer before the state moves on: a retry finds them taken for this step
        group_metrics, consumed = consume_groups(run.run_id, batch, state, cfg, taken, decision)
        metrics_.update(group_metrics)
        if group_metrics.get("sampling/generation_batches"):
            sampling["sampling/generation_batches"] = group_metrics["sampling/generation_batches"]
        metrics_["consumed_groups"] = [list(x) for x in consumed.trained]
        metrics_["filtered_groups"] = [list(x) for x in consumed.filtered]
        epoch = max([state.epoch, *(g // max(1, taken.per_epoch) for g, _ in consumed.trained)])
        metrics_["epoch"] = epoch
        result["groups"] = len(consumed.trained)

    cap_reason = (f"max_num_gen_batches ({cfg.max_num_gen_batches}) reached at step {batch.step} "
                  f"with {len(train_groups)}/{cfg.batch_size} informative groups")

    def change(s: RunState) -> None:
        record_step(s, cfg, batch, decision=decision, result=result, usage=batch_usage, epoch=epoch, at=at,
                    outcome=outcome, step_metrics=metrics_, chunk_sizes=chunk_sizes, cap_reason=cap_reason)

    at = now()
    if decision in ("skip", "cap_reached"):
        reason = {"stop_reason": cap_reason} if decision == "cap_reached" else {}
        # the step's cost as the state will close it (from the state read above: the write below adds
        # this invocation's own measurement too, so the summary's figure can be a few ms of Lambda short)
        preview = state.model_copy(deep=True)
        preview.ledger.usage.add(batch_usage)
        cost = ledger.close_step(preview, cfg, at, batch.step) | ledger.check_metrics(preview)
        write_summary(run.run_id, batch.step, metrics_ | cost | {"decision": decision} | reason)
        metrics_.update(cost)  # emitted below with the step's other metrics
    if decision in ("train", "skip", "cap_reached"):
        emit({k: v for k, v in metrics_.items() if k not in ("step", "epoch") and isinstance(v, (int, float))},
             run_id=run.run_id)
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


class TakenGroups:
    """What a group-engine step takes (`take_groups`): the readiness that chose its groups, their rollouts,
    the buffer's usage not counted yet, or the answer to return when nothing is ready (``waiting``)."""

    def __init__(self, *, ready: Any = None, rollouts: list[list[RolloutRecord]] | None = None,
                 refs: list[BatchRef] | None = None, pending_usage: Usage | None = None, per_epoch: int = 1,
                 waiting: dict[str, Any] | None = None) -> None:
        self.ready, self.rollouts, self.waiting = ready, rollouts or [], waiting
        self.refs = refs or []  # the groups' batches (folders), one per entry of ``rollouts``
        self.pending_usage = pending_usage or Usage()
        self.per_epoch = per_epoch

    @property
    def cap(self) -> bool:
        return self.ready is not None and self.ready.status == "cap"


def take_groups(run_id: str, batch: BatchRef, state: RunState, cfg: RunConfig) -> TakenGroups:
    """The groups step ``batch.step`` trains (`stepwise.core.groups.readiness` at the policy version the
    update applies to), or, on a retry after the buffer was written, those it took then. Not ready (the
    trainer was woken for a version it no longer waits at): ``waiting`` = ``{"decision": "wait"}`` (or
    ``"exhausted"``: nothing left), and the state machine goes back to its wait."""
    from stepwise.core import groups as engine
    from stepwise.handlers import _groups

    buffer, _ = store().read_buffer(run_id)
    kn = _groups.knobs(cfg)
    last = buffer.last_consumption
    if last is not None and last.step == batch.step:
        ready = engine.Readiness("cap" if last.decision == "cap_reached" else "ready", list(last.trained))
    else:
        ready = engine.readiness(buffer, kn, version=state.policy_version)
    if not ready.trainable:
        decision = "exhausted" if ready.status == "exhausted" else "wait"
        logger.info("no batch of groups to train yet", extra={"status": ready.status, "reason": ready.reason})
        return TakenGroups(waiting={"decision": decision, "step": batch.step, "generation_batch": 0,
                                    "reason": ready.reason, "roll_out_next": False})
    refs = chosen_group_refs(cfg, ready.chosen if ready.status == "ready" else [])
    return TakenGroups(ready=ready, rollouts=chosen_group_rollouts(run_id, refs), refs=refs,
                       pending_usage=buffer.pending_usage.model_copy(deep=True),
                       per_epoch=_groups.per_epoch(state, cfg))


def consume_groups(run_id: str, batch: BatchRef, state: RunState, cfg: RunConfig, taken: TakenGroups,
                   decision: str) -> tuple[dict[str, float], Any]:
    """Take the step's groups out of the buffer (one conditional write: `stepwise.core.groups.consume`, with
    the usage it held) and measure the engine for the step's summary (`stepwise.core.groups.step_metrics`)."""
    from stepwise.core import groups as engine
    from stepwise.handlers import _groups

    kn, t = _groups.knobs(cfg), now()
    _, (metrics_, consumed) = store().update_buffer(run_id, lambda b: engine.consume_for_step(
        b, taken.ready, kn, step=batch.step, version=state.policy_version, decision=decision, now=t,
        read_usage=taken.pending_usage))
    return metrics_, consumed


#: State transitions of a rollout group's own states (its Map state, the "Judge the group?" choice, Record group
#: complete), besides each member's (counted by its rollout record) and its judge loop's (counted by the judge
#: function in the group's judge progress record).
GROUP_TRANSITIONS = 3


def record_group(event: GroupEvent) -> dict[str, Any]:
    """RecordGroupComplete, the last state of a rollout group: read its members' records (a member without
    one is a lost rollout), with a judge merge the group's judge record in (`stepwise.judging.group_judgement`:
    DAPO decides on the judged rewards, the ones its estimator will read), write what its completion records
    (``complete.json``: versions, DAPO's verdict, durations), then in one conditional write of the buffer record
    it complete (or filtered), with its own and its judge's usage for the ledger, take the waiting trainer's token
    when a batch is now ready, and admit the groups the freed room allows; then wake the trainer and start those
    groups. A duplicate or an attempt a resume replaced changes nothing."""
    from stepwise.core import groups as engine
    from stepwise.handlers import _groups

    rs = store()
    run, batch = event.run, event.batch
    if batch.group is None:
        raise ValueError("RecordGroupComplete needs a group's batch (batch.group)")
    bind(run_id=run.run_id, step=batch.step)
    cfg = run_config(run.run_id)
    rollouts = group_rollouts_of(run.run_id, batch)
    own = Usage(state_transitions=GROUP_TRANSITIONS + event.retry_count)
    if cfg.judge is not None:
        from stepwise.judging import group_judgement

        rollouts, judging = group_judgement(rs, run.run_id, batch, rollouts, cfg)
        own.add(judging)
    mark = engine.completion(rollouts, cfg, batch.attempt)
    rs.put_json(group_complete_key(run.run_id, batch.group, batch.attempt),
                {**mark.__dict__, "durations_s": list(mark.durations_s), "group": batch.group}, bulk=True)
    state, _ = rs.read_state(run.run_id)
    kn, t = _groups.knobs(cfg), now()
    members = Usage()
    for r in rollouts:
        members.add(r.usage)

    _, (status, token, admitted) = rs.update_buffer(run.run_id, lambda b: engine.record_completion(
        b, kn, state, group=batch.group, attempt=batch.attempt, mark=mark, own=own, members=members, now=t))
    _groups.wake(token, f"group {batch.group} {status}")
    _groups.start_groups(run, cfg, state, admitted, event.group_state_machine_arn)
    out = {"group": batch.group, "attempt": batch.attempt, "status": status, "admitted": len(admitted),
           "first_turn_version": mark.first_turn_version, "informative": mark.informative}
    logger.info("group recorded", extra=out)
    return out


def record_eval(event: BatchEvent) -> dict[str, Any]:
    """RecordEval: the eval batch's rollouts -> its summary and per-prompt results
    (`stepwise.core.evals.summarize_eval`), then the run state's eval marks and model selection's
    history and best (`stepwise.core.selection.record_eval_point`). A retry after the state moved on
    returns the summary written."""
    from stepwise.core.evals import EvalRollout, eval_sets_of, summarize_eval
    from stepwise.core.selection import criterion, record_eval

    rs = store()
    run, batch = event.run, event.batch
    bind(run_id=run.run_id, step=batch.step)
    state = rs.owned_state(run.run_id, run.execution_arn)
    if state.current_batch is None and state.last_eval_step == batch.step:
        return rs.get_json(eval_summary_key(run.run_id, batch.step))
    check_batch(state, batch)
    cfg = run_config(run.run_id)
    rollouts = completed_rollouts(run.run_id, batch, state.current_batch)
    check_not_all_failed(rollouts, batch)
    batch_usage = ledger.batch_usage(rollouts)  # the eval batch's rollouts (the cost ledger)
    payloads = rs.get_json(prompts_key(run.run_id, batch.step, batch.generation_batch, "eval"))
    summary, results = summarize_eval(
        [EvalRollout(r.input_id, r.row, r.member, float(r.reward), r.status) for r in rollouts],
        sets=eval_sets_of(state), payloads=payloads, threshold=cfg.eval_success_threshold, ks=cfg.pass_ks,
        step=batch.step, final=batch.final, eval_only=cfg.eval_only, policy=batch.policy)
    rs.put_json(eval_results_key(run.run_id, batch.step), results.model_dump(mode="json"))
    write_summary(run.run_id, batch.step, summary, kind="eval")

    evaluated = batch.policy.sampler_model_package_arn if batch.policy is not None else state.sampler_model_package_arn

    state = rs.update_state(run.run_id, lambda s: record_eval(s, cfg, batch, usage=batch_usage, summary=summary,
                                                              evaluated=evaluated),
                            execution_arn=run.execution_arn)
    if state.best is not None and state.best.step == batch.step:
        logger.info("best model so far", extra={"metric": criterion(cfg).metric, "value": state.best.value,
                                                 "model_package_arn": state.best.model_package_arn})
    emit({k: v for k, v in summary.items() if k.startswith("eval/") and isinstance(v, (int, float))},
         run_id=run.run_id)
    logger.info("eval recorded", extra={k: v for k, v in summary.items() if not k.startswith("eval/")
                                        or k.endswith(("accuracy", "/n"))})
    return summary


handler = entrypoint(BatchEvent, compute, transient_retry=True)
eval_handler = entrypoint(BatchEvent, record_eval, transient_retry=True)
group_handler = entrypoint(GroupEvent, record_group, transient_retry=True)
