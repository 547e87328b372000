"""The planner with overlapped steps (max_staleness 1): `plan_ahead` rolls out the next
step's first batch while a step trains, and `decide` hands it on at that step's start. Overlapping
changes when rollouts happen, never which prompts a step trains on, nor where evals, checkpoints,
continue-as-new and the end fall."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.planning import cfg, state

from stepwise.config import RunConfig
from stepwise.core.phases import PhaseMismatch, complete_phase, plan_checkpoint, rewind_to_checkpoint
from stepwise.core.planning import decide, plan_ahead
from stepwise.records import Checkpoint, PlannedBatch, RunState


def walk(s: RunState, c: RunConfig, *, overlap: bool, limit: int = 2000) -> list[tuple]:
    """Drive the planner as the state machine does; every action seen, with the rows of train batches.
    ``overlap``: after a train batch's advantages, run `plan_ahead` as the Parallel state does."""
    seen: list[tuple] = []
    for _ in range(limit):
        d = decide(s, c)
        if d.action == "checkpoint":
            seen.append(("checkpoint", s.step, s.checkpoint_reason, s.epoch, s.cursor))
            s.checkpoints.append(Checkpoint(step=s.step, kind="state", model_package_arn="arn", reason=s.checkpoint_reason,
                                            epoch=s.epoch, cursor=s.cursor, policy_version=s.policy_version))
            s.final_checkpoint_done |= s.checkpoint_reason == "final"
            s.phase, s.checkpoint_reason, s.pending = "idle", "", []
            continue
        if d.action == "continue":
            seen.append(("continue", s.step))
            s.segment += 1
            s.segment_start_step = s.step
            continue
        if d.action == "finish":
            seen.append(("finish", s.step))
            return seen
        if d.kind == "eval":
            seen.append(("eval", d.step))
            s.current_batch, s.last_eval_step = None, d.step
            continue
        seen.append(("train", d.step, tuple(d.rows)))
        s.current_batch = None  # ComputeAdvantages: train
        if overlap:
            plan_ahead(s, c, d.step)
        s.step += 1  # Rebind
        s.policy_version += 1
        s.sampler_model_package_arn = f"arn:aws:sagemaker:us-east-1:123456789012:model-package/g/{s.policy_version}"
        s.generation_batch = 0
    raise AssertionError(f"no finish in {limit} actions: {seen[-5:]}")


@settings(max_examples=150, deadline=None)
@given(rows=st.integers(1, 40), batch=st.integers(1, 6), epochs=st.integers(1, 3), save_every=st.integers(-1, 4),
       per_execution=st.integers(1, 5), eval_every=st.integers(0, 3))
def test_overlap_trains_the_same_prompts_at_the_same_steps_with_the_same_evals_and_checkpoints(
        rows, batch, epochs, save_every, per_execution, eval_every):
    kw = dict(batch_size=batch, responses_per_prompt=2, epochs=epochs, save_every=save_every,
              steps_per_execution=per_execution, eval_every=eval_every, eval_dataset_path="s3://bucket-name/e.jsonl")
    if rows < batch:
        return
    sequential = walk(state(dataset_rows=rows, eval_rows=3), cfg(**kw), overlap=False)
    overlapped = walk(state(dataset_rows=rows, eval_rows=3), cfg(**kw, max_staleness=1), overlap=True)
    assert overlapped == sequential  # checkpoints record the same epoch and cursor too


