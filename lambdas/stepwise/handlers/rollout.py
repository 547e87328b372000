"""StartRollout, OnRolloutResult and FinishRollout: one rollout child of the Distributed Map.

docs/architecture.md. StartRollout opens the gateway session (``sessions/{sid}.json``), stores the
task token keyed by sid *before* invoking the agent (a fast result cannot race it), then calls
``InvokeAgentRuntime`` with ``runtimeSessionId = sid`` and ``_rollout`` (the toolkit's
``exp_id``/``input_id``/``s3_bucket`` plus ``base_url``, ``model_id``, ``api_key`` (a fresh secret
``{sid}.{secret}`` whose digest only the session record keeps) and the sampling params). The agent
writes ``rollout-results/{run_id}/{input_id}/{sid}.json``; the S3 notification runs OnRolloutResult,
which resumes the task with ``{"sid", "result_key", "session"}`` (the session record it read, without
the key's digest). FinishRollout extracts the reward exactly as the reference does (0.0
on timeout or error), closes the session (with that record: no second read), stops the agent's
runtime session (``StopRuntimeSession``, as the reference's ``AgentCoreHttpSession`` does after every
rollout), replays the captured turns into `TraceRecord`s and writes the rollout record. A StartRollout
whose invoke fails closes its session and stops the runtime session it may have started before it raises.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from stepwise import metering
from stepwise.aws import agentcore, task_tokens
from stepwise.aws.runstore import ObjectTooLarge
from stepwise.core.ledger import PACE_STATES, acr_usage, start_retried, task_transitions
from stepwise.core.liveness import task_error
from stepwise.core.rewards import ResultRead
from stepwise.gateway.session import API_KEY_DIGEST_FIELD, new_api_key
from stepwise.events import FinishEvent, RecheckRequest, ResultEvent, S3Notification, StartEvent
from stepwise.handlers._common import (
    bind,
    dependencies,
    entrypoint,
    logger,
    now,
    redact,
    run_config,
    settings,
    sfn_client,
    store,
)
from stepwise.handlers._rollout_sessions import close_gateway_session
from stepwise.layout import (
    parse_result_key,
    prompts_key,
    result_key,
    results_exp_id,
    rollout_key,
    session_key,
    start_marker_key,
    task_token_key,
    tokenizer_prefix,
    turns_prefix,
)
from stepwise.records import BatchRef, RolloutRecord, SamplerPolicy, SessionRecord, Usage

if TYPE_CHECKING:
    from stepwise.aws.runstore import RunStore
    from stepwise.config import RunConfig

#: The session record's field holding the rollout's Step Functions task token (OnRolloutResult reads it).
TASK_TOKEN_FIELD = "task_token"
#: Seconds the gateway session outlives the task timeout (the agent's last call may be in flight).
SESSION_GRACE_S = 60


def turn_grace_seconds() -> float:
    """Wait between closing a session and listing its turns (docs/internals.md: a turn object can
    land a few ms after a streaming client saw the reply end). ``STEPWISE_TURN_GRACE_SECONDS``, default 1."""
    return settings().turn_grace_seconds


def session_record(cfg: RunConfig, run_id: str, batch: BatchRef, sid: str, input_id: str, index: int) -> SessionRecord:
    """The gateway session record (docs/internals.md), plus ``input_id`` and ``started_at``.

    The sampler (session name, model package ARN, policy version) is ``batch.policy``, which must
    be set. ``index`` is the rollout's item index in the batch; with the config's ``seed`` and the
    batch it fixes ``sampling_seed`` (`stepwise.core.seeding.rollout_seed`), from which the gateway
    seeds each turn's sample.
    """
    from stepwise.core.sampler_binding import rebind_during_rollouts, session_binding
    from stepwise.core.seeding import rollout_seed

    policy = batch.policy
    if policy is None:
        raise ValueError("session_record needs batch.policy (StartRollout fills it from state.json)")
    sampling = cfg.eval_sampling_defaults if batch.kind == "eval" else cfg.sampling_defaults
    timeouts = batch.timeouts()
    return SessionRecord(
        sid=sid,
        run_id=run_id,
        step=batch.step,
        generation_batch=batch.generation_batch,
        kind=batch.kind,
        input_id=input_id,
        training_session_name=policy.training_session_name,
        sampler_model_package_arn=policy.sampler_model_package_arn,
        policy_version=policy.policy_version,
        region=cfg.region,
        tokenizer_prefix=tokenizer_prefix(run_id),
        sampling_defaults=sampling,
        chat_template_kwargs=cfg.chat_template_kwargs,
        max_context_tokens=cfg.max_context_tokens,
        max_turns=cfg.max_turns_per_rollout,
        max_total_tokens=cfg.max_tokens_per_rollout,
        sampling_seed=rollout_seed(cfg.seed, kind=batch.kind, step=batch.step,
                                   generation_batch=batch.generation_batch, index=index),
        heartbeat_seconds=timeouts.heartbeat_seconds if timeouts.heartbeat_on else 0,
        sampler_binding=session_binding(cfg.sampler_binding, loads_during_rollouts=rebind_during_rollouts(
            cfg.sampler_binding, cfg.max_staleness, cfg.admission)),
        started_at=now(),
        deadline=now() + timeouts.max_rollout_seconds + SESSION_GRACE_S,
        closed=False,
    )


def rollout_payload(payload: dict[str, Any], *, run_id: str, input_id: str, bucket: str, api_key: str,
                    gateway_url: str, model_id: str, sampling: dict[str, Any],
                    reward_granularity: str = "trajectory") -> dict[str, Any]:
    """The agent's invocation payload: the dataset row plus ``_rollout`` (toolkit ``RolloutConfig`` fields,
    and ``reward_granularity``: the reward shape the run reads, docs/agent-contract.md); ``api_key`` is the
    rollout's gateway key (`stepwise.gateway.session.new_api_key`), a secret."""
    return {
        **payload,
        "_rollout": {
            "exp_id": results_exp_id(run_id),
            "input_id": input_id,
            "s3_bucket": bucket,
            "base_url": gateway_url,
            "model_id": model_id,
            "api_key": api_key,
            "sampling_params": {"temperature": sampling["temperature"], "max_tokens": sampling["max_new_tokens"]},
            "reward_granularity": reward_granularity,
        },
    }


