"""The group judge against Bedrock's wire protocol: every fault mode of the Converse call through the Bedrock
emulator and the real botocore client (`stepwise.aws.bedrock`), the retries and the fallback, the cache, the
rate limit, and the model lookups the refusals before billing make (`stepwise.judging`, `local.bedrock`)."""

from __future__ import annotations

import random
import uuid

import pytest

from stepwise import judging
from stepwise.aws import bedrock
from stepwise.layout import judge_cache_key, judge_record_key
from stepwise.records import JudgeRecord
from tests.support.judge import MODEL, JudgeBench, judge_config


@pytest.fixture(scope="module")
def bench():
    b = JudgeBench()
    yield b
    b.stop()


@pytest.fixture
def b(bench):
    bench.reset()
    return bench


def session(b: JudgeBench, cfg, **kw) -> judging.JudgeSession:
    j = cfg.judge
    client = bedrock.runtime_client("us-east-1", timeout_s=j.timeout_seconds, concurrency=j.concurrency)
    sleeps: list[float] = []
    kw.setdefault("sleep", sleeps.append)  # backoff waits are recorded, not slept (the limiter's too)
    s = judging.JudgeSession(store=b.store, run_id=kw.pop("run_id"), cfg=cfg, client=client,
                             limiter=judging.RateLimiter(j.requests_per_second, sleep=kw["sleep"]),
                             rng=random.Random(0), **kw)
    s.sleeps = sleeps  # type: ignore[attr-defined]
    return s


def judge_one(b: JudgeBench, replies=("4", "7", "4", "9"), *, cfg=None, **kw) -> tuple[JudgeRecord | None, str]:
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    cfg = cfg or judge_config()
    group = b.put_group(run_id, 3, list(replies), statuses=kw.pop("statuses", None))
    s = session(b, cfg, run_id=run_id, **kw)
    return judging.judge_group(s, 0, 0, group[0].input_id, group), run_id


# ---------------------------------------------------------------------------- a clean verdict


def test_a_group_is_judged_relative_to_its_rubric_and_its_record_written(b):
    record, run_id = judge_one(b)
    assert record.source == "judge" and record.attempts == 1 and record.throttled == 0
    assert record.scores_G == [10, 0, 10, 0] and record.reasons_G[1] == "answers '7', not the digit 4"
    assert record.usage.judge_requests == 1 and record.usage.judge_input_tokens == b.bedrock.counters.input_tokens > 0
    assert record.usage.judge_output_tokens == b.bedrock.counters.output_tokens > 0
    assert JudgeRecord.model_validate(b.store.get_json(judge_record_key(run_id, 0, 0, "s0g0p3"))) == record
    body = b.bedrock.requests[-1]
    assert "What digit comes after 3?" in body["messages"][0]["content"][0]["text"]


def test_no_sid_reaches_bedrock(b):
    """A rollout's sid is its gateway api key: the judge is shown attempts by number only."""
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    group = b.put_group(run_id, 5, ["6", "1"])
    judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, group[0].input_id, group)
    assert not any(r.sid in str(b.bedrock.requests[-1]) for r in group)


def test_a_group_with_no_completed_member_is_skipped_without_a_request(b):
    record, _ = judge_one(b, ("", ""), statuses=["error", "timeout"])
    assert record.source == "skipped" and b.bedrock.counters.converse == 0
    assert record.reasons_G == ["not judged: the rollout did not complete (error)",
                                "not judged: the rollout did not complete (timeout)"]


# ---------------------------------------------------------------------------- fault modes


@pytest.mark.parametrize("fault", ["throttle", "unavailable"])
def test_throttling_is_waited_out_within_the_step_and_never_counts_as_an_attempt(b, fault):
    b.bedrock.inject(**{fault: 3})
    record, _ = judge_one(b)
    assert record.source == "judge" and record.throttled == 3 and record.attempts == 1
    assert record.usage.judge_requests == 1  # throttled requests are not billed
    assert b.bedrock.counters.converse == 4


def test_the_judge_s_client_makes_one_attempt_per_call(b):
    """botocore's own retries are off (``total_max_attempts`` 1): each throttled request comes back to the judge,
    which waits with backoff under its rate limit and deadline (``max_attempts: 1`` meant one retry)."""
    client = bedrock.runtime_client("us-east-1", timeout_s=30, concurrency=2)
    assert client.meta.config.retries["total_max_attempts"] == 1
    b.bedrock.inject(throttle=1)
    with pytest.raises(Exception) as e:
        bedrock.converse(client, {"modelId": MODEL, "messages": [{"role": "user", "content": [{"text": "<attempt 1>\nx\n</attempt 1>"}]}]})
    assert bedrock.is_throttled(e.value) and b.bedrock.counters.converse == 1


