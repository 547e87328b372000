"""The overlap's pure rules (stepwise.core.staleness): the staleness bound ComputeAdvantages asserts,
the per-step staleness figures, when a step may be rolled out ahead, and session busy/idle time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepwise.core.staleness import (
    MAX_SUPPORTED_STALENESS,
    StalenessExceeded,
    check_staleness,
    roll_out_ahead_blocker,
    session_time_metrics,
    staleness_metrics,
    staleness_R,
)


def test_on_policy_batch_has_zero_staleness_and_passes_at_zero():
    check_staleness([4, 4, 4], 4, 0)
    assert staleness_metrics([4, 4, 4], 4) == {"staleness/max": 0.0, "staleness/mean": 0.0,
                                               "staleness/stale_fraction": 0.0}


def test_one_version_old_batch_is_refused_at_zero_and_accepted_at_one():
    with pytest.raises(StalenessExceeded, match=r"update policy version 5 with 2 rollout\(s\) 1 version\(s\) old "
                                                r"\(max_staleness 0\); sampled versions \[4, 5\]"):
        check_staleness([4, 4, 5], 5, 0)
    check_staleness([4, 4, 5], 5, 1)
    m = staleness_metrics([4, 4, 5, 5], 5)
    assert m == {"staleness/max": 1.0, "staleness/mean": 0.5, "staleness/stale_fraction": 0.5}


def test_two_versions_old_or_a_future_version_is_refused_at_one():
    with pytest.raises(StalenessExceeded, match="2 version"):
        check_staleness([3, 5], 5, 1, where="step 7")
    with pytest.raises(StalenessExceeded, match="newer than the policy"):
        check_staleness([6], 5, 1)


def test_records_without_a_version_count_as_on_policy():
    assert staleness_R([None, 2], 3) == [0, 1]
    check_staleness([None], 9, 0)


@given(st.lists(st.integers(0, 50), max_size=40), st.integers(0, 50), st.integers(0, MAX_SUPPORTED_STALENESS))
def test_check_accepts_exactly_the_versions_within_the_bound(versions, trained, bound):
    ok = all(trained - bound <= v <= trained for v in versions)
    try:
        check_staleness(versions, trained, bound)
        raised = False
    except StalenessExceeded:
        raised = True
    assert raised is not ok
    if versions:
        m = staleness_metrics(versions, trained)
        assert m["staleness/max"] == max(trained - v for v in versions)
        assert 0.0 <= m["staleness/stale_fraction"] <= 1.0
    else:
        assert staleness_metrics(versions, trained) == {}


def test_roll_out_ahead_blockers():
    free = dict(finishing=False, save_due=False, segment_ends=False)
    assert roll_out_ahead_blocker(max_staleness=1, **free) is None
    assert roll_out_ahead_blocker(max_staleness=0, **free) == "max_staleness 0"
    assert roll_out_ahead_blocker(max_staleness=1, **(free | {"finishing": True})) == "no next training step"
    assert "checkpoint" in roll_out_ahead_blocker(max_staleness=1, **(free | {"save_due": True}))
    assert "new one" in roll_out_ahead_blocker(max_staleness=1, **(free | {"segment_ends": True}))


def test_session_time_splits_the_step_wall_into_busy_and_idle():
    # sequential step: 10 s of rollouts after the previous rebind, then 4 s of training + rebind
    assert session_time_metrics(train_started_at=110.0, rebound_at=114.0, previous_end=100.0) == {
        "time/session_busy": 4.0, "time/session_idle": 10.0, "time/step_wall": 14.0,
        "session/busy_fraction": pytest.approx(4 / 14)}
    # overlapped step: the rollouts ran during the previous step's training; 1 s between
    m = session_time_metrics(train_started_at=101.0, rebound_at=105.0, previous_end=100.0)
    assert m["time/session_idle"] == 1.0 and m["time/step_wall"] == 5.0
    assert session_time_metrics(train_started_at=1.0, rebound_at=3.0, previous_end=None) == {"time/session_busy": 2.0}


def test_loss_outputs_are_summed_by_staleness_bucket():
    """The service's per-datum lossFnOutputs (the policy's logprobs) against the datum's sampler logprobs:
    KL (k1, log q - log p) and the clip fraction per staleness bucket, weighted tokens only."""
    import math

    from stepwise.core.staleness import loss_outputs_by_staleness, staleness_loss_metrics

    def datum(logq, weights):
        return {"lossFnInputs": {"logprobs": {"data": logq}, "weights": {"data": weights}}}

    datums = [datum([-1.0, -1.0, -2.0], [0, 1, 1]), datum([-1.0], [1]), datum([-3.0, -0.5], [1, 1])]
    outputs = [{"logprobs": {"data": [-5.0, -1.0, -1.0]}}, {"logprobs": {"data": [-1.0]}},
               {"logprobs": {"data": [-1.0, -0.5]}}]
    parts = loss_outputs_by_staleness(datums, outputs, [0, 0, 2], (0.8, 1.2))
    # bucket 0: tokens (q=-1, p=-1) and (q=-2, p=-1): kl 0 + (-1); ratio e^1 clipped; then (q=-1, p=-1)
    assert parts["0"] == pytest.approx([-1.0, 1.0, 3.0])
    assert parts["2"] == pytest.approx([-2.0, 1.0, 2.0])  # (q=-3, p=-1): ratio e^2 clipped; (-0.5, -0.5)
    m = staleness_loss_metrics([parts, {"2": [1.0, 0.0, 2.0]}])
    assert m == pytest.approx({"train/kl_staleness_0": -1 / 3, "train/clipfrac_staleness_0": 1 / 3,
                               "train/kl_staleness_2": -0.25, "train/clipfrac_staleness_2": 0.25})
    # a datum whose shapes do not match its output is left out, never raised
    assert loss_outputs_by_staleness([datum([-1.0], [1])], [{"logprobs": {"data": [1, 2]}}], [1], (0.8, 1.2)) == {}
    assert math.isfinite(loss_outputs_by_staleness([datum([-200.0], [1])], [{"logprobs": {"data": [0.0]}}], [0],
                                                   (0.8, 1.2))["0"][1])


def test_busy_fraction_is_busy_over_wall():
    from stepwise.core.staleness import session_time_metrics

    m = session_time_metrics(train_started_at=10.0, rebound_at=14.0, previous_end=6.0)
    assert m["session/busy_fraction"] == pytest.approx(0.5) and m["time/step_wall"] == 8.0
    assert "session/busy_fraction" not in session_time_metrics(train_started_at=1.0, rebound_at=2.0, previous_end=None)