def _prompts(key: str) -> dict[str, Any]:
    """A generation batch's ``prompts.json`` (written once by PlanStep, never changed): read once
    per container instead of once per rollout (`Dependencies.memo`: rollouts starting together in
    one process, the local stack, read it once, not once each)."""
    deps = dependencies()
    return deps.memo(("prompts", key), lambda: deps.store.get_json(key))


def start(event: StartEvent) -> dict[str, Any]:
    """Open the session, store the task token, invoke the agent; returns ``{"sid"}``.

    S3 requests: 2 PUTs (start marker, session record with the task token), plus ``config.json`` and the
    batch's ``prompts.json`` once per container. ``state.json`` is read (and its owner checked)
    only for a batch without ``policy``: PlanStep checked the owner when it planned the batch.
    """
    rs = store()
    run, batch, item = event.run, event.batch, event.item
    if batch.policy is None:
        state = rs.owned_state(run.run_id, run.execution_arn)
        batch = batch.model_copy(update={"policy": SamplerPolicy.of(state)})
    cfg = run_config(run.run_id)
    sid = str(uuid.uuid4())
    bind(run_id=run.run_id, step=batch.step, sid=sid)
    rs.put_json(start_marker_key(run.run_id, batch.step, batch.generation_batch, batch.kind, item.i, **batch.folder),
                {"sid": sid, "input_id": item.input_id, "started_at": now()}, bulk=True)
    record = session_record(cfg, run.run_id, batch, sid, item.input_id, item.i)
    # The agent's gateway key is a fresh secret: only its digest is kept (in the record), the key itself
    # only in the invoke's payload. Nothing logs it or writes it to a key or a state's output.
    api_key, key_digest = new_api_key(sid)
    # The task token rides in the session record (one PUT fewer than an object of its own), written
    # before the invoke, so the fastest result finds it. The gateway never serves the record. So does
    # this invocation's measurement for the cost ledger (FinishRollout adds it to the rollout record),
    # with the Start rollout state's transitions (entered once, retried retry_count times) and the Pace start
    # state's before it. The ride is settled once the invoke's outcome is known (`_settle_ride`).
    ride = metering.ride(run.run_id)
    ride.usage.state_transitions += PACE_STATES + task_transitions(event.retry_count)
    stored = {**record.model_dump(), TASK_TOKEN_FIELD: event.task_token, API_KEY_DIGEST_FIELD: key_digest,
              "usage": ride.usage.model_dump()}
    try:
        rs.put_json(session_key(sid), stored)
    except BaseException:
        ride.cancel()
        raise
    payload = _prompts(prompts_key(run.run_id, batch.step, batch.generation_batch, batch.kind,
                                   **batch.folder))[item.input_id]
    body = rollout_payload(payload, run_id=run.run_id, input_id=item.input_id, bucket=rs.bucket, api_key=api_key,
                           gateway_url=settings().gateway_url, model_id=cfg.base_model_arn,
                           sampling=record.sampling_defaults, reward_granularity=cfg.reward_granularity)
    try:
        status_code = agentcore.invoke(cfg.agent_runtime_arn, cfg.region, session_id=sid,
                                       payload=json.dumps(body).encode())
    except Exception as exc:
        _settle_ride(ride, exc, event.retry_count)
        _abandon_start(rs, cfg, sid, stored, exc)
        raise
    ride.commit()
    logger.info("rollout started", extra={"input_id": item.input_id, "status_code": status_code})
    return {"sid": sid}


