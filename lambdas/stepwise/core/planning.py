"""The step planner: the run's next action, pure, from (state.json, config).

PlanStep (`stepwise.handlers.plan`) applies :func:`decide` as one conditional read-modify-write of
state.json and writes the generation batch's items (:func:`build_items`). Order of checks,
following the reference loop (`train_grpo.py`) with the toolkit's DAPO proposal (`train_dapo.py`) and
the fixes docs/migration.md lists:

1. the baseline eval at step 0, before the first optimizer step (``eval_before_train``, on by
   default when there is an eval dataset), once: a resume that rewinds to step 0 keeps it
   (``last_eval_step`` stays 0, see `stepwise.core.phases.rewind_to_checkpoint`); then an eval
   due after a completed step (``eval_every > 0 and step % eval_every == 0``), once per step;
2. at the start of a step: move to the next epoch when the queue cannot fill a batch (the
   reference drops a partial last batch); ask the stopping rules (`stepwise.core.stopping`: budget
   limits such as ``max_steps``), which may set ``state.stop_reason``; when the run is finishing
   (epochs done, DAPO cap hit, data exhausted, or a stopping rule answered): fail with ``NoTrainingSignal`` if its last steps were empty and no optimizer
   step was ever applied; final eval unless one ran at the last step, final ``save_state``,
   ``save_weights_at_end``, then finish; else ``save_state`` when ``save_every`` is due, else
   continue as a new execution every ``steps_per_execution`` steps;
3. roll out the next generation batch of ``batch_size`` prompts x ``responses_per_prompt``.

With ``max_staleness`` 1, the step's first generation batch may already be rolled out: planned by
:func:`plan_ahead` while the previous step trained (the state machine's Parallel state), held in
``state.ahead_batch``. At the step's start, after the evals due (which run on the new policy), the
planner hands it on (``action="rolled_out"``) instead of checking epochs or planning a batch:
:func:`plan_ahead` planned it only when no checkpoint, new execution or end of run comes first
(`stepwise.core.staleness.roll_out_ahead_blocker`), and no stopping rule would end the run before
it (`stepwise.core.stopping.ahead_reason`), from the cursor and epoch this step would have used; a
step whose batch was rolled out ahead therefore runs.

Before all of these, between steps: continue as a new execution when the execution's history is
near ``history_event_budget`` (:func:`history_budget_decision`). A Standard execution fails at
25,000 events, and a step's events are not a constant: every poll of a long training operation or
checkpoint adds a Wait, a Task and a Choice (~7 events), so a count of steps alone cannot bound it.

Eval generation batches use the first ``eval_max_prompts`` rows of each eval set, ``eval_group_size``
rollouts each, at ``eval_temperature`` (reference ``run_eval``, which rolls out each once): one eval is
one Map run over every eval set (`stepwise.core.evals.eval_batch_rows`). An eval-only run
(``eval_only``) plans its one eval, then finishes: no training step, no checkpoint.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from stepwise.core import ledger, stopping
from stepwise.core.evals import eval_batch_rows, eval_sets_of
from stepwise.core.phases import PhaseMismatch, plan_checkpoint
from stepwise.core.staleness import roll_out_ahead_blocker
from stepwise.records import BatchItem, GroupFrontier, PlannedBatch, RunState
from stepwise.core.service_limits import CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY

if TYPE_CHECKING:
    from stepwise.config import RunConfig


class NoTrainingSignal(RuntimeError):
    """The run cannot train: ``max_consecutive_empty_steps`` steps in a row produced no trainable
    datum (ComputeAdvantages), or the run reached its end without one optimizer step, its last steps
    empty (PlanStep). No rollout captured a turn with a loss-mask token: the agent answers without
    calling its LLM, or never reaches the gateway. Fail the run instead of billing the session for
    steps that train nothing."""


@dataclass
class Decision:
    action: Literal["rollout", "rolled_out", "groups", "checkpoint", "continue", "finish"]
    reason: str
    kind: Literal["train", "eval"] | None = None
    step: int = 0
    generation_batch: int = 0
    rows: list[int] = field(default_factory=list)
    responses_per_prompt: int = 1
    final: bool = False
    #: Budget warnings given at this step's start (`stepwise.core.stopping.record_checks`): PlanStep
    #: logs them and notifies the stack's topic.
    warnings: list[str] = field(default_factory=list)


def prompts_used(rows: int, limit: int) -> int:
    """Rows a run uses: the first ``limit`` (0 = all)."""
    return min(rows, limit) if limit > 0 else rows


def _batch_decision(batch: PlannedBatch) -> Decision:
    action = "groups" if batch.kind == "train" and batch.group_engine else "rollout"
    return Decision(action, "planned", batch.kind, batch.step, batch.generation_batch, list(batch.rows),
                    batch.responses_per_prompt, batch.final)


#: History events kept free beyond the next step's estimate: the end of the execution (ContinueRun
#: or the stop path, ~10 events) and this PlanStep's own.
HISTORY_HEADROOM = 50
#: The next step is assumed to use up to this many times the most events a step has used so far.
STEP_EVENTS_FACTOR = 2


def history_budget_decision(state: RunState, cfg: RunConfig, history_events: int | None) -> Decision | None:
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


@dataclass(frozen=True)
class GroupProgress:
    """What the planner needs of the group engine's buffer (``admission: group``): whether every group of
    the run is consumed (the data is exhausted), and the frontier a checkpoint records."""

    exhausted: bool
    frontier: GroupFrontier


def decide(state: RunState, cfg: RunConfig, history_events: int | None = None, *,
           now: Callable[[], float] = time.time, groups: GroupProgress | None = None) -> Decision:
    """The next action; mutates ``state`` (cursor, epoch, planned batch, planned checkpoint, history marks).

    ``history_events``: the id of the execution's newest history event (see `history_budget_decision`).
    ``now``: the clock a step's start is stamped with (``state.step_started_at``, epoch seconds).
    ``groups``: the group engine's progress (``admission: group``; required then). Its step is
    ``action="groups"``: the training loop admits groups and waits for a batch of them (`stepwise.core.groups`),
    after the same evals, stopping rules, checkpoints and continue-as-new as a generation batch.

    Raises:
        PhaseMismatch: the run is driving operations (not idle, no checkpoint planned).
        NoTrainingSignal: the run ends without one optimizer step, its last steps empty.
    """
    warnings: list[str] = []
    d = _decide(state, cfg, history_events, now, warnings, groups)
    d.warnings = warnings
    return d


def _decide(state: RunState, cfg: RunConfig, history_events: int | None, now: Callable[[], float],
            warnings: list[str], groups: GroupProgress | None = None) -> Decision:
    if state.current_batch is not None:
        return _batch_decision(state.current_batch)  # a retried PlanStep re-plans the same batch
    if state.phase == "checkpoint":
        return Decision("checkpoint", state.checkpoint_reason)
    if state.phase != "idle":
        raise PhaseMismatch(f"PlanStep called in phase {state.phase!r}")
    bs = cfg.batch_size
    used = prompts_used(state.dataset_rows, cfg.max_prompts)
    eval_rows = eval_batch_rows(eval_sets_of(state), cfg.eval_max_prompts)
    eval_n = len(eval_rows)

    def eval_batch(final: bool, reason: str) -> Decision:
        d = Decision("rollout", reason, "eval", state.step, 0, list(eval_rows), cfg.eval_group_size, final)
        state.current_batch = _planned(d)
        return d

    if cfg.eval_only:
        # An eval-only run: its eval sets once, on the weights PollSession loaded, then the end
        # (no training step, no checkpoint: the session is stopped by the state machine's finish path).
        if not state.final_eval_done:
            return eval_batch(True, "eval only")
        return Decision("finish", state.stop_reason or "eval only: evaluated")
    if state.generation_batch == 0:
        if (budget := history_budget_decision(state, cfg, history_events)) is not None:
            return budget
        if eval_n and state.step == 0 and cfg.baseline_eval and state.last_eval_step != 0:
            return eval_batch(False, "eval_before_train")
        if eval_n and state.step > 0 and cfg.should_eval(state.step) and state.last_eval_step != state.step:
            return eval_batch(False, f"eval_every {cfg.eval_every}")
        if state.ahead_batch is not None:
            return _take_ahead(state, history_events)
        if cfg.admission == "group":
            return _decide_groups(state, cfg, history_events, now, warnings, groups, eval_batch, bool(eval_n))
        if state.stop_reason is None and state.epoch < cfg.epochs and state.cursor + bs > used:
            state.epoch += 1
            state.cursor = 0
        if state.stop_reason is None and state.epoch < cfg.epochs:
            t = now()
            state.stop_reason = stopping.stop_reason(state, cfg, t)
            warnings.extend(stopping.record_checks(state, cfg, t))
        if state.stop_reason is not None or state.epoch >= cfg.epochs:
            return _end_of_run(state, cfg, eval_batch, bool(eval_n), f"{cfg.epochs} epoch(s) done", frontier=None)
        if (between := _between_steps(state, cfg, frontier=None)) is not None:
            return between
        state.step_cursor_start = state.cursor
        _open_step(state, history_events, now)
    elif state.cursor + bs > used:  # DAPO: the epoch ran dry in the middle of a step
        if state.epoch + 1 < cfg.epochs:
            state.epoch += 1
            state.cursor = 0
        else:
            state.stop_reason = "dataset exhausted during dynamic sampling"
            state.generation_batch = 0
            return _decide(state, cfg, history_events, now, warnings)
    d = Decision("rollout", "generation batch", "train", state.step, state.generation_batch,
                 list(range(state.cursor, state.cursor + bs)), cfg.responses_per_prompt)
    state.cursor += bs
    state.current_batch = _planned(d)
    return d


def _decide_groups(state: RunState, cfg: RunConfig, history_events: int | None, now: Callable[[], float],
                   warnings: list[str], groups: GroupProgress | None, eval_batch: Callable[[bool, str], Decision],
                   has_evals: bool) -> Decision:
    """The start of a group-engine step: the batch path's order (stopping rules, the end of the run,
    save_every, continue-as-new), the end of the data being every group consumed."""
    if groups is None:
        raise ValueError("admission 'group' needs the group engine's progress (GroupProgress) to plan")
    if state.stop_reason is None and not groups.exhausted:
        t = now()
        state.stop_reason = stopping.stop_reason(state, cfg, t)
        warnings.extend(stopping.record_checks(state, cfg, t))
    if state.stop_reason is not None or groups.exhausted:
        return _end_of_run(state, cfg, eval_batch, has_evals, f"{cfg.epochs} epoch(s) done: every group trained",
                           frontier=groups.frontier)
    if (between := _between_steps(state, cfg, frontier=groups.frontier)) is not None:
        return between
    _open_step(state, history_events, now)
    d = Decision("groups", "group engine", "train", state.step, 0, [], cfg.responses_per_prompt)
    state.current_batch = _planned(d)
    return d


def _end_of_run(state: RunState, cfg: RunConfig, eval_batch: Callable[[bool, str], Decision], has_evals: bool,
                done: str, *, frontier: GroupFrontier | None) -> Decision:
    """The run ends (a stop reason, or the data used up): the final eval, then the final ``save_state``, then
    ``save_weights_at_end``, then ``finish`` (its reason the stop reason, else ``done``). One per PlanStep;
    the checkpoints carry the group engine's ``frontier`` (None: the batch path).

    Raises:
        NoTrainingSignal: the run ends without one optimizer step, its last steps empty.
    """
    if state.empty_steps and state.policy_version == 0:
        # Shorter than max_consecutive_empty_steps, but the same verdict: it trained nothing.
        raise NoTrainingSignal(
            f"the run ended after {state.step} step(s) without one optimizer step; its last "
            f"{state.empty_steps} step(s) produced no trainable datum; {state.empty_steps_report}"
        )
    if has_evals and cfg.final_eval_needed(state.step, state.last_eval_step):
        return eval_batch(True, "final eval")
    if not state.final_checkpoint_done:
        plan_checkpoint(state, "final", groups=frontier)
        return Decision("checkpoint", "final save_state")
    if cfg.save_weights_at_end and not state.final_weights_done:
        plan_checkpoint(state, "weights_at_end", groups=frontier)
        return Decision("checkpoint", "save_weights_at_end")
    return Decision("finish", state.stop_reason or done)


def _between_steps(state: RunState, cfg: RunConfig, *, frontier: GroupFrontier | None) -> Decision | None:
    """Before a step starts: its ``save_every`` checkpoint (once per step), else continue-as-new after
    ``steps_per_execution`` steps of this execution, else None (the step starts)."""
    if cfg.should_save(state.step) and not any(
        c.step == state.step and c.reason == "save_every" for c in state.checkpoints
    ):
        plan_checkpoint(state, "save_every", groups=frontier)
        return Decision("checkpoint", f"save_every {cfg.save_every}")
    if state.step - state.segment_start_step >= cfg.steps_per_execution:
        return Decision("continue", f"steps_per_execution {cfg.steps_per_execution}")
    return None


def _open_step(state: RunState, history_events: int | None, now: Callable[[], float]) -> None:
    """Stamp a step's start: its clock, the ledger's first step, the history event it starts at."""
    state.step_started_at = now()
    ledger.open_first_step(state, state.step_started_at)
    if history_events is not None:
        state.step_start_event = history_events
        state.step_start_event_step = state.step
        state.step_start_event_segment = state.segment


def _take_ahead(state: RunState, history_events: int | None) -> Decision:
    """Start the step with the batch `plan_ahead` rolled out during the previous step's training."""
    ahead = state.ahead_batch
    assert ahead is not None
    if ahead.step != state.step or ahead.kind != "train" or ahead.generation_batch != 0:
        raise PhaseMismatch(f"the batch rolled out ahead is for step {ahead.step} (gen {ahead.generation_batch}), "
                            f"but the run is at step {state.step}")
    state.current_batch, state.ahead_batch = ahead, None
    state.step_cursor_start = state.ahead_cursor_start
    state.step_started_at = state.ahead_started_at
    if history_events is not None:
        state.step_start_event = history_events
        state.step_start_event_step = state.step
        state.step_start_event_segment = state.segment
    d = _batch_decision(ahead)
    d.action, d.reason = "rolled_out", "rolled out during the previous step's training"
    return d


