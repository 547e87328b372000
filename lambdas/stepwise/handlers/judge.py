"""JudgeGroups: the "Judge groups" state, between a training generation batch's rollouts and "Compute
advantages and filter groups", when the run config has a ``judge`` (the state machine's Choice skips it
otherwise).

A thin loop over `stepwise.judging.judge_group`: the batch's current rollout records grouped by prompt, every
group judged (``judge.concurrency`` at once) and its record written under ``.../gen{g}/judge/``, which
ComputeAdvantages merges into the rollouts (`stepwise.core.judge.apply_judgements`). Returns ``{"done": bool,
...}``: False when the invocation's time ran out with groups still throttled, and the state machine waits
and calls it again (each call resumes where the last stopped: a group with a record is not judged twice);
``judge-progress.json`` keeps when the batch's judging started (``judge.max_wait_seconds`` counts from it)
and carries the invocations' own measurements to the cost ledger (`stepwise.metering`).

The group engine (``admission: group``) calls it with a group's batch (``batch.group`` set) from its rollout
group's "Judge the group" state, the same loop over its one group: the records and ``judge-progress.json`` sit in
the group's folder (`stepwise.layout.judge_progress_key` with ``group``), the progress record also counts the
judge loop's own state transitions, and RecordGroupComplete merges the record and adds what judging used to the
ledger. A group's execution outlives the training-loop execution that admitted it (continue-as-new), so the
owner check is the run's end instead: a run that has ended judges nothing.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from stepwise import metering
from stepwise.events import BatchEvent
from stepwise.handlers._common import bind, entrypoint, logger, now, poll_seconds, run_config, store
from stepwise.judging import judge_batch, open_session
from stepwise.layout import judge_progress_key
from stepwise.records import JudgeProgress, RolloutRecord, Usage

#: State transitions of one pass of a rollout group's judge loop ("Judge the group", "Group judged?"; its Wait
#: when not done is one more), counted in the group's progress record.
GROUP_LOOP_TRANSITIONS = 2
#: Seconds of the function's timeout kept free after the last request may start: that request's own
#: ``judge.timeout_seconds`` plus this margin for the writes.
MARGIN_S = 30.0


def invocation_budget(function_timeout_s: float, request_timeout_s: float) -> float:
    """Seconds an invocation may start Converse requests for: the function's timeout less the slowest request
    and `MARGIN_S`, at least a tenth of the timeout."""
    return max(function_timeout_s / 10, function_timeout_s - request_timeout_s - MARGIN_S)


def batch_fingerprint(rollouts: list[RolloutRecord]) -> str:
    """Which rollouts a batch's judging is for: a hash of their sids (a re-done step has new ones)."""
    return hashlib.sha256(",".join(sorted(str(r.sid) for r in rollouts)).encode()).hexdigest()[:16]


def judge(event: BatchEvent) -> dict[str, Any]:
    from stepwise.functions import by_name

    t0 = time.monotonic()
    rs = store()
    run, batch = event.run, event.batch
    bind(run_id=run.run_id, step=batch.step)
    cfg = run_config(run.run_id)
    if cfg.judge is None or batch.kind != "train":
        why = "no judge" if cfg.judge is None else "not a training batch"
        return {"done": True, "wait_seconds": poll_seconds(), "groups": 0, "skipped": why}
    folder = batch.folder
    if batch.group is None:
        rs.owned_state(run.run_id, run.execution_arn)  # a superseded execution does not judge (nor bill)
    elif (ended := rs.read_state(run.run_id)[0]).session_stopped or ended.finished:
        return {"done": True, "wait_seconds": poll_seconds(), "groups": 0, "skipped": "the run has ended"}
    key = judge_progress_key(run.run_id, batch.step, batch.generation_batch, **folder)
    rollouts = rs.batch_rollouts(run.run_id, batch.step, batch.generation_batch, batch.kind, **folder)
    attempt = batch_fingerprint(rollouts)
    progress = JudgeProgress.model_validate(rs.get_json_or(key) or {
        "step": batch.step, "generation_batch": batch.generation_batch, "started_at": now(), "rollouts": attempt})
    if progress.rollouts != attempt:  # judged before for other rollouts: a resumed run re-does the step
        # what an unfinished attempt used was never added to the ledger: it rides on; a finished one's was
        progress = JudgeProgress(step=batch.step, generation_batch=batch.generation_batch, started_at=now(),
                                 rollouts=attempt, usage=None if progress.done else progress.usage)
    budget = invocation_budget(by_name("JudgeGroups").timeout_s, cfg.judge.timeout_seconds)
    session = open_session(rs, run.run_id, cfg, budget_s=budget - (time.monotonic() - t0),
                           started_at=progress.started_at)
    records, pending = judge_batch(session, batch.step, batch.generation_batch, rollouts, folder=folder)
    done = not pending
    with metering.riding(run.run_id) as own:
        usage = (progress.usage or Usage()).add(own)
        if batch.group is not None:  # the group's judge loop: this Task and its Choice, and a Wait when not done
            usage.state_transitions += GROUP_LOOP_TRANSITIONS + (0 if done else 1)
        rs.put_json(key, progress.model_copy(update={"invocations": progress.invocations + 1, "done": done,
                                                     "usage": usage}).model_dump(), bulk=True)
    sources = [r.source for r in records]
    out = {"done": done, "wait_seconds": poll_seconds(), "groups": len(records) + len(pending),
           "pending": len(pending), **{s: sources.count(s) for s in ("judge", "cache", "fallback", "skipped")}}
    logger.info("groups judged" if done else "judging continues after a wait", extra=out)
    return out


handler = entrypoint(BatchEvent, judge, transient_retry=True)
