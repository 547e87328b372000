"""PlanStep's decision: batches over epochs from the cursor, evals, checkpoints, continue-as-new, the end."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from tests.support.planning import cfg, state

from stepwise.config import RunConfig
from stepwise.core.planning import build_items, decide
from stepwise.records import Checkpoint, RunState


def finish_step(s: RunState) -> None:
    """What ComputeAdvantages + Rebind do to the state after a trained step."""
    s.current_batch = None
    s.step += 1
    s.generation_batch = 0


def test_batches_walk_the_dataset_over_epochs_dropping_the_partial_batch():
    c = cfg(batch_size=3, responses_per_prompt=2, epochs=2)
    s = state(dataset_rows=7)
    rows = []
    while (d := decide(s, c)).action == "rollout":
        assert d.kind == "train" and d.responses_per_prompt == 2 and d.step == len(rows)
        rows.append((s.epoch, d.rows))
        finish_step(s)
    assert rows == [(0, [0, 1, 2]), (0, [3, 4, 5]), (1, [0, 1, 2]), (1, [3, 4, 5])]
    assert d.action == "checkpoint" and d.reason == "final save_state" and s.phase == "checkpoint"


def test_max_prompts_limits_the_rows_and_a_retry_replans_the_same_batch():
    c = cfg(batch_size=2, max_prompts=4)
    s = state(dataset_rows=100)
    first = decide(s, c)
    assert decide(s, c).rows == first.rows == [0, 1]  # PlanStep retried before the batch was consumed
    finish_step(s)
    assert decide(s, c).rows == [2, 3]
    finish_step(s)
    assert decide(s, c).action == "checkpoint"


def test_eval_every_then_final_eval_unless_one_ran_at_the_last_step():
    c = cfg(batch_size=1, eval_every=2, eval_dataset_path="s3://bucket-name/eval.jsonl", eval_max_prompts=3,
            eval_before_train=False)
    s = state(dataset_rows=3, eval_rows=5)
    seen = []
    for _ in range(20):
        d = decide(s, c)
        if d.action != "rollout":
            break
        seen.append((d.kind, d.step, d.final, len(d.rows)))
        if d.kind == "eval":
            s.current_batch = None
            s.last_eval_step = d.step
        else:
            finish_step(s)
    assert seen == [("train", 0, False, 1), ("train", 1, False, 1), ("eval", 2, False, 3),
                    ("train", 2, False, 1), ("eval", 3, True, 3)]
    s2 = state(dataset_rows=2, eval_rows=5)
    for _ in range(2):
        decide(s2, c)
        finish_step(s2)
    assert decide(s2, c).kind == "eval"  # step 2: periodic eval ...
    s2.current_batch, s2.last_eval_step = None, 2
    assert decide(s2, c).action == "checkpoint"  # ... and no second (final) eval at the same step


def _walk(s: RunState, c: RunConfig, limit: int = 30) -> list[tuple]:
    """Drive decide() as the state machine does; the rollouts seen: (kind, step, final, reason)."""
    seen = []
    for _ in range(limit):
        d = decide(s, c)
        if d.action == "checkpoint":
            s.phase, s.checkpoint_reason = "idle", ""
            if d.reason == "final save_state":
                s.final_checkpoint_done = True
            continue
        if d.action != "rollout":
            break
        seen.append((d.kind, d.step, d.final, d.reason))
        if d.kind == "eval":
            s.current_batch = None
            s.last_eval_step = d.step
            s.eval_steps = sorted({*s.eval_steps, d.step})
        else:
            finish_step(s)
    return seen


def test_baseline_eval_runs_once_at_step_0_before_the_first_training_batch():
    c = cfg(batch_size=1, eval_every=2, eval_dataset_path="s3://bucket-name/eval.jsonl", eval_max_prompts=3)
    assert c.eval_before_train is None and c.baseline_eval  # default: on with an eval dataset
    s = state(dataset_rows=2, eval_rows=5)
    first = decide(s, c)
    assert (first.kind, first.step, first.reason, len(first.rows), first.responses_per_prompt) == \
        ("eval", 0, "eval_before_train", 3, 1)
    again = decide(s, c)  # a retried PlanStep re-plans the same batch
    assert (again.kind, again.step, again.rows) == ("eval", 0, first.rows)
    s.current_batch, s.last_eval_step, s.eval_steps = None, 0, [0]
    assert [x[:2] for x in _walk(s, c)] == [("train", 0), ("train", 1), ("eval", 2)]
    # off explicitly, or no eval dataset: the first batch trains
    assert decide(state(dataset_rows=2, eval_rows=5), cfg(batch_size=1, eval_every=2, eval_before_train=False,
                                                          eval_dataset_path="s3://bucket-name/eval.jsonl")).kind == "train"
    assert not cfg().baseline_eval and decide(state(dataset_rows=2), cfg(batch_size=1)).kind == "train"
    # a run with no step to train evaluates once, not a baseline and then a final eval at the same step
    assert [x[:3] for x in _walk(state(dataset_rows=0, eval_rows=5), c)] == [("eval", 0, False)]


def test_eval_before_train_without_an_eval_dataset_is_refused():
    with pytest.raises(ValidationError, match="eval_before_train"):
        cfg(eval_before_train=True)


def test_a_resume_that_rewinds_to_step_0_does_not_evaluate_step_0_again():
    from stepwise.core.phases import rewind_to_checkpoint

    c = cfg(batch_size=1, eval_every=1, eval_dataset_path="s3://bucket-name/eval.jsonl", eval_max_prompts=2)
    s = state(dataset_rows=3, eval_rows=2)
    seen = []
    for _ in range(3):  # baseline, step 0, eval after step 1
        d = decide(s, c)
        seen.append((d.kind, d.step))
        if d.kind == "eval":
            s.current_batch, s.last_eval_step, s.eval_steps = None, d.step, sorted({*s.eval_steps, d.step})
        else:
            finish_step(s)
    assert seen == [("eval", 0), ("train", 0), ("eval", 1)]
    s.session_stopped = True  # the run failed here, with no save_state checkpoint: a resume restarts at step 0
    assert rewind_to_checkpoint(s, session_name="new", created_at=1.0) is None
    assert (s.step, s.last_eval_step, s.eval_steps) == (0, 0, [0])
    assert [x[:2] for x in _walk(s, c)][:3] == [("train", 0), ("eval", 1), ("train", 1)]


def test_save_every_checkpoints_at_the_start_of_due_steps_once():
    c = cfg(batch_size=1, save_every=2)
    s = state(dataset_rows=10, step=2)
    assert decide(s, c).action == "checkpoint" and s.checkpoint_reason == "save_every"
    s.phase, s.pending = "idle", []
    s.checkpoints.append(Checkpoint(step=2, kind="state", model_package_arn="arn:p", reason="save_every"))
    assert decide(s, c).action == "rollout"


def test_continue_as_new_every_steps_per_execution_then_end_sequence():
    c = cfg(batch_size=1, steps_per_execution=2, save_weights_at_end=True)
    s = state(dataset_rows=10, step=2, segment_start_step=0)
    assert decide(s, c).action == "continue"
    s.segment_start_step = 2  # the next execution took over
    assert decide(s, c).action == "rollout"
    s2 = state(dataset_rows=1, step=1, stop_reason="max_num_gen_batches (2) reached")
    assert decide(s2, c).reason == "final save_state"
    s2.phase, s2.pending, s2.final_checkpoint_done = "idle", [], True
    assert decide(s2, c).reason == "save_weights_at_end" and s2.pending[0].name == "save_weights"
    s2.phase, s2.pending, s2.final_weights_done = "idle", [], True
    d = decide(s2, c)
    assert d.action == "finish" and "max_num_gen_batches" in d.reason


def test_dapo_generation_batches_draw_new_prompts_within_the_step():
    c = cfg(algorithm="dapo", batch_size=2, epochs=1)
    s = state(dataset_rows=5)
    assert decide(s, c).rows == [0, 1]
    s.current_batch, s.generation_batch = None, 1  # ComputeAdvantages: need more
    d = decide(s, c)
    assert (d.step, d.generation_batch, d.rows) == (0, 1, [2, 3])
    s.current_batch, s.generation_batch = None, 2
    d = decide(s, c)  # only one row left: the data ran out mid-step
    assert d.action == "checkpoint" and s.stop_reason == "dataset exhausted during dynamic sampling"


def test_items_are_references_one_per_rollout_grouped_by_prompt():
    c = cfg(batch_size=2, responses_per_prompt=3)
    s = state(dataset_rows=4)
    d = decide(s, c)
    payloads = [{"prompt": f"q{i}", "big": "x" * 10_000} for i in range(4)]
    items, prompts = build_items(d, payloads)
    assert [(it.input_id, it.member) for it in items] == [
        ("s0g0p0", 0), ("s0g0p0", 1), ("s0g0p0", 2), ("s0g0p1", 0), ("s0g0p1", 1), ("s0g0p1", 2)]
    assert [it.i for it in items] == list(range(6)) and all(len(str(it.model_dump())) < 100 for it in items)
    assert prompts == {"s0g0p0": payloads[0], "s0g0p1": payloads[1]}


def test_history_budget_continues_before_a_step_that_would_not_fit_and_never_twice_in_a_row():
    c = cfg(batch_size=1, steps_per_execution=1000, history_event_budget=1000)
    s = state(dataset_rows=10)
    assert decide(s, c, history_events=11).action == "rollout"  # step 0 starts at event 11
    finish_step(s)
    # step 0 used 300 events: the next needs up to 2 x 300 + headroom; 311 + 650 <= 1000 goes on
    assert decide(s, c, history_events=311).action == "rollout" and s.max_step_events == 300
    finish_step(s)
    d = decide(s, c, history_events=611)  # 611 + 650 > 1000: continue before step 2
    assert d.action == "continue" and "history_event_budget 1000" in d.reason and s.current_batch is None
    # the next execution (its history starts over) plans step 2 even though the budget is tight
    s.segment, s.segment_start_step = s.segment + 1, s.step
    assert decide(s, c, history_events=11).action == "rollout" and s.step_start_event_segment == s.segment
    assert s.max_step_events == 300  # carried over from the earlier execution
    finish_step(s)
    assert decide(s, c, history_events=90).action == "rollout" and s.max_step_events == 300


def test_without_a_history_the_count_still_bounds_an_execution():
    c = cfg(batch_size=1, steps_per_execution=2)
    s = state(dataset_rows=10)
    for _ in range(2):
        assert decide(s, c, history_events=None).action == "rollout"
        finish_step(s)
    assert decide(s, c, history_events=None).action == "continue"


def test_rollouts_in_flight_stay_within_the_active_session_quota_and_the_tps_bound():
    """PlanStep's MaxConcurrency never passes acr_max_active_sessions (ACR's active-session quota: every
    rollout in flight holds a runtime session), acr_tps_limit x 8, the batch or 1,000, and is at least 1
    (hypothesis over the fields' whole ranges)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from stepwise.core.planning import map_concurrency
    from stepwise.core.service_limits import CONCURRENCY_PER_TPS, MAX_ACR_TPS_LIMIT, MAX_MAP_CONCURRENCY

    @settings(max_examples=300, deadline=None)
    @given(items=st.integers(1, 20_000), tps=st.integers(1, MAX_ACR_TPS_LIMIT), quota=st.integers(1, 10_000))
    def check(items: int, tps: int, quota: int) -> None:
        n = map_concurrency(items, tps, quota)
        assert 1 <= n <= min(items, tps * CONCURRENCY_PER_TPS, quota, MAX_MAP_CONCURRENCY)
        assert n == min(items, tps * CONCURRENCY_PER_TPS, quota, MAX_MAP_CONCURRENCY)

    check()
    assert cfg().acr_max_active_sessions == 500  # ACR's default quota outside us-east-1 / us-west-2
    from stepwise.config import ConfigError, load_run_config

    with pytest.raises(ConfigError, match="acr_max_active_sessions: .*Active session workloads per account"):
        load_run_config({**cfg().model_dump(), "acr_max_active_sessions": 0})


from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(n=st.integers(0, 3000), concurrency=st.integers(1, 1000), tps=st.integers(1, 125))
def test_a_batch_s_first_invokes_are_paced_under_the_tps_limit_and_the_rest_start_as_rollouts_end(n, concurrency, tps):
    """`start_offsets` on arbitrary batches: the Map's first ``concurrency`` children invoke at most
    ``floor(0.45 x tps)`` (at least 1) in any whole second, in item order, as early as that allows; the
    children the Map starts later (as rollouts end) do not wait."""
    from collections import Counter

    from stepwise.core.planning import START_PACE, start_offsets

    offsets = start_offsets(n, concurrency, tps)
    per_second = max(1, int(START_PACE * tps))
    first = offsets[:concurrency]
    assert len(offsets) == n and all(isinstance(s, int) and s >= 0 for s in offsets)
    assert first == sorted(first) and all(s == 0 for s in offsets[concurrency:])
    assert max(Counter(first).values(), default=0) <= min(per_second, tps)
    assert all(count == per_second for s, count in Counter(first).items() if s < max(first))  # no second left short
    assert max(first, default=0) == (min(n, concurrency) - 1) // per_second if n else True


def test_plan_writes_the_paced_offsets_into_the_items():
    """The toy batch (8 x 8 at acr_tps_limit 25, all 64 in flight): 11 invoke each second, the last 9 at 5 s."""
    from collections import Counter

    from stepwise.core.planning import map_concurrency, pace_starts

    c = cfg(batch_size=8, responses_per_prompt=8, acr_tps_limit=25)
    items, _ = build_items(decide(state(dataset_rows=100), c), [{"prompt": str(row)} for row in range(100)])
    paced = pace_starts(items, map_concurrency(len(items), c.acr_tps_limit), c.acr_tps_limit)
    assert Counter(it.start_after_seconds for it in paced) == {0: 11, 1: 11, 2: 11, 3: 11, 4: 11, 5: 9}
    assert [it.model_dump(exclude={"start_after_seconds"}) for it in paced] == [it.model_dump(exclude={"start_after_seconds"}) for it in items]
