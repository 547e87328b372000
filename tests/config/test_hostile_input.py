"""Hostile config files: whatever a YAML or JSON file holds, `load_run_config` and `stepwise validate`
answer with ``field: message`` errors (a ConfigError, exit 2) or warnings, never a traceback, never
code execution (safe loading), and every message stays short whatever the value's size.

Hypothesis builds arbitrary YAML documents (recursive strategies over scalars that YAML resolves
ambiguously: ``yes``/``no``/``on``/``off``, ``1e-5``, ``.inf``, ``NaN``, dates, huge integers) and
runs them through the real loader and `stepwise validate`'s main()."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepwise_cli.main import main
from stepwise.config import ConfigError, load_run_config

BASE = """role_arn: arn:aws:iam::123456789012:role/r
base_model_arn: Qwen3-4B
agent_runtime_arn: arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1
dataset_path: s3://bucket-1/x.jsonl
"""
#: A message longer than this (per error) is unreadable; values are shown abbreviated.
MAX_ERROR_CHARS = 600


def _write(tmp_path: Path, name: str, data: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def _errors(path: Path) -> list[str]:
    with pytest.raises(ConfigError) as e:
        load_run_config(path, warnings=[])
    for err in e.value.errors:
        assert len(err) <= MAX_ERROR_CHARS, err[:200]
        assert ": " in err, err
    return e.value.errors


def test_a_python_tag_is_refused_not_run(tmp_path):
    marker = tmp_path / "pwned"
    text = BASE + f"exp_id: !!python/object/apply:os.system ['touch {marker}']\n"
    assert any("not valid YAML" in e for e in _errors(_write(tmp_path, "tag.yaml", text)))
    assert not marker.exists()


@pytest.mark.parametrize("suffix, text", [
    (".yaml", BASE + "lora_rank: " + "9" * 5000 + "\n"),
    (".json", json.dumps(yaml.safe_load(BASE))[:-1] + ', "lora_rank": ' + "9" * 5000 + "}"),
])
def test_an_integer_of_thousands_of_digits_is_an_error_not_a_traceback(tmp_path, suffix, text):
    errors = _errors(_write(tmp_path, "huge" + suffix, text))
    assert any("digits" in e for e in errors), errors


def test_a_huge_integer_in_a_dict_config_is_shown_abbreviated():
    errors = pytest.raises(ConfigError, load_run_config, {**yaml.safe_load(BASE), "lora_rank": 10 ** 5000}).value.errors
    assert errors and errors[0].startswith("lora_rank: ") and "5001-digit int" in errors[0], errors


@pytest.mark.parametrize("suffix, text", [
    (".yaml", BASE + "exp_id: " + "[" * 5000 + "]" * 5000 + "\n"),
    (".json", '{"exp_id": ' + "[" * 5000 + "]" * 5000 + "}"),
])
def test_nesting_thousands_deep_is_an_error_not_a_recursion_error(tmp_path, suffix, text):
    assert any("nested" in e for e in _errors(_write(tmp_path, "deep" + suffix, text)))


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_file_that_is_not_utf8_is_an_error_naming_the_encoding(tmp_path, suffix):
    data = (BASE + "exp_id: caf").encode() + b"\xe9\n" if suffix == ".yaml" else b'{"exp_id": "caf\xe9"}'
    assert any("UTF-8" in e for e in _errors(_write(tmp_path, "latin1" + suffix, data)))


@pytest.mark.parametrize("suffix, text", [
    (".yaml", BASE + "lora_rank: 4\nlora_rank: 8\n"),
    (".json", json.dumps(yaml.safe_load(BASE))[:-1] + ', "lora_rank": 4, "lora_rank": 8}'),
    (".yaml", BASE + "vpc_config:\n  subnets: [subnet-1]\n  subnets: [subnet-2]\n  security_group_ids: [sg-1]\n"),
])
def test_a_key_given_twice_is_an_error_not_last_one_wins(tmp_path, suffix, text):
    errors = _errors(_write(tmp_path, "dupe" + suffix, text))
    assert any("given twice" in e and ("lora_rank" in e or "subnets" in e) for e in errors), errors


def test_a_merge_key_overridden_by_an_explicit_key_is_not_a_duplicate(tmp_path):
    cfg = load_run_config(_write(tmp_path, "merge.yaml", BASE + "<<: {lora_rank: 4, lora_alpha: 16}\nlora_rank: 8\n"),
                          warnings=[])
    assert (cfg.lora_rank, cfg.lora_alpha) == (8, 16)


def test_aliases_expanding_to_millions_of_values_are_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    text = BASE + "\n".join(lines) + "\nchat_template_kwargs: {k: *a8}\n"
    errors = _errors(_write(tmp_path, "laughs.yaml", text))
    assert any("values" in e for e in errors), errors


@pytest.mark.parametrize("value, fragment", [
    ("&a {x: *a}", "refers to itself"),
    ("{x: &a [*a]}", "refers to itself"),
    ("{x: 2024-01-01}", "JSON"),
    ("{x: .nan}", "JSON"),
    ("{x: !!binary aGVsbG8=}", "JSON"),
    ("{x: !!set {a}}", "JSON"),
    ("{1: true}", "string"),
])
def test_chat_template_kwargs_must_be_json_data(tmp_path, value, fragment):
    # The value rides in the execution input (JSON) and the gateway's session record.
    errors = _errors(_write(tmp_path, "ctk.yaml", BASE + f"chat_template_kwargs: {value}\n"))
    assert any(e.startswith("chat_template_kwargs") and fragment in e for e in errors), errors


def test_chat_template_kwargs_of_json_data_loads():
    cfg = load_run_config({**yaml.safe_load(BASE), "chat_template_kwargs": {"enable_thinking": False, "x": [1, 2.5, None]}})
    assert json.loads(json.dumps(cfg.chat_template_kwargs, allow_nan=False)) == cfg.chat_template_kwargs


# ------------------------------------------------------------------ property tests

#: Scalars YAML resolves in surprising ways (YAML 1.1 booleans, 1.2 floats, dates, nulls) or that are huge.
_AMBIGUOUS = st.sampled_from(["yes", "no", "on", "off", "Yes", "NO", "y", "n", "~", "null", "1e-5", ".inf", "-.inf",
                              "NaN", ".nan", "1_000", "0x1F", "0o17", "2024-01-01", "12:30:00", "1e999", "-0",
                              "'1e-5'", "!!python/none ''", "!!binary aGk=", "!!float 1", "'x'", '"\\u0000"',
                              "9" * 4400, "*undefined", "&a 1", "[]", "{}", "!!set {a}", "!!timestamp x", "2024-13-45"])
_SCALAR = st.one_of(_AMBIGUOUS, st.integers().map(str), st.floats().map(repr), st.text(max_size=12).map(json.dumps))
_FIELDS = st.sampled_from(["lora_rank", "learning_rate", "region", "exp_id", "seed", "save_weights_at_end", "vpc_config",
                           "chat_template_kwargs", "eval_before_train", "max_rollout_time", "gateway_port",
                           "history_mode", "dataset_path", "agent_runtime_arn", "1", "yes", "~", "<<", "? [a]",
                           # this round's fields: estimators, budgets, model selection, evals, liveness, W&B
                           "advantage_estimator", "reward_granularity", "max_cost_usd", "max_session_hours", "max_steps",
                           "max_run_hours", "budget_warning_fraction", "session_usd_per_hour", "early_stopping",
                           "metric", "patience", "min_delta", "keep_model_packages", "eval_group_size", "eval_pass_k",
                           "eval_datasets", "eval_every", "eval_only", "accept_eula", "rollout_heartbeat_seconds",
                           "acr_max_active_sessions", "wandb_project", "wandb_run_name", "wandb_entity"])


def _flow(children):
    return st.one_of(
        st.lists(children, max_size=4).map(lambda xs: "[" + ", ".join(xs) + "]"),
        st.lists(st.tuples(_FIELDS, children), max_size=4).map(
            lambda kv: "{" + ", ".join(f"{k}: {v}" for k, v in kv) + "}"),
    )


_VALUE = st.recursive(_SCALAR, _flow, max_leaves=12)
_DOCUMENT = st.lists(st.tuples(_FIELDS, _VALUE), max_size=6).map(
    lambda kv: BASE + "".join(f"{k}: {v}\n" for k, v in kv))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_DOCUMENT)
def test_any_yaml_document_loads_or_gives_field_errors(tmp_path, text):
    path = _write(tmp_path, "fuzz.yaml", text)
    try:
        cfg = load_run_config(path, warnings=[])
    except ConfigError as e:
        assert e.errors and all(": " in err and len(err) <= MAX_ERROR_CHARS for err in e.errors), e.errors
    else:  # what loads can be sent as an execution's input
        json.dumps(cfg.model_dump(mode="json"), allow_nan=False)
        json.dumps(cfg.chat_template_kwargs, allow_nan=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=_DOCUMENT)
def test_stepwise_validate_exits_0_or_2_on_any_yaml_document(tmp_path, capsys, text):
    path = _write(tmp_path, "fuzz.yaml", text)
    assert main(["validate", str(path), "--json"]) in (0, 2)
    capsys.readouterr()


def test_an_upper_case_yaml_suffix_is_read_as_yaml(tmp_path):
    assert load_run_config(_write(tmp_path, "config.YAML", BASE + "lora_rank: 8\n"), warnings=[]).lora_rank == 8


def test_a_json_key_given_twice_names_the_file(tmp_path):
    path = _write(tmp_path, "dupe.json", '{"lora_rank": 4, "lora_rank": 8}')
    with pytest.raises(ConfigError) as e:
        load_run_config(path, warnings=[])
    assert e.value.source == str(path) and str(path) in str(e.value)


@pytest.mark.parametrize("value", ["!!timestamp x", "2024-13-45", "!!int abc", "!!float abc", "!!int 09"])
def test_a_scalar_its_tag_cannot_construct_is_an_error_not_a_traceback(tmp_path, value):
    # PyYAML's own constructors raise AttributeError (an explicit !!timestamp that is no date) or ValueError.
    errors = _errors(_write(tmp_path, "tagged.yaml", BASE + f"exp_id: {value}\n"))
    assert any(e.startswith("(file): ") for e in errors), errors


def test_a_value_of_nested_long_keys_is_shown_cut_to_a_readable_message(tmp_path: Path):
    """reprlib bounds each container's items, not the whole: six dicts of six 120-character keys holding lists
    of integers past 2**53 made a 9,860-character message (found by the YAML fuzz test); now at most 600."""
    value = {"k" * 120 + str(i): {"j" * 120 + str(j): [2**60] * 6 for j in range(6)} for i in range(6)}
    path = _write(tmp_path, "c.json", json.dumps({"judge": value}))
    errors = _errors(path)
    assert any("judge" in err and "2**53" in err for err in errors), errors
