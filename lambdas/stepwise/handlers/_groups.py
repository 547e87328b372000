"""The group engine's side effects (``admission: group``), shared by its handlers: AdmitGroups, AwaitGroups
(`stepwise.handlers.groups`), RecordGroupComplete and ComputeAdvantages (`stepwise.handlers.advantages`),
StopSession and Cleanup, Init.

- the buffer (``runs/{run_id}/buffer.json``, `stepwise.records.GroupBuffer`), read-modify-written
  conditionally (`stepwise.aws.runstore.RunStore.update_buffer`) with the rules of `stepwise.core.groups`;
- starting a group: its items and prompt under its folder (`stepwise.layout.group_prefix`), then a
  rollout-group execution named after the run, the group and its attempt, so a retried admission finds
  it started (`start_groups`);
- waking the waiting trainer: its task token rides in the buffer, written by its wait (AwaitGroups) and
  taken, in the same conditional write that makes a batch ready, by whoever makes it so
  (`stepwise.core.groups.note_ready`): the two writes are ordered by the ETag, so the wake-up cannot be
  lost; a second SendTaskSuccess is harmless (the task is gone);
- the groups whose execution ended without recording them (`reconcile`), found by the trainer's wait;
- stopping every running group when the run ends (`stop_groups`).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from stepwise.aws import task_tokens
from stepwise.core import groups as engine
from stepwise.core.liveness import rollout_timeouts
from stepwise.core.planning import prompts_used
from stepwise.executions import execution_arn_of, group_execution_name
from stepwise.handlers._common import bind, logger, now, run_config, sfn_client, store
from stepwise.handlers._payloads import batch_payloads
from stepwise.layout import items_key, prompts_key
from stepwise.records import BatchRef, GroupBuffer, GroupEntry, RunRef, RunState, SamplerPolicy

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: Parallel S3 writes and StartExecution calls when many groups start at once.
START_WORKERS = 8
#: Seconds past a group's rollout timeout after which the trainer's wait asks Step Functions about its
#: execution (its members' FinishRollout retries and "Record failed rollout" take up to a few minutes).
OVERDUE_GRACE_S = 600.0
#: The longest the trainer's wait for a batch lasts before it re-checks (`reconcile`), seconds.
MAX_WAIT_S = 900


def owned_run(run: RunRef) -> tuple[RunState, RunConfig]:
    """The prologue of the training loop's group handlers: the run's state (its owner checked: ``run``'s
    execution), the log context bound to its run and step, and its config."""
    state = store().owned_state(run.run_id, run.execution_arn)
    bind(run_id=run.run_id, step=state.step)
    return state, run_config(run.run_id)


def knobs(cfg: RunConfig) -> engine.Knobs:
    return engine.Knobs.of(cfg)


def per_epoch(state: RunState, cfg: RunConfig) -> int:
    """Groups per epoch of the run (`stepwise.core.groups.groups_per_epoch` of the rows it uses)."""
    return engine.groups_per_epoch(prompts_used(state.dataset_rows, cfg.max_prompts), cfg.batch_size)


def total_groups(state: RunState, cfg: RunConfig) -> int:
    return engine.total_groups(prompts_used(state.dataset_rows, cfg.max_prompts), cfg.batch_size, cfg.epochs)


def wait_seconds(cfg: RunConfig) -> int:
    """The trainer's wait for a batch: its timeout (the task's ``TimeoutSecondsPath``), after which it
    re-checks; a rollout's timeout plus a minute, at most `MAX_WAIT_S`."""
    timeout = rollout_timeouts(cfg.max_rollout_time, cfg.rollout_heartbeat_seconds).timeout_seconds
    return int(min(MAX_WAIT_S, timeout + 60))


def group_batch(cfg: RunConfig, entry: GroupEntry, policy: SamplerPolicy) -> BatchRef:
    """The `BatchRef` every rollout of ``entry`` carries: the synchronous loop's place of its prompt
    (`stepwise.core.groups.seed_place`: its seeds and input id), its folder, the policy it samples and PlanStep's
    timeouts (a silence of ``rollout_recheck_seconds`` re-checks the result: `stepwise.core.liveness`)."""
    step, _ = engine.seed_place(entry.id, cfg.batch_size)
    timeouts = rollout_timeouts(cfg.max_rollout_time, cfg.rollout_heartbeat_seconds, cfg.rollout_recheck_seconds)
    return BatchRef(kind="train", step=step, generation_batch=0, **timeouts._asdict(), policy=policy, group=entry.id,
                    attempt=entry.attempt)


def group_execution_arn(group_state_machine_arn: str, run_id: str, entry: GroupEntry) -> str:
    return execution_arn_of(group_state_machine_arn, group_execution_name(run_id, entry.id, entry.attempt))


