"""What every handler shares: event models, the run store, the run's config, logging and metrics.

Environment (besides ``STEPWISE_BUCKET`` / ``STEPWISE_GATEWAY_URL``, docs/internals.md):
``STEPWISE_POLL_SECONDS`` (Wait-state seconds between polls, integer >= 1, default 10) and
``STEPWISE_INLINE_WAIT_SECONDS`` (how long a submit/poll handler may poll before handing the
wait to the state machine, default 5; fast operations then need no Wait state at all).
"""

from __future__ import annotations

import functools
import json
import os
import time
from typing import Any

from aws_lambda_powertools import Logger, Metrics
from aws_lambda_powertools.metrics import MetricUnit
from pydantic import BaseModel, ConfigDict

from stepwise.layout import config_key, eval_summary_key, summary_key
from stepwise.records import BatchRef, Phase, RunRef, RunState
from stepwise.aws.runstore import RunStore

SERVICE = os.environ.get("POWERTOOLS_SERVICE_NAME", "stepwise")
logger = Logger(service=SERVICE)
#: EMF dimensions: ``service`` and ``run_id`` (the dashboard's SEARCH expressions rely on both).
metrics = Metrics(namespace=os.environ.get("POWERTOOLS_METRICS_NAMESPACE", "Stepwise"), service=SERVICE)


class RunEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run: RunRef


class BatchEvent(BaseModel):
    model_config = ConfigDict(extra="ignore")

    run: RunRef
    batch: BatchRef


def poll_seconds() -> int:
    return max(1, int(os.environ.get("STEPWISE_POLL_SECONDS", "10")))


def inline_wait_seconds() -> float:
    return max(0.0, float(os.environ.get("STEPWISE_INLINE_WAIT_SECONDS", "5")))


@functools.lru_cache(maxsize=1)
def _store(bucket: str) -> RunStore:
    return RunStore(bucket)


def store() -> RunStore:
    """The run store of ``STEPWISE_BUCKET`` (one client per container)."""
    try:
        return _store(os.environ["STEPWISE_BUCKET"])
    except KeyError:
        raise KeyError("STEPWISE_BUCKET is not set: the Lambda environment must name the run bucket") from None


def sfn_client() -> Any:
    """The Step Functions client of this container (one per endpoint: the local stack's tests start
    one moto server after another in a process)."""
    return _sfn_client(os.environ.get("AWS_ENDPOINT_URL_SFN", ""))


@functools.lru_cache(maxsize=4)
def _sfn_client(_endpoint: str) -> Any:
    import boto3

    from stepwise.aws.clients import client_config

    return boto3.client("stepfunctions", config=client_config())


_CONFIGS: dict[tuple[str, str], Any] = {}


def run_config(run_id: str) -> Any:
    """The run's validated `RunConfig` from ``runs/{run_id}/config.json`` (cached per container)."""
    from stepwise.config import RunConfig

    key = (store().bucket, run_id)
    if key not in _CONFIGS:
        _CONFIGS[key] = RunConfig.model_validate(store().get_json(config_key(run_id)))
    return _CONFIGS[key]


def redact(text: str, sid: str | None) -> str:
    """``text`` with ``sid`` replaced by ``sid#{digest}``: the sid is the agent's gateway api key,
    so it never reaches a log in clear (the gateway logs the same digest)."""
    if not sid:
        return text
    from stepwise.gateway.session import sid_digest

    return text.replace(sid, f"sid#{sid_digest(sid)}")


def bind(run_id: str | None = None, step: int | None = None, sid: str | None = None) -> None:
    """Append correlation keys to every log line of this invocation (``sid`` as its digest, see `redact`)."""
    keys = {k: v for k, v in (("run_id", run_id), ("step", step), ("sid", redact(sid, sid) if sid else None))
            if v is not None}
    if keys:
        logger.append_keys(**keys)


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
    metrics.add_dimension(name="run_id", value=run_id)
    for name, value in clean.items():
        default = MetricUnit.Seconds if name.startswith("time/") else (
            MetricUnit.Count if "/num_" in name or name.endswith(("_rollouts", "/n")) else MetricUnit.NoUnit)
        unit = units.get(name, default)
        metrics.add_metric(name=name, unit=unit, value=value)
    metrics.flush_metrics()


def drive(run_id: str, execution_arn: str, phases: tuple[Phase, ...]) -> tuple[RunState, bool, dict[str, Any]]:
    """Drive the run's operations in ``phases`` (`stepwise.aws.sagemaker.drive`) with this container's
    store and the run's runtime client, for up to ``STEPWISE_INLINE_WAIT_SECONDS``."""
    from stepwise.aws import sagemaker

    cfg = run_config(run_id)
    return sagemaker.drive(store(), sagemaker.runtime(cfg.region), cfg, run_id, execution_arn, phases,
                          budget_s=inline_wait_seconds())


def write_summary(run_id: str, step: int, summary: dict[str, Any], *, kind: str = "train") -> None:
    """Publish a step (``kind="train"``) or eval (``kind="eval"``) summary to MLflow, then to S3.

    The one place summaries are published: `stepwise.aws.tracking.summary_warning` (nothing unless
    the config names an MLflow tracking server; never raises), then
    ``runs/{run_id}/steps/{step}/summary.json`` or ``runs/{run_id}/evals/{step}/summary.json``,
    which carries a tracking failure's text under ``tracking.WARNING_KEY`` (``stepwise watch``
    prints it), so metrics that never reached MLflow are not a silent gap.
    """
    from stepwise.aws import tracking

    warning = tracking.summary_warning(run_config(run_id), run_id, step, summary, kind=kind)
    if warning:
        summary = {**summary, tracking.WARNING_KEY: warning}
    key = summary_key(run_id, step) if kind == "train" else eval_summary_key(run_id, step)
    store().put_json(key, summary)


def now() -> float:
    return time.time()


CONTINUATION_KEY = "continuation"


def resolve_run(execution_name: str, execution_input: Any) -> tuple[str, dict[str, Any] | None]:
    """``(run_id, continuation or None)`` of an execution.

    The first execution of a run is started with the RunConfig JSON and its name is the run id.
    A continuation (continue-as-new) is started with ``{"continuation": {"run_id": ...,
    "parent_execution_arn": ..., "segment": n}}``. ``execution_input`` may be the JSON text
    (EventBridge ``detail.input``) or the parsed object.
    """
    if isinstance(execution_input, str):
        try:
            execution_input = json.loads(execution_input)
        except ValueError:
            execution_input = None
    if isinstance(execution_input, dict) and isinstance(execution_input.get(CONTINUATION_KEY), dict):
        cont = execution_input[CONTINUATION_KEY]
        return str(cont["run_id"]), cont
    return execution_name, None
