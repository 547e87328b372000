"""Model selection (`stepwise.core.selection`): the best eval and the patience count against a direct
definition (Keras' EarlyStopping counter), early stopping through the planner with and without
overlapped steps (same stop, no batch rolled out for a step that does not run), and retention."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support.planning import cfg, state

from stepwise.config import RunConfig
from stepwise.core.phases import final_weights, rewind_to_checkpoint
from stepwise.core.planning import decide, plan_ahead
from stepwise.core.selection import (best_of, evals_since_best, improves, packages_to_delete, record_eval_point,
                                     refresh_best)
from stepwise.records import Checkpoint, EvalPoint, RunState

EVAL = {"eval_dataset_path": "s3://bucket-name/e.jsonl"}
values = st.lists(st.sampled_from([0.0, 0.1, 0.2, 0.25, 0.5, 0.9, 1.0]), min_size=1, max_size=15)


def _keras(history: list[float], mode: str, min_delta: float) -> tuple[int, int]:
    """Keras EarlyStopping's bookkeeping: (index of the best, wait = evals since it)."""
    best, best_i, wait = None, -1, 0
    for i, v in enumerate(history):
        better = best is None or (v > best + min_delta if mode == "max" else v < best - min_delta)
        if better:
            best, best_i, wait = v, i, 0
        else:
            wait += 1
    return best_i, wait


@settings(max_examples=300, deadline=None)
@given(values, st.sampled_from(["max", "min"]), st.sampled_from([0.0, 0.05, 0.3]))
def test_best_and_evals_since_it_follow_the_keras_counter(vs, mode, min_delta):
    history = [EvalPoint(step=2 * i, value=v, model_package_arn=f"arn{i}") for i, v in enumerate(vs)]
    best_i, wait = _keras(vs, mode, min_delta)
    assert best_of(history, mode, min_delta) == history[best_i]
    assert evals_since_best(history, mode, min_delta) == wait


def test_improves_needs_more_than_min_delta_and_a_tie_keeps_the_earlier_best():
    assert improves(0.5, None, "max", 0.1) and not improves(0.6, 0.5, "max", 0.1) and improves(0.61, 0.5, "max", 0.1)
    assert improves(0.3, 0.5, "min", 0.1) and not improves(0.45, 0.5, "min", 0.1)
    history = [EvalPoint(step=0, value=0.1), EvalPoint(step=2, value=1.0, model_package_arn="a"),
               EvalPoint(step=4, value=1.0, model_package_arn="b")]
    assert best_of(history, "max", 0.0).model_package_arn == "a"


def walk_with_evals(s: RunState, c: RunConfig, values_by_eval: list[float], *, overlap: bool) -> list[tuple]:
    """Drive the planner as the state machine does, each eval scoring the next of ``values_by_eval``
    (the last repeats) on the sampler package of its step; every action seen."""
    seen: list[tuple] = []
    evals = 0
    for _ in range(500):
        d = decide(s, c)
        if d.action == "checkpoint":
            seen.append(("checkpoint", s.step, s.checkpoint_reason))
            s.checkpoints.append(Checkpoint(step=s.step, kind="state", model_package_arn=f"state{s.step}",
                                            reason=s.checkpoint_reason, epoch=s.epoch, cursor=s.cursor))
            s.final_checkpoint_done |= s.checkpoint_reason == "final"
            s.phase, s.checkpoint_reason, s.pending = "idle", "", []
            continue
        if d.action == "continue":
            s.segment_start_step = s.step
            continue
        if d.action == "finish":
            seen.append(("finish", s.step))
            return seen
        if d.kind == "eval":
            value = values_by_eval[min(evals, len(values_by_eval) - 1)]
            evals += 1
            seen.append(("eval", d.step, value))
            s.current_batch, s.last_eval_step = None, d.step
            record_eval_point(s, c, d.step, {"eval/accuracy": value}, s.sampler_model_package_arn)
            continue
        seen.append(("train", d.step))
        s.current_batch = None
        if overlap:
            plan_ahead(s, c, d.step)
            assert s.ahead_batch is None or s.ahead_batch.step == d.step + 1
        s.step += 1
        s.policy_version += 1
        s.sampler_model_package_arn = f"sampler{s.step}"
        s.generation_batch = 0
    raise AssertionError(f"no finish: {seen[-5:]}")


