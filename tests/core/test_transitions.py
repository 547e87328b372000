"""The handlers' state transitions, pure in `stepwise.core` (hypothesis over arbitrary records).

Each transition is what one handler applies in one conditional write (`RunStore.update_state` /
`update_buffer`). A Lambda retry, or a duplicate event, applies it again to the record as written: the
properties below are what the handlers rely on then: applied again it changes nothing (ownership, the
session's clock and end, resume, the group buffer's transitions), or, for the two a retry must never apply
twice (a step's decision, an eval's), it refuses (`BatchMismatch`) and the handler answers from what the
first application recorded.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.planning import cfg, state

from stepwise.core import groups as eng
from stepwise.core.groups import CompleteMark, Knobs
from stepwise.core.ledger import session_clock
from stepwise.core.selection import record_eval
from stepwise.core.steps import BatchMismatch, StepOutcome, record_step
from stepwise.core.sweeping import (RunOwnedElsewhere, mark_refused, mark_stopped, may_stop_session, resume_run,
                                    take_over)
from stepwise.records import BatchRef, Checkpoint, PlannedBatch, Usage

ARNS = st.sampled_from(["arn:owner", "arn:successor", "arn:other"])
TIMES = st.floats(1.0, 1e9)
REASONS = st.sampled_from([None, "failed: States.TaskFailed", "execution ABORTED", "dataset exhausted", "max_steps"])


@st.composite
def run_states(draw):
    s = state(successor_execution_arn=draw(st.sampled_from([None, "arn:successor"])),
              session_stopped=draw(st.booleans()), session_created_at=draw(TIMES), stop_reason=draw(REASONS),
              step=draw(st.integers(0, 6)), segment=draw(st.integers(0, 3)),
              session_status=draw(st.sampled_from(["Creating", "Running", "Stopping", "Refused"])))
    s.owner_execution_arn = "arn:owner"
    for step in sorted(draw(st.sets(st.integers(0, 6), max_size=3))):
        s.checkpoints.append(Checkpoint(step=step, kind=draw(st.sampled_from(["state", "weights"])),
                                        model_package_arn=f"arn:pkg/{step}", reason="save_every"))
    return s


@settings(max_examples=200, deadline=None)
@given(s=run_states(), arn=ARNS, parent=ARNS)
def test_a_continuation_takes_the_run_over_once_or_not_at_all(s, arn, parent):
    before = s.model_copy(deep=True)
    try:
        take_over(s, arn, parent)
    except RunOwnedElsewhere:
        assert before.owner_execution_arn not in (arn, parent) and s == before  # refused: nothing changed
        return
    assert s.owner_execution_arn == arn and s.successor_execution_arn is None
    assert s.segment == before.segment + (before.owner_execution_arn != arn)
    once = s.model_copy(deep=True)
    take_over(s, arn, parent)  # a retried Init
    assert s == once


@settings(max_examples=200, deadline=None)
@given(s=run_states(), arn=ARNS, reason=st.sampled_from(["finished", "failed: X", "execution ABORTED"]),
       stopped_at=TIMES, created=st.none() | TIMES, newest=st.none() | st.integers(1, 50),
       ids=st.lists(st.integers(1, 50), max_size=6))
def test_a_stop_records_the_sessions_seconds_and_the_runs_end_once(s, arn, reason, stopped_at, created, newest, ids):
    events = [{"id": i, "type": "TaskStateEntered"} for i in ids]
    args = dict(reason=reason, stopped_at=stopped_at, created_at=created, newest_event=newest, events=events,
                tail_transitions=0, estimate=None)
    before = s.model_copy(deep=True)
    if not may_stop_session(s, arn):
        with pytest.raises(RunOwnedElsewhere):
            mark_stopped(s, cfg(), arn, **args)
        assert s == before
        return
    mark_stopped(s, cfg(), arn, **args)
    assert s.session_stopped and (s.finished or s.stop_reason is not None)
    assert (s.session_status == "Refused") == (before.session_status == "Refused")
    seconds, reason_kept, finished = s.ledger.sessions_closed_seconds, s.stop_reason, s.finished
    mark_stopped(s, cfg(), arn, **args | {"stopped_at": stopped_at + 3600})  # a retried stop, an hour later
    assert (s.ledger.sessions_closed_seconds, s.stop_reason, s.finished) == (seconds, reason_kept, finished)


@settings(max_examples=150, deadline=None)
@given(s=run_states(), name=st.sampled_from(["s", "other"]), created=st.none() | TIMES,
       status=st.none() | st.sampled_from(["Running", "Creating"]), why=st.text(max_size=20))
def test_inits_marks_of_the_session_applied_again_change_nothing(s, name, created, status, why):
    for change in (lambda x: session_clock(x, name, created_at=created, status=status),
                   lambda x: mark_refused(x, name, why)):
        change(s)
        once = s.model_copy(deep=True)
        change(s)
        assert s == once


@settings(max_examples=150, deadline=None)
@given(s=run_states(), at=TIMES, saves_initial=st.booleans())
def test_a_resume_rewinds_once(s, at, saves_initial):
    c = cfg(admission="group", max_staleness=1) if saves_initial else cfg()
    stopped = s.session_stopped
    first = resume_run(s, c, session_name="s-2", at=at)
    assert first.rewound == stopped and not s.session_stopped
    assert s.stop_reason is None or not s.stop_reason.startswith(("failed", "execution "))
    if stopped:
        states = [c_.step for c_ in s.checkpoints if c_.kind == "state"]
        assert s.training_session_name == "s-2" and s.step == (max(states) if states else 0)
    once = s.model_copy(deep=True)
    assert resume_run(s, c, session_name="s-2", at=at + 10) == (False, None)  # a retried Init
    assert s == once


def _outcome(groups: int) -> StepOutcome:
    return StepOutcome(status="ready", train_groups=[None] * groups, all_groups=[], rollouts=[], metrics={})


@settings(max_examples=150, deadline=None)
@given(decision=st.sampled_from(["train", "need_more", "cap_reached", "skip"]), gen=st.integers(0, 3),
       step=st.integers(0, 5), at=TIMES)
def test_a_steps_decision_is_recorded_once_and_a_retry_is_refused(decision, gen, step, at):
    s = state(step=step, generation_batch=gen, step_started_at=at - 5)
    s.current_batch = PlannedBatch(kind="train", step=step, generation_batch=gen, rows=[0], responses_per_prompt=1)
    batch = BatchRef(kind="train", step=step, generation_batch=gen)
    result = {"decision": decision, "step": step}
    apply = lambda x: record_step(x, cfg(), batch, decision=decision, result=result, usage=Usage(s3_put_class=1),  # noqa: E731
                                  epoch=0, at=at, outcome=_outcome(2), step_metrics={"m": 1.0}, chunk_sizes=[3],
                                  cap_reason="cap")
    apply(s)
    assert s.current_batch is None and s.last_decision == {"batch": batch.model_dump(), "result": result}
    assert s.step == step + (decision == "skip")
    assert s.generation_batch == (gen + 1 if decision == "need_more" else gen if decision == "train" else 0)
    assert (s.stop_reason == "cap") == (decision == "cap_reached")
    once = s.model_copy(deep=True)
    with pytest.raises(BatchMismatch):  # the handler answers a retry from last_decision before this
        apply(s)
    assert s == once


def test_an_evals_record_is_refused_once_the_batch_is_done():
    s = state(step=2)
    s.current_batch = PlannedBatch(kind="eval", step=2, generation_batch=0, rows=[0], responses_per_prompt=1, final=True)
    batch = BatchRef(kind="eval", step=2, generation_batch=0, final=True)
    record_eval(s, cfg(), batch, usage=Usage(), summary={"eval/accuracy": 0.5}, evaluated="arn:pkg/2")
    assert s.last_eval_step == 2 and s.eval_steps == [2] and s.final_eval_done and s.best.step == 2
    once = s.model_copy(deep=True)
    with pytest.raises(BatchMismatch):
        record_eval(s, cfg(), batch, usage=Usage(), summary={"eval/accuracy": 0.9}, evaluated="arn:pkg/2")
    assert s == once


@st.composite
def buffers(draw):
    """A group buffer after arbitrary admissions and completions, with its knobs and a run state."""
    bs, size = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    k = draw(st.integers(0, 2))
    dapo = draw(st.booleans())
    kn = Knobs(batch_size=bs, group_size=size, steps_ahead=draw(st.integers(0, k)), max_staleness=k,
               max_in_flight=size * bs * 4, dapo=dapo, max_num_gen_batches=2 if dapo else 1)
    b = eng.new_buffer("r", draw(st.integers(1, 12)), 0)
    s = state(policy_version=0, sampler_model_package_arn="arn:pkg/0")
    eng.admit_on(b, kn, s, group_state_machine_arn="arn:sm", now=1.0)
    for g in [g for g in b.groups if draw(st.booleans())]:
        eng.complete_group(b, g.id, g.attempt, first_turn_version=0, durations_s=[1.0], informative=draw(st.booleans()),
                           knobs=kn, now=2.0)
    if draw(st.booleans()):
        b.trainer_token, b.waiting_version, b.waiting_since = "token", 0, 1.0
    return kn, b, s


def _again(buffer, change):
    """Apply ``change`` to ``buffer``, then to its result; returns (first answer, second answer, buffer after one)."""
    first = change(buffer)
    once = buffer.model_copy(deep=True)
    second = change(buffer)
    return first, second, once


@settings(max_examples=200, deadline=None)
@given(case=buffers(), informative=st.booleans(), pick=st.integers(0, 20))
def test_a_groups_completion_recorded_twice_is_stale_the_second_time(case, informative, pick):
    kn, b, s = case
    running = [g for g in b.groups if g.status == "running"]
    if not running:
        return
    g = running[pick % len(running)]
    mark = CompleteMark(attempt=g.attempt, members=g.members, first_turn_version=0, last_turn_version=0,
                        informative=informative, durations_s=(1.0,))
    change = lambda x: eng.record_completion(x, kn, s, group=g.id, attempt=g.attempt, mark=mark,  # noqa: E731
                                             own=Usage(state_transitions=3), members=Usage(s3_put_class=1), now=3.0)
    first, second, once = _again(b, change)
    assert first[0] in ("complete", "filtered") and second == ("stale", None, [])
    assert b == once  # a duplicate RecordGroupComplete changes nothing


@settings(max_examples=200, deadline=None)
@given(case=buffers(), verdict=st.sampled_from(["GONE", "FAILED", "SUCCEEDED", "ABORTED"]))
def test_the_buffers_other_transitions_applied_again_change_nothing(case, verdict):
    kn, b, s = case
    verdicts = {(g.id, g.attempt): verdict for g in b.groups if g.status == "running"}
    for change in (lambda x: eng.record_ended(x, kn, verdicts, now=4.0),
                   lambda x: eng.await_trainer(x, kn, token="token-2", version=0, now=5.0),
                   lambda x: eng.admit_on(x, kn, s, group_state_machine_arn="arn:sm", now=6.0),
                   eng.stop_admitting):
        first, second, once = _again(b, change)
        assert b == once
    ready = eng.readiness(b, kn, version=0)
    if ready.trainable:
        first, second, once = _again(b, lambda x: eng.consume_for_step(x, ready, kn, step=0, version=0,
                                                                       decision="train", now=7.0,
                                                                       read_usage=x.pending_usage))
        assert first[1] == second[1] and b == once  # a retried ComputeAdvantages takes the same groups
    at = eng.frontier(b)
    _, _, once = _again(b, lambda x: eng.rewind_for_session(x, at, version=0, knobs=kn, marks={}, session_name="s-2"))
    assert b == once and b.rewound_for == "s-2"