def _settle_ride(ride: metering.Ride, exc: BaseException, retry_count: int | None) -> None:
    """The measurement in the session record of a StartRollout whose invoke failed: when the Start rollout
    state retries it (`stepwise.core.ledger.start_retried`), the retry opens a fresh session and nothing
    ever reads this record, so the measurement stays in this process (`stepwise.metering.CARRY`: all of
    this invocation rides with the next record written here, as an invocation that writes no record
    does); otherwise FinishRollout reads this record and sums it (committed)."""
    if start_retried(type(exc).__name__, retry_count):
        ride.cancel()
    else:
        ride.commit()


def _abandon_start(rs: Any, cfg: RunConfig, sid: str, stored: dict[str, Any], exc: BaseException) -> None:
    """An invoke that failed leaves nothing behind: the gateway session is closed and, unless ACR
    refused before creating one (`agentcore.AgentRuntimeThrottled`, or `agentcore.AgentRuntimeUnavailable`
    before anything was sent), the runtime session is stopped, so a retry (a fresh sid) never runs
    beside an agent the first attempt may have started. Best effort: the invoke's error is what raises.
    ``stored`` is the session record as written; the closed one keeps its ``usage`` (FinishRollout sums
    it when no retry follows) and drops the task token and the key's digest."""
    started = not isinstance(exc, agentcore.AgentRuntimeThrottled) and getattr(exc, "maybe_started", True)
    try:
        if started:
            closed = {k: v for k, v in stored.items() if k not in (TASK_TOKEN_FIELD, API_KEY_DIGEST_FIELD)}
            rs.put_json(session_key(sid), {**closed, "closed": True})
            agentcore.stop_session(cfg.agent_runtime_arn, cfg.region, session_id=sid)
    except Exception as stop_exc:  # logged; the failed invoke is the error that matters
        logger.warning("could not stop the session of a failed invoke",
                       extra={"error": type(stop_exc).__name__, "detail": redact(str(stop_exc), sid)[:300]})


# ---------------------------------------------------------------------------- result notification


