"""The group judge at work: one group judged (`judge_group`) and a generation batch's groups judged in
parallel (`judge_batch`), through the run store and Amazon Bedrock.

`judge_group` is the unit: the "Judge groups" state's function runs it for every group of a batch (a loop
over it, ``judge.concurrency`` groups at once), and the group engine (``admission: group``), whose groups
complete one at a time, runs the same function for one group from its rollout group's "Judge the group"
state (``folder``: the group's folder, `stepwise.records.BatchRef.folder`; its record then sits beside its
rollouts, ``.../groups/{g}/a{n}/judge/``). For a group it:

1. returns the group's record when it already has one for these rollouts (``.../judge/{input_id}.json``: a
   retried invocation or a re-run state pays nothing; a record of other rollouts, left by an attempt at the step
   a resumed run re-does, is judged anew);
2. reads each completed member's captured turns and the agent's result and builds the judged text
   (`stepwise.core.judge.judged_group`); a group with no completed member is recorded ``skipped``;
3. reads the verdict cached under the hash of the judge's config and that text (``runs/{run_id}/judge-cache/``,
   `stepwise.core.judge.cache_key`): a step re-done on the same text (a retried step, a seeded re-run)
   reuses it, source ``cache``;
4. otherwise asks Bedrock (`stepwise.aws.bedrock.converse`), at most ``judge.requests_per_second`` across the
   batch (`RateLimiter`): a throttled request (or one that got no answer within ``judge.timeout_seconds``) is
   waited out with exponential backoff and full jitter and sent again, without counting as an attempt; an
   answer that is not a valid verdict (`stepwise.core.judge.parse_verdict`) is asked again with what was
   wrong, ``judge.max_attempts`` answers in all; a request Bedrock refuses outright (IAM, no such model)
   raises `JudgeRefused`, failing the step loudly;
5. writes the verdict to the cache and the group's record: the scores and reasons, or, without a valid
   verdict, the fallback and its reason, with what the group's requests billed (``usage``).

Time: judging stops starting requests at ``invocation_deadline`` (the function's time less a margin) and
returns None for an unfinished group (nothing written: the next invocation resumes it); throttling past
``wait_deadline`` (``judge.max_wait_seconds`` after the batch's judging started) gives the group its fallback.
"""

from __future__ import annotations

import contextvars
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise.aws import bedrock
from stepwise.core import judge as core
from stepwise.layout import judge_cache_key, judge_record_key, result_key, turns_prefix
from stepwise.records import BatchRef, JudgeRecord, JudgeVerdict, RolloutRecord, Usage

if TYPE_CHECKING:
    from stepwise.aws.runstore import RunStore
    from stepwise.config import RunConfig

__all__ = ["JudgeRefused", "JudgeSession", "RateLimiter", "group_judgement", "judge_batch", "judge_group",
           "judged_batches", "judged_groups", "load_judgements", "load_members", "open_session"]

#: Backoff after a throttled request: full jitter over ``BACKOFF_BASE_S x 2^n``, at most ``BACKOFF_CAP_S``.
BACKOFF_BASE_S = 1.0
BACKOFF_CAP_S = 20.0


class JudgeRefused(RuntimeError):
    """Bedrock refused the judge's request outright (access denied, no such model, bad credentials): every
    group would fail alike, so the step fails loudly (the catch-all stops the session). The message names
    the answer and the model."""


class RateLimiter:
    """At most ``rate`` acquisitions per second across threads: each `acquire` takes the next free slot
    (``1 / rate`` seconds after the previous one) and sleeps until it (a token bucket of depth one)."""

    def __init__(self, rate: float, *, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.interval = 1.0 / rate
        self.clock, self.sleep = clock, sleep
        self._next = 0.0
        self._lock = threading.Lock()

    def acquire(self, deadline: float = float("inf")) -> bool:
        """Wait for the next slot; False (and no slot taken) when it would come after ``deadline`` (clock time)."""
        with self._lock:
            slot = max(self.clock(), self._next)
            if slot > deadline:
                return False
            self._next = slot + self.interval
        delay = slot - self.clock()
        if delay > 0:
            self.sleep(delay)
        return True


@dataclass
class JudgeSession:
    """What judging a generation batch shares: the run store and run, its config, the Bedrock runtime client,
    the rate limiter, the two deadlines (``invocation_deadline`` on ``clock``, ``wait_deadline`` in epoch
    seconds on ``now``), and the clocks (tests drive them)."""

    store: RunStore
    run_id: str
    cfg: RunConfig
    client: Any
    limiter: RateLimiter
    invocation_deadline: float = float("inf")
    wait_deadline: float = float("inf")
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], float] = time.time
    sleep: Callable[[float], None] = time.sleep
    rng: random.Random = field(default_factory=random.Random)


