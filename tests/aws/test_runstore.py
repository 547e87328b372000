"""The run store: conditional state.json writes (S3 If-Match / If-None-Match, as moto honours them)."""

from __future__ import annotations

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from stepwise.layout import parse_result_key, result_key, state_key
from stepwise.records import RunState
from stepwise.aws.runstore import RunOwnedElsewhere, RunStore, StateConflict

OWNER = "arn:aws:states:us-east-1:123456789012:execution:sm:run-1"


@pytest.fixture
def rs(monkeypatch):
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(k, v)
    for k in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(k, raising=False)
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket="runstore-test")
        store = RunStore("runstore-test", s3)
        store.create_state(RunState(run_id="run-1", owner_execution_arn=OWNER, training_session_name="s"))
        yield store


def test_a_concurrent_write_is_not_lost_the_change_is_reapplied(rs):
    calls = []

    def change(state: RunState) -> None:
        calls.append(state.step)
        if len(calls) == 1:  # another writer gets in between our read and our write
            other, etag = rs.read_state("run-1")
            other.cursor = 7
            rs.put_json(state_key("run-1"), other.model_dump(), if_match=etag)
        state.step += 1

    state = rs.update_state("run-1", change, execution_arn=OWNER)
    assert len(calls) == 2 and state.step == 1 and state.cursor == 7
    assert rs.read_state("run-1")[0].cursor == 7


def test_a_first_read_the_caller_made_is_used_once_and_a_stale_one_only_costs_a_retry(rs):
    """PlanStep reads state.json before its update (the ledger's counted history): ``first_read`` saves the
    update's own GET, and a write that got in between is not lost (the write is conditional on its ETag)."""
    gets = []
    rs.s3.meta.events.register("after-call.s3.GetObject", lambda **_: gets.append(1))
    first = rs.read_state("run-1")
    assert rs.update_state("run-1", lambda s: setattr(s, "step", s.step + 1), execution_arn=OWNER,
                           first_read=first).step == 1
    assert len(gets) == 1  # the caller's read only

    stale = rs.read_state("run-1")
    other, etag = rs.read_state("run-1")
    rs.put_json(state_key("run-1"), other.model_dump() | {"cursor": 5}, if_match=etag)
    state = rs.update_state("run-1", lambda s: setattr(s, "step", s.step + 1), execution_arn=OWNER, first_read=stale)
    assert (state.step, state.cursor) == (2, 5) and rs.read_state("run-1")[0].cursor == 5


def test_stale_etags_and_second_creations_are_refused(rs):
    _, etag = rs.read_state("run-1")
    rs.update_state("run-1", lambda s: setattr(s, "step", 3), execution_arn=OWNER)
    with pytest.raises(ClientError) as e:
        rs.put_json(state_key("run-1"), {"x": 1}, if_match=etag)
    assert e.value.response["Error"]["Code"] == "PreconditionFailed"
    with pytest.raises(RunOwnedElsewhere, match="already exists"):
        rs.create_state(RunState(run_id="run-1", owner_execution_arn="arn:other", training_session_name="s"))
    assert rs.read_state("run-1")[0].step == 3


def test_only_the_owner_may_change_the_run_and_conflicts_are_bounded(rs):
    with pytest.raises(RunOwnedElsewhere, match="owned by execution"):
        rs.update_state("run-1", lambda s: setattr(s, "step", 9), execution_arn=OWNER + "-2")

    def always_conflicting(state: RunState) -> None:
        other, etag = rs.read_state("run-1")
        rs.put_json(state_key("run-1"), other.model_dump() | {"cursor": other.cursor + 1}, if_match=etag)

    with pytest.raises(StateConflict):
        rs.update_state("run-1", always_conflicting, execution_arn=OWNER, attempts=3)
    assert rs.read_state("run-1")[0].step == 0


def test_bulky_objects_are_tagged_for_expiry(rs):
    rs.put_json("runs/run-1/steps/0/gen0/items.json", [{"i": 0}], bulk=True)
    tags = rs.s3.get_object_tagging(Bucket="runstore-test", Key="runs/run-1/steps/0/gen0/items.json")["TagSet"]
    assert tags == [{"Key": "stepwise-class", "Value": "bulk"}]
    assert rs.s3.get_object_tagging(Bucket="runstore-test", Key=state_key("run-1"))["TagSet"] == []