@pytest.mark.parametrize(("fault", "problem"), [
    ("malformed", "the answer's JSON is malformed"),
    ("out_of_range", "attempt 1's score 15 is outside the range 0 to 10"),
    ("missing_member", "attempt(s) 4 missing"),
    ("duplicate_member", "attempt 1 is scored twice"),
])
def test_an_invalid_answer_is_asked_again_with_what_was_wrong(b, fault, problem):
    b.bedrock.inject(**{fault: 1})
    record, _ = judge_one(b)
    assert record.source == "judge" and record.attempts == 2 and record.scores_G == [10, 0, 10, 0]
    assert record.usage.judge_requests == 2 and getattr(b.bedrock.counters, fault) == 1
    retry = b.bedrock.requests[-1]["messages"]
    assert [m["role"] for m in retry] == ["user", "assistant", "user"]
    assert problem in str(retry[-1]["content"])


def test_a_slow_answer_past_the_timeout_is_sent_again_like_throttling(b):
    b.bedrock.inject(slow=1)  # the emulator answers after 2 s; the judge's read timeout is 1 s
    record, _ = judge_one(b, cfg=judge_config(timeout_seconds=1))
    assert record.source == "judge" and record.throttled == 1 and record.attempts == 1


def test_invalid_answers_past_max_attempts_fall_back_with_the_reason_recorded(b):
    b.bedrock.inject(out_of_range=3)
    record, _ = judge_one(b, cfg=judge_config(max_attempts=3))
    assert record.source == "fallback" and record.attempts == 3 and record.scores_G == [None] * 4
    assert record.fallback_reason == "no valid answer in 3 attempt(s): attempt 1's score 15 is outside the range 0 to 10"
    assert all(r.startswith("fallback: no valid answer") for r in record.reasons_G)
    assert record.usage.judge_requests == 3 and b.bedrock.counters.converse == 3


def test_throttling_past_max_wait_seconds_falls_back_instead_of_failing(b):
    b.bedrock.inject(throttle=50)
    clock = iter(range(0, 10_000, 7))  # each look at the wall clock: 7 s later
    record, _ = judge_one(b, wait_deadline=30.0, now=lambda: float(next(clock)))
    assert record.source == "fallback" and record.throttled >= 1
    assert record.fallback_reason.startswith("Bedrock throttled the judge past max_wait_seconds")


def test_an_invocation_out_of_time_leaves_the_group_for_the_next_one_and_writes_nothing(b):
    b.bedrock.inject(throttle=2)
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    group = b.put_group(run_id, 3, ["4", "7"])
    assert judging.judge_group(session(b, judge_config(), run_id=run_id, invocation_deadline=0.0), 0, 0,
                               group[0].input_id, group) is None
    assert b.store.get_json_or(judge_record_key(run_id, 0, 0, group[0].input_id)) is None
    record = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, group[0].input_id, group)
    assert record.source == "judge" and record.throttled == 2


def test_a_model_the_stack_does_not_grant_fails_the_step_loudly(b):
    with pytest.raises(judging.JudgeRefused, match="AccessDeniedException"):
        judge_one(b, cfg=judge_config(model_id="amazon.nova-pro-v1:0"))


def test_a_request_the_model_refuses_counts_as_an_invalid_answer():
    """Claude Haiku 4.5 is offered through inference profiles only: its bare id is a ValidationException."""
    bench = JudgeBench(granted=("anthropic.claude-haiku-4-5-20251001-v1:0",))
    try:
        record, _ = judge_one(bench, cfg=judge_config(model_id="anthropic.claude-haiku-4-5-20251001-v1:0", max_attempts=2))
        assert record.source == "fallback" and "ValidationException" in record.fallback_reason
        assert "inference profile" in record.fallback_reason
    finally:
        bench.stop()


# ---------------------------------------------------------------------------- paying once


def test_a_retried_invocation_pays_nothing_for_a_group_already_judged(b):
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    group = b.put_group(run_id, 3, ["4", "7"])
    first = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, group[0].input_id, group)
    again = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, group[0].input_id, group)
    assert again == first and b.bedrock.counters.converse == 1


