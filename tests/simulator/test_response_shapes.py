"""Every answer the simulator gives parses into botocore's *output* shapes: required members
present, types right (botocore's parsers are lenient, so a misspelt member would otherwise go
unnoticed by the SDK until it read ``None``)."""

from __future__ import annotations

import pytest
from botocore.validate import ParamValidator

from local.simulator import start_simulator

from tests.support.simulator import control_client, create_session, runtime_client, wait_op


@pytest.fixture(scope="module")
def sim():
    handle = start_simulator()
    yield handle
    handle.stop()


def _check(client, operation: str, response: dict) -> dict:
    shape = client.meta.service_model.operation_model(operation).output_shape
    body = {k: v for k, v in response.items() if k != "ResponseMetadata"}
    report = ParamValidator().validate(body, shape)
    assert not report.has_errors(), f"{operation}: {report.generate_report()}"
    return body


def test_control_plane_hub_and_registry_answers_fit_their_output_shapes(sim):
    sm = control_client(sim)
    name = create_session(sim, "shapes-control")
    _check(sm, "DescribeTrainingSession", sm.describe_training_session(TrainingSessionName=name))
    _check(sm, "ListTrainingSessions", sm.list_training_sessions(MaxResults=5))
    _check(sm, "ListHubContents", sm.list_hub_contents(HubName="SageMakerPublicHub", HubContentType="Model"))
    _check(sm, "DescribeHubContent", sm.describe_hub_content(HubName="SageMakerPublicHub", HubContentType="Model", HubContentName="stepwise-tiny"))
    rt = runtime_client(sim)
    op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=1, clientToken="s", operationConfig={"saveState": {}})
    arn = wait_op(rt, name, op["operationId"])["operationResult"]["saveState"]["modelPackageArn"]
    _check(sm, "DescribeModelPackage", sm.describe_model_package(ModelPackageName=arn))
    _check(sm, "ListModelPackages", sm.list_model_packages(ModelPackageGroupName=sim.model_package_group_arn))
    _check(sm, "DescribeModelPackageGroup", sm.describe_model_package_group(ModelPackageGroupName="stepwise-local"))
    _check(sm, "CreateModelPackageGroup", sm.create_model_package_group(ModelPackageGroupName="another-group"))
    _check(sm, "StopTrainingSession", sm.stop_training_session(TrainingSessionName=name))


def test_runtime_answers_fit_their_output_shapes(sim):
    name = create_session(sim, "shapes-runtime")
    rt = runtime_client(sim)
    tokens = [257, 117, 115, 101, 114, 10, 51, 258, 10]
    datum = {
        "modelInput": {"chunks": [{"tokens": tokens, "type": "encoded_text"}]},
        "lossFnInputs": {
            "target_tokens": {"data": tokens[1:] + [52], "dtype": "int64"},
            "weights": {"data": [1.0] * len(tokens), "dtype": "float32"},
            "logprobs": {"data": [-1.0] * len(tokens), "dtype": "float32"},
            "advantages": {"data": [0.5] * len(tokens), "dtype": "float32"},
        },
    }
    configs = [
        {"forward": {"lossFnName": "ppo", "datumList": [datum]}},
        {"forwardBackward": {"lossFnName": "cispo", "datumList": [datum], "lossFnConfig": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28}}},
        {"optimizerStep": {"adamParamsConfig": {"learningRate": 1e-4, "gradClipNorm": 1.0}}},
        {"saveWeights": {"description": "w"}},
        {"saveState": {}},
    ]
    arn = None
    for seq, config in enumerate(configs, start=1):
        op = rt.execute_training_operation(trainingSessionName=name, sequenceNumber=seq, clientToken=f"t{seq}", operationConfig=config)
        _check(rt, "ExecuteTrainingOperation", op)
        done = _check(rt, "GetTrainingOperationResult", wait_op(rt, name, op["operationId"]))
        assert done["status"] == "Completed"
        arn = done["operationResult"].get("saveState", {}).get("modelPackageArn", arn)
    op = rt.execute_training_operation(
        trainingSessionName=name, sequenceNumber=6, clientToken="t6", operationConfig={"loadState": {"modelPackageArn": arn, "loadOptimizer": True}}
    )
    _check(rt, "GetTrainingOperationResult", wait_op(rt, name, op["operationId"]))
    sampling = [
        {"sample": {"prompt": datum["modelInput"], "numSamples": 2, "samplingParams": {"maxTokens": 512, "temperature": 0.5},
                    "includePromptLogprobs": True, "topkPromptLogprobs": 2}},
        {"computeLogprobs": {"prompt": datum["modelInput"]}},
        {"loadWeightsForSampling": {"modelPackageArn": arn}},
    ]
    for config in sampling:
        op = rt.execute_sampling_operation(trainingSessionName=name, operationConfig=config)
        _check(rt, "ExecuteSamplingOperation", op)
        done = wait_op(rt, name, op["operationId"], sampling=True)
        assert done["status"] == "Completed"
        if "computeLogprobs" in config or "sample" in config:
            # promptLogprobs / logprobs start with None (no context for the first token), which the
            # service model's DoubleList cannot express; the SDK expects it (sampling_client.py).
            key = "computeLogprobs" if "computeLogprobs" in config else "sample"
            result = done["operationResult"][key]
            field = "logprobs" if key == "computeLogprobs" else "promptLogprobs"
            assert result[field][0] is None
            result[field] = result[field][1:]
        _check(rt, "GetSamplingOperationResult", done)
    control_client(sim).stop_training_session(TrainingSessionName=name)
