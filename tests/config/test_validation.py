"""RunConfig: defaults equal the reference, each field's validation, unknown keys, error text."""

from __future__ import annotations

import dataclasses
import json

import pytest
from agentcore_rl_toolkit.backends.experimental.sagemaker.config import Config as ReferenceConfig

from stepwise.config import DEFAULT_SAVE_EVERY, DROPPED_FIELDS, ConfigError, RunConfig, load_run_config

VALID = {
    "region": "us-west-2",
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/gpt-oss-20b/1.0.0",
    "s3_output_path": "s3://my-bucket/output/",
    "model_package_group_arn": "arn:aws:sagemaker:us-west-2:123456789012:model-package-group/stepwise",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/math_agent-AbC123",
    "dataset_path": "s3://my-bucket/data/gsm8k/train.parquet",
    "eval_dataset_path": "s3://my-bucket/data/gsm8k/test.parquet",
    "eval_every": 10,
    "chat_template_kwargs": {"enable_thinking": False},
}


def errors_for(**overrides) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_run_config({**VALID, **overrides})
    return exc.value.errors


def test_valid_example_loads_and_round_trips_through_json():
    cfg = load_run_config(VALID)
    assert cfg.eval_every == 10 and cfg.chat_template_kwargs == {"enable_thinking": False}
    assert load_run_config(json.loads(cfg.model_dump_json())) == cfg


def test_defaults_equal_the_reference_config():
    cfg = load_run_config({k: VALID[k] for k in ("role_arn", "base_model_arn", "agent_runtime_arn", "dataset_path")})
    ref = ReferenceConfig()
    shared = {f.name for f in dataclasses.fields(ReferenceConfig)} - set(DROPPED_FIELDS)
    shared -= {"role_arn", "base_model_arn", "agent_runtime_arn", "dataset_path"}  # required here
    assert shared <= set(RunConfig.model_fields)
    # deliberate: '' = the stack's region (Init refuses any other; the reference says us-east-1)
    assert cfg.region == "" and ref.region == "us-east-1"
    # deliberate: a checkpoint cadence by default, so a resumed run does not restart from step 0
    assert cfg.save_every == DEFAULT_SAVE_EVERY > 0 and ref.save_every == -1
    shared -= {"region", "save_every"}
    for name in sorted(shared):
        assert getattr(cfg, name) == getattr(ref, name), name


def test_every_dropped_reference_field_is_warned_about_with_a_reason_not_refused():
    assert set(DROPPED_FIELDS) == {f.name for f in dataclasses.fields(ReferenceConfig)} - set(RunConfig.model_fields)
    warnings: list[str] = []
    assert load_run_config({**VALID, "gateway_port": 0, "history_mode": "tree"},
                           warnings=warnings) == load_run_config(VALID)
    assert any(w.startswith("gateway_port: ignored, the gateway is a Lambda Function URL") for w in warnings)
    assert any(w.startswith("history_mode: ignored, only 'tree'") and "(got 'tree')" in w for w in warnings)
    assert len(warnings) == 2
    assert load_run_config({**VALID, "wandb_project": "p"}).wandb_project == "p"  # the reference's W&B fields are real
    # still an error where there is one: the warnings come with the errors
    errs = errors_for(gateway_port=0, batch_size=0)
    assert len(errs) == 1 and errs[0].startswith("batch_size")


def test_unknown_key_is_rejected_with_a_suggestion():
    assert errors_for(lora_rnk=8) == ["lora_rnk: unknown field (got 8); did you mean 'lora_rank'?"]


def test_all_errors_are_reported_at_once():
    errs = errors_for(batch_size=0, responses_per_prompt=1, loss="grpo", temperature=-1.0, typo_key=1)
    fields = sorted(e.split(":")[0] for e in errs)
    assert fields == ["batch_size", "loss", "responses_per_prompt", "temperature", "typo_key"]
    with pytest.raises(ConfigError) as exc:
        load_run_config({**VALID, "batch_size": 0, "loss": "grpo"})
    assert "2 error(s)" in str(exc.value)


