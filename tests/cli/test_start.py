"""`stepwise start`: validates, uploads local data, starts the execution named after the run, refuses reuse."""

from __future__ import annotations

import json

from tests.support.cli import BASE_CONFIG, run_state

from stepwise_cli.main import main
from stepwise.layout import state_key


def _config(tmp_path, **extra):
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"payload": {"prompt": f"q{i}"}}) + "\n" for i in range(5)))
    ev = tmp_path / "eval.jsonl"
    ev.write_text(json.dumps({"payload": {"prompt": "e0"}}) + "\n")
    tok = tmp_path / "tok"
    tok.mkdir(exist_ok=True)
    (tok / "tokenizer.json").write_text("{}")
    (tok / "tokenizer_config.json").write_text("{}")
    cfg = {**BASE_CONFIG, "dataset_path": str(train), "eval_dataset_path": str(ev), "tokenizer_path": str(tok), **extra}
    path = tmp_path / "my run.json"
    path.write_text(json.dumps(cfg))
    return path, train


def test_start_uploads_rewrites_and_names_the_execution(moto_dep, tmp_path, capsys):
    path, train = _config(tmp_path)
    assert main(["start", str(path), "--run-id", "r1", "--json", *moto_dep.flags]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["run_id"] == "r1" and out["execution_arn"].endswith(":r1")
    assert out["console_url"].startswith("https://us-east-1.console.aws.amazon.com/states/")
    desc = moto_dep.sfn.describe_execution(executionArn=out["execution_arn"])
    assert desc["name"] == "r1"
    sent = json.loads(desc["input"])
    bucket = moto_dep.bucket
    assert sent["dataset_path"] == f"s3://{bucket}/datasets/r1/train.jsonl"
    assert sent["eval_dataset_path"] == f"s3://{bucket}/datasets/r1/eval.jsonl"
    assert sent["tokenizer_path"] == f"s3://{bucket}/datasets/r1/tokenizer/"
    assert sent["batch_size"] == 2  # the rest of the config is passed as written
    body = moto_dep.s3.get_object(Bucket=bucket, Key="datasets/r1/train.jsonl")["Body"].read()
    assert body == train.read_bytes()
    keys = {o["Key"] for o in moto_dep.s3.list_objects_v2(Bucket=bucket, Prefix="datasets/r1/tokenizer/")["Contents"]}
    assert keys == {"datasets/r1/tokenizer/tokenizer.json", "datasets/r1/tokenizer/tokenizer_config.json"}


def test_default_run_id_from_config_name(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path)
    assert main(["start", str(path), *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    run_id = out.split("started run ", 1)[1].split()[0]
    assert run_id.startswith("my-run-") and len(run_id) == len("my-run-YYYYMMDD-HHMMSS")
    assert "stepwise watch " + run_id in out


def test_existing_run_id_is_refused(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path)
    assert main(["start", str(path), "--run-id", "dup", *moto_dep.flags]) == 0
    capsys.readouterr()
    assert main(["start", str(path), "--run-id", "dup", *moto_dep.flags]) == 1
    err = capsys.readouterr().err
    assert "already exists" in err and "stepwise resume dup" in err
    # a run known only by its state in the bucket (its executions expired) is refused too
    moto_dep.put_json(state_key("old"), run_state("old", "arn:aws:states:us-east-1:123456789012:execution:x:old"))
    assert main(["start", str(path), "--run-id", "old", *moto_dep.flags]) == 1
    assert len(moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"]) == 1


def test_invalid_config_and_short_dataset_start_nothing(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path, batch_size=0, tempreature=1.0)
    assert main(["start", str(path), "--run-id", "bad", *moto_dep.flags]) == 2
    err = capsys.readouterr().err
    assert "batch_size" in err and "tempreature" in err
    path, _ = _config(tmp_path, batch_size=8)  # 5 rows < batch_size
    assert main(["start", str(path), "--run-id", "short", *moto_dep.flags]) == 2
    assert "dataset_path" in capsys.readouterr().err
    assert moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"] == []
    assert "Contents" not in moto_dep.s3.list_objects_v2(Bucket=moto_dep.bucket, Prefix="datasets/")


def test_bad_run_id_is_refused(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path)
    for bad in ("has space", "a--1", "x" * 71, "-lead"):
        assert main(["start", str(path), f"--run-id={bad}", *moto_dep.flags]) == 1
        assert "run id" in capsys.readouterr().err


def test_resume_flag_hands_an_existing_run_to_resume(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path)
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="again",
                                       input=json.dumps({"fail": True}))["executionArn"]
    from tests.support.cli import wait_status

    wait_status(moto_dep.sfn, arn, ("FAILED",))
    moto_dep.put_json(state_key("again"), run_state("again", arn, step=3, session_stopped=True))
    assert main(["start", str(path), "--run-id", "again", "--resume", *moto_dep.flags]) == 0
    assert "started a new execution of run again" in capsys.readouterr().out
    names = sorted(e["name"] for e in moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"])
    assert names == ["again", "again--1"]


def test_a_region_other_than_the_stacks_is_refused_before_anything_is_uploaded(moto_dep, tmp_path, capsys):
    path, _ = _config(tmp_path, region="eu-west-1")
    assert main(["start", str(path), "--run-id", "elsewhere", *moto_dep.flags]) == 2
    err = capsys.readouterr().err
    assert "region: the run's region 'eu-west-1' is not the stack's region 'us-east-1'" in err
    assert "Contents" not in moto_dep.s3.list_objects_v2(Bucket=moto_dep.bucket, Prefix="datasets/elsewhere/")
    executions = moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"]
    assert all(e["name"] != "elsewhere" for e in executions)


def test_an_uncapped_run_is_warned_with_its_projection_and_a_capped_one_is_not(moto_dep, tmp_path, capsys):
    """A run with neither max_cost_usd nor max_session_hours starts with a warning naming its projected cost and the
    price table's figure for its model; the price table's unconfirmed default is warned about until replaced."""
    path, _ = _config(tmp_path)
    assert main(["start", str(path), "--run-id", "uncapped", *moto_dep.flags]) == 0
    err = capsys.readouterr().err
    assert "warning: this run has no dollar or hour cap (projected $" in err and "session-hours for its" in err
    assert "max_session_hours" in err and "the price table says 0 USD/h" in err  # BASE_CONFIG: the simulator's model

    path, _ = _config(tmp_path, session_usd_per_hour=100.0, max_cost_usd=20.0)
    assert main(["start", str(path), "--run-id", "default-price", *moto_dep.flags]) == 0
    err = capsys.readouterr().err
    assert "no dollar or hour cap" not in err
    assert "session_usd_per_hour is the price table's default (100 USD/h" in err

    path, _ = _config(tmp_path, session_usd_per_hour=42.0, max_cost_usd=20.0)
    assert main(["start", str(path), "--run-id", "capped", *moto_dep.flags]) == 0
    assert "warning:" not in capsys.readouterr().err
    path, _ = _config(tmp_path, max_session_hours=1.0)
    assert main(["start", str(path), "--run-id", "hour-capped", *moto_dep.flags]) == 0
    assert "warning:" not in capsys.readouterr().err


def test_the_aws_examples_are_priced_and_capped_for_a_first_run():
    from pathlib import Path

    from stepwise.config import load_run_config
    from stepwise.core.prices import session_price

    for path in sorted((Path(__file__).resolve().parents[2] / "examples" / "aws").glob("*.json")):
        cfg = load_run_config(json.loads(path.read_text()))
        assert cfg.session_usd_per_hour == session_price(cfg.base_model_arn).usd_per_hour, path
        assert cfg.max_cost_usd is not None and cfg.max_session_hours is not None, path
