"""MLflow tracking against a local file-backed store: params once, per-step metrics, one run per run id."""

from __future__ import annotations

import pytest

from stepwise.aws import tracking
from stepwise.config import load_run_config

BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent",
    "dataset_path": "s3://bkt/train.jsonl",
    "batch_size": 4,
    "vpc_config": {"subnets": ["subnet-1"], "security_group_ids": ["sg-1"]},
}


@pytest.fixture
def cfg(tmp_path):
    tracking._RUNS.clear()  # a fresh "container"
    yield load_run_config({**BASE, "mlflow_tracking_uri": f"file:{tmp_path / 'mlruns'}",
                           "mlflow_experiment_name": "toy"})
    tracking._RUNS.clear()


def _client(cfg):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=cfg.mlflow_tracking_uri)


def test_params_and_step_metrics_land_in_one_run(cfg):
    steps = [{"step": 0, "epoch": 0, "sampler/mean_reward": 0.25, "decision": "train", "final": False},
             {"step": 1, "epoch": 0, "sampler/mean_reward": 0.5, "time/rollout": 3.5, "bad": float("nan")}]
    ids = {tracking.log_step_metrics(cfg, "run-1", s["step"], s, strict=True) for s in steps}
    tracking._RUNS.clear()  # another container finds the same MLflow run by its tag
    ids.add(tracking.log_step_metrics(cfg, "run-1", 1, {"eval/accuracy": 0.75, "eval/n": 4, "final": True},
                                      kind="eval", strict=True))
    assert len(ids) == 1 and None not in ids
    client = _client(cfg)
    run = client.get_run(ids.pop())
    assert run.info.run_name == "run-1" and run.data.tags[tracking.RUN_ID_TAG] == "run-1"
    assert run.data.params["batch_size"] == "4" and run.data.params["algorithm"] == "grpo"
    assert run.data.params["vpc_config.subnets"] == "['subnet-1']"
    assert set(run.data.params) >= {"learning_rate", "mlflow_experiment_name", "dataset_path"}
    history = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "sampler/mean_reward")]
    assert sorted(history) == [(0, 0.25), (1, 0.5)]
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "eval/accuracy")] == [(1, 0.75)]
    assert "bad" not in run.data.metrics and "decision" not in run.data.metrics and "final" not in run.data.metrics
    assert "step" not in run.data.metrics and run.data.metrics["time/rollout"] == 3.5
    assert client.get_experiment(run.info.experiment_id).name == "toy"


def test_runs_are_separate_and_finish_sets_status(cfg):
    a = tracking.log_step_metrics(cfg, "a", 0, {"sampler/mean_reward": 1.0}, strict=True)
    b = tracking.log_step_metrics(cfg, "b", 0, {"sampler/mean_reward": 0.0}, strict=True)
    assert a != b
    assert tracking.finish_run(cfg, "a", "KILLED", strict=True) == a
    assert _client(cfg).get_run(a).info.status == "KILLED"
    with pytest.raises(ValueError, match="FINISHED, FAILED or KILLED"):
        tracking.finish_run(cfg, "a", "DONE")


def test_off_by_default_and_never_fails_the_run(tmp_path):
    plain = load_run_config(BASE)
    assert not tracking.enabled(plain)
    assert tracking.log_step_metrics(plain, "r", 0, {"sampler/mean_reward": 1.0}) is None
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the store should be")
    broken = load_run_config({**BASE, "mlflow_tracking_uri": f"file:{blocked}"})
    tracking._RUNS.clear()
    assert tracking.log_step_metrics(broken, "r", 0, {"sampler/mean_reward": 1.0}) is None
    with pytest.raises(Exception):
        tracking.log_step_metrics(broken, "r", 0, {"sampler/mean_reward": 1.0}, strict=True)


def test_metric_keys_and_numbers():
    assert tracking.metric_key("train/loss:sum") == "train/loss:sum"
    assert tracking.metric_key("a[b]") == "a_b_"
    assert tracking.numeric_metrics({"step": 3, "x": 1, "ok": True, "s": "v", "inf": float("inf")}) == {"x": 1.0}


@pytest.mark.parametrize("uri", [
    "arn:aws:sagemaker:us-east-1:123456789012:mlflow-app/app-abc123",
    "arn:aws:sagemaker:us-west-2:123456789012:mlflow-tracking-server/my-server",
    "https://mlflow.internal:5000",
    "file:/tmp/mlruns",
    "sqlite:////tmp/mlflow.db",
])
def test_accepted_tracking_uris(uri):
    assert load_run_config({**BASE, "mlflow_tracking_uri": uri}).mlflow_tracking_uri == uri
