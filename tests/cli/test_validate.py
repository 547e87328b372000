"""`stepwise validate`: ok + summary, every error at once with exit code 2, dataset checks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from stepwise.datasets import payloads_to_parquet_bytes

from stepwise_cli.main import main

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent",
    "batch_size": 4,
    "responses_per_prompt": 2,
}


def write(tmp_path, name, obj):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def datasets(tmp_path, train_rows=10, eval_rows=3):
    train = tmp_path / "train.parquet"
    train.write_bytes(payloads_to_parquet_bytes([{"prompt": f"q{i}"} for i in range(train_rows)]))
    ev = tmp_path / "eval.jsonl"
    ev.write_text("".join(json.dumps({"payload": {"prompt": f"e{i}"}}) + "\n" for i in range(eval_rows)))
    return str(train), str(ev)


def test_ok_with_dataset_summary(tmp_path, capsys):
    train, ev = datasets(tmp_path)
    cfg = write(tmp_path, "run.json", {**BASE, "dataset_path": train, "eval_dataset_path": ev, "epochs": 3})
    assert main(["validate", cfg, "--check-datasets"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"ok: {cfg}\n")
    lines = dict(line.split(None, 1) for line in out.splitlines()[1:])
    assert lines["rollouts_per_step"] == "8" and lines["steps_per_epoch"] == "2" and lines["total_steps"] == "6"
    assert lines["eval_prompts"] == "3"
    # the cost projection in three lines at most, every figure kept (--json keeps its keys apart)
    assert lines["projected_step"].startswith("$") and "session-hours" in lines["projected_step"]
    assert "stepwise cost CONFIG" in lines["projected_step"]
    assert "session-hours; excludes the training session" in lines["projected_run"]
    assert len(out.splitlines()) < 25  # one screen


def test_json_summary_without_datasets(tmp_path, capsys):
    cfg = write(tmp_path, "run.json", {**BASE, "dataset_path": "s3://bkt/never-read.parquet", "algorithm": "dapo"})
    assert main(["validate", cfg, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["ok"] is True and got["summary"]["max_rollouts_per_step"] == 80
    assert "steps_per_epoch" not in got["summary"]


def test_every_error_at_once_exit_2(tmp_path, capsys):
    cfg = write(tmp_path, "run.json", {**BASE, "dataset_path": "x.jsonl", "batch_size": 0, "loss": "grpo",
                                       "gateway_port": 8000, "tempreature": 0.5})
    assert main(["validate", cfg]) == 2
    err = capsys.readouterr().err
    assert "3 error(s)" in err
    for fragment in ["batch_size: Input should be greater than or equal to 1 (got 0)",
                     "loss: Input should be 'ppo', 'importance_sampling' or 'cispo' (got 'grpo')",
                     "warning: gateway_port: ignored, the gateway is a Lambda Function URL",  # a reference field: warned, not an error
                     "tempreature: unknown field (got 0.5); did you mean 'temperature'?"]:
        assert fragment in err


def test_dataset_problems_exit_2(tmp_path, capsys):
    train, _ = datasets(tmp_path, train_rows=3)
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    cfg = write(tmp_path, "run.json", {**BASE, "dataset_path": train, "eval_dataset_path": str(empty)})
    assert main(["validate", cfg, "--check-datasets"]) == 2
    err = capsys.readouterr().err
    assert "dataset_path: " in err and "3 rows, need at least 4 (batch_size)" in err
    assert "eval_dataset_path: " in err and "no rows" in err


def test_console_script_entry(tmp_path):
    cfg = write(tmp_path, "bad.json", {"batch_size": 1})
    proc = subprocess.run([sys.executable, "-m", "stepwise_cli", "validate", cfg],
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and "role_arn: required" in proc.stderr
