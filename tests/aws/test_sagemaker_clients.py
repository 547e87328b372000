"""`stepwise.aws.sagemaker`'s clients: built once per container, region and endpoint.

Building a botocore client loads its service model and endpoint rules from disk (~0.1-0.2 s of CPU
here); PollSession, SubmitTrain and Rebind used to build one per invocation.
"""

from stepwise.aws import sagemaker


def test_runtime_and_control_plane_clients_are_built_once_per_region_and_endpoint(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setenv("SAGEMAKER_TRAINING_SESSION_ENDPOINT", "http://127.0.0.1:1")
    runtime = sagemaker.runtime("us-east-1")
    assert sagemaker.runtime("us-east-1") is runtime
    assert runtime.meta.endpoint_url == "http://127.0.0.1:1"
    assert sagemaker.runtime("us-west-2") is not runtime
    control = sagemaker.control_plane("us-east-1")
    assert sagemaker.control_plane("us-east-1") is control and control is not runtime
    assert control.meta.service_model.service_name == "sagemaker"

    # a new simulator (another port) or other credentials: a new client, never a stale endpoint
    monkeypatch.setenv("SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT", "http://127.0.0.1:2")
    moved = sagemaker.runtime("us-east-1")
    assert moved is not runtime and moved.meta.endpoint_url == "http://127.0.0.1:2"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "other")
    assert sagemaker.runtime("us-east-1") is not moved