def test_the_next_batch_is_planned_while_a_step_trains_and_handed_on_at_its_start():
    c = cfg(batch_size=2, responses_per_prompt=2, max_staleness=1)
    s = state(dataset_rows=8, sampler_model_package_arn="arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1")
    assert decide(s, c).rows == [0, 1]
    s.current_batch = None
    s.phase = "train"  # step 0 trains ...
    d, why = plan_ahead(s, c, 0, now=lambda: 100.0)  # ... while step 1's batch is planned
    assert (d.step, d.rows, why, s.cursor, s.ahead_started_at, s.ahead_cursor_start) == (1, [2, 3], "planned", 4, 100.0, 2)
    again, _ = plan_ahead(s, c, 0)  # a retried PlanStep: the same batch, the cursor not moved twice
    assert (again.rows, s.cursor) == ([2, 3], 4)
    with pytest.raises(PhaseMismatch, match="rolled out ahead"):
        s.phase = "idle"
        plan_checkpoint(s, "save_every")  # a checkpoint never records a cursor past a batch rolled out ahead
    s.step, s.policy_version = 1, 1
    taken = decide(s, c, now=lambda: 200.0)
    assert (taken.action, taken.step, taken.rows) == ("rolled_out", 1, [2, 3])
    assert s.ahead_batch is None and s.current_batch.rows == [2, 3]
    assert (s.step_started_at, s.step_cursor_start) == (100.0, 2)  # the step's rollouts started during step 0


@pytest.mark.parametrize(("kw", "rows", "reason"), [
    ({"max_staleness": 0}, 8, "max_staleness 0"),
    ({"save_every": 1}, 8, "checkpoint"),
    ({"steps_per_execution": 1}, 8, "new one"),
    ({}, 2, "no next training step"),
])
def test_nothing_is_rolled_out_ahead_when_something_else_comes_first(kw, rows, reason):
    c = cfg(**({"batch_size": 2, "responses_per_prompt": 2, "max_staleness": 1} | kw))
    s = state(dataset_rows=rows)
    decide(s, c)
    s.current_batch = None
    before = s.model_dump()
    d, why = plan_ahead(s, c, 0)
    assert d is None and reason in why and s.model_dump() == before


def test_nothing_is_rolled_out_ahead_while_the_sampler_is_the_base_model():
    """For the service a sample without a model package runs on "the session's latest checkpoint", which
    the step being trained replaces (botocore's SampleConfig): rollouts planned on the base model ("")
    could sample the new weights while they record version 0. The first step (or any step still on
    the base model) is never overlapped; once the sampler names a package, the next step is."""
    c = cfg(batch_size=2, responses_per_prompt=2, max_staleness=1)
    s = state(dataset_rows=8)
    decide(s, c)
    s.current_batch, s.phase = None, "train"
    before = s.model_dump()
    d, why = plan_ahead(s, c, 0)
    assert d is None and "base model" in why and s.model_dump() == before
    s.sampler_model_package_arn = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1"  # resumed from a package
    d, why = plan_ahead(s, c, 0)
    assert why == "planned" and d.step == 1


def test_a_resume_drops_the_batch_rolled_out_ahead_and_rewinds_to_the_checkpoints_cursor():
    s = state(dataset_rows=8, step=3, policy_version=3, cursor=8, phase="train",
              checkpoints=[Checkpoint(step=2, kind="state", model_package_arn="arn:ck", reason="save_every",
                                      epoch=0, cursor=4, policy_version=2)])
    s.ahead_batch = PlannedBatch(kind="train", step=4, rows=[6, 7], responses_per_prompt=2)
    s.ahead_started_at, s.ahead_cursor_start = 50.0, 6
    rewind_to_checkpoint(s, session_name="s2", created_at=0.0)
    assert (s.step, s.cursor, s.policy_version, s.ahead_batch, s.ahead_started_at) == (2, 4, 2, None, None)


def test_rebind_reports_how_long_the_session_was_busy_and_idle():
    from stepwise.records import PendingOperation

    s = state(step=1, phase="rebind", step_started_at=90.0, last_rebound_at=100.0, train_started_at=103.0,
              pending=[PendingOperation(name="load_weights_for_sampling", kind="sampling", argument="arn:w")])
    complete_phase(s, now=lambda: 110.0)
    assert s.step_metrics == {"time/session_busy": 7.0, "time/session_idle": 3.0, "time/step_wall": 10.0,
                              "session/busy_fraction": 0.7}
    assert (s.step, s.last_rebound_at, s.train_started_at) == (2, 110.0, None)
