"""PlanStep: decide the run's next action from state.json and write the generation batch's items.

The decision (:func:`decide`) is a pure function of (state, config) that the handler applies
as one conditional read-modify-write of state.json. Order of checks, following the reference
loop (`train_grpo.py`) with the DAPO proposal (shared/seeds/002) and DESIGN.md section 8:

1. the baseline eval at step 0, before the first optimizer step (``eval_before_train``, on by
   default when there is an eval dataset), once: a resume that rewinds to step 0 keeps it
   (``last_eval_step`` stays 0, see `stepwise.handlers.init.rewind_to_checkpoint`); then an eval
   due after a completed step (``eval_every > 0 and step % eval_every == 0``), once per step;
2. at the start of a step: move to the next epoch when the queue cannot fill a batch (the
   reference drops a partial last batch); when the run is finishing (epochs done, DAPO cap hit,
   or data exhausted): fail with ``NoTrainingSignal`` if its last steps were empty and no optimizer
   step was ever applied; final eval unless one ran at the last step, final ``save_state``,
   ``save_weights_at_end``, then finish; else ``save_state`` when ``save_every`` is due, else
   continue as a new execution every ``steps_per_execution`` steps;
3. roll out the next generation batch of ``batch_size`` prompts x ``responses_per_prompt``.

Before all of these, between steps: continue as a new execution when the execution's history is
near ``history_event_budget`` (:func:`history_budget_decision`). A Standard execution fails at
25,000 events, and a step's events are not a constant: every poll of a long training operation or
checkpoint adds a Wait, a Task and a Choice (~7 events), so a count of steps alone cannot bound it.

Eval generation batches use the first ``eval_max_prompts`` eval rows, one rollout each, at
``eval_temperature`` (reference ``run_eval``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from stepwise.handlers._common import NoTrainingSignal, RunEvent, bind, logger, now, run_config, sfn_client, store
from stepwise.handlers.train import PhaseMismatch, plan_checkpoint
from stepwise.layout import dataset_index_key, dataset_shard_key, items_key, prompts_key
from stepwise.records import BatchItem, BatchRef, PlannedBatch, RunState, SamplerPolicy

from stepwise.service_limits import CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY  # one home: the config bounds use them


@dataclass
class Decision:
    action: Literal["rollout", "checkpoint", "continue", "finish"]
    reason: str
    kind: Literal["train", "eval"] | None = None
    step: int = 0
    generation_batch: int = 0
    rows: list[int] = field(default_factory=list)
    responses_per_prompt: int = 1
    final: bool = False


def prompts_used(rows: int, limit: int) -> int:
    """Rows a run uses: the first ``limit`` (0 = all)."""
    return min(rows, limit) if limit > 0 else rows


def _batch_decision(batch: PlannedBatch) -> Decision:
    return Decision("rollout", "planned", batch.kind, batch.step, batch.generation_batch, list(batch.rows),
                    batch.responses_per_prompt, batch.final)


#: History events kept free beyond the next step's estimate: the end of the execution (ContinueRun
#: or the stop path, ~10 events) and this PlanStep's own.
HISTORY_HEADROOM = 50
#: The next step is assumed to use up to this many times the most events a step has used so far.
STEP_EVENTS_FACTOR = 2


def history_budget_decision(state: RunState, cfg: Any, history_events: int | None) -> Decision | None:
    """Continue as a new execution when ``history_events`` leaves no room for one more step (mutates
    ``state.max_step_events``); None to go on. Called at the start of a step (generation batch 0).

    ``history_events`` is the id of the execution's newest history event (None = unknown: no check).
    The room a step needs is ``STEP_EVENTS_FACTOR`` x the most events a step used so far (measured
    from one step start to the next within an execution, evals and checkpoints in between included)
    plus ``HISTORY_HEADROOM``. Never before this execution completed a step, so a budget smaller than
    one step cannot continue forever.
    """
    if history_events is None:
        return None
    if state.step_start_event_segment == state.segment and state.step > state.step_start_event_step >= 0:
        per_step = (history_events - state.step_start_event) // (state.step - state.step_start_event_step)
        state.max_step_events = max(state.max_step_events, per_step)
    if state.step <= state.segment_start_step:
        return None
    need = STEP_EVENTS_FACTOR * state.max_step_events + HISTORY_HEADROOM
    if history_events + need > cfg.history_event_budget:
        return Decision("continue", f"history at {history_events} events, a step needs up to {need}: "
                                    f"history_event_budget {cfg.history_event_budget}")
    return None


def decide(state: RunState, cfg: Any, history_events: int | None = None) -> Decision:
    """The next action; mutates ``state`` (cursor, epoch, planned batch, planned checkpoint, history marks).

    ``history_events``: the id of the execution's newest history event (see `history_budget_decision`).
    """
    if state.current_batch is not None:
        return _batch_decision(state.current_batch)  # a retried PlanStep re-plans the same batch
    if state.phase == "checkpoint":
        return Decision("checkpoint", state.checkpoint_reason)
    if state.phase != "idle":
        raise PhaseMismatch(f"PlanStep called in phase {state.phase!r}")
    bs = cfg.batch_size
    used = prompts_used(state.dataset_rows, cfg.max_prompts)
    eval_n = prompts_used(state.eval_rows, cfg.eval_max_prompts)

    def eval_batch(final: bool, reason: str) -> Decision:
        d = Decision("rollout", reason, "eval", state.step, 0, list(range(eval_n)), 1, final)
        state.current_batch = _planned(d)
        return d

    if state.generation_batch == 0:
        if (budget := history_budget_decision(state, cfg, history_events)) is not None:
            return budget
        if eval_n and state.step == 0 and cfg.baseline_eval and state.last_eval_step != 0:
            return eval_batch(False, "eval_before_train")
        if eval_n and state.step > 0 and cfg.should_eval(state.step) and state.last_eval_step != state.step:
            return eval_batch(False, f"eval_every {cfg.eval_every}")
        if state.stop_reason is None and state.epoch < cfg.epochs and state.cursor + bs > used:
            state.epoch += 1
            state.cursor = 0
        if state.stop_reason is not None or state.epoch >= cfg.epochs:
            if state.empty_steps and state.policy_version == 0:
                # Shorter than max_consecutive_empty_steps, but the same verdict: it trained nothing.
                raise NoTrainingSignal(
                    f"the run ended after {state.step} step(s) without one optimizer step; its last "
                    f"{state.empty_steps} step(s) produced no trainable datum; {state.empty_steps_report}"
                )
            if eval_n and cfg.final_eval_needed(state.step, state.last_eval_step):
                return eval_batch(True, "final eval")
            if not state.final_checkpoint_done:
                plan_checkpoint(state, "final")
                return Decision("checkpoint", "final save_state")
            if cfg.save_weights_at_end and not state.final_weights_done:
                plan_checkpoint(state, "weights_at_end")
                return Decision("checkpoint", "save_weights_at_end")
            return Decision("finish", state.stop_reason or f"{cfg.epochs} epoch(s) done")
        if cfg.should_save(state.step) and not any(
            c.step == state.step and c.reason == "save_every" for c in state.checkpoints
        ):
            plan_checkpoint(state, "save_every")
            return Decision("checkpoint", f"save_every {cfg.save_every}")
        if state.step - state.segment_start_step >= cfg.steps_per_execution:
            return Decision("continue", f"steps_per_execution {cfg.steps_per_execution}")
        state.step_cursor_start = state.cursor
        state.step_started_at = now()
        if history_events is not None:
            state.step_start_event = history_events
            state.step_start_event_step = state.step
            state.step_start_event_segment = state.segment
    elif state.cursor + bs > used:  # DAPO: the epoch ran dry in the middle of a step
        if state.epoch + 1 < cfg.epochs:
            state.epoch += 1
            state.cursor = 0
        else:
            state.stop_reason = "dataset exhausted during dynamic sampling"
            state.generation_batch = 0
            return decide(state, cfg, history_events)
    d = Decision("rollout", "generation batch", "train", state.step, state.generation_batch,
                 list(range(state.cursor, state.cursor + bs)), cfg.responses_per_prompt)
    state.cursor += bs
    state.current_batch = _planned(d)
    return d


def _planned(d: Decision) -> PlannedBatch:
    return PlannedBatch(kind=d.kind or "train", step=d.step, generation_batch=d.generation_batch, rows=d.rows,
                        responses_per_prompt=d.responses_per_prompt, final=d.final)


def input_id(kind: str, step: int, generation_batch: int, position: int) -> str:
    """The toolkit ``input_id`` of a prompt in a batch (one S3 folder per prompt: its group)."""
    return f"e{step}p{position}" if kind == "eval" else f"s{step}g{generation_batch}p{position}"


def build_items(d: Decision, payloads: Mapping[int, dict[str, Any]] | Sequence[dict[str, Any]]) -> tuple[list[BatchItem], dict[str, Any]]:
    """``(items, prompts)``: one `BatchItem` per rollout (references only), and ``{input_id: payload}``.

    ``payloads[row]`` is the payload of dataset row ``row`` for every row of ``d.rows``."""
    items, prompts = [], {}
    kind = d.kind or "train"
    for position, row in enumerate(d.rows):
        iid = input_id(kind, d.step, d.generation_batch, position)
        prompts[iid] = payloads[row]
        for member in range(d.responses_per_prompt):
            items.append(BatchItem(i=len(items), input_id=iid, row=row, member=member))
    return items, prompts


_INDEXES: dict[tuple[str, str, str], Any] = {}


def batch_payloads(run_id: str, kind: str, rows: list[int], source: str) -> dict[int, dict[str, Any]]:
    """``{row: payload}`` of a batch's rows from the run's dataset snapshot (Init's shards).

    Reads the snapshot's index (cached per container: it never changes) and only the shards holding
    ``rows``, so memory and bytes read do not grow with the dataset. A run whose Init predates the
    snapshots has no index: its ``source`` is streamed up to the last row needed instead.
    """
    from stepwise.datasets import DatasetIndex, iter_payloads, read_rows

    rs = store()
    key = (rs.bucket, run_id, kind)
    if key not in _INDEXES:
        try:
            _INDEXES[key] = DatasetIndex.model_validate(rs.get_json(dataset_index_key(run_id, kind)))
        except KeyError:
            logger.warning("no dataset snapshot (run started before snapshots): streaming the source",
                           extra={"kind": kind, "source": source})
            wanted, last = set(rows), max(rows, default=-1)
            out: dict[int, dict[str, Any]] = {}
            for i, payload in enumerate(iter_payloads(source, s3_client=rs.s3)):
                if i in wanted:
                    out[i] = payload
                if i >= last:
                    break
            return out
    return read_rows(rows, _INDEXES[key], lambda shard: rs.s3.get_object(
        Bucket=rs.bucket, Key=dataset_shard_key(run_id, kind, shard))["Body"].read())


def history_length(execution_arn: str) -> int | None:
    """The id of the execution's newest history event: its history's length, in one small call
    (GetExecutionHistory, newest first, one event). None when Step Functions does not know the
    execution (a handler invoked outside one, as in handler tests); other errors raise."""
    sfn = sfn_client()
    try:
        events = sfn.get_execution_history(executionArn=execution_arn, reverseOrder=True, maxResults=1)["events"]
    except (sfn.exceptions.ExecutionDoesNotExist, sfn.exceptions.InvalidArn):
        logger.warning("execution unknown to Step Functions: no history budget check",
                       extra={"execution_arn": execution_arn})
        return None
    return max((int(e["id"]) for e in events), default=0)


def plan(event: RunEvent) -> dict[str, Any]:
    rs = store()
    run = event.run
    cfg = run_config(run.run_id)
    decision: list[Decision] = []
    history_events = history_length(run.execution_arn)

    def change(state: RunState) -> None:
        decision.clear()
        decision.append(decide(state, cfg, history_events))

    state = rs.update_state(run.run_id, change, execution_arn=run.execution_arn)
    d = decision[0]
    bind(run_id=run.run_id, step=state.step)
    out: dict[str, Any] = {"action": d.action, "reason": d.reason, "step": state.step, "epoch": state.epoch,
                           "history_events": history_events}
    if d.action != "rollout":
        logger.info("planned", extra=out)
        return out
    kind = d.kind or "train"
    source = cfg.eval_dataset_path if kind == "eval" else cfg.dataset_path
    items, prompts = build_items(d, batch_payloads(run.run_id, kind, d.rows, source))
    rs.put_json(prompts_key(run.run_id, d.step, d.generation_batch, kind), prompts, bulk=True)
    key = items_key(run.run_id, d.step, d.generation_batch, kind)
    rs.put_json(key, [item.model_dump() for item in items], bulk=True)
    batch = BatchRef(kind=kind, step=d.step, generation_batch=d.generation_batch,
                     timeout_seconds=max(1, math.ceil(cfg.max_rollout_time)), final=d.final,
                     policy=SamplerPolicy.of(state))
    out.update(
        items_key=key,
        num_items=len(items),
        max_concurrency=max(1, min(len(items), cfg.acr_tps_limit * CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY)),
        batch=batch.model_dump(),
    )
    logger.info("planned generation batch", extra={k: v for k, v in out.items() if k != "batch"} | {"kind": kind})
    return out


@logger.inject_lambda_context(clear_state=True)
def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
    return plan(RunEvent.model_validate(event))
