"""Fault and latency drills: injected throttling, 5xx and failed operations, sessions that
never start, and the counters tests use to prove "applied once" / "nothing sampled"."""

from __future__ import annotations

import json
import time
import urllib.request

import pytest
from botocore.exceptions import ClientError

from sagemaker.train.training_session import AdamParams, OperationError, SamplingParams

from tests.support.simulator import control_client, create_session, running_simulator, runtime_client


@pytest.fixture(scope="module")
def sim():
    yield from running_simulator(fault_seed=7)


@pytest.fixture(scope="module")
def tc(sim):
    from sagemaker.train.training_session import ServiceClient

    svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path)
    client = svc.create_lora_training_client(base_model="stepwise-tiny")
    yield client
    client.stop()


@pytest.fixture(autouse=True)
def _clean(sim):
    sim.clear_faults()
    yield
    sim.clear_faults()


def test_throttled_submits_are_retried_by_the_sdk_and_the_step_is_applied_once(sim, tc):
    before = sim.counters
    sim.inject_fault("throttle:ExecuteTrainingOperation:2")
    tc.optim_step(AdamParams(learning_rate=1e-3)).result(timeout=30)
    after = sim.counters
    assert after["ExecuteTrainingOperation"] - before.get("ExecuteTrainingOperation", 0) == 3
    assert after["optim_step"] - before.get("optim_step", 0) == 1


def test_server_errors_while_polling_are_survived(sim, tc):
    before = sim.counters.get("optim_step", 0)
    sim.inject_fault("internal:GetTrainingOperationResult:2")
    tc.optim_step(AdamParams(learning_rate=1e-3)).result(timeout=30)
    assert sim.counters["optim_step"] == before + 1


def test_a_failed_operation_surfaces_as_operation_error_and_is_not_applied(sim, tc):
    before = sim.counters.get("optim_step", 0)
    sim.inject_fault("fail:optim_step:1")
    with pytest.raises(OperationError, match="injected fault"):
        tc.optim_step(AdamParams(learning_rate=1e-3)).result(timeout=30)
    assert sim.counters.get("optim_step", 0) == before
    tc.optim_step(AdamParams(learning_rate=1e-3)).result(timeout=30)  # the next one runs
    assert sim.counters["optim_step"] == before + 1


def test_throttling_refuses_before_anything_is_sampled(sim, tc):
    rt = runtime_client(sim)
    before = sim.counters.get("sample", 0)
    sim.inject_fault("throttle:ExecuteSamplingOperation:1")
    with pytest.raises(ClientError) as exc:
        rt.execute_sampling_operation(
            trainingSessionName=tc.training_session_name,
            operationConfig={"sample": {"prompt": {"chunks": [{"tokens": [257, 10], "type": "encoded_text"}]},
                                        "numSamples": 1, "samplingParams": {"maxTokens": 512}}},
        )
    assert exc.value.response["Error"]["Code"] == "ThrottlingException"
    assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 429
    assert sim.counters.get("sample", 0) == before


def test_binding_and_warm_up_answer_a_503_the_sdk_retries_as_transient(sim, svc):
    """The 'not ready' answers (a runtime warming up after Running, a checkpoint still binding after
    its save) are 503s the SDK's own rule calls transient, so its clients ride them out."""
    from sagemaker.train.training_session.exceptions import is_retryable

    sim.set_not_ready(warmup_seconds=1.5, binding_seconds=1.5)
    try:
        before = sim.counters
        tc = svc.create_lora_training_client(base_model="stepwise-tiny")  # Running: warming up for 1.5 s
        with pytest.raises(ClientError) as exc:
            runtime_client(sim).get_training_operation_result(trainingSessionName=tc.training_session_name,
                                                              operationId="op-00000000-000000000000")
        assert exc.value.response["ResponseMetadata"]["HTTPStatusCode"] == 503 and is_retryable(exc.value)
        tc.optim_step(AdamParams(learning_rate=1e-3)).result(timeout=30)  # the SDK retried the submit
        sampler = tc.save_weights_and_get_sampling_client()  # loadWeightsForSampling: binding, retried
        after = sim.counters
        assert after["ExecuteTrainingOperation"] - before.get("ExecuteTrainingOperation", 0) > 2
        assert after["ExecuteSamplingOperation"] - before.get("ExecuteSamplingOperation", 0) > 1
        assert after["load_weights_for_sampling"] - before.get("load_weights_for_sampling", 0) == 1
        assert sampler.model_package_arn
        tc.stop()
    finally:
        sim.set_not_ready(warmup_seconds=0, binding_seconds=0)