def test_a_record_of_other_rollouts_is_judged_anew(b):
    """A resumed run re-doing a step rolls the batch out again: same keys, new sids. The old attempt's record is not
    taken for the new rollouts (it would score none of them); the same text still reads the cache."""
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    old = b.put_group(run_id, 3, ["4", "7"])
    new = b.put_group(run_id, 3, ["7", "4"], input_id=old[0].input_id)
    first = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, old[0].input_id, old)
    redone = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, new[0].input_id, new)
    assert redone.sids_G == [r.sid for r in new] and redone.scores_G == [0, 10] and first.scores_G == [10, 0]
    assert JudgeRecord.model_validate(b.store.get_json(judge_record_key(run_id, 0, 0, old[0].input_id))) == redone


def test_the_same_judged_text_is_read_from_the_cache_not_paid_twice(b):
    """A re-done step (a resumed run, a seeded re-run) whose group has the same text: the cached verdict."""
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    first = b.put_group(run_id, 3, ["4", "7"], step=0)
    redone = b.put_group(run_id, 3, ["4", "7"], step=1, input_id=first[0].input_id)
    one = judging.judge_group(session(b, judge_config(), run_id=run_id), 0, 0, first[0].input_id, first)
    two = judging.judge_group(session(b, judge_config(), run_id=run_id), 1, 0, redone[0].input_id, redone)
    assert (one.source, two.source) == ("judge", "cache") and two.scores_G == one.scores_G
    assert two.cache_key == one.cache_key and two.usage.judge_requests == 0 and b.bedrock.counters.converse == 1
    assert b.store.get_json(judge_cache_key(run_id, one.cache_key))["scores"] == [10, 0]
    other = b.put_group(run_id, 3, ["4", "8"], step=2)
    assert judging.judge_group(session(b, judge_config(), run_id=run_id), 2, 0, other[0].input_id, other).source == "judge"


# ---------------------------------------------------------------------------- a batch


def test_a_batch_is_judged_group_by_group_at_the_configured_concurrency(b):
    run_id = f"judge-{uuid.uuid4().hex[:8]}"
    rollouts = [r for n in range(6) for r in b.put_group(run_id, n, [str((n + 1) % 10), "x"])]
    b.bedrock.inject(throttle=2, malformed=1)
    records, pending = judging.judge_batch(session(b, judge_config(concurrency=3), run_id=run_id), 0, 0, rollouts)
    assert pending == [] and sorted(r.input_id for r in records) == sorted({r.input_id for r in rollouts})
    assert all(r.scores_G == [10, 0] for r in records)
    assert sum(r.throttled for r in records) == 2 and sum(r.attempts for r in records) == 7


def test_the_rate_limiter_spaces_acquisitions_across_threads():
    import threading

    now = [0.0]
    slept: list[float] = []
    lock = threading.Lock()

    def sleep(s):
        with lock:
            slept.append(s)

    limiter = judging.RateLimiter(4.0, clock=lambda: now[0], sleep=sleep)
    threads = [threading.Thread(target=limiter.acquire) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(slept) == pytest.approx([0.25 * k for k in range(1, 8)])  # the first goes at once
    assert limiter.acquire(deadline=1.0) is False  # the next slot (2.0 s) is past the deadline


# ---------------------------------------------------------------------------- the lookups before billing


@pytest.mark.parametrize(("model_id", "problem"), [
    ("us.amazon.nova-micro-v1:0", ""),
    ("amazon.nova-micro-v1:0", ""),
    ("arn:aws:bedrock:us-east-1:123456789012:inference-profile/global.anthropic.claude-haiku-4-5-20251001-v1:0", ""),
    ("anthropic.claude-haiku-4-5-20251001-v1:0", "not offered on demand in us-east-1"),
    ("us.amazon.titan-text-v1:0", "Bedrock has no such model or inference profile in us-east-1"),
    ("amazon.titan-text-v1:0", "Bedrock has no such model"),
])
def test_the_model_lookup_says_what_stops_the_judge_from_calling_it(b, model_id, problem):
    found = bedrock.model_problem("us-east-1", model_id)
    assert (found == "") if not problem else problem in found
    if "on demand" in problem:
        assert "us.anthropic.claude-haiku-4-5-20251001-v1:0" in found
