"""Session lifecycle and model packages, through the SDK and raw boto3."""

from __future__ import annotations

import os
import time

import pytest
import torch
from botocore.exceptions import ClientError

from local.simulator import start_simulator
from sagemaker.train.training_session import AdamParams, ModelPackageKind, SamplingParams, ServiceClient

from tests.support.simulator import control_client, session_request


def _status(sm, name):
    return sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]["TrainingSessionStatus"]


@pytest.fixture()
def slow_transitions(sim):
    sim.set_session_start("ok", seconds=1.5)
    sim.simulator.session_stop_seconds = 1.0
    yield
    sim.set_session_start("ok", seconds=0.0)
    sim.simulator.session_stop_seconds = 0.0


def _wait_status(sm, name, status, timeout=10.0):
    deadline = time.monotonic() + timeout
    while _status(sm, name) != status:
        assert time.monotonic() < deadline, f"{name} never reached {status}"
        time.sleep(0.05)


def test_session_goes_created_running_stopping_stopped_then_deletes(sim, slow_transitions):
    sm = control_client(sim)
    name = "lifecycle"
    sm.create_training_session(**session_request(sim, name))
    assert _status(sm, name) == "Created"
    with pytest.raises(ClientError) as exc:
        sm.create_training_session(
            TrainingSessionName=name, LoraConfig={"Rank": 8, "Alpha": 16}, RoleArn=sim.role_arn,
            ModelConfig={"BaseModelArn": f"arn:aws:sagemaker:{sim.region}:aws:hub-content/SageMakerPublicHub/Model/stepwise-tiny/1.0.0"},
            OutputConfig={"S3Location": {"Path": sim.s3_output_path}},
        )
    assert exc.value.response["Error"]["Code"] == "ResourceInUse"
    with pytest.raises(ClientError) as exc:
        sm.delete_training_session(TrainingSessionName=name)
    assert exc.value.response["Error"]["Code"] == "ValidationException"
    _wait_status(sm, name, "Running")
    assert name in sim.running_sessions()
    summaries = sm.list_training_sessions(StatusEquals="Running")["TrainingSessionSummaries"]
    assert any(s["TrainingSessionArn"].endswith(f"/{name}") for s in summaries)
    sm.stop_training_session(TrainingSessionName=name)
    assert _status(sm, name) == "Stopping"
    with pytest.raises(ClientError) as exc:
        sm.stop_training_session(TrainingSessionName=name)
    assert "invalid session state transition from Stopping to Stopping" in exc.value.response["Error"]["Message"]
    _wait_status(sm, name, "Stopped")
    detail = sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert detail["TrainingSessionStatus"] == "Stopped" and "EndTime" in detail
    assert name not in sim.running_sessions()
    sm.delete_training_session(TrainingSessionName=name)
    with pytest.raises(ClientError) as exc:
        _status(sm, name)
    assert exc.value.response["Error"]["Code"] == "ResourceNotFound"


def test_base_model_is_listed_and_unknown_base_models_are_refused(sim):
    svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path)
    from local.simulator.service import GATED_MODEL_DIR
    from local.simulator.model import ASSETS_DIR

    listed = svc.list_base_models()
    # The hub serves the tiny model and its gated copy (the accept_eula drill), each under its own folder:
    # no id is another's folder spelled differently (a listing a person reads shows two models, each once).
    assert listed == sorted([str(ASSETS_DIR), str(GATED_MODEL_DIR)], key=str.lower)
    assert len({os.path.normpath(p) for p in listed}) == len(listed)
    with pytest.raises(ValueError, match="Could not resolve base model"):
        svc.create_lora_training_client(base_model="no-such-model")
    assert sim.running_sessions() == []