def test_missing_required_fields_are_named():
    with pytest.raises(ConfigError) as exc:
        load_run_config({})
    assert sorted(e.split(":")[0] for e in exc.value.errors) == [
        "agent_runtime_arn", "base_model_arn", "dataset_path", "role_arn",
    ]


# field -> (a bad value, a fragment the message must contain); each error names the value too.
BAD_VALUES = [
    ("region", "us_west_2", "AWS region"),
    ("role_arn", "arn:aws:iam::123:role/x", "IAM role ARN"),
    ("role_arn", "arn:aws:iam::123456789012:user/x", "IAM role ARN"),
    ("base_model_arn", "arn:aws:sagemaker:us-west-2:123456789012:model/x", "hub-content ARN"),
    ("base_model_arn", "has space", "hub model name"),
    ("s3_output_path", "/local/out", "s3://"),
    ("model_package_group_arn", "arn:aws:sagemaker:us-west-2:123456789012:model-package/x/1", "model-package-group"),
    ("resume_from_model_package", "checkpoint-1", "model-package/"),
    ("kms_key_arn", "my-key", "arn:aws:kms"),
    ("tokenizer_path", "s3://x/", "s3://"),
    ("tokenizer_path", "a b c", "model id"),
    ("agent_runtime_arn", "arn:aws:bedrock-agentcore:us-west-2:123456789012:agent/x", "runtime/AGENT_ID"),
    ("lora_rank", 0, "greater than or equal to 1"),
    ("lora_alpha", 0, "greater than or equal to 1"),
    ("max_rollout_time", 0, "greater than 0"),
    ("max_rollout_time", float("inf"), "finite number"),
    ("acr_tps_limit", 0, "greater than or equal to 1"),
    ("acr_max_active_sessions", 0, "greater than or equal to 1"),
    ("rollout_heartbeat_seconds", -1, "greater than or equal to 0"),
    ("rollout_recheck_seconds", 0, "greater than or equal to 1"),
    ("chat_template_kwargs", ["enable_thinking"], "valid dictionary"),
    ("max_turns_per_rollout", 0, "greater than or equal to 1"),
    ("max_tokens_per_rollout", 0, "greater than or equal to 1"),
    ("algorithm", "ppo", "'grpo' or 'dapo'"),
    ("advantage_estimator", "gae", "'grpo', 'dr_grpo', 'rloo', 'reinforce_pp_baseline' or 'per_turn_rloo'"),
    ("reward_granularity", "per_step", "'trajectory' or 'per_turn'"),
    ("batch_size", 0, "greater than or equal to 1"),
    ("batch_size", "32", "valid integer"),
    ("batch_size", True, "valid integer"),
    ("responses_per_prompt", 1, "greater than or equal to 2"),
    ("learning_rate", 0.0, "greater than 0"),
    ("learning_rate", float("nan"), "finite"),
    ("max_context_tokens", 0, "greater than or equal to 1"),
    ("max_new_tokens", 40000, "max_context_tokens (32768)"),
    ("temperature", -0.1, "greater than or equal to 0"),
    ("epochs", 0, "greater than or equal to 1"),
    ("save_every", -2, "greater than or equal to -1"),
    ("accept_eula", "yes", "valid boolean"),
    ("loss", "grpo", "'ppo', 'importance_sampling' or 'cispo'"),
    ("clip_low_threshold", 1.5, "between 0 and 1"),
    ("clip_high_threshold", 0.5, "between 1 and 10"),
    ("clip_high_threshold", 11.0, "between 1 and 10"),
    ("max_num_gen_batches", 0, "greater than or equal to 1"),
    ("max_staleness", -1, "greater than or equal to 0"),
    ("max_staleness", 2, "needs admission 'group'"),
    ("max_staleness", 17, "less than or equal to 16"),
    ("admission", "async", "'batch' or 'group'"),
    ("sampling_steps_ahead", 1, "applies to admission 'group' only"),
    ("max_rollouts_in_flight", 64, "applies to admission 'group' only"),
    ("sampler_binding", "per_turn", "'per_rollout', 'next_turn' or 'turn_gate'"),
    ("overlong_buffer_len", -1, "greater than or equal to 0"),
    ("overlong_buffer_len", 262144, "max_tokens_per_rollout (262144)"),
    ("overlong_penalty_factor", -1.0, "greater than or equal to 0"),
    ("save_weights_at_end", "yes", "valid boolean"),
    ("train_op_timeout", 0, "greater than 0"),
    ("seed", -1, "greater than or equal to 0"),
    ("steps_per_execution", 0, "greater than or equal to 1"),
    ("steps_per_execution", 1001, "less than or equal to 1000"),
    ("history_event_budget", 199, "greater than or equal to 200"),
    ("history_event_budget", 25_001, "less than or equal to 25000"),
    ("max_consecutive_empty_steps", 0, "greater than or equal to 1"),
    ("max_consecutive_empty_steps", 1001, "less than or equal to 1000"),
    ("max_steps", 0, "greater than or equal to 1"),
    ("max_steps", 2.5, "valid integer"),
    ("session_usd_per_hour", 0, "greater than 0"),
    ("acr_vcpus", -1, "greater than or equal to 0"),
    ("acr_memory_gb", 300, "less than or equal to 256"),
    ("max_cost_usd", 0, "greater than 0"),
    ("max_cost_usd", 5.0, "needs session_usd_per_hour"),
    ("max_session_hours", -1, "greater than 0"),
    ("max_run_hours", 0, "greater than 0"),
    ("budget_warning_fraction", 1.5, "less than or equal to 1"),
    ("dataset_path", "", "required"),
    ("dataset_path", "s3://my-bucket/data/", "must name a file"),
    ("dataset_path", "s3://B/x.parquet", "valid bucket name"),
    ("max_prompts", -1, "greater than or equal to 0"),
    ("max_prompts", 10, "fewer prompts than batch_size (32)"),
    ("eval_dataset_path", "s3://my-bucket", "must name a file"),
    ("eval_every", -1, "greater than or equal to 0"),
    ("eval_before_train", "yes", "valid boolean"),
    ("eval_max_prompts", -1, "greater than or equal to 0"),
    ("eval_temperature", -1.0, "greater than or equal to 0"),
    ("eval_datasets", {"hard": 5}, "valid string"),
    ("eval_group_size", 0, "greater than or equal to 1"),
    ("eval_group_size", 4, "eval_temperature 0 (greedy)"),
    ("eval_pass_k", [2], "between 1 and eval_group_size (1)"),
    ("eval_success_threshold", float("inf"), "finite number"),
    ("eval_only", "yes", "valid boolean"),
    ("eval_model_package_arn", "checkpoint-1", "model-package/"),
    ("early_stopping", {"patience": 0}, "greater than or equal to 1"),
    ("keep_model_packages", "none", "'all' or 'best_and_last'"),
    ("exp_id", 5, "valid string"),
    ("mlflow_tracking_uri", "mlflow.example.com", "SageMaker MLflow ARN"),
    ("mlflow_tracking_uri", "arn:aws:sagemaker:us-east-1:123456789012:model-package/x/1", "http(s):// URL"),
    ("mlflow_experiment_name", "", "at least 1 character"),
    ("wandb_project", "team/project", "must not contain /"),
    ("wandb_entity", "a:b", "must not contain :"),
    ("wandb_run_name", 7, "valid string"),
    ("vpc_config", {"subnets": [], "security_group_ids": ["sg-1"]}, "at least 1 item"),
    ("judge", {"model_id": "amazon.nova-micro-v1:0", "rubric": "r", "score_min": 1.0, "score_max": 1.0},
     "must be above score_min"),
]