def session_and_token(rs: Any, run_id: str, sid: str) -> tuple[dict[str, Any] | None, str | None]:
    """``(session record of run_id, task token)`` of session ``sid``: the token is the record's
    ``task_token``; for a session started before the token moved there, ``task_token_key``'s object.
    The record is None when it is not this run's session, the token None when the session is unknown
    or belongs to another run."""
    record = rs.get_json_or(session_key(sid))
    if isinstance(record, dict) and record.get("run_id") == run_id and record.get(TASK_TOKEN_FIELD):
        return record, str(record[TASK_TOKEN_FIELD])
    legacy = rs.get_json_or(task_token_key(run_id, sid)) if record is None or TASK_TOKEN_FIELD not in record else None
    owned = record if isinstance(record, dict) and record.get("run_id") == run_id else None
    return owned, str(legacy["task_token"]) if isinstance(legacy, dict) and legacy.get("task_token") else None


def on_result(event: S3Notification) -> dict[str, Any]:
    """SendTaskSuccess for each result object. Unknown, duplicate and late results are logged and ignored.
    A re-check (`ResultEvent` ``recheck``) looks for one rollout's result instead (`recheck`)."""
    if isinstance(event, ResultEvent) and event.recheck is not None:
        return recheck(event.recheck)
    rs = store()
    sfn = sfn_client()  # the client OnRolloutResult resumes tasks with (one per container)
    resumed, ignored = 0, 0
    for _bucket, key in event.objects():
        try:
            run_id, input_id, sid = parse_result_key(key)
        except ValueError:
            logger.warning("not a rollout result key", extra={"key": redact(key, key.rsplit("/", 1)[-1].removesuffix(".json"))})
            ignored += 1
            continue
        bind(run_id=run_id, sid=sid)
        record, token = session_and_token(rs, run_id, sid)
        if token is None:
            logger.warning("no task token for this result (unknown session)", extra={"key": redact(key, sid)})
            ignored += 1
            continue
        # The session record rides to FinishRollout, which closes the session with it: one GET of
        # the record per rollout fewer. Nothing changes the record meanwhile (StartRollout wrote it
        # before the invoke; the gateway only reads it). Its token is already in the history (the
        # Start rollout task's parameters), so the output reveals nothing new.
        output: dict[str, Any] = {"sid": sid, "result_key": key}
        if record is not None:
            output["session"] = {k: v for k, v in record.items() if k != API_KEY_DIGEST_FIELD}
        # This invocation's measurement rides to FinishRollout in the task's output (the cost ledger).
        ride = metering.ride(run_id)
        if not ride.usage.is_empty():
            output["usage"] = ride.usage.model_dump()
        gone = task_tokens.send_result(sfn, token, output)
        if gone is None:
            ride.commit()
            resumed += 1
        else:
            ride.cancel()
            logger.info("result arrived after its task ended (duplicate or late)", extra={"key": redact(key, sid), "why": gone})
            ignored += 1
    return {"resumed": resumed, "ignored": ignored}


#: States a re-check round enters before its own task ("Rollout silent", a Pass: the ASL's loop goes through it).
RECHECK_PASS_STATES = 1


class RolloutSilent(RuntimeError):
    """The re-check found no result and no LLM call for ``rollout_heartbeat_seconds`` (`stepwise.core.liveness`)."""


class RolloutOverdue(RuntimeError):
    """The re-check found no result past ``max_rollout_time`` (`stepwise.core.liveness`)."""