def plan_ahead(state: RunState, cfg: RunConfig, trained_step: int, *,
               now: Callable[[], float] = time.time) -> tuple[Decision | None, str]:
    """Plan the first generation batch of step ``trained_step + 1`` while step ``trained_step`` trains
    (``max_staleness`` >= 1); mutates ``state`` (cursor, epoch, ``ahead_batch``). Returns
    ``(decision or None, reason)``: None when the next step must not start early (its reason, from
    `stepwise.core.staleness.roll_out_ahead_blocker`). A retried call returns the batch already planned.

    The batch is the one `decide` would plan at the next step's start (same epoch rollover, same
    rows), so overlapping changes when rollouts happen, never which prompts a step trains on.
    ``state`` may be at ``trained_step`` (training or rebinding) or already at the next step (rebound).
    """
    if state.ahead_batch is not None:
        return _batch_decision(state.ahead_batch), "planned"
    next_step = trained_step + 1
    if state.step not in (trained_step, next_step) or state.current_batch is not None or state.generation_batch:
        return None, f"the run is at step {state.step} (gen {state.generation_batch}), not training step {trained_step}"
    bs = cfg.batch_size
    used = prompts_used(state.dataset_rows, cfg.max_prompts)
    epoch, cursor = state.epoch, state.cursor
    if state.stop_reason is None and epoch < cfg.epochs and cursor + bs > used:
        epoch, cursor = epoch + 1, 0
    finishing = state.stop_reason is not None or epoch >= cfg.epochs
    blocker = roll_out_ahead_blocker(
        max_staleness=cfg.max_staleness,
        finishing=finishing,
        save_due=cfg.should_save(next_step) and not any(
            c.step == next_step and c.reason == "save_every" for c in state.checkpoints),
        segment_ends=next_step - state.segment_start_step >= cfg.steps_per_execution,
        stop_due=None if finishing or cfg.max_staleness < 1 else stopping.ahead_reason(state, cfg, now(), next_step),
        base_sampler=not state.sampler_model_package_arn,
    )
    if blocker is not None:
        return None, blocker
    state.epoch, state.ahead_cursor_start = epoch, cursor
    d = Decision("rollout", "rolled out ahead", "train", next_step, 0, list(range(cursor, cursor + bs)),
                 cfg.responses_per_prompt)
    state.cursor = cursor + bs
    state.ahead_batch = _planned(d)
    state.ahead_started_at = now()
    return d, "planned"


