"""The config's bounds follow the services: read from botocore's models (checked here against botocore
itself, independently of `stepwise.core.service_limits`), and property-tested with hypothesis: a value is
accepted exactly when the service and one step of the state machine can take it."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import botocore.session
from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core import service_limits as limits
from stepwise.config import LOSSES, ConfigError, load_run_config

REPO = Path(__file__).resolve().parents[2]
BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/StepwiseSageMaker",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/toy_agent-local",
    "dataset_path": "s3://bkt/train.jsonl",
}


def _member(shape: str, member: str):
    model = botocore.session.get_session().get_service_model("sagemakertrainingsessionruntime")
    return model.shape_for(shape).members[member].metadata


def errors(**overrides) -> list[str]:
    try:
        load_run_config({**BASE, **overrides})
    except ConfigError as e:
        return e.errors
    return []


def test_bounds_are_botocores():
    assert (limits.MAX_TOKENS.lo, limits.MAX_TOKENS.hi) == (_member("SamplingParams", "maxTokens")["min"],
                                                            _member("SamplingParams", "maxTokens")["max"])
    assert limits.TEMPERATURE.hi == _member("SamplingParams", "temperature")["max"]
    assert limits.NUM_SAMPLES.hi == _member("SampleConfig", "numSamples")["max"]
    assert limits.LEARNING_RATE.hi == _member("AdamParamsConfig", "learningRate")["max"]
    model = botocore.session.get_session().get_service_model("sagemakertrainingsessionruntime")
    assert set(LOSSES) <= set(model.shape_for("LossFnName").metadata["enum"])


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=-10, max_value=300_000))
def test_max_new_tokens_accepted_exactly_within_the_services_range(v):
    errs = [e for e in errors(max_new_tokens=v, max_context_tokens=300_000) if e.startswith("max_new_tokens:")]
    inside = limits.MAX_TOKENS.lo <= v <= limits.MAX_TOKENS.hi
    assert (not errs) == inside
    if errs:
        assert repr(v) in errs[0] and "SamplingParams.maxTokens" in errs[0]


@settings(max_examples=150, deadline=None)
@given(st.floats(min_value=-5, max_value=5, allow_nan=False), st.sampled_from(["temperature", "eval_temperature"]))
def test_temperatures_accepted_exactly_within_the_services_range(t, field):
    errs = [e for e in errors(**{field: t}) if e.startswith(f"{field}:")]
    assert (not errs) == (limits.TEMPERATURE.lo <= t <= limits.TEMPERATURE.hi)


@settings(max_examples=150, deadline=None)
@given(st.integers(min_value=1, max_value=20_000), st.integers(min_value=2, max_value=1_500))
def test_a_generation_batch_is_accepted_exactly_when_one_map_run_and_the_sampler_can_hold_it(batch, k):
    errs = [e for e in errors(batch_size=batch, responses_per_prompt=k) if e.startswith("responses_per_prompt:")]
    fits = k <= limits.NUM_SAMPLES.hi and batch * k <= limits.DISTRIBUTED_MAP_MAX_CHILDREN
    assert (not errs) == fits
    if errs:
        assert repr(k) in errs[0]


@settings(max_examples=100, deadline=None)
@given(st.floats(min_value=1e-9, max_value=1.0, allow_nan=False))
def test_learning_rate_accepted_exactly_within_the_services_range(lr):
    errs = [e for e in errors(learning_rate=lr) if e.startswith("learning_rate:")]
    assert (not errs) == (lr <= limits.LEARNING_RATE.hi)


def test_the_generation_batch_cycle_of_the_asl_costs_the_counted_history_events():
    """EVENTS_PER_GENERATION_BATCH counts the parent-history events of one more DAPO generation batch:
    the cycle PlanStep -> choice -> Map -> choice -> ComputeAdvantages -> choice -> PlanStep of the real
    ASL; a Task adds Entered/Scheduled/Started/Succeeded/Exited, a Choice Entered/Exited, a
    Distributed Map Entered/Started/MapRunStarted/MapRunSucceeded/Succeeded/Exited."""
    states = json.loads((REPO / "state_machine" / "training_loop.asl.json").read_text())["States"]
    cycle = ["Plan next action", "What comes next?", "Roll out generation batch", "Train or eval batch?",
             "Compute advantages and filter groups", "Enough groups to train?"]
    for here, there in zip(cycle, cycle[1:] + cycle[:1]):
        s = states[here]
        assert there in [s.get("Next"), s.get("Default"), *(c.get("Next") for c in s.get("Choices", []))], here
    per_type = {"Task": 5, "Choice": 2, "Map": 6}
    assert sum(per_type[states[n]["Type"]] for n in cycle) == limits.EVENTS_PER_GENERATION_BATCH
    cap = limits.MAX_GENERATION_BATCHES_PER_STEP
    assert cap * limits.EVENTS_PER_GENERATION_BATCH + limits.HISTORY_RESERVE_EVENTS <= limits.EXECUTION_HISTORY_EVENTS
    assert errors(algorithm="dapo", max_num_gen_batches=cap) == []
    assert errors(algorithm="dapo", max_num_gen_batches=cap + 1)[0].startswith("max_num_gen_batches:")


def test_acr_tps_limit_stops_where_the_map_concurrency_cap_binds():
    from stepwise.core.service_limits import CONCURRENCY_PER_TPS, MAX_MAP_CONCURRENCY

    top = limits.MAX_ACR_TPS_LIMIT
    assert top * CONCURRENCY_PER_TPS <= MAX_MAP_CONCURRENCY < (top + 1) * CONCURRENCY_PER_TPS
    assert errors(acr_tps_limit=top) == []
    [err] = errors(acr_tps_limit=top + 1)
    assert err.startswith("acr_tps_limit:") and str(top) in err


@functools.lru_cache(maxsize=None)  # the sagemaker model is a large JSON: loaded once, not per example
def _sagemaker_member(shape: str, member: str):
    model = botocore.session.get_session().get_service_model("sagemaker")
    return model.shape_for(shape).members[member]


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=-2, max_value=2 ** 40), st.sampled_from(["lora_rank", "lora_alpha"]))
def test_lora_rank_and_alpha_accepted_exactly_within_create_training_sessions_lora_config(v, field):
    # CreateTrainingSession's LoraConfig (botocore's sagemaker model): Rank 1..256, Alpha >= 1, both
    # 32-bit integers; the config allowed a rank up to 1024 and any alpha, refused only by the service.
    member = _sagemaker_member("LoraConfig", {"lora_rank": "Rank", "lora_alpha": "Alpha"}[field])
    assert member.type_name == "integer"
    lo, hi = member.metadata["min"], member.metadata.get("max", 2 ** 31 - 1)
    errs = [e for e in errors(**{field: v}) if e.startswith(f"{field}:")]
    assert (not errs) == (lo <= v <= hi), errs
    if errs and v >= lo:
        assert "LoraConfig" in errs[0], errs
