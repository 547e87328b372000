"""`stepwise.handlers._leftovers`: the record a run's end hands to the session sweeper (what is left, who
holds it), on moto's S3. The clean-up itself at scale: tests/drills/test_run_end_at_scale.py."""

from __future__ import annotations

import time

import boto3
import pytest
from moto import mock_aws

from stepwise.aws.runstore import RunStore
from stepwise.config import RunConfig
from stepwise.handlers import _leftovers
from stepwise.layout import leftovers_key
from stepwise.records import PlannedBatch

BUCKET = "stepwise-leftovers-test"
CFG = RunConfig.model_validate({
    "region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/R", "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/agent",
    "dataset_path": f"s3://{BUCKET}/d.jsonl", "batch_size": 2})


@pytest.fixture
def rs(monkeypatch):
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        yield RunStore(BUCKET, s3)


def _batch(step: int) -> PlannedBatch:
    return PlannedBatch(kind="train", step=step, rows=[0, 1], responses_per_prompt=2)


def test_nothing_to_leave_writes_nothing_and_a_second_end_merges_into_the_first(rs):
    assert _leftovers.hand_over(rs, "r", batches=[None, None], retention=False, reason="finished",
                                deadline=time.monotonic() + 5) is None
    assert not rs.exists(leftovers_key("r"))
    first = _leftovers.hand_over(rs, "r", batches=[_batch(3), None], retention=False, reason="failed: X",
                                 deadline=time.monotonic() + 30, sids=["s1"])
    assert first is not None and 25 < first.held_until - time.time() <= 30
    merged = _leftovers.hand_over(rs, "r", batches=[_batch(3), _batch(4)], retention=True, reason="execution FAILED",
                                  deadline=time.monotonic() + 5, sids=["s1", "s2"])
    assert [b.step for b in merged.batches] == [3, 4] and merged.sids == ["s1", "s2"] and merged.retention
    assert merged.since == first.since and _leftovers.read(rs, "r")[0] == merged
    assert _leftovers.pending(rs) == ["r"]


def test_the_sweeper_takes_only_leftovers_nobody_holds_and_only_one_taker_wins(rs):
    _leftovers.hand_over(rs, "r", batches=[_batch(1)], retention=False, reason="x", deadline=time.monotonic() + 60)
    assert _leftovers.take(rs, "r", time.monotonic() + 60) is None  # the stop path still holds it
    _leftovers.update(rs, "r", lambda rec: setattr(rec, "held_until", 0.0))  # it released it (or died: its deadline passed)
    found = _leftovers.read(rs, "r")
    taken = _leftovers.take(rs, "r", time.monotonic() + 60)
    assert taken is not None and taken.held_until > time.time()
    assert _leftovers.take(rs, "r", time.monotonic() + 60) is None  # now held by the first taker
    rec, stale_etag = found  # a second sweeper that read before the first took it: its conditional write loses
    rec.held_until = 1.0
    with pytest.raises(Exception, match="PreconditionFailed|412"):
        rs.put_json(leftovers_key("r"), rec.model_dump(), if_match=stale_etag)


def test_a_record_left_with_nothing_to_do_is_deleted_and_work_that_never_succeeds_is_given_up(rs):
    _leftovers.hand_over(rs, "r", batches=[], retention=False, reason="x", deadline=time.monotonic(), sids=["a"])
    assert _leftovers.update(rs, "r", lambda rec: setattr(rec, "sids", [])) is None
    assert not rs.exists(leftovers_key("r")) and _leftovers.pending(rs) == []

    _leftovers.hand_over(rs, "s", batches=[_batch(2)], retention=False, reason="x", deadline=time.monotonic())
    for n in range(1, _leftovers.MAX_PASSES):
        report = _leftovers.work_off(rs, CFG, "s", deadline=time.monotonic() - 1)  # no time: nothing done
        assert report["left"] == {"sids": 0, "batches": 1, "groups": 0, "retention": False}
        assert _leftovers.read(rs, "s")[0].passes == n and _leftovers.read(rs, "s")[0].held_until == 0.0
    report = _leftovers.work_off(rs, CFG, "s", deadline=time.monotonic() - 1)
    assert report["left"] is None and not rs.exists(leftovers_key("s"))  # given up, logged as an error


def test_a_group_engine_end_hands_over_its_stopped_groups_whose_started_rollouts_without_record_are_in_flight(rs):
    """admission group: the batch the loop planned has no rollouts of its own (its groups' are in their
    folders): the end hands over the group executions it stopped, (id, attempt), resolved to the sids
    started without a record in each group's folder."""
    from stepwise.handlers._rollout_sessions import rollouts_in_flight
    from stepwise.layout import rollout_key, start_marker_key

    engine_batch = PlannedBatch(kind="train", step=3, group_engine=True)
    rec = _leftovers.hand_over(rs, "g", batches=[engine_batch, None], retention=False, reason="x",
                               deadline=time.monotonic() + 5, groups=[(4, 0), (7, 1), (4, 0)])
    assert rec is not None and rec.batches == [] and rec.groups == [[4, 0], [7, 1]]
    merged = _leftovers.hand_over(rs, "g", batches=[], retention=False, reason="y", deadline=time.monotonic(),
                                  groups=[(7, 1), (9, 0)])
    assert merged.groups == [[4, 0], [7, 1], [9, 0]]
    for group, attempt, i, sid, recorded in ((4, 0, 0, "a", False), (4, 0, 1, "b", True), (7, 1, 0, "c", False),
                                             (7, 0, 0, "old", False)):  # attempt 0 of group 7 is not handed over
        rs.put_json(start_marker_key("g", 0, 0, "train", i, group=group, attempt=attempt), {"sid": sid})
        if recorded:
            rs.put_json(rollout_key("g", 0, 0, sid, group=group, attempt=attempt), {"sid": sid})
    assert rollouts_in_flight(rs, "g", [], workers=2, deadline=time.monotonic() + 30,
                              groups=[(g, a) for g, a in merged.groups]) == ["a", "c"]
