"""Each invocation measures itself and its measurement rides in a record it writes anyway
(`stepwise.metering`): counted once, never lost to a failed write, S3 requests by price class,
the handler entrypoint naming the function and its configured memory."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import boto3
import pytest
from moto import mock_aws

from tests.support.planning import state

from stepwise import metering
from stepwise.aws.runstore import RunStore
from stepwise.records import Usage

BUCKET = "stepwise-metering-test"


@pytest.fixture
def store():
    metering.CARRY.clear()
    outside = metering._CURRENT.set(None)  # a test that fails mid-invocation leaves no meter behind
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        rs = RunStore(BUCKET, s3)
        rs.create_state(state())  # run "r"
        yield rs
    metering._CURRENT.reset(outside)
    metering.CARRY.clear()


def test_a_ride_carries_the_invocation_since_its_last_ride_and_what_the_process_carried(store):
    metering.CARRY.put("r", Usage(s3_get_class=7))
    token = metering.begin("PlanStep", 1024)
    time.sleep(0.05)
    first = metering.ride("r")
    assert first.usage.s3_get_class == 7 and first.usage.lambda_requests == {"PlanStep": 1}
    assert first.usage.lambda_gb_seconds["PlanStep"] >= 0.05
    first.commit()
    second = metering.ride("r")  # right after: only the few microseconds since, no second request
    assert second.usage.lambda_requests == {} and second.usage.s3_get_class == 0
    assert second.usage.lambda_gb_seconds["PlanStep"] < 0.04
    second.cancel()
    rest = metering.end(token)
    assert rest.lambda_requests == {} and metering.CARRY.pending("r").lambda_gb_seconds["PlanStep"] == pytest.approx(
        rest.lambda_gb_seconds["PlanStep"])


def test_a_failed_write_gives_the_carried_measurements_back(store):
    metering.CARRY.put("r", Usage(s3_put_class=3))
    with pytest.raises(RuntimeError):
        with metering.riding("r") as usage:
            assert usage.s3_put_class == 3
            raise RuntimeError("the PUT failed")
    assert metering.CARRY.pending("r").s3_put_class == 3
    with metering.riding("r") as usage:
        assert usage.s3_put_class == 3
    assert metering.CARRY.pending("r").is_empty()


def test_every_state_write_adds_the_measurements_once_even_when_it_is_retried_on_a_conflict(store):
    token = metering.begin("Rebind", 2048)
    metering.bind_run("r")
    calls = []

    def change(s):
        calls.append(1)
        if len(calls) == 1:  # another invocation writes in between: this write is retried on a fresh read
            other = threading.Thread(target=lambda: store.update_state("r", lambda t: setattr(t, "step", 5),
                                                                       execution_arn=None))
            other.start()
            other.join()

    after = store.update_state("r", change, execution_arn=None)
    assert len(calls) == 2 and after.step == 5
    assert after.ledger.usage.lambda_requests == {"Rebind": 1}
    assert after.ledger.usage.s3_get_class == 0  # this invocation's reads come after its ride: in its tail
    metering.end(token)
    again = store.update_state("r", lambda s: None, execution_arn=None)  # the tail rides with the next write
    assert again.ledger.usage.lambda_requests == {"Rebind": 1}
    assert again.ledger.usage.lambda_gb_seconds["Rebind"] > after.ledger.usage.lambda_gb_seconds["Rebind"]
    assert metering.CARRY.pending("r").is_empty()


def test_s3_requests_are_counted_by_price_class_once_per_attempt(store):
    token = metering.begin("FinishRollout", 1024)
    store.put_json("a.json", {"x": 1})
    store.get_json("a.json")
    store.list_keys("a")
    store.exists("missing.json")  # HEAD: GET-class
    store.s3.delete_object(Bucket=BUCKET, Key="a.json")  # free
    m = metering.current()
    assert (m.s3_put, m.s3_get) == (2, 2)
    metering.end(token)
    assert metering.current() is None
    store.get_json("runs/r/state.json")  # outside an invocation: nobody to count it for
    assert metering.CARRY.pending("r").is_empty()


@dataclass
class _Context:
    function_name: str = "local-StartRollout-abc"
    memory_limit_in_mb: int = 512
    invoked_function_arn: str = "arn:aws:lambda:us-east-1:123456789012:function:x"
    aws_request_id: str = "req"


def test_the_entrypoint_names_the_function_by_the_registry_and_bills_its_configured_memory(store):
    from pydantic import BaseModel

    from stepwise.handlers._common import entrypoint, function_name
    from stepwise.handlers.rollout import start_handler

    assert function_name(start_handler, _Context()) == "StartRollout"  # not the context's physical name

    class E(BaseModel):
        run_id: str

    def work(e: E) -> dict:
        metering.bind_run(e.run_id)
        time.sleep(0.1)
        return {}

    handler = entrypoint(E, work)
    handler({"run_id": "r"}, _Context(function_name="outside-the-registry", memory_limit_in_mb=2048))
    carried = metering.CARRY.pending("r")
    assert carried.lambda_requests == {"outside-the-registry": 1}
    assert 0.2 <= carried.lambda_gb_seconds["outside-the-registry"] < 1.0  # 2 GB x ~0.1 s