def recheck(req: RecheckRequest) -> dict[str, Any]:
    """"Wait for rollout result": the rollout's task heard nothing for ``rollout_recheck_seconds`` (no LLM call,
    no result notification; `stepwise.core.liveness`). Its result object found, its task (this state's, token
    ``req.task_token``) ends with it at once, as OnRolloutResult's notification would have ended it (with
    ``rechecked``: FinishRollout marks the rollout ``late``). Not found, `stepwise.core.liveness.recheck_verdict`:
    ``wait`` stores this task's token in the session record (the notification and the gateway's heartbeats now
    reach it; the record's ``usage`` gains this call's measurement) and looks for the result once more (it may
    have landed meanwhile, its notification reading the old token); ``silent`` / ``overdue`` raise
    `RolloutSilent` / `RolloutOverdue` (the state's Catch hands them to FinishRollout, a timeout).

    S3 requests: the start marker, the session record and the result (HEAD); waiting, the turns' listing, the
    record's PUT and a second HEAD. Two state transitions (the Pass before it and its own; counted here, riding
    in the record or the output)."""
    from stepwise.core.liveness import recheck_verdict
    from stepwise.gateway.session import last_completed_at

    rs = store()
    run, batch, item = req.run, req.batch, req.item
    marker = rs.get_json_or(start_marker_key(run.run_id, batch.step, batch.generation_batch, batch.kind, item.i,
                                             **batch.folder)) or {}
    sid = marker.get("sid")
    bind(run_id=run.run_id, step=batch.step, sid=sid)
    record, _ = session_and_token(rs, run.run_id, sid) if sid else (None, None)
    if sid is None or record is None:
        raise RolloutOverdue(f"item {item.i} has no started session to wait for")
    key = result_key(run.run_id, item.input_id, sid)
    sfn = sfn_client()
    ride = metering.ride(run.run_id)
    ride.usage.state_transitions += RECHECK_PASS_STATES + task_transitions(req.retry_count)

    def resume() -> dict[str, Any]:
        # ends this task with the result, as OnRolloutResult's notification would; this call's measurement rides in it
        output = {"sid": sid, "result_key": key, "rechecked": True, "usage": ride.usage.model_dump(),
                  "session": {k: v for k, v in record.items() if k != API_KEY_DIGEST_FIELD}}
        gone = task_tokens.send_result(sfn, req.task_token, output)
        (ride.commit if gone is None else ride.cancel)()
        logger.warning("result found by the re-check: its S3 notification came late or never",
                       extra={"key": redact(key, sid), "gone": gone})
        return {"resumed": int(gone is None), "ignored": int(gone is not None)}

    if rs.exists(key):
        return resume()
    cfg = run_config(run.run_id)
    last_call = last_completed_at(rs.list_keys(turns_prefix(run.run_id, sid)))
    verdict = recheck_verdict(now(), started_at=float(record.get("started_at") or now()), last_call_at=last_call,
                              timeout_seconds=batch.timeouts().max_rollout_seconds,
                              silence_seconds=cfg.rollout_heartbeat_seconds)
    # The record carries what the rollout's calls have used so far (FinishRollout sums it): this one's too.
    usage = (_usage_of(record.get("usage")) or Usage()).add(ride.usage)
    if verdict != "wait":
        rs.put_json(session_key(sid), {**record, "usage": usage.model_dump()})
        ride.commit()
        if verdict == "silent":
            raise RolloutSilent(f"no LLM call for {cfg.rollout_heartbeat_seconds} s and no result")
        raise RolloutOverdue(f"no result within {batch.timeouts().max_rollout_seconds} s")
    record = {**record, TASK_TOKEN_FIELD: req.task_token, "usage": usage.model_dump()}
    rs.put_json(session_key(sid), record)
    ride.commit()
    ride = metering.ride(run.run_id)
    if rs.exists(key):
        return resume()
    ride.cancel()
    return {"waiting": True}


# ---------------------------------------------------------------------------- finish


def _usage_of(raw: Any) -> Usage | None:
    """A measurement carried in a record (`stepwise.records.Usage`), or None when absent or not one
    (a record of an older release; the agent can write turns' neighbours, never these records)."""
    if not isinstance(raw, dict):
        return None
    try:
        return Usage.model_validate(raw)
    except ValueError:
        logger.warning("a carried usage measurement is malformed; left out of the ledger")
        return None


def _load_turns(rs: Any, run_id: str, sid: str) -> list[dict[str, Any]]:
    """Captured turns in key order (keys sort in completion order, docs/internals.md)."""
    return [rs.get_json(k) for k in rs.list_keys(turns_prefix(run_id, sid)) if k.endswith(".json")]


