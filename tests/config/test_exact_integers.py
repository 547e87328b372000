"""Every integer of a run config is one Step Functions carries exactly: within +-(2**53 - 1)
(`stepwise.core.service_limits.MAX_EXACT_INTEGER`), the one bound `RunConfig` applies to every field before
the field's own checks (before: an integer field with no upper bound of its own, ``batch_size`` say, took
10**30, which an execution's state data, whose numbers are doubles, turns into 1e30).

The integer fields are found by introspection, so a field added later is covered and tested too.
"""

from __future__ import annotations

import json
import types
import typing

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from stepwise.config import ConfigError, RunConfig, load_run_config
from stepwise.core.service_limits import MAX_EXACT_INTEGER
from tests.config.test_service_limits import BASE, errors


def _is_int(annotation) -> bool:
    if annotation is int:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return any(_is_int(a) for a in typing.get_args(annotation))
    return False


INT_FIELDS = sorted(name for name, f in RunConfig.model_fields.items() if _is_int(f.annotation))
beyond = st.one_of(st.integers(min_value=MAX_EXACT_INTEGER + 1), st.integers(max_value=-MAX_EXACT_INTEGER - 1),
                   st.sampled_from([2**53, 2**53 + 1, -(2**53), 10**30, 2**63, 10**400]))


def test_the_bound_is_where_doubles_stop_holding_integers_exactly():
    assert all(int(float(v)) == v for v in (MAX_EXACT_INTEGER, MAX_EXACT_INTEGER - 1, -MAX_EXACT_INTEGER))
    assert int(float(MAX_EXACT_INTEGER + 2)) != MAX_EXACT_INTEGER + 2  # 2**53 + 1 rounds to 2**53
    assert len(INT_FIELDS) >= 25, INT_FIELDS  # batch_size, seed, max_steps, eval_every, ...


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(INT_FIELDS), beyond)
@example("batch_size", 10**30).via("the issue's example")
def test_an_integer_beyond_the_bound_is_refused_in_every_integer_field(field, value):
    errs = [e for e in errors(**{field: value}) if e.startswith(f"{field}:")]
    assert len(errs) == 1 and f"{MAX_EXACT_INTEGER:,}" in errs[0] and "Step Functions" in errs[0], errs


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(INT_FIELDS), st.sampled_from([MAX_EXACT_INTEGER, -MAX_EXACT_INTEGER, 0, 1, 2**31]))
def test_an_integer_within_the_bound_meets_only_the_fields_own_checks(field, value):
    assert not any(f"{MAX_EXACT_INTEGER:,}" in e for e in errors(**{field: value}))


@pytest.mark.parametrize("field, value", [
    ("chat_template_kwargs", {"thinking_budget": 10**20}),
    ("chat_template_kwargs", {"nested": [1, [2, {"k": -(2**60)}]]}),
    ("early_stopping", {"metric": "eval/accuracy", "patience": 2**64}),
])
def test_integers_nested_in_a_field_are_bounded_too(field, value):
    config = {**BASE, "eval_dataset_path": "s3://bkt/eval.jsonl", field: value}
    with pytest.raises(ConfigError) as e:
        load_run_config(config)
    assert any(err.startswith(f"{field}:") and f"{MAX_EXACT_INTEGER:,}" in err for err in e.value.errors), e.value.errors


def test_a_config_within_the_bound_survives_a_trip_through_doubles():
    """What Init reads back equals what the user wrote once every number has been a double (``json`` with
    ``parse_int=float``, as the execution's state data holds it)."""
    cfg = load_run_config({**BASE, "seed": MAX_EXACT_INTEGER, "max_steps": 2**40})
    as_doubles = json.loads(json.dumps(cfg.model_dump(mode="json")), parse_int=float)
    back = {k: int(v) if isinstance(v, float) and k in INT_FIELDS else v for k, v in as_doubles.items()}
    assert back["seed"] == MAX_EXACT_INTEGER and back["max_steps"] == 2**40