def test_result_keys_round_trip_and_bad_keys_are_named():
    key = result_key("exp=1+a", "s3g0p1", "sid-1")
    assert key == "rollout-results/exp=1+a/s3g0p1/sid-1.json"
    assert parse_result_key(key) == ("exp=1+a", "s3g0p1", "sid-1")
    with pytest.raises(ValueError, match="expected rollout-results/RUN_ID/INPUT_ID/SID.json"):
        parse_result_key("rollout-results/run/sid.json")


def test_final_weights_are_the_weights_saved_at_the_end_else_the_sampler_else_none():
    from stepwise.core.phases import final_weights
    from stepwise.records import Checkpoint, RunState

    state = RunState(run_id="r", owner_execution_arn="e", training_session_name="s", step=5, policy_version=4)
    assert final_weights(state) is None  # nothing trained: the sampler is the base model
    state.checkpoints = [Checkpoint(step=5, kind="state", reason="final", model_package_arn="arn:state")]
    assert final_weights(state) is None  # a save_state checkpoint resumes a run; it is not the weights
    state.sampler_model_package_arn = "arn:sampler"
    got = final_weights(state)
    assert (got.step, got.kind, got.reason, got.model_package_arn, got.policy_version) == (5, "weights", "sampler", "arn:sampler", 4)
    state.checkpoints.append(Checkpoint(step=5, kind="weights", reason="weights_at_end", model_package_arn="arn:end"))
    assert final_weights(state).model_package_arn == "arn:end"


def test_many_objects_are_read_in_parallel_in_order_within_the_pool_each_get_counted(rs):
    """`RunStore.get_json_many` (ComputeAdvantages' read of a step's rollout records): the objects in the
    order of the keys, parsed in the reading threads, at most the client's connection pool of GETs at once
    (10 here; a GET from a Lambda takes tens of ms: one at a time, 1,024 records are tens of seconds), every
    GET counted for the invocation that asked (the threads run in its context), an absent key named (the
    time it saves: benchmarks/advantages_read.py)."""
    import threading
    import time

    from stepwise import metering

    keys = [f"runs/run-1/steps/0/gen0/rollouts/s{i:03d}.json" for i in range(40)]
    for i, k in enumerate(keys):
        rs.put_json(k, {"i": i})
    lock, in_flight, peak = threading.Lock(), [0], [0]

    def slow(**_):  # each GET takes 20 ms, as from a Lambda
        with lock:
            in_flight[0] += 1
            peak[0] = max(peak[0], in_flight[0])
        time.sleep(0.02)
        with lock:
            in_flight[0] -= 1

    rs.s3.meta.events.register("before-send.s3.GetObject", slow)
    token = metering.begin("ComputeAdvantages", 2048)
    try:
        got = rs.get_json_many(list(reversed(keys)), lambda obj: obj["i"])
        assert got == list(reversed(range(40)))
        assert metering.current().s3_get == 40
    finally:
        metering.end(token)
        metering.CARRY.clear()
    assert 1 < peak[0] <= rs.s3.meta.config.max_pool_connections == 10  # one at a time: 1 (and 0.8 s here)
    assert rs.get_json_many([], None) == []
    with pytest.raises(KeyError, match="missing"):
        rs.get_json_many(keys[:3] + ["runs/run-1/missing.json"])


def test_a_bounded_read_returns_an_object_up_to_the_bound_and_names_the_size_of_a_longer_one(rs):
    """`RunStore.get_json_bounded` (FinishRollout's read of the agent's result): one ranged GET; an object up
    to the bound is parsed, a longer one raises ObjectTooLarge with its size and is never read whole; an
    empty object (no byte 0 to range over) is read as it is, an absent one is a KeyError."""
    from stepwise.aws.runstore import ObjectTooLarge

    body = b'{"rewards": 1.0, "pad": "' + b"x" * 100 + b'"}'
    rs.s3.put_object(Bucket=rs.bucket, Key="r/fits.json", Body=body)
    assert rs.get_json_bounded("r/fits.json", len(body))["rewards"] == 1.0
    with pytest.raises(ObjectTooLarge) as e:
        rs.get_json_bounded("r/fits.json", len(body) - 1)
    assert e.value.size == len(body) and e.value.key == "r/fits.json"
    rs.s3.put_object(Bucket=rs.bucket, Key="r/empty.json", Body=b"")
    with pytest.raises(ValueError):
        rs.get_json_bounded("r/empty.json", 10)
    with pytest.raises(KeyError):
        rs.get_json_bounded("r/none.json", 10)
