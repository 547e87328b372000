"""Behaviour metrics and seeds on hostile input: turn bodies and rollout records of any shape
(missing fields, wrong types, empty lists, huge or non-finite numbers, negative counts) give counts
and metrics, never an exception; every metric is a finite number >= 0 and the summary is strict JSON
(``allow_nan=False``: CloudWatch EMF and MLflow refuse NaN)."""

from __future__ import annotations

import json
import math

from hypothesis import given, settings
from hypothesis import strategies as st

from stepwise.core.behaviour import ROLLOUT_STATUSES, behaviour_metrics, rollout_behaviour
from stepwise.core.seeding import SEED_BITS, rollout_seed, turn_seed

_HOSTILE_NUMBERS = st.one_of(st.integers(), st.integers(min_value=10 ** 300, max_value=10 ** 400), st.floats(),
                             st.sampled_from([math.nan, math.inf, -math.inf, -1, True, 10 ** 309]))
_JSONISH = st.recursive(st.one_of(st.none(), st.booleans(), _HOSTILE_NUMBERS, st.text(max_size=5)),
                        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=5), c, max_size=3),
                        max_leaves=8)
_TURN = st.fixed_dictionaries({}, optional={
    "output_ids": st.one_of(st.lists(st.integers(), max_size=5), _JSONISH),
    "finish_reason": st.one_of(st.sampled_from(["length", "stop", None]), _JSONISH),
    "ill_formed": _JSONISH,
})
_BODY = st.one_of(
    st.fixed_dictionaries({}, optional={
        "turn": st.one_of(_TURN, _JSONISH),
        "response_message": st.one_of(st.fixed_dictionaries({}, optional={"tool_calls": _JSONISH}), _JSONISH),
    }),
    _JSONISH,
)
_RECORD = st.one_of(
    st.fixed_dictionaries({}, optional={k: st.one_of(_HOSTILE_NUMBERS, _JSONISH) for k in (
        "num_turns", "sampled_tokens", "truncated_turns", "ill_formed_turns", "tool_calls", "duration_s")} | {
        "status": st.one_of(st.sampled_from(ROLLOUT_STATUSES), _JSONISH)}),
    _JSONISH,
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_BODY, max_size=6))
def test_any_turns_give_non_negative_integer_counts(turns):
    counts = rollout_behaviour(turns)
    assert set(counts) == {"num_turns", "sampled_tokens", "truncated_turns", "ill_formed_turns", "tool_calls"}
    assert all(type(v) is int and v >= 0 for v in counts.values()), counts
    assert counts["truncated_turns"] <= counts["num_turns"] and counts["ill_formed_turns"] <= counts["num_turns"]


@settings(max_examples=300, deadline=None)
@given(st.lists(_RECORD, max_size=8))
def test_any_rollout_records_give_finite_metrics_and_strict_json(records):
    metrics = behaviour_metrics(records)
    json.dumps(metrics, allow_nan=False)
    assert all(isinstance(v, float) and math.isfinite(v) and v >= 0 for v in metrics.values()), metrics
    if metrics:  # an entry that is not a mapping is not a rollout
        assert sum(metrics[f"rollouts/num_{s}"] for s in ROLLOUT_STATUSES) <= len(records)
        assert metrics["behaviour/truncated_turns_fraction"] <= 1 and metrics["behaviour/ill_formed_turns_fraction"] <= 1


def test_the_counts_of_real_turns_feed_the_metrics_unchanged():
    turns = [{"turn": {"output_ids": [1, 2, 3], "finish_reason": "length"}, "response_message": {"tool_calls": [{}]}},
             {"turn": {"output_ids": [4], "finish_reason": "stop", "ill_formed": True}}]
    counts = rollout_behaviour(turns)
    assert counts == {"num_turns": 2, "sampled_tokens": 4, "truncated_turns": 1, "ill_formed_turns": 1, "tool_calls": 1}
    m = behaviour_metrics([{**counts, "status": "ok", "duration_s": 2.0}, {"status": "timeout", "duration_s": math.nan}])
    assert m["behaviour/turns_per_rollout"] == 1.0 and m["behaviour/truncated_turns_fraction"] == 0.5
    assert m["time/rollout_duration_p50"] == 2.0  # the NaN duration is not a duration
    assert (m["rollouts/num_ok"], m["rollouts/num_timeout"]) == (1.0, 1.0)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(min_value=0, max_value=2 ** 63 - 1), kind=st.text(max_size=10),
       step=st.integers(), gb=st.integers(), index=st.integers(), turn=st.integers(min_value=0, max_value=10 ** 6))
def test_seeds_are_31_bit_and_deterministic_for_any_place(seed, kind, step, gb, index, turn):
    r = rollout_seed(seed, kind=kind, step=step, generation_batch=gb, index=index)
    assert 0 <= r < 2 ** SEED_BITS and r == rollout_seed(seed, kind=kind, step=step, generation_batch=gb, index=index)
    t = turn_seed(r, turn)
    assert 0 <= t < 2 ** SEED_BITS and t == turn_seed(r, turn)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from(["train", "eval"]), st.integers(0, 50), st.integers(0, 3),
                          st.integers(0, 511)), unique=True, min_size=2, max_size=60))
def test_distinct_places_get_distinct_seeds(places):
    seeds = [rollout_seed(s, kind=k, step=st_, generation_batch=g, index=i) for s, k, st_, g, i in places]
    assert len(set(seeds)) == len(seeds)


def test_the_config_bounds_the_seed_so_every_seed_can_be_derived():
    import pytest

    from stepwise.config import ConfigError, load_run_config

    base = {"role_arn": "arn:aws:iam::123456789012:role/R", "base_model_arn": "stepwise-tiny",
            "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
            "dataset_path": "s3://stack-bucket/train.jsonl"}
    from stepwise.core.service_limits import MAX_EXACT_INTEGER

    for seed in (0, MAX_EXACT_INTEGER):  # the largest the config admits (Step Functions carries doubles)
        cfg = load_run_config({**base, "seed": seed})
        assert 0 <= rollout_seed(cfg.seed, kind="train", step=0, generation_batch=0, index=0) < 2 ** SEED_BITS
    for seed in (2 ** 63 - 1, 10 ** 5000):  # str() of the last, the derivation's input, raises
        with pytest.raises(ConfigError, match="seed: "):
            load_run_config({**base, "seed": seed})