def test_window_faults_refuse_every_call_for_a_while_and_expire_moves_a_session_to_expired(sim):
    sm = control_client(sim)
    sim.inject_fault("unavailable:ListTrainingSessions:0.6s")
    with pytest.raises(ClientError) as exc:
        sm.list_training_sessions()
    assert exc.value.response["Error"]["Code"] == "ServiceUnavailable"
    time.sleep(0.7)
    sm.list_training_sessions()  # the window closed
    name = create_session(sim, "expiring")
    sim.inject_fault("expire:DescribeTrainingSession:1")
    detail = sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["TrainingSessionStatus"] == "Expired" and "injected fault" in detail["ErrorDetails"]
    assert name not in sim.running_sessions()
    with pytest.raises(ClientError, match="invalid session state transition from Expired to Stopping"):
        sm.stop_training_session(TrainingSessionName=name)


def test_rate_faults_hit_a_fraction_of_calls(sim):
    sm = control_client(sim)
    sim.inject_fault("throttle:ListTrainingSessions:0.5")
    throttled = 0
    for _ in range(40):
        try:
            sm.list_training_sessions()
        except ClientError as e:
            assert e.response["Error"]["Code"] == "ThrottlingException"
            throttled += 1
    assert 8 <= throttled <= 32


def test_latency_per_operation_kind(sim, tc):
    sc = tc.create_sampling_client()
    sim.set_latency("sample", 0.4)
    started = time.monotonic()
    sc.sample([257, 117, 10], num_samples=1, sampling_params=SamplingParams(max_tokens=512, temperature=0.0)).result(timeout=30)
    assert time.monotonic() - started >= 0.4


def test_sessions_that_never_start_or_fail_to_start(sim):
    sm = control_client(sim)
    sim.set_session_start("hang")
    try:
        with pytest.raises(AssertionError, match="did not reach Running"):
            create_session(sim, "never-runs", timeout=0.5)
        assert "never-runs" in sim.running_sessions()
        sm.stop_training_session(TrainingSessionName="never-runs")
        assert "never-runs" not in sim.running_sessions()

        sim.set_session_start("fail")
        from sagemaker.train.training_session import ServiceClient

        svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path)
        before = sim.counters.get("CreateTrainingSession", 0)
        with pytest.raises(RuntimeError, match="Failed.*injected fault"):
            svc.create_lora_training_client(base_model="stepwise-tiny")
        assert sim.counters["CreateTrainingSession"] == before + 1
    finally:
        sim.set_session_start("ok")


def test_faults_and_state_are_reachable_over_http_from_another_process(sim):
    req = urllib.request.Request(
        f"{sim.url}/_simulator/faults", data=json.dumps({"faults": ["throttle:ListTrainingSessions:1"]}).encode(), method="POST"
    )
    armed = json.loads(urllib.request.urlopen(req).read())
    assert armed["faults"][0]["target"] == "ListTrainingSessions"
    with pytest.raises(ClientError):
        control_client(sim).list_training_sessions()
    state = json.loads(urllib.request.urlopen(f"{sim.url}/_simulator/state").read())
    assert state["counters"]["ListTrainingSessions"] >= 1
    assert isinstance(state["running_sessions"], list)
