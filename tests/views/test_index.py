"""stepwise.views.index: the report index stays bounded whatever the run's length, draws what the
summaries said, adds a step once, and lets go of the trackers' lease only when nothing waits."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.records import ReportIndex
from stepwise.views import index as ix

KEYS = ["sampler/mean_reward", "time/rollout"]


def _run(steps: int) -> ReportIndex:
    index = ReportIndex()
    for s in range(steps):
        ix.add_step(index, "train", s, {"sampler/mean_reward": s / 100, "time/rollout": 10.0}, None, curve_keys=KEYS,
                    track=False)
    return index


def test_curves_are_bounded_exact_for_the_newest_steps_and_binned_evenly_before():
    sizes = {n: len(_run(n).model_dump_json()) for n in (100, 1000, 5000)}
    assert sizes[5000] <= sizes[1000] * 1.2, sizes
    index = _run(5000)
    points = index.series["train"]["sampler/mean_reward"]
    assert len(points) <= ix.MAX_POINTS
    assert [p[0] for p in points[-ix.TAIL:]] == list(range(5000 - ix.TAIL, 5000))  # the newest, one per step
    widths = {int(p[1] - p[0] + 1) for p in points[:-ix.TAIL] if p[1] < 4900}
    assert len(widths) == 1, widths  # the run's beginning binned evenly (aligned, power-of-two bins)
    for x, y in ix.series(index, "train", "sampler/mean_reward"):  # a bin is drawn at its mean, mid-step
        assert math.isclose(y, x / 100, rel_tol=1e-4)
    assert {y for _, y in ix.series(index, "train", "time/rollout")} == {10.0}


def test_a_step_is_added_once_and_a_late_one_joins_its_bin():
    index = _run(300)
    before = index.model_dump_json()
    assert ix.add_step(index, "train", 299, {"sampler/mean_reward": 9.0}, None, curve_keys=KEYS, track=True) is False
    assert index.model_dump_json() == before
    index.published = []  # long forgotten: a very late retry of step 0 is counted into its bin
    ix.add_step(index, "train", 0, {"sampler/mean_reward": 0.0}, None, curve_keys=KEYS, track=False)
    assert sum(p[3] for p in index.series["train"]["sampler/mean_reward"]) == 301


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ok", "error", "timeout"]), st.integers(0, 80), st.integers(1, 5)),
                max_size=200))
def test_failures_by_cause_are_capped_and_keep_their_total(failures):
    index = ReportIndex()
    for status, cause, count in failures:
        ix.add_failures(index, [{"status": status, "cause": f"cause {cause}", "count": count,
                                 "examples": [{"step": 1, "kind": "train", "sid": "s", "input_id": "p"}] * 5}])
    assert len(index.failures) <= ix.MAX_CAUSES
    assert sum(f["count"] for f in index.failures) == sum(c for _, _, c in failures)
    assert all(len(f["examples"]) <= 3 for f in index.failures)


def test_the_lease_is_let_go_only_when_nothing_waits_and_a_lapsed_one_is_taken_over():
    index = ReportIndex()
    ix.enqueue(index, "train", 3)
    assert ix.take_lease(index, "a", now=100.0, until=400.0)
    assert not ix.take_lease(index, "b", now=200.0, until=500.0)  # held
    assert not ix.release(index, "a", ["mlflow"])  # an item waits
    assert ix.start_item(index, "train", 3, "a")
    ix.record_outcome(index, "train", 3, "mlflow", None)
    assert ix.next_item(index, ["mlflow"]) is None and ix.release(index, "a", ["mlflow"]) and index.lease is None
    ix.enqueue(index, "eval", 3)
    assert ix.take_lease(index, "a", now=100.0, until=400.0)
    assert ix.take_lease(index, "b", now=401.0, until=700.0)  # a's lapsed with its Lambda's timeout
    assert not ix.start_item(index, "eval", 3, "a")  # a can no longer start anything


def test_an_item_tried_too_often_is_given_up_with_a_warning():
    index = ReportIndex()
    ix.enqueue(index, "train", 1)
    ix.take_lease(index, "a", now=0.0, until=10.0)
    for _ in range(ix.MAX_ATTEMPTS):
        assert ix.next_item(index, ["wandb"]) is not None
        ix.start_item(index, "train", 1, "a")
    assert ix.next_item(index, ["wandb"]) is None
    assert index.warnings and "gave up" in index.warnings[-1][2]
