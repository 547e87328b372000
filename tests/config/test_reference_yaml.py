"""Reference configs load: the toolkit's own ``config.yaml.example`` (read from the installed package),
with the DAPO proposal's fields, validates as YAML or JSON in `stepwise validate`, `start` and
`run-local`; the fields we dropped are warned about with the reason; YAML's ``1e-5`` is a number."""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import re
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from agentcore_rl_toolkit.backends.experimental.sagemaker.config import Config as ReferenceConfig
from agentcore_rl_toolkit.backends.experimental.sagemaker.config import load_config as reference_load_config

from stepwise_cli.main import main
from stepwise.config import DROPPED_FIELDS, load_run_config, read_config_file

EXAMPLE = importlib.resources.files("agentcore_rl_toolkit.backends.experimental.sagemaker") / "config.yaml.example"
#: What a user types over the example's <placeholders> (nothing else of the file is changed).
FILLED = {"account-id": "123456789012", "region": "us-east-1", "your-s3-bucket": "my-bucket"}
DAPO_FIELDS = "\n# --- DAPO (train_dapo.py) ---\nmax_num_gen_batches: 10\nclip_low_threshold: 0.8\nclip_high_threshold: 1.28\n"


def filled_example(extra: str = "") -> str:
    text = EXAMPLE.read_text()
    assert "<account-id>" in text and "gateway_port" in text  # the example we mean
    return re.sub(r"<([^>]+)>", lambda m: FILLED.get(m.group(1), "example"), text) + extra


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_toolkits_own_example_validates_with_a_warning_per_dropped_field(tmp_path, capsys):
    path = _write(tmp_path, "config.yaml", filled_example())
    assert main(["validate", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    warned = {w.split(":", 1)[0]: w for w in out["warnings"]}
    present = set(yaml.safe_load(path.read_text())) & set(DROPPED_FIELDS)
    assert present == {"gateway_port", "history_mode"}  # wandb_project / wandb_run_name are ours too now
    assert set(warned) == present
    for field in present:  # each with its reason, never refused
        assert DROPPED_FIELDS[field] in warned[field], warned[field]
    assert "(got 'linear')" in warned["history_mode"]
    cfg = load_run_config(path, warnings=[])
    ref = reference_load_config(str(path))  # the reference reads the same values
    shared = {f.name for f in dataclasses.fields(ReferenceConfig)} - set(DROPPED_FIELDS)
    assert {n: getattr(cfg, n) for n in shared} == {n: getattr(ref, n) for n in shared}
    assert cfg.max_new_tokens == 8192 and cfg.eval_every == 10 and cfg.chat_template_kwargs == {"enable_thinking": False}


def test_the_same_config_as_json_loads_the_same_with_the_same_warnings(tmp_path):
    y = _write(tmp_path, "config.yaml", filled_example(DAPO_FIELDS + "algorithm: dapo\n"))
    j = _write(tmp_path, "config.json", json.dumps(read_config_file(y)))
    wy, wj = [], []
    assert load_run_config(y, warnings=wy) == load_run_config(j, warnings=wj)
    assert wy == wj and len(wy) == 2  # gateway_port, history_mode
    dapo = load_run_config(j, warnings=[])
    assert (dapo.algorithm, dapo.max_num_gen_batches, dapo.loss_fn_config) == (
        "dapo", 10, {"clip_low_threshold": 0.8, "clip_high_threshold": 1.28})


def test_dapo_fields_without_an_algorithm_load_and_say_they_train_grpo(tmp_path):
    warnings: list[str] = []
    cfg = load_run_config(_write(tmp_path, "dapo.yaml", filled_example(DAPO_FIELDS)), warnings=warnings)
    assert cfg.algorithm == "grpo" and cfg.max_num_gen_batches == 10
    assert any(w.startswith("max_num_gen_batches:") and "algorithm: dapo" in w for w in warnings)


def test_yaml_exponent_floats_are_numbers(tmp_path):
    text = filled_example().replace("learning_rate: 1.0e-5", "learning_rate: 1e-5")
    assert "learning_rate: 1e-5" in text
    path = _write(tmp_path, "lr.yaml", text)
    assert yaml.safe_load(text)["learning_rate"] == "1e-5"  # PyYAML's YAML 1.1 rules: a string
    assert read_config_file(path)["learning_rate"] == 1e-05
    assert load_run_config(path, warnings=[]).learning_rate == 1e-05
    raw = read_config_file(_write(tmp_path, "kinds.yaml", "a: 3e2\nb: 32\nc: -2.5E-3\nd: 1_000\ne: '1e-5'\nf: .5\n"))
    assert raw == {"a": 300.0, "b": 32, "c": -0.0025, "d": 1000, "e": "1e-5", "f": 0.5}  # quoted stays text


def test_start_sends_the_execution_the_config_without_the_dropped_fields(moto_dep, tmp_path, capsys):
    train = _write(tmp_path, "train.jsonl", "".join(json.dumps({"payload": {"prompt": f"q{i}"}}) + "\n" for i in range(40)))
    text = filled_example().replace('"/path/to/train.parquet"', json.dumps(str(train)))
    text = text.replace('eval_dataset_path: "/path/to/test.parquet"', 'eval_dataset_path: ""').replace(
        "eval_every: 10", "eval_every: 0").replace("batch_size: 32", "batch_size: 4").replace(
        "learning_rate: 1.0e-5", "learning_rate: 2e-5")
    path = _write(tmp_path, "config.yaml", text)
    assert main(["start", str(path), "--run-id", "from-yaml", "--json", *moto_dep.flags]) == 0
    captured = capsys.readouterr()
    dropped = [line for line in captured.err.splitlines() if line.startswith("warning: ") and ": ignored" in line]
    assert len(dropped) == 2 and "gateway_port: ignored" in captured.err, captured.err
    sent = json.loads(moto_dep.sfn.describe_execution(executionArn=json.loads(captured.out)["execution_arn"])["input"])
    assert not set(sent) & set(DROPPED_FIELDS)
    assert sent["learning_rate"] == 2e-05 and sent["dataset_path"].startswith("s3://")


def test_run_local_reads_yaml_and_drops_the_fields_it_warns_about(tmp_path, capsys):
    from local.run import load_local_config

    raw = load_local_config(_write(tmp_path, "config.yml", filled_example()))
    assert not set(raw) & set(DROPPED_FIELDS) and raw["learning_rate"] == 1e-05
    assert capsys.readouterr().err.count("warning: ") == 2


@pytest.mark.parametrize("field", sorted(DROPPED_FIELDS))
def test_an_unknown_field_is_still_refused_but_a_dropped_one_is_not(field):
    base = yaml.safe_load(filled_example())
    warnings: list[str] = []
    load_run_config({**base, field: base.get(field, "")}, warnings=warnings)
    assert any(w.startswith(f"{field}: ignored") for w in warnings)
    with pytest.raises(Exception, match="lora_rnk: unknown field"):
        load_run_config({**base, "lora_rnk": 8}, warnings=[])


def test_a_config_whose_extension_does_not_say_is_read_by_its_content(tmp_path, capsys):
    """The reference's template is named ``config.yaml.example``: read as YAML (before, the unknown
    extension meant JSON and `stepwise validate` answered "not valid JSON at line 1 column 1")."""
    raw = _write(tmp_path, "config.yaml.example", EXAMPLE.read_text())
    assert main(["validate", str(raw)]) == 2  # its <placeholders> are not ARNs: named, field by field
    err = capsys.readouterr().err
    assert "not valid JSON" not in err and "role_arn:" in err and "agent_runtime_arn:" in err
    filled = _write(tmp_path, "filled.yaml.example", filled_example())
    assert main(["validate", str(filled)]) == 0
    assert load_run_config(filled, warnings=[]) == load_run_config(_write(tmp_path, "c.yaml", filled_example()),
                                                                  warnings=[])
    as_json = _write(tmp_path, "run.conf", json.dumps(read_config_file(filled)))
    assert load_run_config(as_json, warnings=[]) == load_run_config(filled, warnings=[])
    broken = _write(tmp_path, "run.cfg", '{"role_arn": ')  # JSON by its first character: JSON's error
    with pytest.raises(Exception, match="not valid JSON"):
        read_config_file(broken)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=st.dictionaries(st.from_regex(r"[a-z][a-z_]{0,12}", fullmatch=True),
                              st.one_of(st.integers(-10**6, 10**6), st.booleans(), st.text(alphabet="abcxyz _-.", max_size=20),
                                        st.lists(st.integers(0, 9), max_size=3)), max_size=6),
       suffix=st.sampled_from(["", ".example", ".conf", ".txt", ".cfg", ".in"]))
@example(config={"a": "._"}, suffix="")  # read as a float, then float('.') raised: a string stays a string
def test_content_decides_json_or_yaml_for_any_config_under_any_uninformative_name(tmp_path, config, suffix):
    as_json = tmp_path / f"a{suffix}"
    as_json.write_text(json.dumps(config))
    assert read_config_file(as_json) == config
    as_yaml = tmp_path / f"b{suffix}"
    as_yaml.write_text(yaml.safe_dump(config, default_flow_style=False) if config else "{}\n")
    assert read_config_file(as_yaml) == config
