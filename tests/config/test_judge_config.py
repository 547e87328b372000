"""The run config's ``judge`` section: what it accepts, and what it refuses before anything is billed (the rubric,
the combination against the estimator, the price a cost limit needs, the model's forms and region)."""

from __future__ import annotations

import json

import pytest

from stepwise.config import ConfigError, load_run_config, read_config_file
from tests.support.planning import BASE

JUDGE = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "Prefer the right digit."}


def errors(**kw) -> list[str]:
    try:
        load_run_config({**BASE, **kw})
    except ConfigError as e:
        return e.errors
    return []


def test_a_judge_is_optional_and_defaults_to_replace_with_the_agent_s_reward_as_fallback():
    assert load_run_config(BASE).judge is None
    j = load_run_config({**BASE, "judge": JUDGE}).judge
    assert (j.combine, j.fallback, j.score_min, j.score_max, j.max_attempts) == ("replace", "agent_reward", 0, 10, 3)
    assert j.usd_per_million == (0.035, 0.14)  # the price table's Nova Micro, through its US profile


@pytest.mark.parametrize("model_id", [
    "amazon.nova-micro-v1:0", "us.amazon.nova-micro-v1:0", "global.anthropic.claude-sonnet-4-5-20250929-v1:0",
    "meta.llama3-1-8b-instruct-v1:0", "arn:aws:bedrock:us-east-1::foundation-model/amazon.nova-lite-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:inference-profile/us.amazon.nova-micro-v1:0",
    "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/a1b2c3d4e5f6",
])
def test_model_ids_profiles_and_their_arns_are_accepted(model_id):
    assert errors(judge={**JUDGE, "model_id": model_id}) == []


@pytest.mark.parametrize("model_id", ["", "nova micro", "arn:aws:bedrock:us-east-1:123456789012:agent/x", "amazon"])
def test_anything_else_is_not_a_model(model_id):
    [err] = errors(judge={**JUDGE, "model_id": model_id})
    assert err.startswith("judge.model_id: must be a Bedrock model id")


def test_a_judge_needs_a_rubric():
    [err] = errors(judge={"model_id": "amazon.nova-micro-v1:0", "rubric": "   "})
    assert "the judge needs a rubric" in err


def test_a_rubric_file_is_read_with_the_config_file_relative_to_its_folder(tmp_path):
    (tmp_path / "rubrics").mkdir()
    (tmp_path / "rubrics" / "support.md").write_text("Prefer the reply that resolves the ticket.\n")
    path = tmp_path / "run.json"
    path.write_text(json.dumps({**BASE, "judge": {"model_id": "amazon.nova-micro-v1:0", "rubric_file": "rubrics/support.md"}}))
    raw = read_config_file(path)  # what `stepwise start` and run-local send as the execution's input
    assert raw["judge"]["rubric"] == "Prefer the reply that resolves the ticket.\n"
    assert load_run_config(path).judge.rubric_file == "rubrics/support.md"
    (tmp_path / "missing.json").write_text(json.dumps({**BASE, "judge": {"model_id": "amazon.nova-micro-v1:0",
                                                                          "rubric_file": "nope.md"}}))
    with pytest.raises(ConfigError, match="judge.rubric_file: cannot read"):
        read_config_file(tmp_path / "missing.json")


def test_a_rubric_file_the_execution_s_input_still_names_is_refused_saying_why():
    [err] = errors(judge={"model_id": "amazon.nova-micro-v1:0", "rubric_file": "rubric.md"})
    assert "'rubric.md' was not read into rubric" in err and "must carry the rubric's text" in err


def test_the_score_range_must_be_a_range():
    [err] = errors(judge={**JUDGE, "score_min": 5, "score_max": 5})
    assert err.startswith("judge.score_max: must be above score_min")


@pytest.mark.parametrize("combine", ["replace", "gdpo"])
def test_a_per_turn_estimator_takes_the_judge_only_added_to_its_last_turn(combine):
    per_turn = {"advantage_estimator": "per_turn_rloo", "reward_granularity": "per_turn"}
    [err] = errors(**per_turn, judge={**JUDGE, "combine": combine})
    assert err.startswith("judge:") and "use combine 'add'" in err
    assert errors(**per_turn, judge={**JUDGE, "combine": "add"}) == []
    assert errors(reward_granularity="per_turn", judge={**JUDGE, "combine": combine}) == []  # returns: one per rollout


def test_a_cost_limit_needs_the_judge_s_price():
    unpriced = {**JUDGE, "model_id": "arn:aws:bedrock:us-east-1:123456789012:application-inference-profile/abc"}
    [err] = errors(session_usd_per_hour=10.0, max_cost_usd=50.0, judge=unpriced)
    assert "max_cost_usd needs the judge's price" in err
    assert errors(session_usd_per_hour=10.0, max_cost_usd=50.0, judge={**unpriced, "usd_per_million_input_tokens": 0.1,
                                                                        "usd_per_million_output_tokens": 0.4}) == []
    [err] = errors(judge={**JUDGE, "usd_per_million_input_tokens": 0.1})
    assert "set both" in err


def test_a_model_arn_of_another_region_is_refused():
    [err] = errors(region="us-east-1", judge={**JUDGE, "model_id": "arn:aws:bedrock:eu-west-1::foundation-model/amazon.nova-micro-v1:0"})
    assert "names region eu-west-1, not the run's region us-east-1" in err


def test_dapo_s_generation_batch_cap_leaves_room_for_the_judge_s_history_events():
    from stepwise.core import service_limits as limits

    cap = limits.MAX_JUDGED_GENERATION_BATCHES_PER_STEP
    assert cap < limits.MAX_GENERATION_BATCHES_PER_STEP
    assert errors(algorithm="dapo", max_num_gen_batches=cap, judge=JUDGE) == []
    [err] = errors(algorithm="dapo", max_num_gen_batches=cap + 1, judge=JUDGE)
    assert err.startswith("judge:") and f"at most {cap}" in err


def test_unknown_judge_fields_get_a_suggestion():
    [err] = errors(judge={**JUDGE, "rubrik": "x"})
    assert err == "judge.rubrik: unknown field (got 'x'); did you mean 'rubric'?"