def test_early_stopping_ends_the_run_patience_evals_after_the_plateau_with_a_final_checkpoint():
    c = cfg(batch_size=1, responses_per_prompt=2, eval_every=2,
            early_stopping={"patience": 2, "min_delta": 0.01}, **EVAL)
    s = state(dataset_rows=100, eval_rows=3)
    seen = walk_with_evals(s, c, [0.1, 0.5, 0.9, 0.9, 0.905, 0.9], overlap=False)
    evals = [x for x in seen if x[0] == "eval"]
    assert [e[1] for e in evals] == [0, 2, 4, 6, 8]  # the best at step 4, two evals without gain, stop
    assert seen[-2:] == [("checkpoint", 8, "final"), ("finish", 8)]
    assert s.best == EvalPoint(step=4, value=0.9, model_package_arn="sampler4")
    assert s.stop_reason == ("early_stopping: eval/accuracy has not improved by more than 0.01 (max) for 2 evals "
                             "(patience 2); best 0.9 at step 4; history: step 0: 0.1, step 2: 0.5, step 4: 0.9, "
                             "step 6: 0.9, step 8: 0.905")


@settings(max_examples=150, deadline=None)
@given(values, st.integers(1, 3), st.integers(1, 3), st.sampled_from([0.0, 0.05]), st.booleans())
def test_with_early_stopping_overlap_changes_nothing_and_no_batch_is_rolled_out_past_the_stop(
        vs, patience, eval_every, min_delta, baseline):
    kw = dict(batch_size=1, responses_per_prompt=2, eval_every=eval_every, eval_before_train=baseline,
              early_stopping={"patience": patience, "min_delta": min_delta}, **EVAL)
    s0, s1 = state(dataset_rows=40, eval_rows=3), state(dataset_rows=40, eval_rows=3)
    sequential = walk_with_evals(s0, cfg(**kw), vs, overlap=False)
    overlapped = walk_with_evals(s1, cfg(**kw, max_staleness=1), vs, overlap=True)
    assert overlapped == sequential
    assert s1.ahead_batch is None
    evals = [x[2] for x in sequential if x[0] == "eval"]
    best_i, wait = _keras(evals, "max", min_delta)
    if s0.stop_reason is not None:  # stopped early: exactly when the counter reached patience
        assert wait == patience and s0.stop_reason.startswith("early_stopping:")
    else:
        assert wait < patience or sequential[-1] == ("finish", 40)


def test_retention_keeps_the_best_the_final_weights_and_the_newest_checkpoint():
    s = state(dataset_rows=10, step=6, sampler_model_package_arn="w6",
              created_packages=["w1", "w2", "state2", "w3", "w4", "w5", "state6", "w6"],
              checkpoints=[Checkpoint(step=2, kind="state", model_package_arn="state2", reason="save_every"),
                           Checkpoint(step=6, kind="state", model_package_arn="state6", reason="final")],
              best=EvalPoint(step=3, value=0.9, model_package_arn="w3"), deleted_packages=["w1"])
    assert final_weights(s).model_package_arn == "w6"
    delete, kept = packages_to_delete(s)
    assert delete == ["w2", "state2", "w4", "w5"] and kept == ["w3", "state6", "w6"]
    s.best = EvalPoint(step=0, value=0.1)  # the base model was best: nothing more is kept for it
    assert "w3" in packages_to_delete(s)[0]


def test_a_rewind_drops_the_evals_after_the_checkpoint_and_the_best_is_recomputed():
    c = cfg(batch_size=1, eval_every=2, early_stopping={"patience": 3}, **EVAL)
    s = state(dataset_rows=10, step=6, eval_steps=[0, 2, 4, 6], last_eval_step=6, session_stopped=True,
              checkpoints=[Checkpoint(step=2, kind="state", model_package_arn="state2", reason="save_every",
                                      epoch=0, cursor=2, policy_version=2)])
    for step, value in ((0, 0.1), (2, 0.5), (4, 0.9), (6, 0.7)):
        record_eval_point(s, c, step, {"eval/accuracy": value}, f"w{step}")
    assert s.best.step == 4
    rewind_to_checkpoint(s, session_name="s2", created_at=0.0)
    refresh_best(s, c)
    assert [p.step for p in s.eval_history] == [0, 2] and s.best.step == 2


def test_an_eval_only_run_and_a_summary_without_the_metric_record_nothing():
    c = cfg(batch_size=1, eval_every=2, early_stopping={"metric": "eval/pass@1"}, **EVAL)
    s = state(dataset_rows=10)
    assert not record_eval_point(s, c, 0, {"eval/accuracy": 1.0}, "") and s.eval_history == []
    assert record_eval_point(s, c, 0, {"eval/pass@1": 0.5}, "") and s.best.value == 0.5
    s2 = state(dataset_rows=10, eval_only=True)
    assert not record_eval_point(s2, c, 0, {"eval/pass@1": 0.5}, "") and s2.best is None