def open_session(store: RunStore, run_id: str, cfg: RunConfig, *, budget_s: float, started_at: float) -> JudgeSession:
    """The session a caller judges with for ``budget_s`` seconds from now: the run's Bedrock runtime client, a rate
    limiter at ``judge.requests_per_second``, and the throttling deadline ``judge.max_wait_seconds`` after
    ``started_at`` (epoch seconds: when the judging of these groups began, across invocations)."""
    judge = cfg.judge
    assert judge is not None, "open_session needs a run config with a judge"
    client = bedrock.runtime_client(cfg.region, timeout_s=judge.timeout_seconds, concurrency=judge.concurrency)
    return JudgeSession(store=store, run_id=run_id, cfg=cfg, client=client, limiter=RateLimiter(judge.requests_per_second),
                        invocation_deadline=time.monotonic() + budget_s, wait_deadline=started_at + judge.max_wait_seconds)


def load_members(store: RunStore, run_id: str, rollouts: Sequence[RolloutRecord]) -> list[core.JudgedMember]:
    """A group's members as the judge reads them: for each completed rollout its captured turns (key order)
    and the agent's result object; the others with neither (they are not judged)."""
    out = []
    for r in rollouts:
        turns: list[dict[str, Any]] = []
        result = None
        if r.status == "ok" and r.sid:
            for key in store.list_keys(turns_prefix(run_id, r.sid)):
                body = store.get_json_or(key)
                if isinstance(body, dict):
                    turns.append(body)
            got = store.get_json_or(result_key(run_id, r.input_id, r.sid))
            result = got if isinstance(got, dict) else None
        out.append(core.JudgedMember(member=r.member, sid=r.sid, status=str(r.status), agent_reward=float(r.reward),
                                     turns=turns, result=result))
    return out


def _backoff(session: JudgeSession, n: int) -> float:
    return session.rng.uniform(0.0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2 ** min(n, 10)))


def judge_group(session: JudgeSession, step: int, generation_batch: int, input_id: str,
                rollouts: Sequence[RolloutRecord], *, folder: Mapping[str, Any] | None = None) -> JudgeRecord | None:
    """Judge one group (``rollouts``: its members, any order) of a training generation batch and write its
    record (see the module doc); returns the record, or None when the invocation's time ran out first
    (nothing is written; call again). ``folder``: the group engine's group (``{"group", "attempt"}``), whose
    record goes to its folder.

    Raises:
        JudgeRefused: Bedrock refused the request outright.
    """
    store, judge = session.store, session.cfg.judge
    assert judge is not None, "judge_group needs a run config with a judge"
    key = judge_record_key(session.run_id, step, generation_batch, input_id, **(folder or {}))
    members_G = sorted(rollouts, key=lambda r: (r.member, r.i))
    existing = store.get_json_or(key)
    if isinstance(existing, dict):
        found = JudgeRecord.model_validate(existing)
        if found.sids_G == [r.sid for r in members_G]:
            return found
    started = session.clock()
    members = load_members(store, session.run_id, members_G)
    group = core.judged_group(members, judge.include)
    n = len(group.parts)
    record = JudgeRecord(input_id=input_id, step=step, generation_batch=generation_batch,
                         sids_G=[r.sid for r in members_G], members_G=[r.member for r in members_G],
                         judged_G=[i in group.judged for i in range(len(members_G))],
                         scores_G=[None] * len(members_G), reasons_G=[""] * len(members_G),
                         judged_chars_G=[0] * len(members_G), model_id=judge.model_id, usage=Usage())
    for i, chars in zip(group.judged, group.chars, strict=True):
        record.judged_chars_G[i] = chars
    verdict: JudgeVerdict | None = None
    if n == 0:
        record.source = "skipped"
        record.fallback_reason = "no member of the group completed: nothing to judge"
    else:
        record.cache_key = core.cache_key(judge, group)
        cached = store.get_json_or(judge_cache_key(session.run_id, record.cache_key))
        if isinstance(cached, dict):
            verdict = JudgeVerdict.model_validate(cached)
            record.source = "cache"
        else:
            outcome = _ask(session, group, record)
            if outcome is None:
                return None
            verdict = outcome if isinstance(outcome, JudgeVerdict) else None
            if verdict is not None:
                store.put_json(judge_cache_key(session.run_id, record.cache_key), verdict.model_dump(), bulk=True)
            else:
                record.source, record.fallback_reason = "fallback", str(outcome)
    if verdict is not None and len(verdict.scores) == n:
        for k, i in enumerate(group.judged):
            record.scores_G[i] = verdict.scores[k]
            record.reasons_G[i] = verdict.reasons[k]
    for i in range(len(members_G)):
        if not record.reasons_G[i]:
            record.reasons_G[i] = (f"not judged: the rollout did not complete ({members_G[i].status})"
                                   if i not in group.judged else f"fallback: {record.fallback_reason}")
    record.seconds = session.clock() - started
    store.put_json(key, record.model_dump(), bulk=True)
    return record


