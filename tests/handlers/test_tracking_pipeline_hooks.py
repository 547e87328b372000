"""What `stepwise.aws.tracking` asks of an MLflow tracking server is what the stack grants (the Track
function logs every summary: tests/handlers/test_track.py)."""

from __future__ import annotations


import boto3
import pytest
from moto import mock_aws

from stepwise import settings
from stepwise.aws import tracking
from stepwise.config import load_run_config
from stepwise.handlers import _common
from stepwise.layout import config_key

BUCKET = "stepwise-tracking-test"


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    tracking._RUNS.clear()
    cfg = load_run_config({
        "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
        "base_model_arn": "stepwise-tiny",
        "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent",
        "dataset_path": f"s3://{BUCKET}/train.jsonl",
        "batch_size": 4,
        "mlflow_tracking_uri": f"file:{tmp_path / 'mlruns'}",
    })
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key=config_key("run-7"), Body=cfg.model_dump_json())
        with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
            yield cfg, s3
    tracking._RUNS.clear()


def test_the_stacks_mlflow_grant_is_what_tracking_asks_of_a_tracking_server(run, monkeypatch):
    """infra.permissions.MLFLOW_ACTIONS are the REST messages MLflow's own RestStore sends for the store
    calls stepwise.aws.tracking makes (SageMaker managed MLflow authorizes each as sagemaker-mlflow:<message>)."""
    import inspect
    import re

    from mlflow.store.tracking.file_store import FileStore
    from mlflow.store.tracking.rest_store import RestStore

    from infra.permissions import MLFLOW_ACTIONS

    cfg, _ = run
    called: set[str] = set()
    depth = [0]  # only the client's calls: a local store's own inner calls run on the server over REST
    for name, fn in inspect.getmembers(FileStore, inspect.isfunction):
        if hasattr(RestStore, name) and not name.startswith("__"):
            def recording(self, *a, __name=name, __fn=fn, **kw):
                if depth[0] == 0:
                    called.add(__name)
                depth[0] += 1
                try:
                    return __fn(self, *a, **kw)
                finally:
                    depth[0] -= 1
            monkeypatch.setattr(FileStore, name, recording)
    tracking.log_step_metrics(cfg, "run-9", 0, {"step": 0, "sampler/mean_reward": 0.5}, strict=True)
    tracking.finish_run(cfg, "run-9", "FINISHED", strict=True)
    # (an inherited public method, like search_runs, sends from RestStore's _search_runs)
    sources = [inspect.getsource(getattr(RestStore, n)) for name in called for n in (name, f"_{name}")
               if hasattr(RestStore, n)]
    messages = {m for src in sources for m in re.findall(r"_call_endpoint\(\s*([A-Z]\w+)", src)}
    assert {f"sagemaker-mlflow:{m}" for m in messages} == set(MLFLOW_ACTIONS), sorted(messages)
    assert {"CreateRun", "LogBatch", "UpdateRun"} <= messages