def turn_policy_versions(turns: list[Any]) -> list[int]:
    """The policy version each captured turn sampled (`stepwise.records.CapturedTurn.policy_version`), in
    the order the gateway recorded them; turns without one (written by an older gateway) are left out."""
    return [int(t["policy_version"]) for t in turns if isinstance(t, dict)
            and isinstance(t.get("policy_version"), int) and not isinstance(t.get("policy_version"), bool)]


def _rollout_sid(rs: RunStore, event: FinishEvent) -> str | None:
    """The rollout's sid: the one its result carries, else StartRollout's start marker's (a rollout
    that failed before resuming its task), else None (it never started)."""
    sid = (event.result or {}).get("sid")
    if sid is None:
        batch, item = event.batch, event.item
        marker = rs.get_json_or(start_marker_key(event.run.run_id, batch.step, batch.generation_batch, batch.kind,
                                                 item.i, **batch.folder)) or {}
        sid = marker.get("sid")
    return sid


def end_error(event: FinishEvent) -> str:
    """The task error a rollout's task ended with, as its record names it (`stepwise.core.liveness.task_error`)."""
    return task_error(str((event.error or {}).get("Error", "error")))


def read_result(rs: RunStore, key: str) -> ResultRead:
    """Read a rollout's result object (at most `stepwise.core.rewards.MAX_RESULT_BYTES`) into what
    `stepwise.core.rewards.rollout_outcome` classifies; never raises for the agent's faults."""
    from stepwise.core.rewards import MAX_RESULT_BYTES, preview

    try:
        return ResultRead(value=rs.get_json_bounded(key, MAX_RESULT_BYTES))
    except KeyError:
        return ResultRead(missing=True)
    except ObjectTooLarge as e:  # never read: a result beyond the bound is the agent's fault, not an OOM
        return ResultRead(too_large=e.size)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested too deep: scored 0.0, never raised
        return ResultRead(malformed=preview(e, 1000))


#: The Finish rollout state's retries on States.ALL (``MaxAttempts`` in the ASL; tests/core/test_ledger.py
#: checks it), all spent when "Record failed rollout" runs.
FINISH_ROLLOUT_RETRIES = 8


