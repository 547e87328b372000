"""What a simulated session samples once it loaded new weights (the ``serving`` option,
`local.simulator.service`): several packages, only the latest (refusing the others, or answering them
with it), or a load that spoils the samples in flight. Through the unmodified SDK."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from botocore.exceptions import ClientError
from sagemaker.train.training_session import AdamParams, Datum, ModelInput, SamplingParams, SamplingClient, TensorData

from local.simulator.service import DISTURBED_LOGPROB_SHIFT
from tests.support.simulator import runtime_client, running_simulator, wait_op

PROMPT = list(b"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
GREEDY = SamplingParams(max_tokens=512, temperature=0.0, seed=1)


@pytest.fixture(scope="module")
def sim():
    yield from running_simulator(sampling_workers=6)


@pytest.fixture(scope="module")
def packages(sim):
    """A session with two saved and loaded packages: A (the base weights) then B (after a training step)."""
    from sagemaker.train.training_session import ServiceClient

    svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn,
                        s3_output_path=sim.s3_output_path)
    tc = svc.create_lora_training_client(base_model="stepwise-tiny", rank=8, alpha=16)
    try:
        a = tc.save_weights_and_get_sampling_client()
        ids = PROMPT + list(b"zzzz")
        datum = Datum(model_input=ModelInput.from_ints(ids[:-1]),
                      loss_fn_inputs={"target_tokens": TensorData(data=ids[1:], dtype="int64"),
                                      "weights": TensorData(data=[1.0] * (len(ids) - 1))})
        tc.forward_backward([datum], loss_fn="cross_entropy").result()
        tc.optim_step(AdamParams(learning_rate=1e-2)).result()
        b = tc.save_weights_and_get_sampling_client()
        yield tc, a, b
    finally:
        tc.stop()


def _sample(client: SamplingClient):
    return client.sample(prompt=PROMPT, num_samples=1, sampling_params=GREEDY).result(timeout=30).sequences[0]


def _load(sim, tc, arn: str) -> None:
    """loadWeightsForSampling of ``arn`` in ``tc``'s session, to its end."""
    rt = runtime_client(sim)
    op = rt.execute_sampling_operation(trainingSessionName=tc.training_session_name,
                                       operationConfig={"loadWeightsForSampling": {"modelPackageArn": arn}})
    assert wait_op(rt, tc.training_session_name, op["operationId"], sampling=True)["status"] == "Completed"


@pytest.fixture
def serving(sim):
    yield sim.set_serving
    sim.set_serving("several")
    sim.clear_faults()


def test_several_serves_the_package_named_latest_refuses_the_others_and_switching_answers_with_the_latest(
        sim, packages, serving):
    tc, a, b = packages
    serving("several")
    ref_a, ref_b = _sample(a), _sample(b)
    assert ref_a.logprobs != ref_b.logprobs  # the training step changed the weights
    serving("latest")  # B was loaded last
    assert _sample(b).logprobs == ref_b.logprobs
    with pytest.raises(ClientError, match="is not loaded for sampling"):
        _sample(a)
    base = SamplingClient(tc.training_session_name, runtime_client(sim), model_package_arn="")
    assert _sample(base).logprobs == ref_b.logprobs  # no package named: the one loaded last
    serving("switching")
    assert _sample(a).logprobs == ref_b.logprobs  # named A, answered by B, silently
    serving("several")
    assert _sample(a).logprobs == ref_a.logprobs


@pytest.mark.parametrize("mode", ["several", "latest", "switching", "disturbing"])
def test_only_a_disturbing_session_spoils_the_samples_in_flight_across_a_load(sim, packages, serving, mode):
    tc, a, b = packages
    serving("several")
    _load(sim, tc, b.model_package_arn)
    truth = _sample(b)
    serving(mode)
    sim.set_latency("sample", 0.6)
    sim.set_latency("load_weights_for_sampling", 0.2)
    with ThreadPoolExecutor(2) as pool:
        in_flight = pool.submit(_sample, b)
        time.sleep(0.1)  # accepted, not answered
        _load(sim, tc, b.model_package_arn)  # the same package again: only the load itself can disturb
        spanning = in_flight.result()
    assert spanning.tokens == truth.tokens
    if mode == "disturbing":
        half = len(truth.logprobs) // 2
        assert spanning.logprobs[:half] == truth.logprobs[:half]
        assert spanning.logprobs[half:] == pytest.approx([x - DISTURBED_LOGPROB_SHIFT for x in truth.logprobs[half:]])
    else:
        assert spanning.logprobs == truth.logprobs
    sim.clear_faults()
    assert _sample(b).logprobs == truth.logprobs  # a sample that does not span a load is never disturbed


def test_sampling_slows_while_a_training_operation_runs_when_contention_is_set(sim, packages, serving):
    tc, a, b = packages
    sim.set_serving("several", contention_seconds=0.4)
    sim.set_latency("optim_step", 1.0)
    try:
        t0 = time.monotonic()
        _sample(b)
        idle = time.monotonic() - t0
        step = tc.optim_step(AdamParams(learning_rate=1e-9))
        time.sleep(0.2)
        t0 = time.monotonic()
        _sample(b)
        busy = time.monotonic() - t0
        step.result()
    finally:
        sim.set_serving("several", contention_seconds=0.0)
    assert busy >= idle + 0.35
