"""PlanStep: decide the run's next action from state.json and write the generation batch's items.

The decision is `stepwise.core.planning.decide`, a pure function of (state, config) that this
handler applies as one conditional read-modify-write of state.json; then it writes the batch's
``prompts.json`` and Map ``items.json`` and hands the state machine a `stepwise.records.BatchRef`.
The execution's history (one GetExecutionHistory call, newest first) feeds the planner's history
budget (its length) and the cost ledger (the state transitions not counted yet); budget warnings the
planner gives are logged and published to the stack's notification topic.
Inside the overlapped step's Parallel state (``max_staleness`` 1) the event names ``ahead_of_step``
and the handler plans the next step's first generation batch instead
(`stepwise.core.planning.plan_ahead`), on the sampler of the moment, or answers ``action: "none"``.
"""

from __future__ import annotations

from typing import Any

from stepwise.aws import task_tokens
from stepwise.core.ledger import history_after
from stepwise.core.liveness import rollout_timeouts
from stepwise.core.planning import Decision, GroupProgress, build_items, map_concurrency, pace_starts, plan_step
from stepwise.events import PlanEvent, RunEvent
from stepwise.handlers._common import bind, dependencies, entrypoint, logger, run_config, settings, sfn_client, store
from stepwise.handlers._payloads import batch_payloads, eval_payloads
from stepwise.layout import items_key, prompts_key
from stepwise.records import BatchRef, RunState, SamplerPolicy


def history_since(execution_arn: str, after_event: int) -> tuple[int | None, list[dict[str, Any]]]:
    """`stepwise.aws.task_tokens.history_since` of this execution: its length (the newest event id:
    the history budget) and the events the cost ledger has not counted yet; ``(None, [])``, logged,
    when Step Functions does not know it (a handler invoked outside one, as in handler tests)."""
    newest, events = task_tokens.history_since(sfn_client(), execution_arn, after_event)
    if newest is None:
        logger.warning("execution unknown to Step Functions: no history budget check",
                       extra={"execution_arn": execution_arn})
    return newest, events


def counted_up_to(run_id: str, execution_arn: str) -> tuple[int, tuple[RunState, str] | None]:
    """The newest event of this execution the cost ledger has counted: remembered by this container
    from its last PlanStep of the execution (a warm container reads no state for it), else read from
    ``state.json``, and that read, ``(state, etag)``, is returned too so the plan's conditional update
    starts from it instead of reading ``state.json`` again (else ``None``). A stale figure only makes
    `history_since` read events the ledger then skips."""
    cached = dependencies().cache.get(("history_counted", run_id, execution_arn))
    if cached is not None:
        return int(cached), None
    read = store().read_state(run_id)
    return history_after(read[0]), read


def notify_warnings(run_id: str, warnings: list[str]) -> None:
    """Budget warnings (`stepwise.core.stopping.record_checks`): logged, and published to the stack's
    notification topic when it has one (`stepwise.aws.notify`; a failure to publish is logged)."""
    from stepwise.aws import notify

    for text in warnings:
        logger.warning("budget warning", extra={"warning": text})
        notify.publish(settings().notification_topic_arn, subject=f"Stepwise run {run_id}: budget warning",
                       message=f"Run {run_id}: {text}")


def group_progress(run_id: str) -> GroupProgress:
    """The group engine's progress for the planner: whether every group is consumed, and its frontier."""
    from stepwise.core import groups as engine

    buffer, _ = store().read_buffer(run_id)
    exhausted = buffer.next_group >= buffer.total_groups and not buffer.groups
    return GroupProgress(exhausted=exhausted, frontier=engine.frontier(buffer))