def record_failed_finish(event: FinishEvent) -> dict[str, Any]:
    """FinishRollout kept failing (``event.finish_error``): write the rollout as ``error`` (reward 0.0,
    cause ``FinishRolloutFailed: <its last error>``), nothing else, so one child never sinks a step.
    Its sessions are closed and stopped on a best-effort basis (a failure is logged, not raised)."""
    from stepwise.core.rewards import preview

    rs = store()
    run, batch, item = event.run, event.batch, event.item
    sid = _rollout_sid(rs, event)
    bind(run_id=run.run_id, step=batch.step, sid=sid)
    failure = event.finish_error or {}
    cause = f"{failure.get('Error', 'error')}: {preview(failure.get('Cause', ''), 800)}"
    # For the cost ledger: the Finish rollout state's transitions (entered once, every retry spent: its
    # Retry is on States.ALL) and this state's own, and what rode to FinishRollout, which never wrote it:
    # OnRolloutResult's measurement (the result), StartRollout's (the session record), the gateway's
    # (the captured turns) and the ACR session's seconds (best effort on a path that is already failing).
    usage = Usage(state_transitions=task_transitions(FINISH_ROLLOUT_RETRIES) + task_transitions(event.retry_count))
    usage.add(_usage_of((event.result or {}).get("usage")))
    if sid is not None:
        try:
            session = close_gateway_session(rs, sid, (event.result or {}).get("session")) or {}
            usage.add(_usage_of(session.get("usage")))
            cfg = run_config(run.run_id)
            stopped = agentcore.stop_session(cfg.agent_runtime_arn, cfg.region, session_id=sid)
            if isinstance(session.get("started_at"), (int, float)):
                # its seconds when this call ended it; an earlier attempt that ended it took their count along
                usage.add(acr_usage(max(0.0, now() - float(session["started_at"])) if stopped else 0.0, cfg))
        except Exception as exc:  # the record is what matters now
            logger.warning("could not close or stop the sessions of a failed rollout",
                           extra={"error": type(exc).__name__, "detail": redact(str(exc), sid)[:300]})
        try:
            for turn in _load_turns(rs, run.run_id, sid):
                usage.add(_usage_of(turn.get("usage") if isinstance(turn, dict) else None))
        except Exception as exc:
            logger.warning("could not read the captured turns of a failed rollout",
                           extra={"error": type(exc).__name__})
    error = {"error": "FinishRolloutFailed", "cause": cause}
    if event.error is not None:
        error["rollout_error"] = str(event.error.get("Error", "error"))
    logger.error("FinishRollout failed for this rollout; recorded as an error rollout (reward 0.0)",
                 extra={"error": redact(json.dumps(error), sid or "")})
    key_sid = sid or f"unstarted-{item.i}"
    with metering.riding(run.run_id) as own:  # and this invocation's own
        rollout = RolloutRecord(sid=sid, i=item.i, input_id=item.input_id, row=item.row, member=item.member,
                                kind=batch.kind, step=batch.step, generation_batch=batch.generation_batch,
                                reward=0.0, reward_reason=f"error: FinishRolloutFailed: {preview(cause, 200)}",
                                status="error", error=error, usage=usage.add(own), group=batch.group,
                                policy_version=batch.policy.policy_version if batch.policy is not None else None)
        rs.put_json(rollout_key(run.run_id, batch.step, batch.generation_batch, key_sid, batch.kind, **batch.folder),
                    rollout.model_dump(), bulk=True)
    return {"sid": key_sid, "reward": 0.0, "status": "error", "records": 0}