@pytest.mark.parametrize(("field", "value", "fragment"), BAD_VALUES, ids=[f"{f}={v!r}" for f, v, _ in BAD_VALUES])
def test_bad_value_is_rejected_naming_field_value_and_accepted(field, value, fragment):
    errs = errors_for(**{field: value})
    assert len(errs) == 1, errs
    assert errs[0].startswith(f"{field}"), errs
    assert fragment in errs[0], errs
    if isinstance(value, dict):  # nested: the error names the inner field and its value
        assert errs[0].startswith(f"{field}.") and "(got " in errs[0], errs
    elif value != "":
        assert f"(got {value!r})" in errs[0], errs


def test_every_field_is_covered_by_a_bad_value_case():
    assert {f for f, _, _ in BAD_VALUES} == set(RunConfig.model_fields)


def test_a_per_turn_estimator_needs_per_turn_rewards():
    errs = errors_for(advantage_estimator="per_turn_rloo")
    assert len(errs) == 1 and errs[0].startswith("reward_granularity") and "set reward_granularity 'per_turn'" in errs[0]
    assert load_run_config({**VALID, "advantage_estimator": "per_turn_rloo", "reward_granularity": "per_turn"})
    assert load_run_config({**VALID, "advantage_estimator": "rloo", "reward_granularity": "per_turn"})