def plan(event: RunEvent) -> dict[str, Any]:
    """Plan the run's next action (a `PlanEvent` with ``ahead_of_step``: the next step's first batch)."""
    rs = store()
    run = event.run
    cfg = run_config(run.run_id)
    planned: list[tuple[Decision | None, str]] = []
    ahead = event.ahead_of_step if isinstance(event, PlanEvent) else None
    history_events, new_events, first_read = None, [], None
    if ahead is None:  # the parent's history: its length (budget) and the transitions the ledger counts
        counted, first_read = counted_up_to(run.run_id, run.execution_arn)
        history_events, new_events = history_since(run.execution_arn, counted)

    progress = group_progress(run.run_id) if cfg.admission == "group" and ahead is None else None

    def change(state: RunState) -> None:
        planned[:] = [plan_step(state, cfg, ahead_of_step=ahead, history_events=history_events, new_events=new_events,
                                groups=progress)]

    # one conditional write; retried on a conflict with the training branch's writes (pure change)
    state = rs.update_state(run.run_id, change, execution_arn=run.execution_arn, first_read=first_read)
    if ahead is None:
        dependencies().cache[("history_counted", run.run_id, run.execution_arn)] = history_after(state)
    d, why = planned[0]
    bind(run_id=run.run_id, step=state.step)
    if d is not None and d.warnings:
        notify_warnings(run.run_id, d.warnings)
    if d is None:
        out = {"action": "none", "reason": why, "step": state.step, "ahead_of_step": ahead}
        logger.info("nothing to roll out ahead", extra=out)
        return out
    out: dict[str, Any] = {"action": d.action, "reason": d.reason, "step": state.step, "epoch": state.epoch,
                           "history_events": history_events,
                           "judge": cfg.judge is not None}  # the state machine's "Judge groups" runs only then
    if d.action == "groups":  # the group engine: admit groups, wait for a batch of them, train it
        from stepwise.handlers._groups import wait_seconds

        out["batch"] = BatchRef(kind="train", step=d.step, generation_batch=0).model_dump()
        out["wait_seconds"] = wait_seconds(cfg)
        logger.info("group engine step", extra={k: v for k, v in out.items() if k != "batch"})
        return out
    if d.action == "rolled_out":  # rolled out during the previous step's training: straight to its advantages
        timeouts = rollout_timeouts(cfg.max_rollout_time, cfg.rollout_heartbeat_seconds, cfg.rollout_recheck_seconds)
        out["batch"] = BatchRef(kind="train", step=d.step, generation_batch=d.generation_batch,
                                **timeouts._asdict()).model_dump()
        logger.info("batch rolled out ahead", extra={k: v for k, v in out.items() if k != "batch"})
        return out
    if d.action != "rollout":
        logger.info("planned", extra=out)
        return out
    kind = d.kind or "train"
    payloads = (eval_payloads(run.run_id, state, cfg, d.rows) if kind == "eval"
                else batch_payloads(run.run_id, kind, d.rows, cfg.dataset_path))
    items, prompts = build_items(d, payloads)
    concurrency = map_concurrency(len(items), cfg.acr_tps_limit, cfg.acr_max_active_sessions)
    items = pace_starts(items, concurrency, cfg.acr_tps_limit)
    rs.put_json(prompts_key(run.run_id, d.step, d.generation_batch, kind), prompts, bulk=True)
    key = items_key(run.run_id, d.step, d.generation_batch, kind)
    rs.put_json(key, [item.model_dump() for item in items], bulk=True)
    timeouts = rollout_timeouts(cfg.max_rollout_time, cfg.rollout_heartbeat_seconds, cfg.rollout_recheck_seconds)
    batch = BatchRef(kind=kind, step=d.step, generation_batch=d.generation_batch, **timeouts._asdict(),
                     final=d.final, policy=SamplerPolicy.of(state))
    out.update(
        items_key=key,
        num_items=len(items),
        max_concurrency=concurrency,
        batch=batch.model_dump(),
    )
    logger.info("planned generation batch", extra={k: v for k, v in out.items() if k != "batch"} | {"kind": kind})
    return out


handler = entrypoint(PlanEvent, plan, transient_retry=True)