def test_model_packages_restore_exactly_what_was_saved(sim):
    svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path)
    tc = svc.create_lora_training_client(base_model="stepwise-tiny")
    try:
        ids = list(range(40, 80))
        batch = [{"modelInput": {"chunks": [{"tokens": ids[:-1], "type": "encoded_text"}]},
                  "lossFnInputs": {"target_tokens": {"data": ids[1:], "dtype": "int64"},
                                   "weights": {"data": [1.0] * (len(ids) - 1), "dtype": "float32"}}}]
        tc.forward_backward(batch, loss_fn="cross_entropy")
        tc.optim_step(AdamParams(learning_rate=5e-3))
        weights_arn = tc.save_weights_for_sampler(description="after one step").result().model_package_arn
        state_arn = tc.save_state().result().model_package_arn
        saved = sim.simulator.session_weights(tc.training_session_name)

        assert svc.get_latest_model_package(ModelPackageKind.CHECKPOINT).model_package_arn == state_arn
        assert svc.get_latest_model_package(ModelPackageKind.MODEL).model_package_arn == weights_arn
        listed = [p.model_package_arn for p in svc.list_model_packages()]
        assert listed.index(state_arn) < listed.index(weights_arn)  # newest first
        kinds = {p.model_package_arn: p.kind for p in tc.list_model_packages(kind=ModelPackageKind.MODEL)}
        assert kinds.get(weights_arn) == ModelPackageKind.MODEL and state_arn not in kinds

        # Weights only: same weights, optimizer reset (its next step differs from a resumed optimizer's).
        tc_plain = svc.create_training_client_from_state(state_arn)
        tc_full = svc.create_training_client_from_state_with_optimizer(state_arn)
        try:
            for client in (tc_plain, tc_full):
                w = sim.simulator.session_weights(client.training_session_name)
                assert all(torch.equal(w[k], saved[k]) for k in saved)
                client.forward_backward(batch, loss_fn="cross_entropy")
                client.optim_step(AdamParams(learning_rate=5e-3)).result()
            a = sim.simulator.session_weights(tc_plain.training_session_name)
            b = sim.simulator.session_weights(tc_full.training_session_name)
            assert not all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
            # A weights-only package cannot restore an optimizer.
            from sagemaker.train.training_session import OperationError

            with pytest.raises(OperationError, match="no optimizer state"):
                tc_plain.load_state_with_optimizer(weights_arn).result()
        finally:
            tc_plain.stop()
            tc_full.stop()

        # A sampling client on a saved package samples those weights, the base model others.
        prompt = list(range(60, 75))
        params = SamplingParams(max_tokens=512, temperature=0.0)
        with svc.create_sampling_client(model_package_arn=weights_arn) as sc:
            trained = sc.compute_logprobs(prompt).result()
        base = tc.create_sampling_client().compute_logprobs(prompt).result()
        assert trained != base
        assert tc.create_sampling_client(weights_arn).compute_logprobs(prompt).result() == pytest.approx(trained, abs=1e-6)
        greedy = tc.create_sampling_client(weights_arn).sample(prompt, num_samples=2, sampling_params=params).result()
        assert greedy.sequences[0].tokens == greedy.sequences[1].tokens
    finally:
        tc.stop()
    deadline = time.monotonic() + 2
    while sim.running_sessions() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sim.running_sessions() == []


def test_model_packages_survive_a_restart_with_a_state_dir(tmp_path):
    from tests.support.simulator import create_session, runtime_client, wait_op

    first = start_simulator(state_dir=str(tmp_path))
    try:
        name = create_session(first, "persist")
        rt = runtime_client(first)
        op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="s", operationConfig={"saveState": {}})
        arn = wait_op(rt, name, op["operationId"])["operationResult"]["saveState"]["modelPackageArn"]
        saved = first.simulator.session_weights(name)
    finally:
        first.stop()
    second = start_simulator(state_dir=str(tmp_path))
    try:
        name = create_session(second, "resumed")
        rt = runtime_client(second)
        op = rt.execute_training_operation(
            trainingSessionName=name, sequenceNumber=1, clientToken="l",
            operationConfig={"loadState": {"modelPackageArn": arn, "loadOptimizer": True}},
        )
        assert wait_op(rt, name, op["operationId"])["status"] == "Completed"
        restored = second.simulator.session_weights(name)
        assert all(torch.equal(restored[k], saved[k]) for k in saved)
        # New saves continue the group's version numbers instead of overwriting.
        op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=2, clientToken="s2", operationConfig={"saveWeights": {}})
        new_arn = wait_op(rt, name, op["operationId"])["operationResult"]["saveWeights"]["modelPackageArn"]
        assert new_arn != arn and int(new_arn.rsplit("/", 1)[-1]) == int(arn.rsplit("/", 1)[-1]) + 1
    finally:
        second.stop()