def start_groups(run: RunRef, cfg: RunConfig, state: RunState, entries: list[GroupEntry],
                 group_state_machine_arn: str) -> None:
    """Start a rollout-group execution per entry (admitted on ``state``'s sampler): its items and prompt
    first (what StartRollout reads), then StartExecution (idempotent: a name already started is fine). Its
    input says whether the run has a judge (``judge``: the group's "Judge the group?" choice).

    The entries were admitted at ``state.policy_version`` (`stepwise.core.groups.admit`), the version of the
    sampler ``state`` names, so each group samples exactly the version it records."""
    if not entries:
        return
    kn = knobs(cfg)
    per = per_epoch(state, cfg)
    rows = {e.id: engine.group_prompt(e.id, per)[1] for e in entries}
    payloads = batch_payloads(run.run_id, "train", sorted(set(rows.values())), cfg.dataset_path)
    policy = SamplerPolicy.of(state)
    rs, sfn = store(), sfn_client()

    def start(entry: GroupEntry) -> None:
        items = engine.group_items(entry.id, rows[entry.id], kn)
        batch = group_batch(cfg, entry, policy)
        folder = batch.folder
        rs.put_json(prompts_key(run.run_id, batch.step, 0, "train", **folder), {items[0].input_id: payloads[rows[entry.id]]},
                    bulk=True)
        rs.put_json(items_key(run.run_id, batch.step, 0, "train", **folder), [it.model_dump() for it in items], bulk=True)
        task_tokens.start_execution(sfn, group_state_machine_arn, group_execution_name(run.run_id, entry.id, entry.attempt),
                                    {"run": run.model_dump(), "batch": batch.model_dump(),
                                     "items": [it.model_dump() for it in items], "judge": cfg.judge is not None})

    with ThreadPoolExecutor(max_workers=min(START_WORKERS, len(entries))) as pool:
        list(pool.map(start, entries))
    logger.info("groups started", extra={"groups": [e.id for e in entries][:50], "started": len(entries),
                                         "policy_version": state.policy_version})


def admit_groups(run: RunRef, cfg: RunConfig, group_state_machine_arn: str, *, state: RunState | None = None
                 ) -> tuple[GroupBuffer, list[GroupEntry]]:
    """Admit what `stepwise.core.groups.admit` allows on the run's current sampler, and start it.
    ``state``: the state already read (else read here, without an owner check: group executions call
    this too, and they outlive the execution that admitted them)."""
    rs = store()
    state = state if state is not None else rs.read_state(run.run_id)[0]
    kn, t = knobs(cfg), now()
    buffer, admitted = rs.update_buffer(run.run_id, lambda b: engine.admit_on(
        b, kn, state, group_state_machine_arn=group_state_machine_arn, now=t))
    start_groups(run, cfg, state, admitted, group_state_machine_arn)
    return buffer, admitted


def wake(token: str | None, reason: str) -> None:
    """SendTaskSuccess to the waiting trainer (its wait state's output is ``{"woken_by": reason}``); a
    task already gone (a duplicate wake-up, a stopped execution) is logged and ignored."""
    if token is None:
        return
    gone = task_tokens.send_result(sfn_client(), token, {"woken_by": reason})
    if gone is not None:
        logger.info("the trainer's wait had already ended", extra={"why": gone, "woken_by": reason})


def reconcile(run: RunRef, cfg: RunConfig, buffer: GroupBuffer) -> int:
    """Groups still running long past their rollouts' timeout: ask Step Functions about their execution.
    One that never started (a lost admission) is queued again (next attempt); one that ended without
    recording the group (its last state failed) is recorded complete as it is, its members without a
    record becoming lost rollouts when ComputeAdvantages reads them. Returns how many changed."""
    arn = buffer.group_state_machine_arn
    timeout = rollout_timeouts(cfg.max_rollout_time, cfg.rollout_heartbeat_seconds).timeout_seconds
    t = now()
    overdue = [g for g in buffer.groups
               if g.status == "running" and g.admitted_at is not None and t - g.admitted_at > timeout + OVERDUE_GRACE_S]
    if not overdue or not arn:
        return 0
    sfn = sfn_client()
    verdicts = {(g.id, g.attempt): task_tokens.execution_status(sfn, group_execution_arn(arn, run.run_id, g))[0] for g in overdue}
    lost = {k: v for k, v in verdicts.items() if v not in (None, "RUNNING")}
    if not lost:
        return 0
    kn = knobs(cfg)
    _, token = store().update_buffer(run.run_id, lambda b: engine.record_ended(b, kn, lost, now=t))
    logger.warning("groups whose execution ended unrecorded", extra={"groups": {f"{g}a{a}": v for (g, a), v in lost.items()}})
    wake(token, "reconciled")
    return len(lost)


def stop_groups(rs: Any, run_id: str, *, reason: str) -> list[tuple[int, int]]:
    """The run ends: admit nothing more (``stopping``) and stop every running group's execution (its
    rollouts in flight are then ended with the run's other leftovers: the caller hands the groups
    returned to `stepwise.handlers._leftovers.hand_over`). Returns the running groups ``(id, attempt)``;
    never raises (logged): it runs on the way out of a run."""
    try:
        _, (running, arn) = rs.update_buffer(run_id, engine.stop_admitting)
    except KeyError:
        return []
    except Exception as exc:  # noqa: BLE001 - the session stop matters most
        logger.warning("could not read the group buffer to stop its groups", extra={"error": type(exc).__name__})
        return []
    sfn = sfn_client()

    def stop(entry: GroupEntry) -> None:
        try:
            task_tokens.stop_execution(sfn, group_execution_arn(arn, run_id, entry), error="RunEnded", cause=reason)
        except Exception as exc:  # noqa: BLE001
            logger.warning("could not stop a group's execution", extra={"group": entry.id, "error": type(exc).__name__})

    if arn and running:
        with ThreadPoolExecutor(max_workers=min(START_WORKERS, len(running))) as pool:
            list(pool.map(stop, running))
        logger.info("group executions stopped", extra={"groups": len(running), "reason": reason})
    return [(g.id, g.attempt) for g in running]


def create_buffer(rs: Any, state: RunState, cfg: RunConfig) -> None:
    """A new run of the group engine: its empty buffer (a retried Init keeps the one written)."""
    rs.create_buffer(engine.new_buffer(state.run_id, total_groups(state, cfg), state.policy_version))