@pytest.mark.parametrize("field,value,fragment", [
    ("early_stopping", {"metric": "accuracy"}, "must be an eval metric"),
    ("early_stopping", {"metric": "eval/hard/accuracy"}, "no eval set named 'hard'"),
    ("early_stopping", {"metric": "eval/mixed@1"}, "the eval reports accuracy, mean@1, pass@1"),
])
def test_an_early_stopping_metric_the_eval_does_not_report_is_refused(field, value, fragment):
    from stepwise.config import ConfigError, load_run_config
    from tests.support.planning import BASE

    with pytest.raises(ConfigError, match=fragment):
        load_run_config({**BASE, "eval_every": 2, **EVAL, field: value})


_METRIC_PART = st.one_of(st.sampled_from(["", "hard", "accuracy", "mean@4", "pass@1", "pass@4", "mixed@4", "all_pass@4",
                                          "mixed@1", "n", "prompts", "easy"]), st.text(max_size=8))


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(_METRIC_PART, min_size=1, max_size=3))
def test_an_early_stopping_metric_that_loads_is_a_key_the_eval_summary_holds(parts):
    """Any ``eval/...`` text: refused, or one of the keys `eval_metrics` writes for the configured sets
    (an accepted metric the summaries never hold would never stop the run nor choose a best package;
    ``eval//accuracy`` was accepted: its empty set name passed as the unnamed set's)."""
    from stepwise.config import ConfigError, load_run_config
    from stepwise.core.evals import eval_metrics
    from stepwise.records import EvalPrompt
    from tests.support.planning import BASE

    metric = "eval/" + "/".join(parts)
    try:
        c = load_run_config({**BASE, "eval_every": 2, **EVAL, "eval_datasets": {"hard": "s3://bucket-name/h.jsonl"},
                             "eval_group_size": 4, "eval_temperature": 1.0, "early_stopping": {"metric": metric}})
    except ConfigError:
        return
    prompts = [EvalPrompt(eval_set=s, row=0, input_id=s or "u", fingerprint="f", rewards_G=[1.0, 0.0, 1.0, 0.0],
                          statuses_G=["ok"] * 4, successes=2) for s in ("", "hard")]
    assert c.early_stopping.metric in eval_metrics(prompts, ["", "hard"], c.pass_ks), metric


@settings(max_examples=100, deadline=None)
@given(unnamed=st.booleans(), named=st.lists(st.sampled_from(["gsm", "math", "held-out"]), unique=True, max_size=3),
       early=st.booleans())
def test_the_selection_metric_is_a_key_the_runs_eval_summary_holds_for_any_eval_sets(unnamed, named, early):
    """Whatever eval sets a run names (the unnamed one, named ones, both) and with or without
    early_stopping, the selection metric is one of the keys its eval writes (`eval_metrics`), so every
    eval records a point and a best (before: ``eval/accuracy`` whatever the sets, absent with only named
    sets, so the best stayed null and retention deleted the best package)."""
    from stepwise.core.evals import EvalPrompt, eval_metrics
    from stepwise.core.selection import criterion

    if not unnamed and not named:
        return
    sets = {"eval_dataset_path": "s3://bucket-name/e.jsonl"} if unnamed else {}
    sets |= {"eval_datasets": {n: f"s3://bucket-name/{n}.jsonl" for n in named}} if named else {}
    c = cfg(batch_size=1, eval_every=2, **sets, **({"early_stopping": {"patience": 2}} if early and unnamed else {}))
    names = list(c.eval_set_paths)
    prompts = [EvalPrompt(eval_set=n, row=i, input_id=f"p{i}", fingerprint="f", rewards_G=[1.0], statuses_G=["ok"],
                          successes=1) for i, n in enumerate(names)]
    summary = eval_metrics(prompts, names, c.pass_ks)
    assert criterion(c).metric in summary
    s = state(dataset_rows=10)
    assert record_eval_point(s, c, 0, summary, "") and s.best is not None


def test_best_and_last_with_only_a_named_eval_set_keeps_the_best_package():
    """The hostile-use case: ``best_and_last``, one eval set in ``eval_datasets``, no early_stopping; the
    eval scores 0.9 at step 1, then 0.2 and 0.2. The best is step 1 and its package is kept (before:
    ``best`` null and the step-1 package deleted with the intermediate ones)."""
    c = cfg(batch_size=1, eval_every=1, eval_datasets={"held": "s3://bucket-name/h.jsonl"},
            keep_model_packages="best_and_last")
    s = state(dataset_rows=10, step=3, sampler_model_package_arn="w3", created_packages=["w1", "w2", "w3"])
    for step, value in ((1, 0.9), (2, 0.2), (3, 0.2)):
        record_eval_point(s, c, step, {"eval/held/accuracy": value, "eval/held/n": 4}, f"w{step}")
    assert s.best is not None and s.best.step == 1 and s.best.model_package_arn == "w1"
    delete, kept = packages_to_delete(s)
    assert "w1" in kept and "w1" not in delete and delete == ["w2"]