def plan_step(state: RunState, cfg: RunConfig, *, ahead_of_step: int | None, history_events: int | None = None,
              new_events: Sequence[Mapping[str, Any]] = (), groups: GroupProgress | None = None,
              now: Callable[[], float] = time.time) -> tuple[Decision | None, str]:
    """PlanStep's transition of ``state`` (mutated): with ``ahead_of_step`` None, count the execution's
    history events not counted yet in the ledger (``new_events``, up to ``history_events``, the newest id:
    `stepwise.core.ledger.count_parent_history`) and `decide` the next action; else `plan_ahead` the first
    batch of step ``ahead_of_step + 1``. Returns ``(decision, reason)``: the decision None only ahead
    (``reason`` says why not); a retried call returns the batch already planned.

    Raises:
        as `decide` (PhaseMismatch, NoTrainingSignal, ValueError without ``groups`` under ``admission: group``).
    """
    if ahead_of_step is None:
        ledger.count_parent_history(state, history_events, new_events)
        d = decide(state, cfg, history_events, now=now, groups=groups)
        return d, d.reason
    return plan_ahead(state, cfg, ahead_of_step, now=now)


def _planned(d: Decision) -> PlannedBatch:
    return PlannedBatch(kind=d.kind or "train", step=d.step, generation_batch=d.generation_batch, rows=d.rows,
                        responses_per_prompt=d.responses_per_prompt, final=d.final, group_engine=d.action == "groups")