def test_simulators_sharing_a_state_dir_never_reuse_an_arn_see_each_others_saves_and_delete_files(tmp_path):
    """Local runs at once share runs-local/.simulator/: versions are claimed on disk, a package one
    saved after the other started still loads there, and DeleteModelPackage removes its files."""
    from tests.support.simulator import create_session, runtime_client, wait_op

    a, b = start_simulator(state_dir=str(tmp_path)), start_simulator(state_dir=str(tmp_path))
    try:
        arns = {}
        for sim, tag in ((a, "a"), (b, "b")):
            name = create_session(sim, f"shared-{tag}")
            rt = runtime_client(sim)
            op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken=tag,
                                               operationConfig={"saveWeights": {}})
            arns[tag] = wait_op(rt, name, op["operationId"])["operationResult"]["saveWeights"]["modelPackageArn"]
        assert arns["a"] != arns["b"]  # both simulators started at version 0 of the same group
        # b samples a's package, saved after b started
        name = create_session(b, "reader")
        rt = runtime_client(b)
        op = rt.execute_sampling_operation(trainingSessionName=name, operationConfig={
            "loadWeightsForSampling": {"modelPackageArn": arns["a"]}})
        assert wait_op(rt, name, op["operationId"], sampling=True)["status"] == "Completed"
        files = sorted(p.name for p in tmp_path.iterdir())
        assert len(files) == 4
        control_client(b).delete_model_package(ModelPackageName=arns["a"])
        assert len(list(tmp_path.iterdir())) == 2
        with pytest.raises(ClientError, match="does not exist"):
            control_client(a).delete_model_package(ModelPackageName=arns["a"])
    finally:
        a.stop()
        b.stop()


def test_a_sessions_tags_are_kept_and_returned_by_describe_and_list_tags_and_add_tags_overwrites(sim):
    """Tags as botocore's ``sagemaker`` model has them: CreateTrainingSession's ``Tags`` come back in
    DescribeTrainingSession's ``TrainingSessionDetail.Tags`` and from ListTags of the session's ARN;
    AddTags adds a key and overwrites an existing one, seen by both."""
    sm = control_client(sim)
    name = "tagged-session"
    arn = sm.create_training_session(**session_request(sim, name), Tags=[
        {"Key": "stepwise:run-id", "Value": "run-a"}, {"Key": "stepwise:bucket", "Value": "bucket-a"}])["TrainingSessionArn"]
    detail = sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert {t["Key"]: t["Value"] for t in detail["Tags"]} == {"stepwise:run-id": "run-a", "stepwise:bucket": "bucket-a"}
    assert sm.list_tags(ResourceArn=arn)["Tags"] == detail["Tags"]
    sm.add_tags(ResourceArn=arn, Tags=[{"Key": "stepwise:run-id", "Value": "run-b"}, {"Key": "team", "Value": "x"}])
    tags = {t["Key"]: t["Value"] for t in sm.list_tags(ResourceArn=arn)["Tags"]}
    assert tags == {"stepwise:run-id": "run-b", "stepwise:bucket": "bucket-a", "team": "x"}
    detail = sm.describe_training_session(TrainingSessionName=name)["TrainingSessionDetail"]
    assert {t["Key"]: t["Value"] for t in detail["Tags"]} == tags
    with pytest.raises(ClientError, match="ResourceNotFound"):
        sm.list_tags(ResourceArn=arn.replace(name, "no-such-session"))
    sm.stop_training_session(TrainingSessionName=name)


def test_a_grant_on_session_names_refuses_the_others_as_iam_would(sim):
    """``grant_sessions("stepwise-*")`` models the stack's IAM grant: a call naming a session outside it
    is refused with AccessDeniedException (a foreign ``my-stepwise-x``), one inside is answered."""
    sm = control_client(sim)
    sm.create_training_session(**session_request(sim, "my-stepwise-x"))
    sm.create_training_session(**session_request(sim, "stepwise-granted"))
    sim.grant_sessions("stepwise-*")
    try:
        with pytest.raises(ClientError, match="AccessDeniedException"):
            sm.describe_training_session(TrainingSessionName="my-stepwise-x")
        assert sm.describe_training_session(TrainingSessionName="stepwise-granted")["TrainingSessionDetail"]
        sm.stop_training_session(TrainingSessionName="stepwise-granted")
    finally:
        sim.grant_sessions(None)
    sm.stop_training_session(TrainingSessionName="my-stepwise-x")
