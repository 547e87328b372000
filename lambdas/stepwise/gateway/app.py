"""The gateway app: the toolkit's OpenAI + Anthropic adapters on one aiohttp app, with
our three seams (session sampler, S3 turn recorder, session state from S3) and a guard
middleware for identity, limits and input checks.

Per turn request (``POST /v1/chat/completions`` or ``/v1/messages``):

1. 413 if the body is larger than ``max_body_bytes``.
2. 401 unless the bearer / ``x-api-key`` value is the rollout's api key ``{sid}.{secret}``: its sid
   names a live session record (``sessions/{sid}.json``: present, not closed, not past its deadline)
   whose digest is the secret's (SHA-256, compared in constant time; `stepwise.gateway.session`). The
   sid alone, which S3 keys and logs show, opens nothing.
3. 400 unless the body is a JSON object with the field types the adapter reads.
4. 429 if the session's persisted turns reach ``max_turns`` or their sampled tokens reach
   ``max_total_tokens`` (counted from S3, so across containers).
5. The turn's sampler is chosen by the record's ``sampler_binding`` (`stepwise.gateway.binding`): the
   record's package, the run's current one, or the current one behind the run's turn gate, which may
   hold the turn while new weights load (503 past ``HOLD_LIMIT_SECONDS``).
6. Otherwise the toolkit adapter runs the turn (render, sample, parse, reply), while the rollout's
   task is heartbeaten beside it (`stepwise.gateway.heartbeat`: an LLM call is the agent's sign of
   life; at most once per interval, never on the request's path); its
   ``record_turn`` is captured and written to S3 before the response completes. A session
   record with a ``sampling_seed`` samples with ``seed = turn_seed(sampling_seed, turn index)``
   (`stepwise.core.seeding`), so a seeded run is reproducible.

None of 1-4 reaches the sampler. Source of the turn pipeline:
``agentcore_rl_toolkit/rollout_gateway/adapters/common.py`` (``BaseAdapter._run_turn``).
"""

from __future__ import annotations

import asyncio
import contextvars
import dataclasses
import logging
import os
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from typing import Any

from aiohttp import web
from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from botocore.exceptions import ClientError, ParamValidationError

from agentcore_rl_toolkit.rollout_gateway.adapters.anthropic import AnthropicAdapter
from agentcore_rl_toolkit.rollout_gateway.adapters.common import sid_from_bearer
from agentcore_rl_toolkit.rollout_gateway.adapters.openai import OpenAIAdapter
from stepwise import metering
from stepwise.core.seeding import turn_seed
from stepwise.functions import GATEWAY_FUNCTION
from stepwise.layout import session_key, turns_prefix
from stepwise.records import SessionRecord

from stepwise.aws.sampler_gate import store_over

from . import _toolkit
from .binding import GateHeld, SamplerBindings
from .heartbeat import TaskHeartbeats
from .recorder import PendingTurn, S3TurnRecorder
from .renderers import RoutingRenderer, RunRenderers, S3TokenizerLoader, TokenizerLoader
from .sampling import SamplerFactory, SessionSamplerBackend
from .session import (
    TurnUsage,
    is_plausible_sid,
    limit_exceeded,
    turn_index,
    refusal,
    sid_digest,
    split_api_key,
    usage_from_keys,
)
from .validation import TURN_ROUTES, Protocol, error_response, parse_body

logger = Logger(service=os.environ.get("POWERTOOLS_SERVICE_NAME", "stepwise"))
#: EMF metrics (namespace from POWERTOOLS_METRICS_NAMESPACE), one flush per served turn.
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Stepwise"),
                  service=os.environ.get("POWERTOOLS_SERVICE_NAME", "stepwise"))

#: Lambda Function URLs accept request payloads up to 6 MB.
DEFAULT_MAX_BODY_BYTES = 6 * 1024 * 1024

_TOOLKIT_LOGGERS = (
    "agentcore_rl_toolkit.rollout_gateway.adapters.common",
    "agentcore_rl_toolkit.rollout_gateway.adapters.openai",
    "agentcore_rl_toolkit.rollout_gateway.adapters.anthropic",
    "agentcore_rl_toolkit.rollout_gateway.render",
    "agentcore_rl_toolkit.rollout_gateway.trajectory",
    "agentcore_rl_toolkit.rollout_gateway.sampling_backends.sagemaker_sdk",
    "aiohttp.server",
    "aiohttp.web",
)