def test_clip_thresholds_only_with_ppo_or_cispo():
    errs = errors_for(loss="importance_sampling", clip_high_threshold=1.28)
    assert errs == [
        "clip_high_threshold: applies only to loss 'ppo' or 'cispo', but loss is 'importance_sampling'; "
        "remove it or change loss (got 1.28)"
    ]
    cfg = load_run_config({**VALID, "loss": "cispo", "clip_low_threshold": 0.2, "clip_high_threshold": 1.28})
    assert cfg.loss_fn_config == {"clip_low_threshold": 0.2, "clip_high_threshold": 1.28}
    assert load_run_config(VALID).loss_fn_config is None


def test_eval_every_without_eval_dataset_is_an_error():
    errs = errors_for(eval_dataset_path="", eval_every=5)
    assert errs == ["eval_every: evaluates nothing: eval_dataset_path and eval_datasets are empty; set one or use "
                    "eval_every 0 (got 5)"]
    # a named eval set is an eval set
    assert load_run_config({**VALID, "eval_dataset_path": "", "eval_datasets": {"hard": "/tmp/h.jsonl"},
                            "eval_every": 5}).eval_set_paths == {"hard": "/tmp/h.jsonl"}


def test_an_eval_only_run_needs_an_eval_set_and_evaluates_a_package_only_when_eval_only():
    assert errors_for(eval_only=True, eval_dataset_path="", eval_every=0) == [
        "eval_only: an eval-only run needs an eval set: set eval_dataset_path or eval_datasets (got True)"]
    arn = "arn:aws:sagemaker:us-west-2:123456789012:model-package/stepwise/3"
    assert errors_for(eval_only=True, resume_from_model_package=arn)[0].startswith(
        "eval_only: an eval-only run does not train")
    cfg = load_run_config({**VALID, "eval_only": True, "eval_model_package_arn": arn})
    assert cfg.eval_only and cfg.eval_model_package_arn == arn


def test_the_eval_of_every_set_must_fit_one_map_run_and_pass_k_defaults_to_1_and_n():
    errs = errors_for(eval_datasets={"a": "/tmp/a.jsonl"}, eval_temperature=1.0, eval_max_prompts=2000, eval_group_size=4)
    assert errs == ["eval_group_size: 2 eval set(s) x eval_max_prompts 2000 x 4 = 16000 eval rollouts in one Map run, "
                    "more than 10000; lower either (got 4)"]
    assert load_run_config({**VALID, "eval_temperature": 1.0, "eval_group_size": 8}).pass_ks == [1, 8]