def input_id(kind: str, step: int, generation_batch: int, position: int) -> str:
    """The toolkit ``input_id`` of a prompt in a batch (one S3 folder per prompt: its group)."""
    return f"e{step}p{position}" if kind == "eval" else f"s{step}g{generation_batch}p{position}"


def build_items(d: Decision, payloads: Mapping[int, dict[str, Any]] | Sequence[dict[str, Any]]
                ) -> tuple[list[BatchItem], dict[str, Any]]:
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


#: The share of ``acr_tps_limit`` a generation batch's first invokes are paced at (`pace_starts`). Each
#: rollout makes two calls against the quota, its InvokeAgentRuntime and, when it ends, FinishRollout's
#: StopRuntimeSession (they share it: the local ACR emulator, as the toolkit's own rate limiter, counts
#: both), so rollouts can start for long at half the quota only; and a StartRollout's latency varies by a
#: fraction of a second, so 90% of that half. Measured on the toy run (64 rollouts a step at 25 a second):
#: unpaced, 749 of 2,059 StartRollout invocations were refused; paced at 90% of the whole quota, 519 of
#: 1,829 (the stops of the first rollouts took the rest of each second).
START_PACE = 0.45


def start_offsets(num_items: int, concurrency: int, acr_tps_limit: int) -> list[int]:
    """Seconds each of a generation batch's ``num_items`` rollouts waits before its first InvokeAgentRuntime
    (its item's ``start_after_seconds``, the Map child's "Pace start").

    The Map starts ``concurrency`` children at once, and AgentCore Runtime refuses invokes above
    ``acr_tps_limit`` a second: unpaced, a toy batch of 64 at 25 a second had 26-53% of its invokes refused,
    each one more StartRollout and a retry after up to 1, 2, 4 ... s of full jitter, so its last rollouts
    started seconds after ACR could have taken them. Item ``i < concurrency`` waits ``i // per_second`` s,
    ``per_second = max(1, floor(START_PACE x acr_tps_limit))``; later items start as earlier rollouts end
    (0 s: the Map paces them). Whole seconds: a Wait state's ``SecondsPath`` takes a non-negative integer
    (Amazon States Language, "Wait")."""
    per_second = max(1, int(START_PACE * acr_tps_limit))
    return [i // per_second if i < concurrency else 0 for i in range(num_items)]


def pace_starts(items: Sequence[BatchItem], concurrency: int, acr_tps_limit: int) -> list[BatchItem]:
    """``items`` with each one's ``start_after_seconds`` from `start_offsets` (by position)."""
    offsets = start_offsets(len(items), concurrency, acr_tps_limit)
    return [it.model_copy(update={"start_after_seconds": s}) for it, s in zip(items, offsets)]


def map_concurrency(num_items: int, acr_tps_limit: int, acr_max_active_sessions: int | None = None) -> int:
    """The Distributed Map's ``MaxConcurrency`` for a batch of ``num_items`` rollouts:
    ``acr_tps_limit * CONCURRENCY_PER_TPS`` rollouts in flight, at most ``MAX_MAP_CONCURRENCY``
    (`stepwise.core.service_limits`), at most ``acr_max_active_sessions`` (each rollout in flight holds
    one ACR runtime session, and the account's active-session quota bounds them; None = no such bound)
    and at most the batch, at least 1."""
    bound = MAX_MAP_CONCURRENCY if acr_max_active_sessions is None else min(MAX_MAP_CONCURRENCY, acr_max_active_sessions)
    return max(1, min(num_items, acr_tps_limit * CONCURRENCY_PER_TPS, bound))
