"""The runtime's ordering, dedupe and conflict rules and its error answers, pinned with raw
boto3 calls (no SDK in between)."""

from __future__ import annotations

import time

import pytest
from botocore.exceptions import ClientError, ParamValidationError

from local.simulator import start_simulator

from tests.support.simulator import control_client, create_session, runtime_client, unique_name, wait_op

STEP = {"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-3}}}


def _fb(tokens: list[int]) -> dict:
    n = len(tokens)
    return {
        "forwardBackward": {
            "lossFnName": "cross_entropy",
            "datumList": [
                {
                    "modelInput": {"chunks": [{"tokens": tokens, "type": "encoded_text"}]},
                    "lossFnInputs": {
                        "target_tokens": {"data": tokens[1:] + [0], "dtype": "int64"},
                        "weights": {"data": [1.0] * n, "dtype": "float32"},
                    },
                }
            ],
        }
    }


@pytest.fixture(scope="module")
def sim():
    handle = start_simulator(result_wait_seconds=0.0)
    yield handle
    handle.stop()


@pytest.fixture()
def session(sim, request):
    name = create_session(sim, unique_name(request.node.name))
    yield name
    try:
        control_client(sim).stop_training_session(TrainingSessionName=name)
    except ClientError:
        pass


def _code(excinfo) -> str:
    return excinfo.value.response["Error"]["Code"]


def test_a_gap_in_sequence_numbers_blocks_later_operations_until_filled(sim, session):
    rt = runtime_client(sim)
    before = sim.counters.get("optim_step", 0)
    op3 = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=3, clientToken="t3", operationConfig=STEP)
    op1 = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="t1", operationConfig=_fb([1, 2, 3]))
    assert wait_op(rt, session, op1["operationId"])["status"] == "Completed"
    time.sleep(0.3)
    assert rt.get_training_operation_result(trainingSessionName=session, operationId=op3["operationId"])["status"] == "Pending"
    assert sim.counters.get("optim_step", 0) == before
    op2 = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="t2", operationConfig=_fb([4, 5]))
    assert wait_op(rt, session, op2["operationId"])["status"] == "Completed"
    done = wait_op(rt, session, op3["operationId"])
    assert done["status"] == "Completed"
    assert done["operationResult"]["optimizerStep"]["metrics"]["learning_rate"] == pytest.approx(1e-3)
    assert sim.counters["optim_step"] == before + 1
    detail = control_client(sim).describe_training_session(TrainingSessionName=session)["TrainingSessionDetail"]
    assert detail["LastReceivedSequenceNumber"] == 3


def test_same_sequence_and_token_returns_the_original_operation_and_applies_once(sim, session):
    rt = runtime_client(sim)
    rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="fb", operationConfig=_fb([1, 2]))
    before = sim.counters.get("optim_step", 0)
    first = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="step-2", operationConfig=STEP)
    again = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="step-2", operationConfig=STEP)
    assert again["operationId"] == first["operationId"]
    assert wait_op(rt, session, first["operationId"])["status"] == "Completed"
    # A retry after completion still answers the original operation, and nothing is re-applied.
    late = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="step-2", operationConfig=STEP)
    assert late["operationId"] == first["operationId"]
    time.sleep(0.2)
    assert sim.counters["optim_step"] == before + 1


def test_same_sequence_with_another_token_is_a_conflict(sim, session):
    rt = runtime_client(sim)
    rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="a", operationConfig=STEP)
    with pytest.raises(ClientError) as exc:
        rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="b", operationConfig=STEP)
    assert _code(exc) == "ConflictException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 409
    assert "clientToken" in exc.value.response["Error"]["Message"]


def test_unknown_session_and_operation_are_resource_not_found(sim, session):
    rt = runtime_client(sim)
    with pytest.raises(ClientError) as exc:
        rt.execute_training_operation(trainingSessionName="no-such-session", sequenceNumber=1, clientToken="x", operationConfig=STEP)
    assert _code(exc) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as exc:
        rt.get_training_operation_result(trainingSessionName=session, operationId="op-missing")
    assert _code(exc) == "ResourceNotFoundException"
    with pytest.raises(ClientError) as exc:
        control_client(sim).describe_training_session(TrainingSessionName="no-such-session")
    assert _code(exc) == "ResourceNotFound"