def _ask(session: JudgeSession, group: core.JudgedGroup, record: JudgeRecord) -> JudgeVerdict | str | None:
    """Ask Bedrock until a valid verdict, ``max_attempts`` answers or a deadline: the verdict, the fallback's
    reason (str), or None when the invocation's time ran out. Adds the requests' usage to ``record``."""
    judge = session.cfg.judge
    assert judge is not None and record.usage is not None
    request = core.converse_request(judge, group)
    problem = ""
    waited = 0
    while record.attempts < judge.max_attempts:
        if session.now() > session.wait_deadline:
            return (f"Bedrock throttled the judge past max_wait_seconds ({judge.max_wait_seconds} s); "
                    f"{record.attempts} answer(s) read" + (f", the last invalid: {problem}" if problem else ""))
        if not session.limiter.acquire(session.invocation_deadline):
            return None
        try:
            response = bedrock.converse(session.client, request)
        except Exception as e:  # classified below; anything unknown is raised
            if bedrock.is_throttled(e):
                record.throttled += 1
                delay = _backoff(session, waited)
                waited += 1
                if session.clock() + delay > session.invocation_deadline:
                    return None
                session.sleep(delay)
                continue
            if bedrock.is_refused(e):
                raise JudgeRefused(f"Bedrock refused the judge's request to {judge.model_id}: {bedrock.describe(e)}") from e
            from botocore.exceptions import ClientError

            if not isinstance(e, ClientError):
                raise
            record.attempts += 1  # a request the model could not answer (too long, a model error): asked again
            problem = bedrock.describe(e)
            continue
        record.attempts += 1
        tokens_in, tokens_out = bedrock.answer_usage(response)
        record.usage.judge_requests += 1
        record.usage.judge_input_tokens += tokens_in
        record.usage.judge_output_tokens += tokens_out
        try:
            verdict = core.parse_verdict(response, len(group.parts), judge)
        except core.InvalidVerdict as e:
            problem = str(e)
            request = {**request, "messages": core.retry_messages(request, response, problem)}
            continue
        verdict.attempts = record.attempts
        return verdict
    return f"no valid answer in {record.attempts} attempt(s): {problem}"


def judge_batch(session: JudgeSession, step: int, generation_batch: int, rollouts: Sequence[RolloutRecord], *,
                folder: Mapping[str, Any] | None = None) -> tuple[list[JudgeRecord], list[str]]:
    """Judge every group of a generation batch (``rollouts``, grouped by input id), ``judge.concurrency`` at a
    time: ``(the records, the input ids still unjudged when the invocation's time ran out)``. ``folder``: the
    group engine's group (its one group's rollouts), as `judge_group`'s.

    Raises:
        JudgeRefused: Bedrock refused a request outright (the other groups stop starting requests).
    """
    judge = session.cfg.judge
    assert judge is not None
    groups: dict[str, list[RolloutRecord]] = {}
    for r in rollouts:
        groups.setdefault(r.input_id, []).append(r)
    refused = threading.Event()

    def one(input_id: str) -> JudgeRecord | None:
        if refused.is_set():
            return None
        try:
            return judge_group(session, step, generation_batch, input_id, groups[input_id], folder=folder)
        except JudgeRefused:
            refused.set()
            raise

    records: list[JudgeRecord] = []
    pending: list[str] = []
    with ThreadPoolExecutor(max_workers=max(1, min(judge.concurrency, len(groups)))) as pool:
        # each group in a copy of this context: the invocation's meter (stepwise.metering) counts its S3 requests
        futures = {input_id: pool.submit(contextvars.copy_context().run, one, input_id) for input_id in groups}
        for input_id, future in futures.items():
            record = future.result()
            if record is None:
                pending.append(input_id)
            else:
                records.append(record)
    return records, pending