def finish(event: FinishEvent) -> dict[str, Any]:
    if event.finish_error is not None:
        return record_failed_finish(event)
    from stepwise.core.behaviour import rollout_behaviour
    from stepwise.core.replay import record_to_json, replay_session
    from stepwise.core.rewards import per_turn_outcome, rollout_outcome, task_end

    rs = store()
    run, batch, item = event.run, event.batch, event.item
    sid = _rollout_sid(rs, event)
    bind(run_id=run.run_id, step=batch.step, sid=sid)
    cfg = run_config(run.run_id)
    end = task_end(event.error, event.result, batch.timeouts(), silence_seconds=cfg.rollout_heartbeat_seconds,
                   started=sid is not None)
    key = None
    if end.read == "if_present":
        key = result_key(run.run_id, item.input_id, sid)
        if rs.exists(key):
            end = end.found_late()
            logger.warning("result arrived after the task timed out; scored", extra={"timeout": end_error(event)})
        else:
            key = None
    elif end.read == "result":
        key = (event.result or {}).get("result_key") or result_key(run.run_id, item.input_id, sid)
        if end.late:  # found by the re-check ("Wait for rollout result"): its notification came late or never
            logger.warning("result found by the re-check, not its notification; scored")
    per_turn = cfg.reward_granularity == "per_turn"
    outcome = rollout_outcome(end, read_result(rs, key) if key is not None else None, result_key=key, per_turn=per_turn)
    status, error, late, reward, reason = outcome.status, outcome.error, outcome.late, outcome.reward, outcome.reason
    if status != "ok":
        logger.warning("rollout did not complete; reward 0.0", extra={"status": status, "error": redact(json.dumps(error), sid)})
    elif reason:
        logger.warning("reward zeroed", extra={"reason": reason})
    records: list[Any] = []
    turn_rewards: list[float] | None = None
    turn_spans: list[Any] | None = None
    behaviour = rollout_behaviour([])
    duration_s = None
    turn_versions: list[int] = []
    # What the rollout used, for the cost ledger: the Finish rollout state's transitions, the agent's
    # result object (a PUT the agent made into the run bucket), then below StartRollout's and
    # OnRolloutResult's measurements, the gateway's per turn, the ACR session, and this invocation's.
    usage = Usage(state_transitions=task_transitions(event.retry_count),
                  s3_put_class=1 if event.result is not None or late else 0)
    usage.add(_usage_of((event.result or {}).get("usage")))
    # The policy it sampled with: the gateway session's (what every turn used), else the batch's.
    policy_version = batch.policy.policy_version if batch.policy is not None else None
    if sid is not None:
        session = close_gateway_session(rs, sid, (event.result or {}).get("session")) or {}
        # The agent's runtime session ends with its rollout, whichever way it ended (a retried
        # FinishRollout finds it gone, which is fine): otherwise it bills and holds a place under the
        # account's active-session quota until ACR's idle timeout (900 s by default).
        stopped = agentcore.stop_session(cfg.agent_runtime_arn, cfg.region, session_id=sid)
        logger.info("runtime session stopped" if stopped else "runtime session already gone")
        if isinstance(session.get("policy_version"), int):
            policy_version = session["policy_version"]
        if isinstance(session.get("started_at"), (int, float)):
            duration_s = max(0.0, now() - float(session["started_at"]))  # before the grace wait below
        usage.add(_usage_of(session.get("usage")))
        if duration_s is not None:  # the agent's ACR session: from the invoke to its end here
            usage.add(acr_usage(duration_s, cfg))
        time.sleep(turn_grace_seconds())
        turns = _load_turns(rs, run.run_id, sid)
        for turn in turns:
            usage.add(_usage_of(turn.get("usage") if isinstance(turn, dict) else None))
        turn_versions = turn_policy_versions(turns)
        behaviour = rollout_behaviour(turns)
        replay = replay_session(sid, turns, reward, max_context_tokens=cfg.max_context_tokens)
        # The reference keeps records with tokens only (rollout.py run_one_rollout).
        kept = [i for i, r in enumerate(replay.records) if r.token_ids]
        records = [replay.records[i] for i in kept]
        if per_turn:
            # One reward per LLM turn the gateway recorded; a mismatch zeroes the rollout with its reason.
            outcome = per_turn_outcome(outcome, replay.num_turns)
            turn_rewards, turn_spans = outcome.turn_rewards, [replay.turn_spans[i] for i in kept]
            if status == "ok":
                reward, reason = outcome.reward, outcome.reason
                if reason is not None:
                    logger.warning("reward zeroed", extra={"reason": reason})
            for r in records:
                r.reward = reward
    elif per_turn:  # no session: no captured turn to carry a reward
        outcome = per_turn_outcome(outcome, None)
        reward, reason = outcome.reward, outcome.reason
    key_sid = sid or f"unstarted-{item.i}"
    with metering.riding(run.run_id) as own:
        rollout = RolloutRecord(
            sid=sid, i=item.i, input_id=item.input_id, row=item.row, member=item.member,
            kind=batch.kind, step=batch.step, generation_batch=batch.generation_batch,
            reward=reward, reward_reason=reason, status=status, error=error,
            **behaviour,  # num_turns, sampled_tokens, truncated_turns, ill_formed_turns, tool_calls
            duration_s=duration_s, policy_version=policy_version, usage=usage.add(own),
            records=[record_to_json(r) for r in records], turn_rewards=turn_rewards, turn_spans=turn_spans,
            late=late, group=batch.group, turn_versions=turn_versions or None,
            first_turn_version=turn_versions[0] if turn_versions else None,
            last_turn_version=max(turn_versions) if turn_versions else None,
        )
        rs.put_json(rollout_key(run.run_id, batch.step, batch.generation_batch, key_sid, batch.kind, **batch.folder),
                    rollout.model_dump(), bulk=True)
    out: dict[str, Any] = {"sid": key_sid, "reward": reward, "status": status, "records": len(records)}
    if late:
        out["late"] = True
    return out


start_handler = entrypoint(StartEvent, start)
result_handler = entrypoint(ResultEvent, on_result)
finish_handler = entrypoint(FinishEvent, finish)
