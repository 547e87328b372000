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
    s = state(dataset_rows=20)
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