def load_judgements(store: RunStore, run_id: str, step: int, generation_batch: int, *,
                    folder: Mapping[str, Any] | None = None) -> dict[str, JudgeRecord]:
    """The judge records of a generation batch (or of the group engine's group in ``folder``), by input id."""
    from stepwise.layout import judge_prefix

    out = {}
    for key in store.list_keys(judge_prefix(run_id, step, generation_batch, **(folder or {}))):
        body = store.get_json_or(key)
        if isinstance(body, dict):
            record = JudgeRecord.model_validate(body)
            out[record.input_id] = record
    return out


def _progress_usage(store: RunStore, run_id: str, step: int, generation_batch: int,
                    folder: Mapping[str, Any] | None = None) -> Usage:
    """What the judge function's own invocations for a batch (or a group) used, from its progress record."""
    from stepwise.layout import judge_progress_key
    from stepwise.records import JudgeProgress

    progress = store.get_json_or(judge_progress_key(run_id, step, generation_batch, **(folder or {})))
    return (JudgeProgress.model_validate(progress).usage or Usage()) if isinstance(progress, dict) else Usage()


def _merged(store: RunStore, run_id: str, places: Sequence[tuple[int, int, Mapping[str, Any] | None]],
            batches: Sequence[Sequence[RolloutRecord]], cfg: RunConfig
            ) -> tuple[list[list[RolloutRecord]], list[dict[str, JudgeRecord]]]:
    """Each batch's rollouts with the judge records of its place ``(step, generation batch, folder)`` merged in
    (`stepwise.core.judge.apply_judgements`: the one merge of both engines), and the records read."""
    merged, records = [], []
    for (step, g, folder), rollouts in zip(places, batches, strict=True):
        found = load_judgements(store, run_id, step, g, folder=folder)
        records.append(found)
        merged.append(core.apply_judgements(rollouts, found, cfg))
    return merged, records


def judged_batches(store: RunStore, run_id: str, step: int, generation_batches: Sequence[int],
                   batches: Sequence[Sequence[RolloutRecord]], cfg: RunConfig
                   ) -> tuple[list[list[RolloutRecord]], dict[str, float], Usage]:
    """What ComputeAdvantages reads with a judge: each generation batch's rollouts with its groups' judge records
    merged in (`stepwise.core.judge.apply_judgements`), the step's ``judge/*`` metrics over every batch, and what
    judging the last batch used (its groups' requests and tokens, the judge function's invocations: the cost
    ledger's share of it; earlier batches were added when they were computed)."""
    merged, records = _merged(store, run_id, [(step, g, None) for g in generation_batches], batches, cfg)
    usage = Usage()
    for record in (records[-1] if records else {}).values():
        usage.add(record.usage)
    if generation_batches:
        usage.add(_progress_usage(store, run_id, step, generation_batches[-1]))
    metrics = core.judge_metrics([r for b in merged for r in b], [x for found in records for x in found.values()])
    return merged, metrics, usage


def judged_groups(store: RunStore, run_id: str, refs: Sequence[BatchRef], groups: Sequence[Sequence[RolloutRecord]],
                  cfg: RunConfig) -> tuple[list[list[RolloutRecord]], dict[str, float]]:
    """What the group engine's ComputeAdvantages reads with a judge: each chosen group's rollouts (``groups``, the
    group of ``refs[i]``) with the judge record in its folder merged in, as `judged_batches` merges a batch's, and
    the step's ``judge/*`` metrics over them. What judging them used reached the ledger when each was recorded
    complete (`group_judgement`)."""
    merged, records = _merged(store, run_id, [(ref.step, ref.generation_batch, ref.folder) for ref in refs], groups, cfg)
    return merged, core.judge_metrics([r for b in merged for r in b], [x for found in records for x in found.values()])


def group_judgement(store: RunStore, run_id: str, batch: BatchRef, rollouts: Sequence[RolloutRecord],
                    cfg: RunConfig) -> tuple[list[RolloutRecord], Usage]:
    """A complete group of the group engine as RecordGroupComplete decides on it: its rollouts with its judge
    record merged in (the rewards its estimator will read; a group the judge left without a record falls back,
    as `stepwise.core.judge.apply_judgements` says), and what judging it used (its requests and tokens, the
    judge function's invocations for it)."""
    (merged,), records = _merged(store, run_id, [(batch.step, batch.generation_batch, batch.folder)], [rollouts], cfg)
    usage = Usage()
    for record in records[0].values():
        usage.add(record.usage)
    usage.add(_progress_usage(store, run_id, batch.step, batch.generation_batch, batch.folder))
    return merged, usage