def test_accepted_alternatives():
    cfg = load_run_config({
        **VALID,
        "base_model_arn": "stepwise-tiny",
        "dataset_path": "/tmp/train.jsonl",
        "tokenizer_path": "Qwen/Qwen3-0.6B",
        "kms_key_arn": "arn:aws:kms:us-west-2:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "vpc_config": {"subnets": ["subnet-0abc"], "security_group_ids": ["sg-0abc"]},
        "resume_from_model_package": "arn:aws:sagemaker:us-west-2:123456789012:model-package/stepwise/3",
        "algorithm": "dapo",
        "save_every": 0,
    })
    assert cfg.vpc_config is not None and cfg.vpc_config.subnets == ["subnet-0abc"]
    for tok in ("s3://my-bucket/tok/", "/work/main/local/assets/tiny-model"):
        assert load_run_config({**VALID, "tokenizer_path": tok}).tokenizer_path == tok


def test_load_from_json_and_yaml_files(tmp_path):
    p = tmp_path / "run.json"
    p.write_text(json.dumps(VALID))
    assert load_run_config(p) == load_run_config(str(p)) == load_run_config(VALID)
    y = tmp_path / "run.yaml"
    y.write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in VALID.items()))
    assert load_run_config(y) == load_run_config(VALID)


@pytest.mark.parametrize(
    ("content", "fragment"),
    [("{not json", "not valid JSON at line 1"), ("[1, 2]", "must be a JSON object"), (None, "cannot read")],
)
def test_file_errors_are_config_errors(tmp_path, content, fragment):
    p = tmp_path / "run.json"
    if content is not None:
        p.write_text(content)
    with pytest.raises(ConfigError) as exc:
        load_run_config(p)
    assert fragment in str(exc.value) and str(p) in str(exc.value)


def test_reference_schedule_semantics():
    cfg = load_run_config({**VALID, "eval_every": 3, "save_every": 2})
    assert [s for s in range(8) if cfg.should_save(s)] == [2, 4, 6]
    assert [s for s in range(1, 8) if cfg.should_eval(s)] == [3, 6]
    off = load_run_config({**VALID, "eval_every": 0, "save_every": -1})
    assert not any(off.should_save(s) or off.should_eval(s) for s in range(1, 50))
    # final eval: unless one already ran after the last step (fixes the reference's modulo test)
    assert cfg.final_eval_needed(7, last_eval_step=6) and not cfg.final_eval_needed(6, last_eval_step=6)
    assert cfg.final_eval_needed(0, last_eval_step=None)
    assert not load_run_config({**VALID, "eval_dataset_path": "", "eval_every": 0}).final_eval_needed(7, None)


def test_summary_numbers():
    cfg = load_run_config({**VALID, "batch_size": 32, "responses_per_prompt": 4, "max_prompts": 3000, "epochs": 2})
    s = cfg.summary(7473)
    assert s["rollouts_per_step"] == 128
    assert s["prompts_used"] == 3000 and s["steps_per_epoch"] == 93 and s["total_steps"] == 186
    assert s["executions"] == 10  # ceil(186 / 20)
    assert cfg.model_copy(update={"max_steps": 50}).summary(7473)["total_steps"] == 50  # a budget limit binds first
    assert s["evals"] == 1 + 18 + 1  # the baseline at step 0, every 10 steps, the final eval (186 % 10 != 0)
    assert cfg.model_copy(update={"eval_before_train": False}).summary(7473)["evals"] == 18 + 1
    dapo = load_run_config({**VALID, "algorithm": "dapo", "max_num_gen_batches": 4}).summary()
    assert dapo["max_rollouts_per_step"] == 512 and "steps_per_epoch" not in dapo


def test_a_checkpoint_cadence_by_default_and_a_config_that_sets_save_every_keeps_it():
    """A run whose config says nothing saves its state every DEFAULT_SAVE_EVERY steps, so a resume after a
    failure at step 25 restarts from step 20, not 0 (the reference's -1 saved only at the end)."""
    default = load_run_config(VALID)
    assert [s for s in range(1, 31) if default.should_save(s)] == [10, 20, 30]
    for value in (-1, 0, 3):  # the reference's template sets -1: it stays -1 (only at the end)
        cfg = load_run_config({**VALID, "save_every": value})
        assert cfg.save_every == value
        assert [s for s in range(1, 31) if cfg.should_save(s)] == ([3 * k for k in range(1, 11)] if value == 3 else [])
