"""What every handler shares: its dependencies, the run's config, logging, metrics and the entrypoint factory.

Dependencies (`Dependencies`: the run store, the Step Functions client, the per-container caches)
are built once per distinct environment (`stepwise.settings.current`), so a handler run after
another under a new environment (the local engine, the tests: one moto server after another in
one process) never reuses the old ones; tests that want their own swap them in with
`use_dependencies`. Every Lambda's entrypoint is one line: ``handler = entrypoint(EventModel, fn)``.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel

from stepwise import metering
from stepwise import settings as settings_
from stepwise.aws.runstore import RunStore
from stepwise.layout import config_key, eval_summary_key, summary_key
from stepwise.records import Phase, RunState
from stepwise.settings import Settings

if TYPE_CHECKING:
    from stepwise.config import RunConfig

SERVICE = os.environ.get(settings_.ENV_SERVICE, "stepwise")
logger = Logger(service=SERVICE)
#: EMF dimensions: ``service`` and ``run_id`` (the dashboard's SEARCH expressions rely on both).
metrics = Metrics(namespace=os.environ.get(settings_.ENV_METRICS_NAMESPACE, "Stepwise"), service=SERVICE)
# One EMF record at a time per process: the Metrics object is shared, and the local stack runs several
# invocations in one process's threads (a Lambda environment runs one at a time).
_EMIT_LOCK = threading.Lock()


# ---------------------------------------------------------------------------- dependencies


@dataclass
class Dependencies:
    """What a handler talks to and what it caches, for one environment.

    Attributes:
        settings: the environment (`stepwise.settings.Settings`).
        store: the run store of ``settings.bucket``.
        sfn: the Step Functions client (made on first use).
        configs: run id -> its validated `RunConfig` (``config.json`` is written once by Init).
        cache: per-container memo of objects that never change once written (a batch's
            ``prompts.json``, a dataset snapshot's index), keyed by the caller.
    """

    settings: Settings
    store: RunStore
    sfn_client: Any = None
    configs: dict[str, RunConfig] = field(default_factory=dict)
    cache: dict[Any, Any] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def of(cls, settings: Settings, *, s3: Any = None, sfn: Any = None) -> "Dependencies":
        """Fresh dependencies of ``settings`` (clients made with `stepwise.aws.clients.client_config`
        unless given)."""
        return cls(settings=settings, store=RunStore(settings.require_bucket(), s3), sfn_client=sfn)

    @property
    def sfn(self) -> Any:
        if self.sfn_client is None:
            import boto3

            from stepwise.aws.clients import client_config

            self.sfn_client = boto3.client("stepfunctions", config=client_config())
        return self.sfn_client

    def memo(self, key: Any, make: Callable[[], Any]) -> Any:
        """``cache[key]``, made once by ``make()`` (under a lock: rollouts starting together in one
        process read a batch's prompts once, not once each)."""
        with self.lock:
            if key not in self.cache:
                self.cache[key] = make()
            return self.cache[key]


_OVERRIDE: list[Dependencies] = []


@functools.lru_cache(maxsize=8)
def _dependencies_of(settings: Settings) -> Dependencies:
    return Dependencies.of(settings)


def dependencies() -> Dependencies:
    """The dependencies of this invocation: those `use_dependencies` swapped in, else the ones of
    the current environment (made once per distinct environment). Raises KeyError when
    ``STEPWISE_BUCKET`` is unset."""
    if _OVERRIDE:
        return _OVERRIDE[-1]
    return _dependencies_of(settings_.current())


@contextlib.contextmanager
def use_dependencies(deps: Dependencies) -> Iterator[Dependencies]:
    """Run the handlers with ``deps`` inside the block (tests: a moto client, a fresh cache)."""
    _OVERRIDE.append(deps)
    try:
        yield deps
    finally:
        _OVERRIDE.remove(deps)


def store() -> RunStore:
    """The run store of ``STEPWISE_BUCKET`` (one client per container and environment)."""
    return dependencies().store


def sfn_client() -> Any:
    """The Step Functions client of this container (one per environment: the local stack's tests
    start one moto server after another in a process)."""
    return dependencies().sfn


def settings() -> Settings:
    return dependencies().settings if _OVERRIDE else settings_.current()


def poll_seconds() -> int:
    return settings().poll_seconds


def inline_wait_seconds() -> float:
    return settings().inline_wait_seconds


def run_config(run_id: str) -> RunConfig:
    """The run's validated `RunConfig` from ``runs/{run_id}/config.json`` (cached per container)."""
    from stepwise.config import RunConfig

    deps = dependencies()
    if run_id not in deps.configs:
        deps.configs[run_id] = RunConfig.model_validate(deps.store.get_json(config_key(run_id)))
    return deps.configs[run_id]


def now() -> float:
    return time.time()


#: ``time.monotonic()`` at which this invocation's Lambda ends (from its context's remaining time), or
#: None outside an entrypoint (a handler called directly, as tests do).
_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar("stepwise_invocation_deadline", default=None)


def invocation_deadline(margin_s: float = 0.0) -> float:
    """``time.monotonic()`` seconds until which this invocation may work, keeping ``margin_s`` for what
    it must still do before returning: the Lambda context's remaining time at the start of the
    invocation, less ``margin_s``; ``inf`` when the handler was called without a context."""
    end = _DEADLINE.get()
    return float("inf") if end is None else end - margin_s


def _deadline_of(context: Any) -> float | None:
    remaining = getattr(context, "get_remaining_time_in_millis", None)
    try:
        return time.monotonic() + remaining() / 1000.0 if callable(remaining) else None
    except (TypeError, ValueError):
        return None


# ---------------------------------------------------------------------------- entrypoints


@functools.lru_cache(maxsize=64)
def _spec_name(handler: Callable[..., Any]) -> str | None:
    from stepwise.functions import FUNCTIONS

    for spec in FUNCTIONS:
        module_name, _, attr = spec.handler.rpartition(".")
        module = sys.modules.get(module_name)
        if module is not None and getattr(module, attr, None) is handler:
            return spec.name
    return None


def function_name(handler: Callable[..., Any], context: Any) -> str:
    """The logical name (`stepwise.functions.FunctionSpec.name`) of the function whose entrypoint is
    ``handler``, else the context's ``function_name`` (a handler outside the registry)."""
    return _spec_name(handler) or str(getattr(context, "function_name", "") or "unknown")


def memory_mb(context: Any) -> int:
    """The invocation's configured memory (the Lambda context's ``memory_limit_in_mb``; 0 without one)."""
    try:
        return int(getattr(context, "memory_limit_in_mb", 0) or 0)
    except (TypeError, ValueError):
        return 0


E = TypeVar("E", bound=BaseModel)


class TransientServiceError(RuntimeError):
    """A service call (S3, Step Functions, SageMaker) was still refused as transient (throttling,
    HTTP 429/5xx, a connection error: `stepwise.aws.sagemaker.is_transient`, the SDK's rule) after
    the client's own retries. The name is what the state machine's ``Retry`` matches: the task is
    sent again with backoff (every handler is idempotent on its input). The message names the
    service's answer."""


def entrypoint(model: type[E], fn: Callable[[E], dict[str, Any]], *,
               transient_retry: bool = False) -> Callable[[dict[str, Any], Any], dict[str, Any]]:
    """The Lambda handler of ``fn``: the event parsed into ``model`` (pydantic; a malformed event
    raises ValidationError naming the fields), the invocation's log keys set (`invocation_log_keys`:
    the Lambda context's and `bind`'s, never another invocation's), ``fn``'s dict returned.

    ``transient_retry``: a transient service error ``fn`` raises leaves as `TransientServiceError`
    (the training loop's tasks retry it; their ASL ``Retry`` names it)."""

    def handler(event: dict[str, Any], context: Any) -> dict[str, Any]:
        # The invocation measures itself for the run's cost ledger (stepwise.metering): its duration at
        # its configured memory, one request, its S3 requests.
        token = metering.begin(function_name(handler, context), memory_mb(context))
        deadline = _DEADLINE.set(_deadline_of(context))
        with invocation_log_keys(context):
            try:
                return fn(model.model_validate(event))
            except Exception as e:
                if not transient_retry:
                    raise
                from stepwise.aws.sagemaker import describe_error, is_transient

                if is_transient(e):
                    logger.warning("transient service error: the state machine retries",
                                   extra={"error": describe_error(e)})
                    raise TransientServiceError(describe_error(e)) from e
                raise
            finally:
                _DEADLINE.reset(deadline)
                metering.end(token)

    handler.__name__ = handler.__qualname__ = f"{fn.__name__}_handler"
    handler.__doc__ = fn.__doc__
    return handler


# ---------------------------------------------------------------------------- logging and metrics


def redact(text: str, sid: str | None) -> str:
    """``text`` with ``sid`` replaced by ``sid#{digest}``: the sid is the agent's gateway api key,
    so it never reaches a log in clear (the gateway logs the same digest)."""
    if not sid:
        return text
    from stepwise.gateway.session import sid_digest

    return text.replace(sid, f"sid#{sid_digest(sid)}")


_COLD = [True]


@contextlib.contextmanager
def invocation_log_keys(context: Any) -> Iterator[None]:
    """This invocation's log keys while it runs: the Lambda context's (``function_name``,
    ``function_request_id``, ..., ``cold_start``: what Powertools' ``inject_lambda_context`` sets) and
    those `bind` adds, cleared when it ends, so none leaks into the next invocation.

    They live in Powertools' context-local store (``Logger.thread_safe_append_keys``, a ``ContextVar``),
    not in the logger's process-wide keys: the local stack runs several invocations at once on one
    process's threads, where ``append_keys`` let a line carry another invocation's function name and sid.
    On Lambda (one invocation per environment at a time) the two are the same."""
    from aws_lambda_powertools.logging.lambda_context import build_lambda_context_model

    cold, _COLD[0] = _COLD[0], False
    logger.thread_safe_clear_keys()
    logger.thread_safe_append_keys(cold_start=cold, **build_lambda_context_model(context).__dict__)
    try:
        yield
    finally:
        logger.thread_safe_clear_keys()


def bind(run_id: str | None = None, step: int | None = None, sid: str | None = None) -> None:
    """Append correlation keys to every log line of this invocation (``sid`` as its digest, see `redact`);
    context-local, like `invocation_log_keys`."""
    metering.bind_run(run_id)
    keys = {k: v for k, v in (("run_id", run_id), ("step", step), ("sid", redact(sid, sid) if sid else None))
            if v is not None}
    if keys:
        logger.thread_safe_append_keys(**keys)


def emit(values: dict[str, float], *, run_id: str, units: dict[str, MetricUnit] | None = None) -> None:
    """Emit slash-named metrics as one EMF record (dimensions: service, run_id), flushed immediately.

    Units: ``time/*`` Seconds, counts (``*/num_*``, ``*_rollouts``, ``*/n``) Count, the rest None.
    The log messages FinishRollout writes for failed or zeroed rollouts ("rollout did not complete",
    "reward zeroed") are counted by the stack's metric filter: keep them stable.
    """
    units = units or {}
    clean = {k: float(v) for k, v in values.items() if isinstance(v, (int, float)) and v == v}
    if not clean:
        return
    with _EMIT_LOCK:
        metrics.add_dimension(name="run_id", value=run_id)
        for name, value in clean.items():
            default = MetricUnit.Seconds if name.startswith("time/") else (
                MetricUnit.Count if "/num_" in name or name.endswith(("_rollouts", "/n")) else MetricUnit.NoUnit)
            unit = units.get(name, default)
            metrics.add_metric(name=name, unit=unit, value=value)
        metrics.flush_metrics()


#: What a driving handler keeps of its invocation's time for its last poll, its state write and its answer.
DRIVE_MARGIN_S = 15.0


def drive(run_id: str, execution_arn: str, phases: tuple[Phase, ...]) -> tuple[RunState, bool, dict[str, Any]]:
    """Drive the run's operations in ``phases`` (`stepwise.aws.sagemaker.drive`) with this container's
    store and the run's runtime client, for up to ``STEPWISE_INLINE_WAIT_SECONDS`` (at most the
    invocation's time left less `DRIVE_MARGIN_S`)."""
    from stepwise.aws import sagemaker

    cfg = run_config(run_id)
    left = invocation_deadline(DRIVE_MARGIN_S) - time.monotonic()
    return sagemaker.drive(store(), sagemaker.runtime(cfg.region), cfg, run_id, execution_arn, phases,
                           budget_s=max(0.0, min(inline_wait_seconds(), left)), now=now)


def write_summary(run_id: str, step: int, summary: dict[str, Any], *, kind: str = "train") -> None:
    """Write a step (``kind="train"``) or eval (``kind="eval"``) summary to
    ``runs/{run_id}/steps/{step}/summary.json`` or ``runs/{run_id}/evals/{step}/summary.json``.

    The one place summaries are published. Nothing else happens on the training loop's path: the
    object's S3 notification runs the Track function (`stepwise.handlers.track`), which logs it to
    MLflow and W&B and renders the run's report page beside the loop.
    """
    key = summary_key(run_id, step) if kind == "train" else eval_summary_key(run_id, step)
    store().put_json(key, summary)
