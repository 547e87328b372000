"""The one way to end a run early (`stepwise.core.stopping`): a rule answers before a step, the run
takes the graceful path (final eval, final checkpoint, finish), the reason names the rule and its
figures and is never a failure a resume would clear; with overlapped steps no batch is rolled out
ahead of a step that does not run."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_planning_ahead import walk
from tests.support.planning import cfg, state

from stepwise.core import stopping
from stepwise.core.phases import is_failure_stop
from stepwise.core.planning import decide, plan_ahead

EVAL = {"eval_dataset_path": "s3://bucket-name/e.jsonl", "eval_before_train": False}


def test_max_steps_ends_the_run_on_the_graceful_path_with_the_limit_as_its_reason():
    c = cfg(batch_size=2, responses_per_prompt=2, max_steps=2, **EVAL)
    seen = walk(state(dataset_rows=20, eval_rows=3), c, overlap=False)
    assert seen == [("train", 0, (0, 1)), ("train", 1, (2, 3)), ("eval", 2),
                    ("checkpoint", 2, "final", 0, 4), ("finish", 2)]
    s = state(dataset_rows=20, step=2, cursor=4, final_checkpoint_done=True, last_eval_step=2)
    d = decide(s, c)
    assert (d.action, d.reason) == ("finish", "max_steps: 2 steps done, limit 2") == ("finish", s.stop_reason)
    assert not is_failure_stop(s.stop_reason)  # a resume keeps it


def test_max_steps_after_the_epochs_changes_nothing_and_the_epochs_reason_stays():
    c = cfg(batch_size=2, responses_per_prompt=2, max_steps=50)
    s = state(dataset_rows=4)
    assert [x for x in walk(s, c, overlap=False) if x[0] == "train"] == [("train", 0, (0, 1)), ("train", 1, (2, 3))]
    assert s.stop_reason is None and decide(s, c).reason == "1 epoch(s) done"


def test_the_rules_are_asked_at_a_steps_start_after_its_due_eval_and_not_between_generation_batches():
    asked: list[tuple[int, int, int | None]] = []

    def spy(s, c, now):
        asked.append((s.step, s.generation_batch, s.last_eval_step))
        return None

    c = cfg(batch_size=1, responses_per_prompt=2, eval_every=1, algorithm="dapo", **EVAL)
    s = state(dataset_rows=10, eval_rows=2, step=1, cursor=1)
    orig = stopping.RULES
    stopping.RULES = (spy,)
    try:
        assert decide(s, c).kind == "eval" and asked == []  # the eval after step 1 runs first
        s.current_batch, s.last_eval_step = None, 1
        assert decide(s, c).kind == "train" and asked == [(1, 0, 1)]
        s.current_batch, s.generation_batch = None, 1  # DAPO: another generation batch of the same step
        assert decide(s, c).kind == "train" and asked == [(1, 0, 1)]
    finally:
        stopping.RULES = orig


def test_a_rule_answering_a_failure_like_reason_is_refused():
    s, c = state(dataset_rows=10), cfg(batch_size=2)
    for bad in ("failed: over budget", "execution ABORTED", "  "):
        with pytest.raises(stopping.BadStopReason, match="must not start"):
            stopping.stop_reason(s, c, 0.0, rules=(lambda *_a, r=bad: r,))
    assert stopping.stop_reason(s, c, 0.0, rules=(lambda *_: None, lambda *_: "custom: 3 > 2")) == "custom: 3 > 2"


def test_nothing_is_rolled_out_ahead_of_a_step_the_limit_ends():
    c = cfg(batch_size=2, responses_per_prompt=2, max_staleness=1, max_steps=2)
    s = state(dataset_rows=20, sampler_model_package_arn="arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1")
    decide(s, c)
    s.current_batch = None
    d, why = plan_ahead(s, c, 0)  # step 1 may run: planned
    assert d is not None and d.step == 1
    s.step = 1
    decide(s, c)  # step 1 starts with the batch rolled out ahead
    s.current_batch = None
    before = s.model_dump()
    d, why = plan_ahead(s, c, 1)  # step 2 would be the third: not rolled out
    assert d is None and why == "the run stops before the next step (max_steps: 2 steps done, limit 2)"
    assert s.model_dump() == before


@settings(max_examples=120, deadline=None)
@given(rows=st.integers(2, 30), batch=st.integers(1, 4), epochs=st.integers(1, 2), save_every=st.integers(-1, 3),
       per_execution=st.integers(1, 4), eval_every=st.integers(0, 3), max_steps=st.integers(1, 12))
def test_with_max_steps_overlap_changes_nothing_and_no_batch_is_rolled_out_for_a_step_that_does_not_run(
        rows, batch, epochs, save_every, per_execution, eval_every, max_steps):
    if rows < batch:
        return
    kw = dict(batch_size=batch, responses_per_prompt=2, epochs=epochs, save_every=save_every, max_steps=max_steps,
              steps_per_execution=per_execution, eval_every=eval_every, eval_dataset_path="s3://bucket-name/e.jsonl")
    s0, s1 = state(dataset_rows=rows, eval_rows=3), state(dataset_rows=rows, eval_rows=3)
    sequential = walk(s0, cfg(**kw), overlap=False)
    overlapped = walk(s1, cfg(**kw, max_staleness=1), overlap=True)
    assert overlapped == sequential
    trained = [x for x in sequential if x[0] == "train"]
    assert len(trained) == min(max_steps, (min(rows, rows) // batch) * epochs)
    assert s1.ahead_batch is None


# ---------------------------------------------------------------------------- budget limits


def _spent_state(*, step_usd: list[float], spent_usd: float, session_started: float = 1000.0, **kw):
    """A run at the start of step ``len(step_usd)``: the ledger's total is ``spent_usd`` (as Lambda time)
    and its last steps cost ``step_usd``."""
    from stepwise.records import StepCost, Usage

    s = state(dataset_rows=100, step=len(step_usd), cursor=2 * len(step_usd), session_created_at=session_started, **kw)
    s.ledger.usage.add(Usage(lambda_gb_seconds={"Gateway": spent_usd / 0.0000166667}))
    s.ledger.recent_steps = [StepCost(step=i, usd=u, session_seconds=10.0 * (i + 1), wall_seconds=20.0)
                             for i, u in enumerate(step_usd)]
    s.ledger.run_started_at = session_started
    return s


def test_max_cost_usd_stops_before_the_step_that_would_pass_it_projecting_the_costliest_recent_step():
    c = cfg(batch_size=2, max_cost_usd=1.0, session_usd_per_hour=1e-9)  # the session all but free
    below = _spent_state(step_usd=[0.1, 0.3, 0.2], spent_usd=0.69)
    assert stopping.stop_reason(below, c, 1000.0) is None  # 0.69 + 0.3 <= 1.0
    over = _spent_state(step_usd=[0.1, 0.3, 0.2], spent_usd=0.71)
    reason = stopping.stop_reason(over, c, 1000.0)
    assert reason == ("max_cost_usd: $0.7100 spent, the next step projected at $0.3000 each (the largest of the "
                      "last 3 step(s)): $1.0100 against the limit $1.0000 (the run would pass it)")
    assert not is_failure_stop(reason)
    d = decide(over, c, now=lambda: 1000.0)
    assert (d.action, over.stop_reason) == ("checkpoint", reason)  # the graceful path: the final save_state
    first = _spent_state(step_usd=[], spent_usd=0.5)  # no step has ended: nothing to project yet
    assert stopping.stop_reason(first, c, 1000.0) is None


def test_session_and_wall_clock_hours_project_the_longest_recent_step():
    c = cfg(batch_size=2, max_session_hours=0.01, max_run_hours=1.0)  # 36 s of session
    s = _spent_state(step_usd=[0, 0], spent_usd=0, session_started=1000.0)  # recent steps: 10 s, 20 s of session
    assert stopping.stop_reason(s, c, 1010.0) is None  # 10 s + 20 s <= 36 s
    reason = stopping.stop_reason(s, c, 1017.0)  # 17 s + 20 s > 36 s
    assert reason.startswith("max_session_hours: 0.0047 session-hours spent, the next step projected at "
                             "0.0056 session-hours each")
    late = _spent_state(step_usd=[0, 0], spent_usd=0, session_started=1.0)
    late.session_stopped = True  # no session time at all: the wall clock alone binds
    assert stopping.stop_reason(late, c, 3581.0) is None  # 3580 s + 20 s = 1 h
    assert stopping.stop_reason(late, c, 3582.0).startswith("max_run_hours: 0.9947 hours spent")


def test_a_projection_made_while_the_step_trains_adds_that_steps_cost_too():
    c = cfg(batch_size=2, max_staleness=1, max_cost_usd=1.0, session_usd_per_hour=1e-9)
    s = _spent_state(step_usd=[0.3], spent_usd=0.45)
    s.sampler_model_package_arn = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1"
    assert stopping.ahead_reason(s, c, 1000.0, s.step) is None  # rebound: one step to go, 0.75
    reason = stopping.ahead_reason(s, c, 1000.0, s.step + 1)  # still training: two steps, 1.05
    assert reason is not None and "the next 2 steps projected" in reason and "$1.0500" in reason
    assert s.ledger.pending_steps == 0  # the projection was made on a copy
    assert "pending_steps" not in s.model_dump()["ledger"]  # and is never written


def test_each_limit_warns_once_at_its_fraction_and_the_checks_are_kept_for_the_summary():
    from stepwise.core import ledger

    c = cfg(batch_size=2, max_cost_usd=1.0, session_usd_per_hour=1e-9, budget_warning_fraction=0.5)
    s = _spent_state(step_usd=[0.1], spent_usd=0.3)
    assert stopping.record_checks(s, c, 1000.0) == []  # 0.4 < 0.5
    s.ledger.usage.add(ledger.lambda_usage("Gateway", 1024, 0.2 / 0.0000166667, requests=0))
    warned = stopping.record_checks(s, c, 1000.0)  # 0.6 >= 0.5
    assert len(warned) == 1 and warned[0].startswith("max_cost_usd at 60% of its limit after step 1")
    assert stopping.record_checks(s, c, 1000.0) == []  # once
    assert s.ledger.warned == ["max_cost_usd"]
    assert ledger.check_metrics(s) == pytest.approx({"budget/max_cost_usd_limit": 1.0, "budget/max_cost_usd_spent": 0.5,
                                                     "budget/max_cost_usd_next_step": 0.1,
                                                     "budget/max_cost_usd_projected": 0.6}, abs=1e-6)
    s2 = _spent_state(step_usd=[0.1], spent_usd=0.3)
    s2.current_batch = None
    d = decide(s2, cfg(batch_size=2, max_cost_usd=1.0, session_usd_per_hour=1e-9, budget_warning_fraction=0.3))
    assert d.action == "rollout" and len(d.warnings) == 1  # PlanStep logs and notifies it