@dataclasses.dataclass
class GatewaySettings:
    """Configuration from the environment (``STEPWISE_BUCKET`` is required)."""

    bucket: str
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    sampler_cache_size: int = 8
    #: The function's configured memory (``AWS_LAMBDA_FUNCTION_MEMORY_SIZE``, which Lambda sets; else
    #: the registry's, `stepwise.functions.GATEWAY_FUNCTION`): what each turn request is billed at.
    memory_mb: int = GATEWAY_FUNCTION.memory_mb

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> GatewaySettings:
        env = dict(os.environ if env is None else env)
        bucket = env.get("STEPWISE_BUCKET")
        if not bucket:
            raise ValueError("STEPWISE_BUCKET is not set: the gateway needs the run bucket")
        return cls(
            bucket=bucket,
            max_body_bytes=int(env.get("STEPWISE_GATEWAY_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES)),
            sampler_cache_size=int(env.get("STEPWISE_GATEWAY_SAMPLER_CACHE", 8)),
            memory_mb=int(env.get("AWS_LAMBDA_FUNCTION_MEMORY_SIZE") or GATEWAY_FUNCTION.memory_mb),
        )


@dataclasses.dataclass
class RequestScope:
    """Everything one turn request needs from its session, visible to the seams."""

    sid: str
    protocol: Protocol
    record: SessionRecord
    adapter_session: Any
    renderer: Any
    pending: list[PendingTurn] = dataclasses.field(default_factory=list)
    seed: int | None = None  # the sampler seed of this turn (None = unseeded)
    sample_seconds: float = 0.0
    samples: int = 0
    ride: Any = None  # the cost ledger's measurement riding in the turn (stepwise.metering.Ride)


@dataclasses.dataclass
class GatewayStats:
    """Counters for tests and the cold-start / overhead measurements (last 4096 turns)."""

    turns: int = 0
    refused: dict[int, int] = dataclasses.field(default_factory=dict)
    sample_seconds: deque = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    overhead_seconds: deque = dataclasses.field(default_factory=lambda: deque(maxlen=4096))
    turn_bytes: deque = dataclasses.field(default_factory=lambda: deque(maxlen=4096))


_SCOPE: contextvars.ContextVar[RequestScope] = contextvars.ContextVar("stepwise_gateway_scope")

#: ``app[GATEWAY]``: the seams and counters of a built app (for tests and measurements).
GATEWAY: web.AppKey[dict] = web.AppKey("stepwise_gateway", dict)


def current_scope() -> RequestScope | None:
    """The turn request being served on this task, or None."""
    return _SCOPE.get(None)


class _TimedBackend:
    """Accounts sampling time to the request scope so overhead can exclude it."""

    def __init__(self, inner: SessionSamplerBackend) -> None:
        self.inner = inner

    @property
    def min_new_tokens(self) -> int:
        return self.inner.min_new_tokens

    async def generate(self, **kwargs: Any):
        t0 = time.perf_counter()
        try:
            return await self.inner.generate(**kwargs)
        except ParamValidationError as e:  # e.g. maxTokens below the service's 512 floor
            raise _bad_request(f"the sampler rejected the request: {e}") from e
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") != "ValidationException":
                raise
            raise _bad_request(f"the sampler rejected the request: {e.response['Error'].get('Message', e)}") from e
        finally:
            scope = current_scope()
            if scope is not None:
                scope.sample_seconds += time.perf_counter() - t0
                scope.samples += 1


def _bad_request(message: str) -> web.HTTPBadRequest:
    scope = current_scope()
    protocol = scope.protocol if scope is not None else "openai"
    payload = error_response(protocol, 400, "invalid_request_error", message).body
    return web.HTTPBadRequest(body=payload, content_type="application/json")


class _ScopedSid:
    """Adapter mixin: the session id is the one the guard authenticated (bearer first,
    then ``x-api-key``), whichever protocol the turn arrives on."""

    def _session_id(self, request: web.Request, body: dict) -> str:
        scope = current_scope()
        if scope is None:
            raise web.HTTPUnauthorized(text="no authenticated session")
        return scope.sid


class StepwiseOpenAIAdapter(_ScopedSid, OpenAIAdapter):
    """The toolkit's OpenAI Chat Completions adapter, sid from the authenticated scope."""


class StepwiseAnthropicAdapter(_ScopedSid, AnthropicAdapter):
    """The toolkit's Anthropic Messages adapter, sid from the authenticated scope."""


class _RedactSids(logging.Filter):
    """Toolkit log lines name the sid (the public half of the agent's api key): replace it by its digest,
    as every line of ours does."""

    def filter(self, record: logging.LogRecord) -> bool:
        scope = current_scope()
        if scope is not None:
            message = record.getMessage()
            if scope.sid in message:
                record.msg = message.replace(scope.sid, f"sid#{sid_digest(scope.sid)}")
                record.args = ()
        return True


def _install_redaction() -> None:
    for name in _TOOLKIT_LOGGERS:
        target = logging.getLogger(name)
        if not any(isinstance(f, _RedactSids) for f in target.filters):
            target.addFilter(_RedactSids())


def request_sid(request: web.Request) -> str | None:
    """The api key the agent sent (``{sid}.{secret}``): ``Authorization: Bearer <key>``, else ``x-api-key``."""
    return sid_from_bearer(request) or (request.headers.get("X-Api-Key") or "").strip() or None


class SessionDirectory:
    """Reads session records and counts persisted turns in the run bucket."""

    def __init__(self, s3: Any, bucket: str, run_id_cache: int = 4096) -> None:
        self.s3 = s3
        self.bucket = bucket
        self._run_ids: OrderedDict[str, str] = OrderedDict()
        self._run_id_cache = run_id_cache

    def record(self, sid: str) -> SessionRecord | None:
        """The session record, or None if there is none. Other S3 errors raise."""
        try:
            obj = self.s3.get_object(Bucket=self.bucket, Key=session_key(sid))
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return None
            raise
        record = SessionRecord.model_validate_json(obj["Body"].read())
        self._remember(sid, record.run_id)
        return record

    def usage(self, run_id: str, sid: str) -> TurnUsage:
        keys: list[str] = []
        paginator = self.s3.get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=self.bucket, Prefix=turns_prefix(run_id, sid)):
            keys.extend(obj["Key"] for obj in page.get("Contents", []))
        return usage_from_keys(keys)

    def known_run_id(self, sid: str) -> str | None:
        return self._run_ids.get(sid)

    def _remember(self, sid: str, run_id: str) -> None:
        self._run_ids[sid] = run_id
        self._run_ids.move_to_end(sid)
        while len(self._run_ids) > self._run_id_cache:
            self._run_ids.popitem(last=False)

    async def lookup(self, sid: str) -> tuple[SessionRecord | None, TurnUsage | None]:
        """Record and usage; the listing runs alongside the read when the sid's run is known,
        and not at all for a session without a turn cap or token budget."""
        run_id = self.known_run_id(sid)
        if run_id is not None:
            record, usage = await asyncio.gather(
                asyncio.to_thread(self.record, sid), asyncio.to_thread(self.usage, run_id, sid)
            )
            if record is None or record.run_id == run_id:
                return record, usage
        record = await asyncio.to_thread(self.record, sid)
        if record is None:
            return None, None
        if not (record.max_turns or record.max_total_tokens or record.sampling_seed is not None):
            return record, TurnUsage(0, 0)
        return record, await asyncio.to_thread(self.usage, record.run_id, sid)


def build_app(
    settings: GatewaySettings | None = None,
    *,
    s3: Any = None,
    sampler_factory: SamplerFactory | None = None,
    tokenizer_loader: TokenizerLoader | None = None,
    clock: Callable[[], float] = time.time,
    heartbeats: TaskHeartbeats | None = None,
) -> web.Application:
    """Assemble the gateway app.

    Args:
        settings: defaults to :meth:`GatewaySettings.from_env`.
        s3: boto3 S3 client (default: ``boto3.client("s3")``).
        sampler_factory: session record -> sampling backend (default: SDK ``SamplingClient``
            wrapped by the toolkit's ``SageMakerSdkBackend``); tests inject scripted samplers.
        tokenizer_loader: session record -> HF tokenizer (default: the run's S3 copy).
        clock: epoch seconds, for session deadlines.
        heartbeats: the rollout tasks' heartbeat sender (default: `TaskHeartbeats` with Step Functions clients).

    The app exposes ``app[GATEWAY]`` (a dict with ``stats``, ``recorder``, ``backend``,
    ``renderers``, ``bindings``) for tests and measurements.
    """
    _toolkit.check_toolkit_version()
    settings = settings or GatewaySettings.from_env()
    if s3 is None:
        import boto3

        from stepwise.aws.clients import client_config

        # aiohttp serves many turns at once; each S3 call runs on a worker thread
        s3 = boto3.client("s3", config=client_config())
    metering.install_s3_counter(s3)  # the cost ledger counts the gateway's S3 requests per turn
    directory = SessionDirectory(s3, settings.bucket)
    renderers = RunRenderers(tokenizer_loader or S3TokenizerLoader(s3, settings.bucket))
    recorder = S3TurnRecorder(s3, settings.bucket, current_scope, record_for=lambda sid: directory.record(sid))
    bindings = SamplerBindings(store_over(s3, settings.bucket), clock=clock)

    async def retry_turn(record: SessionRecord, error: Exception) -> SessionRecord | None:
        """A turn the service refused, retried once on a newer sampler (``next_turn``; `SamplerBindings.retry_record`)."""
        retried = await bindings.retry_record(record)
        scope = current_scope()
        if retried is not None and scope is not None:
            logger.info("turn retried on a newer sampler", extra={"error": type(error).__name__,
                                                                  "policy_version": retried.policy_version})
            scope.record = retried  # the captured turn names the package that sampled it
        return retried

    sampler = SessionSamplerBackend(
        lambda: (scope.record if (scope := current_scope()) is not None else None),
        sampler_factory,
        cache_size=settings.sampler_cache_size,
        current_seed=lambda: (scope.seed if (scope := current_scope()) is not None else None),
        retry=retry_turn,
    )
    backend = _TimedBackend(sampler)
    renderer = RoutingRenderer(lambda: (scope.renderer if (scope := current_scope()) is not None else None))
    stats = GatewayStats()
    heartbeats = heartbeats or TaskHeartbeats()
    _install_redaction()

    app = web.Application(client_max_size=settings.max_body_bytes)
    for path in ("/healthz", "/health", "/v1/models"):  # the toolkit's probes, plus a common alias
        app.router.add_get(path, _health)
    adapters = []
    for cls in (StepwiseOpenAIAdapter, StepwiseAnthropicAdapter):
        adapter = cls(backend=backend, renderer=renderer, tokenizer=None, max_turns_per_sid=None,
                      manager=recorder, app=app)
        _toolkit.install_request_scoped_sessions(adapter, _toolkit.scoped_lookup(_SCOPE))
        adapters.append(adapter)

    def refuse(protocol: Protocol, status: int, error_type: str, message: str) -> web.Response:
        stats.refused[status] = stats.refused.get(status, 0) + 1
        logger.info("turn refused", extra={"status": status, "reason": message})
        return error_response(protocol, status, error_type, message)

    async def admit(request: web.Request, protocol: Protocol) -> tuple[str, SessionRecord, int | None] | web.Response:
        """Checks 1-4 of the module docstring: the session and body, or the refusal."""
        if request.content_length is not None and request.content_length > settings.max_body_bytes:
            return refuse(protocol, 413, "request_too_large",
                          f"request body of {request.content_length} bytes exceeds {settings.max_body_bytes}")
        sid, secret = split_api_key(request_sid(request))
        if not is_plausible_sid(sid):
            return refuse(protocol, 401, "authentication_error",
                          "missing or malformed api key: send the rollout's api key as Bearer token or x-api-key")
        try:
            record, usage = await directory.lookup(sid)
        except Exception as e:  # logged without the traceback: a bad record's text holds the sid
            logger.error("session lookup failed", extra={
                "sid": sid_digest(sid), "error": type(e).__name__,
                "detail": str(e).replace(sid, f"sid#{sid_digest(sid)}")[:500]})
            return refuse(protocol, 503, "api_error", "session store unavailable; retry")
        if record is None:
            return refuse(protocol, 401, "authentication_error", "unknown session")
        why = refusal(record, sid=sid, now=clock(), secret=secret)
        if why is not None:
            return refuse(protocol, 401, "authentication_error", why)
        try:
            raw = await request.read()
        except web.HTTPRequestEntityTooLarge as e:
            return refuse(protocol, 413, "request_too_large", e.text or "request body too large")
        body, reason = parse_body(raw, protocol)
        if body is None:
            return refuse(protocol, 400, "invalid_request_error", reason or "invalid request body")
        over = limit_exceeded(record, usage)
        if over is not None:
            return refuse(protocol, 429, "rate_limit_error", over)
        seed = None if record.sampling_seed is None else turn_seed(record.sampling_seed, turn_index(usage, body))
        return sid, record, seed

    @web.middleware
    async def guard(request: web.Request, handler):
        protocol = TURN_ROUTES.get(request.path) if request.method == "POST" else None
        if protocol is None:
            return await handler(request)
        # Each turn request is one Lambda invocation: it measures itself for the run's cost ledger
        # (stepwise.metering); the turn it captures carries the measurement.
        with metering.measuring(GATEWAY_FUNCTION.name, settings.memory_mb):
            return await serve_turn(request, handler, protocol)

    async def serve_turn(request: web.Request, handler, protocol: Protocol):
        t0 = time.perf_counter()
        admitted = await admit(request, protocol)
        if isinstance(admitted, web.StreamResponse):
            return admitted
        sid, record, seed = admitted
        metering.bind_run(record.run_id)
        async with heartbeats.during(record):
            try:
                async with bindings.turn(record, holder=sid_digest(sid)) as bound:
                    return await serve(request, handler, protocol, sid, bound.record, seed, t0, bound.release)
            except GateHeld as e:
                return refuse(protocol, 503, "api_error", str(e))

    async def serve(request: web.Request, handler: Any, protocol: Protocol, sid: str, record: SessionRecord,
                    seed: int | None, t0: float, release: Callable[[], Any]) -> web.StreamResponse:
        """Run the admitted turn (``handler``: the toolkit adapter's route) in its request scope, then persist it;
        ``release``: the turn's gate lease, released beside the captured turn's write (the sample is done)."""
        with logger.append_context_keys(run_id=record.run_id, sid=sid_digest(sid), step=record.step,
                                        policy_version=record.policy_version):
            try:
                run_renderer = await renderers.get(record)
            except Exception as e:
                logger.exception("tokenizer load failed")
                return refuse(protocol, 503, "api_error", f"the run's tokenizer could not be loaded: {e}")
            scope = RequestScope(
                sid=sid,
                protocol=protocol,
                record=record,
                adapter_session=_toolkit.make_session(record.sampling_defaults, record.max_context_tokens),
                renderer=run_renderer,
                seed=seed,
            )
            token = _SCOPE.set(scope)
            try:
                response = await handler(request)
                written = sum(len(p.body) for p in scope.pending)
                try:
                    await _uncancellable(asyncio.gather(recorder.flush(scope.pending), release()))
                    if scope.ride is not None:
                        scope.ride.commit()
                except Exception:
                    if scope.ride is not None:
                        scope.ride.cancel()
                    logger.exception("turn capture failed")
                    if not response.prepared:  # not streamed yet: fail the turn, the agent retries
                        return error_response(protocol, 500, "api_error", "turn capture failed; retry")
                    raise
                if written:
                    total = time.perf_counter() - t0
                    stats.turns += 1
                    stats.sample_seconds.append(scope.sample_seconds)
                    stats.overhead_seconds.append(total - scope.sample_seconds)
                    stats.turn_bytes.append(written)
                    overhead_ms = round((total - scope.sample_seconds) * 1e3, 2)
                    logger.info("turn served", extra={
                        "protocol": protocol, "status": response.status, "turn_bytes": written,
                        "sample_ms": round(scope.sample_seconds * 1e3, 2), "overhead_ms": overhead_ms,
                    })
                    metrics.add_metric(name="GatewayTurnOverhead", unit=MetricUnit.Milliseconds, value=overhead_ms)
                    metrics.add_metric(name="GatewaySampleTime", unit=MetricUnit.Milliseconds,
                                       value=round(scope.sample_seconds * 1e3, 2))
                    metrics.add_metric(name="GatewayTurnBytes", unit=MetricUnit.Bytes, value=written)
                    metrics.flush_metrics()
                return response
            finally:
                _SCOPE.reset(token)
                for adapter in adapters:
                    _toolkit.release_sid(adapter, sid)

    app.middlewares.append(guard)
    app[GATEWAY] = {"stats": stats, "recorder": recorder, "backend": sampler, "renderers": renderers,
                    "adapters": adapters, "directory": directory, "heartbeats": heartbeats, "bindings": bindings}
    return app


async def _uncancellable(coro) -> None:
    """Await ``coro`` to completion even if this task is cancelled meanwhile, then re-raise.

    A streaming client may close the connection as soon as it reads the stream's end marker
    (the OpenAI client stops at ``[DONE]``); with handler cancellation on (the toolkit's
    server setting) that cancels the request while its turn, already delivered, is being
    written. The write must finish regardless.
    """
    task = asyncio.ensure_future(coro)
    try:
        await asyncio.shield(task)
    except asyncio.CancelledError:
        try:
            await task
        finally:
            raise asyncio.CancelledError


async def _health(request: web.Request) -> web.Response:
    """Readiness probe (also what the toolkit answers on ``/v1/models``)."""
    return web.json_response({"ok": True})
