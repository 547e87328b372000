"""The pipeline publishes every step and eval summary to S3 and, when configured, to MLflow."""

from __future__ import annotations

import json

import boto3
import pytest
from moto import mock_aws

from stepwise import settings
from stepwise.aws import tracking
from stepwise.config import load_run_config
from stepwise.handlers import _common, session
from stepwise.layout import config_key, eval_summary_key, summary_key

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


def test_write_summary_lands_in_s3_and_mlflow(run):
    cfg, s3 = run
    _common.write_summary("run-7", 0, {"step": 0, "eval/accuracy": 0.125, "eval/n": 10}, kind="eval")  # baseline
    _common.write_summary("run-7", 0, {"step": 0, "sampler/mean_reward": 0.25, "decision": "train",
                                       "behaviour/turns_per_rollout": 1.5, "rollouts/num_timeout": 1.0})
    _common.write_summary("run-7", 1, {"step": 1, "sampler/mean_reward": 0.75, "decision": "train"})
    _common.write_summary("run-7", 1, {"step": 1, "eval/accuracy": 0.5, "eval/n": 10}, kind="eval")

    body = json.loads(s3.get_object(Bucket=BUCKET, Key=summary_key("run-7", 1))["Body"].read())
    assert body["sampler/mean_reward"] == 0.75
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=eval_summary_key("run-7", 1))["Body"].read())["eval/n"] == 10

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=cfg.mlflow_tracking_uri)
    mlflow_id = tracking.mlflow_run_id(cfg, "run-7", client=client)
    rewards = sorted((m.step, m.value) for m in client.get_metric_history(mlflow_id, "sampler/mean_reward"))
    assert rewards == [(0, 0.25), (1, 0.75)]
    assert sorted((m.step, m.value) for m in client.get_metric_history(mlflow_id, "eval/accuracy")) == [
        (0, 0.125), (1, 0.5)]  # the eval before training is the curve's first point
    for key, value in (("behaviour/turns_per_rollout", 1.5), ("rollouts/num_timeout", 1.0)):
        assert [(m.step, m.value) for m in client.get_metric_history(mlflow_id, key)] == [(0, value)]


def test_a_tracking_failure_is_a_warning_in_the_summary_not_a_silent_gap(run, tmp_path):
    cfg, s3 = run
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("MLflow cannot make its store under a file")
    broken = cfg.model_copy(update={"mlflow_tracking_uri": f"file:{blocker / 'mlruns'}"})
    s3.put_object(Bucket=BUCKET, Key=config_key("run-8"), Body=broken.model_dump_json())

    _common.write_summary("run-8", 3, {"step": 3, "sampler/mean_reward": 0.5, "decision": "train"})  # does not raise

    body = json.loads(s3.get_object(Bucket=BUCKET, Key=summary_key("run-8", 3))["Body"].read())
    assert body["sampler/mean_reward"] == 0.5
    warning = body[tracking.WARNING_KEY]
    assert warning.startswith(f"MLflow tracking to {broken.mlflow_tracking_uri} failed at train step 3: ")
    assert tracking.WARNING_KEY not in tracking.numeric_metrics(body)  # never logged as a metric
    # a working store: no warning key at all
    _common.write_summary("run-7", 3, {"step": 3, "sampler/mean_reward": 0.5})
    assert tracking.WARNING_KEY not in json.loads(s3.get_object(Bucket=BUCKET, Key=summary_key("run-7", 3))["Body"].read())


@pytest.mark.parametrize(("reason", "status"), [
    ("finished", "FINISHED"),
    ("execution ABORTED", "KILLED"),
    ("execution TIMED_OUT", "FAILED"),
    ("failed: States.TaskFailed", "FAILED"),
])
def test_stop_reason_maps_to_the_mlflow_run_status(reason, status):
    assert session._tracking_status(reason) == status


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
