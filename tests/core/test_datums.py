"""TraceRecord -> datum: padding and masking pinned by hand, equal to the reference datum.py."""

from __future__ import annotations

import pytest
from agentcore_rl_toolkit.backends.experimental.sagemaker import datum as reference
from agentcore_rl_toolkit.rollout_gateway import TraceRecord

from stepwise.core.datums import group_to_datums, trace_record_to_datum


def record(prompt, response, mask, logprobs=None):
    return TraceRecord(
        token_ids=prompt + response,
        loss_mask=mask,
        logprobs=logprobs if logprobs is not None else [-0.5] * len(mask),
    )


def test_padding_and_masking_by_hand():
    # prompt [10, 11, 12]; response [20, 21 (tool output, masked), 22]
    rec = record([10, 11, 12], [20, 21, 22], [1, 0, 1], [-0.1, 0.0, -0.3])
    d = trace_record_to_datum(rec, 2.0)
    assert d["modelInput"] == {"chunks": [{"tokens": [10, 11, 12, 20, 21], "type": "encoded_text"}]}
    inputs = d["lossFnInputs"]
    assert inputs["target_tokens"] == {"data": [11, 12, 20, 21, 22], "dtype": "int64", "shape": [5]}
    assert inputs["weights"] == {"data": [0.0, 0.0, 1.0, 0.0, 1.0], "dtype": "float32", "shape": [5]}
    assert inputs["logprobs"] == {"data": [0.0, 0.0, -0.1, 0.0, -0.3], "dtype": "float32", "shape": [5]}
    assert inputs["advantages"] == {"data": [0.0, 0.0, 2.0, 0.0, 2.0], "dtype": "float32", "shape": [5]}


@pytest.mark.parametrize(
    "rec",
    [
        record([1], [], []),  # empty response
        record([1, 2], [3, 4], [0, 0]),  # all masked
        TraceRecord(token_ids=[5, 6], loss_mask=[1, 1], logprobs=[-1.0, -1.0]),  # no prompt token
    ],
)
def test_untrainable_records_give_none(rec):
    assert trace_record_to_datum(rec, 1.0) is None


@pytest.mark.parametrize(
    ("rec", "adv"),
    [
        (record([1, 2, 3, 4], [5, 6, 7, 8, 9], [1, 1, 0, 0, 1]), -0.7),
        (record([1], [2], [1]), 1.0),
        (record(list(range(50)), list(range(50, 80)), [i % 3 != 0 for i in range(30)]), 0.0),
    ],
)
def test_equals_the_reference(rec, adv):
    assert trace_record_to_datum(rec, adv) == reference.trace_record_to_datum(rec, adv)


def test_group_to_datums_drops_none_and_keeps_member_order():
    good_a = record([1, 2], [3], [1])
    good_b = record([1, 2], [4, 5], [1, 1])
    empty = record([1, 2], [6], [0])
    datums = group_to_datums([[good_a, empty], [], [good_b]], [1.0, 0.0, -1.0])
    assert [d["lossFnInputs"]["advantages"]["data"][-1] for d in datums] == [1.0, -1.0]
    with pytest.raises(ValueError, match="2 members but advantages_G has 1"):
        group_to_datums([[good_a], [good_b]], [1.0])
