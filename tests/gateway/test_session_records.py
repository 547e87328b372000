"""Session-record rules and turn keys (pure functions of stepwise.gateway.session)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from stepwise.gateway.session import (
    TurnUsage,
    is_plausible_sid,
    limit_exceeded,
    refusal,
    sid_digest,
    turn_key,
    usage_from_keys,
)
from stepwise.records import SessionRecord

RECORD = SessionRecord(sid="s1", run_id="r", training_session_name="ts", deadline=100.0, max_turns=3,
                       max_total_tokens=50)


@given(st.lists(st.tuples(st.integers(0, 10**19), st.integers(0, 10**6)), min_size=1, max_size=20))
def test_turn_keys_sort_in_completion_order_and_count_tokens(turns):
    keys = [turn_key("r", "s1", completed_at_ns=ns, output_tokens=out) for ns, out in turns]
    assert len(set(keys)) == len(keys)  # concurrent turns never collide
    assert [k.split("/")[-1][:20] for k in sorted(keys)] == sorted(f"{ns:020d}" for ns, _ in turns)
    assert all(k.startswith("runs/r/sessions/s1/turns/") for k in keys)
    assert usage_from_keys(keys) == TurnUsage(turns=len(turns), output_tokens=sum(out for _, out in turns))


def test_usage_ignores_foreign_objects_and_accepts_keys_without_token_suffix():
    keys = ["runs/r/sessions/s1/turns/00000000000000000001-" + "a" * 32 + ".json",
            "runs/r/sessions/s1/turns/notes.txt",
            turn_key("r", "s1", completed_at_ns=2, output_tokens=7)]
    assert usage_from_keys(keys) == TurnUsage(turns=2, output_tokens=7)


def test_refusal_reasons():
    assert refusal(RECORD, sid="s1", now=99.0) is None
    assert "expired" in refusal(RECORD, sid="s1", now=101.0)
    assert "closed" in refusal(RECORD.model_copy(update={"closed": True}), sid="s1", now=0.0)
    assert refusal(RECORD, sid="s2", now=0.0) is not None
    assert refusal(RECORD.model_copy(update={"deadline": 0.0}), sid="s1", now=1e12) is None


def test_limits():
    assert limit_exceeded(RECORD, TurnUsage(2, 49)) is None
    assert "max_turns=3" in limit_exceeded(RECORD, TurnUsage(3, 0))
    assert "max_total_tokens=50" in limit_exceeded(RECORD, TurnUsage(0, 50))
    unlimited = RECORD.model_copy(update={"max_turns": 0, "max_total_tokens": 0})
    assert limit_exceeded(unlimited, TurnUsage(10**6, 10**9)) is None


def test_record_defaults_and_extensions():
    record = SessionRecord.model_validate({"sid": "s", "run_id": "r", "training_session_name": "ts", "future": 1})
    assert record.resolved_tokenizer_prefix() == "runs/r/tokenizer/"
    assert record.model_extra == {"future": 1}
    assert record.model_copy(update={"tokenizer_prefix": "x/tok"}).resolved_tokenizer_prefix() == "x/tok/"


def test_sid_shapes_and_digest():
    assert is_plausible_sid("0b6c3c52-2f0e-4a43-9d5e-6b1d1c0b7d9e")
    assert not any(is_plausible_sid(s) for s in (None, "", "../x", "a/b", "x" * 200, "a b"))
    assert sid_digest("abc") == sid_digest("abc") != sid_digest("abd") and "abc" not in sid_digest("abc")


@given(st.text(max_size=300))
def test_any_api_key_text_splits_and_checks_without_raising(key):
    """Whatever an agent sends as its api key (aiohttp hands a header's non-UTF-8 bytes over as lone
    surrogates: ``b'\\xff'`` -> ``'\\udcff'``), splitting it and checking its secret never raises (an
    exception there was a 500, not the 401 a bad key gets); only the rollout's own key matches."""
    from stepwise.gateway.session import API_KEY_DIGEST_FIELD, key_matches, new_api_key, split_api_key

    real, digest = new_api_key("s1")
    record = SessionRecord.model_validate({**RECORD.model_dump(), API_KEY_DIGEST_FIELD: digest})
    sid, secret = split_api_key(key)
    assert key_matches(record, secret) is (key == real)
    assert key_matches(record, split_api_key(real)[1]) is True
    for odd in ("\udcff\udcfe", "é", "\x00", "A" * 10_000, real.split(".", 1)[1] + "\udcff"):
        assert key_matches(record, odd) is False
