"""The session sweeper's pure rules (`stepwise.core.sweeping`): whose sessions, when, and who may stop them."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.phases import session_name_for
from stepwise.core.sweeping import (GONE, LIVE_EXECUTION_STATUSES, TAG_BUCKET, TAG_RUN_ID, SweepConflict, mark_swept,
                                    may_stop_session, run_of_session, sweep_verdict)
from stepwise.records import RunState

STATUSES = st.sampled_from(["RUNNING", "PENDING_REDRIVE", "SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED", GONE, None])
ARNS = st.sampled_from(["arn:owner", "arn:successor", "arn:other"])


def _state(owner: str = "arn:owner", successor: str | None = None, session: str = "stepwise-s", stopped: bool = False) -> RunState:
    return RunState(run_id="r", owner_execution_arn=owner, successor_execution_arn=successor,
                    training_session_name=session, session_stopped=stopped)


@settings(max_examples=300, deadline=None)
@given(owner_status=STATUSES, successor_status=STATUSES, successor=st.sampled_from([None, "arn:successor"]),
       stopped=st.booleans(), same_session=st.booleans())
def test_a_session_is_never_swept_while_an_execution_that_may_stop_it_runs_or_is_unknown(
        owner_status, successor_status, successor, stopped, same_session):
    state = _state(successor=successor, stopped=stopped)
    name = "stepwise-s" if same_session else "stepwise-older"
    v = sweep_verdict(name, state, owner_status, successor_status if successor else None)
    if not same_session or stopped:
        assert v.stop and not v.mark  # the run itself no longer uses it
        return
    live = {owner_status} | ({successor_status} if successor else set())
    if live & (LIVE_EXECUTION_STATUSES | {None}):
        assert not v.stop, v
    else:
        assert v.stop and v.mark, v
        assert (owner_status in v.reason) and (not successor or successor_status in v.reason)


def test_the_verdicts_name_what_they_saw():
    assert sweep_verdict("stepwise-s", _state(), "ABORTED").reason == "owner execution arn:owner ended ABORTED"
    v = sweep_verdict("stepwise-s", _state(successor="arn:successor"), "SUCCEEDED", "RUNNING")
    assert not v.stop and v.reason == "handed over to execution arn:successor, RUNNING"
    v = sweep_verdict("stepwise-s", _state(successor="arn:successor"), "SUCCEEDED", GONE)
    assert v.stop and "arn:successor ended GONE before taking the run over" in v.reason


@given(owner=ARNS, successor=st.sampled_from([None, "arn:successor"]), caller=ARNS)
def test_only_the_owner_or_its_recorded_successor_may_stop_the_session(owner, successor, caller):
    assert may_stop_session(_state(owner=owner, successor=successor), caller) == (caller in (owner, successor))


@settings(max_examples=200, deadline=None)
@given(tag_bucket=st.one_of(st.none(), st.sampled_from(["ours", "theirs", ""])),
       tag_run=st.one_of(st.none(), st.sampled_from(["run-a", "run-b", ""])),
       name_of=st.sampled_from(["run-a", "run-c", None]))
def test_a_session_is_this_stacks_only_by_its_bucket_tag_or_by_the_name_of_one_of_its_runs(tag_bucket, tag_run, name_of):
    tags = {k: v for k, v in ((TAG_BUCKET, tag_bucket), (TAG_RUN_ID, tag_run)) if v is not None}
    name = session_name_for(name_of) if name_of else "stepwise-someone-elses"
    asked = []

    def run_ids():
        asked.append(True)
        return ["run-a", "run-b"]

    got = run_of_session(name, tags, "ours", run_ids)
    if tags:
        assert not asked  # tagged: the bucket's runs are not listed
        assert got == (tag_run if tag_bucket == "ours" and tag_run else None)
    else:
        assert got == ("run-a" if name_of == "run-a" else None)


def test_marking_refuses_a_run_that_moved_on_since_the_verdict():
    state = _state(successor="arn:successor")
    mark_swept(state, "stepwise-s", "arn:owner", "arn:successor", "owner execution arn:owner ended ABORTED")
    assert state.session_stopped and state.stop_reason.startswith("execution ended without stopping its session")
    for changed in (_state(owner="arn:other"), _state(session="stepwise-new"), _state(successor="arn:successor"),
                    _state(stopped=True)):
        with pytest.raises(SweepConflict):
            mark_swept(changed, "stepwise-s", "arn:owner", None, "x")


TIMES = st.one_of(st.none(), st.floats(min_value=0, max_value=1000, allow_nan=False))


@settings(max_examples=400, deadline=None)
@given(owner_status=STATUSES, successor_status=STATUSES, successor=st.sampled_from([None, "arn:successor"]),
       stopped=st.booleans(), same_session=st.booleans(), state_changed=TIMES, owner_stopped=TIMES,
       successor_stopped=TIMES, now=st.floats(min_value=0, max_value=2000, allow_nan=False),
       grace=st.sampled_from([0.0, 30.0, 300.0]))
def test_nothing_is_stopped_within_the_grace_period_of_a_change_and_after_it_the_verdict_is_the_plain_one(
        owner_status, successor_status, successor, stopped, same_session, state_changed, owner_stopped,
        successor_stopped, now, grace):
    """DescribeExecution is eventually consistent (a successor just started may read GONE): no stop while
    the state's last change (unknown = now) or an execution's stop date is younger than the grace period;
    past it, or with no grace, the verdict is the one without times."""
    state = _state(successor=successor, stopped=stopped)
    name = "stepwise-s" if same_session else "stepwise-older"
    plain = sweep_verdict(name, state, owner_status, successor_status if successor else None)
    v = sweep_verdict(name, state, owner_status, successor_status if successor else None, state_changed_at=state_changed,
                      owner_stopped_at=owner_stopped, successor_stopped_at=successor_stopped, now=now, grace=grace)
    latest = max(t for t in (now if state_changed is None else state_changed, owner_stopped, successor_stopped)
                 if t is not None)
    if grace and now - latest < grace:
        assert not v.stop and not v.mark, v
    else:
        assert v == plain


def test_a_hand_over_read_before_the_successor_is_visible_is_left_alone_until_the_grace_period_passed():
    """The window that stopped live runs: the owner handed over (SUCCEEDED), the successor reads GONE
    (eventual consistency), the state was written at the hand-over. Within the grace: no verdict."""
    state = _state(successor="arn:successor")
    assert sweep_verdict("stepwise-s", state, "SUCCEEDED", GONE).stop  # what the sweeper did before
    v = sweep_verdict("stepwise-s", state, "SUCCEEDED", GONE, state_changed_at=1000.0, owner_stopped_at=1001.0,
                      now=1010.0, grace=300.0)
    assert not v.stop and "within the 300 s grace period" in v.reason and "would stop" in v.reason
    assert sweep_verdict("stepwise-s", state, "SUCCEEDED", GONE, state_changed_at=1000.0, owner_stopped_at=1001.0,
                         now=1302.0, grace=300.0).stop


def test_a_run_refused_its_session_never_has_it_swept():
    from stepwise.core.sweeping import REFUSED

    state = _state(stopped=True)
    state.session_status = REFUSED
    assert not sweep_verdict("stepwise-s", state, GONE).stop


def test_marking_a_swept_session_closes_its_seconds_in_the_ledger_from_its_own_creation_time():
    state = _state()
    state.session_created_at = 100.0  # Init's clock until the session's own is known
    mark_swept(state, "stepwise-s", "arn:owner", None, "owner ended ABORTED", stopped_at=160.0, created_at=98.0)
    assert state.ledger.sessions_closed_seconds == 62.0 and state.session_stopped
    again = _state()
    mark_swept(again, "stepwise-s", "arn:owner", None, "x")  # no stop time given: the ledger is left alone
    assert again.ledger.sessions_closed_seconds == 0.0


@settings(max_examples=200, deadline=None)
@given(tag_bucket=st.one_of(st.none(), st.sampled_from(["ours", "theirs"])),
       tag_run=st.one_of(st.none(), st.sampled_from(["run-a", "run-b"])),
       tag_exec=st.one_of(st.none(), st.sampled_from(["arn:x1", "arn:x2"])), caller=st.sampled_from(["", "arn:x1"]))
def test_a_session_is_adopted_only_when_its_tags_name_this_bucket_this_run_and_this_execution(
        tag_bucket, tag_run, tag_exec, caller):
    from stepwise.core.sweeping import TAG_EXECUTION, adoption_problem

    tags = {k: v for k, v in ((TAG_BUCKET, tag_bucket), (TAG_RUN_ID, tag_run), (TAG_EXECUTION, tag_exec)) if v}
    problem = adoption_problem("stepwise-run-a-x", tags, "run-a", "ours", "Running", caller)
    ours = tag_bucket == "ours" and tag_run == "run-a" and (not caller or not tag_exec or tag_exec == caller)
    assert (problem == "") == ours, (tags, problem)
    if problem:
        assert problem.startswith("training session 'stepwise-run-a-x' already exists (Running)") and "run id" in problem