def test_requests_outside_the_botocore_shapes_are_validation_errors(sim, session):
    rt = runtime_client(sim)
    # Above the modelled maximum learning rate (0.01): botocore does not check maxima, the service does.
    with pytest.raises(ClientError) as exc:
        rt.execute_training_operation(
            trainingSessionName=session, sequenceNumber=1, clientToken="x",
            operationConfig={"optimizerStep": {"adamParamsConfig": {"learningRate": 0.5}}},
        )
    assert _code(exc) == "ValidationException"
    assert "learningRate" in exc.value.response["Error"]["Message"]
    # A loss name outside the modelled enum (botocore does not check enums client-side).
    bad = _fb([1, 2])
    bad["forwardBackward"]["lossFnName"] = "mse"
    with pytest.raises(ClientError) as exc:
        rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="y", operationConfig=bad)
    assert _code(exc) == "ValidationException" and "cross_entropy" in exc.value.response["Error"]["Message"]
    # botocore refuses some bad input client-side already (minimums, required members).
    with pytest.raises(ParamValidationError):
        rt.execute_training_operation(trainingSessionName=session, sequenceNumber=0, clientToken="z", operationConfig=STEP)


def test_invalid_requests_sent_past_the_client_are_refused_by_the_service(sim, session):
    import json
    import urllib.request

    req = urllib.request.Request(
        f"{sim.url}/v1/training-sessions/{session}/operations",
        data=json.dumps({"sequenceNumber": 0, "operationConfig": STEP}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    assert exc.value.code == 400
    body = json.loads(exc.value.read())
    assert body["__type"] == "ValidationException" and "sequenceNumber" in body["message"]
    # A union with two members set.
    req = urllib.request.Request(
        f"{sim.url}/v1/training-sessions/{session}/operations",
        data=json.dumps({"sequenceNumber": 1, "clientToken": "u", "operationConfig": {**STEP, "saveState": {}}}).encode(),
        method="POST",
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req)
    body = json.loads(exc.value.read())
    assert body["__type"] == "ValidationException" and "tagged union" in body["message"]


def test_a_failing_operation_ends_failed_with_error_details_and_later_ones_still_run(sim, session):
    rt = runtime_client(sim)
    bad = _fb([1, 2, 3])
    bad["forwardBackward"]["datumList"][0]["lossFnInputs"]["weights"]["data"] = [1.0]  # wrong length
    op1 = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="a", operationConfig=bad)
    op2 = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="b", operationConfig=_fb([1, 2, 3]))
    failed = wait_op(rt, session, op1["operationId"])
    assert failed["status"] == "Failed" and "weights" in failed["errorDetails"]
    assert wait_op(rt, session, op2["operationId"])["status"] == "Completed"


def test_operations_on_a_stopped_session_are_refused_and_queued_ones_skipped(sim, session):
    rt = runtime_client(sim)
    queued = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=2, clientToken="q", operationConfig=STEP)
    control_client(sim).stop_training_session(TrainingSessionName=session)
    assert rt.get_training_operation_result(trainingSessionName=session, operationId=queued["operationId"])["status"] == "Skipped"
    with pytest.raises(ClientError) as exc:
        rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="a", operationConfig=STEP)
    assert _code(exc) == "ValidationException" and "Running" in exc.value.response["Error"]["Message"]


def test_operation_status_is_asynchronous(sim, session):
    rt = runtime_client(sim)
    sim.set_latency("optim_step", 0.5)
    try:
        op = rt.execute_training_operation(trainingSessionName=session, sequenceNumber=1, clientToken="a", operationConfig=STEP)
        first = rt.get_training_operation_result(trainingSessionName=session, operationId=op["operationId"])
        assert first["status"] in ("Pending", "InProgress") and "operationResult" not in first
        assert wait_op(rt, session, op["operationId"])["status"] == "Completed"
    finally:
        sim.clear_faults()
