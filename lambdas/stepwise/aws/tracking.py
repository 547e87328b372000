"""Optional MLflow tracking: the run's params once, then every step and eval summary as metrics.

On when the run config sets ``mlflow_tracking_uri``: a SageMaker managed MLflow ARN
(``...:mlflow-app/ID`` or ``...:mlflow-tracking-server/NAME``, routed by the ``sagemaker-mlflow``
plugin that comes with sagemaker-train), an ``http(s)://`` tracking server, or a local store
(``sqlite:///PATH`` or ``file:PATH``; MLflow 3 needs ``MLFLOW_ALLOW_FILE_STORE`` for the latter,
which a ``file:`` URI here sets).

One Stepwise run = one MLflow run in experiment ``mlflow_experiment_name``, named after the run id
and tagged ``stepwise.run_id``; Lambdas are stateless, so every call finds it by that tag (cached
per container) and creates it, with the config as params, when it does not exist yet. The
summaries' own slash-namespaced names are the metric keys (``sampler/mean_reward``,
``eval/accuracy``, ``train/...``), logged at ``step``.

Uses `mlflow.tracking.MlflowClient` only (not the fluent API, whose global active run does not
belong in a shared Lambda container); ``mlflow`` is imported only when tracking is on.
Tracking never fails a run, but a failure is never silent: `summary_warning` returns it as text,
which ``handlers._common.write_summary`` stores in the step or eval summary under
:data:`WARNING_KEY` (and ``stepwise watch`` prints); the other hooks log it.

The Track function calls it (`stepwise.handlers.track.TRACKERS`: `log_summary` per step or eval
summary, `finish_tracking` at the run's end), one invocation of a run at a time, after the report page
is written (`stepwise.views.publish`).

**Timeouts.** MLflow's client defaults (a 120 s request timeout, 7 retries with a backoff factor of 2:
one call can hold for about 20 minutes against a server that accepts connections and never answers)
do not fit in Track's 300 s. `_client` sets `HTTP_TIMEOUTS` unless the environment sets them already:
each request times out after 10 s and is retried twice (backoff factor 1), so one HTTP call ends within
about 40 s, and Track abandons a `log_summary` still running after `CALL_SECONDS` (a warning).
"""

from __future__ import annotations

import logging
import math
import os
import re
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepwise.config import RunConfig

log = logging.getLogger(__name__)

RUN_ID_TAG = "stepwise.run_id"
#: Summary key of a tracking failure's text (a string, so never logged as a metric).
WARNING_KEY = "warning/tracking"
#: MLflow limits (mlflow/utils/validation.py): params per log_batch, metrics per log_batch, param value length.
MAX_PARAMS_PER_BATCH = 100
MAX_METRICS_PER_BATCH = 1000
MAX_PARAM_VALUE_LENGTH = 6000
_KEY_BAD_CHARS = re.compile(r"[^A-Za-z0-9_\-. /:]")

_RUNS: dict[tuple[str, str, str], str] = {}  # (tracking uri, experiment, run id) -> MLflow run id

#: MLflow's HTTP client settings for Track (environment variables MLflow reads at every request;
#: one already set in the environment wins): 10 s per request, 2 retries, backoff factor 1.
HTTP_TIMEOUTS = {"MLFLOW_HTTP_REQUEST_TIMEOUT": "10", "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",
                 "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}
#: The most one `log_summary` or `finish_tracking` may take in Track before it is abandoned with a
#: warning: a first call makes up to five HTTP calls (experiment, run search, run creation, params,
#: metrics) when the server answers; against one that never answers, the first of them fails after
#: about 40 s (`HTTP_TIMEOUTS`).
CALL_SECONDS = 60.0


def enabled(cfg: RunConfig) -> bool:
    """Whether the run config asks for MLflow tracking."""
    return bool(getattr(cfg, "mlflow_tracking_uri", ""))


def metric_key(name: str) -> str:
    """A summary key as an MLflow metric key (characters MLflow refuses become ``_``)."""
    return _KEY_BAD_CHARS.sub("_", name)


def numeric_metrics(summary: Mapping[str, Any], *, exclude: tuple[str, ...] = ("step",)) -> dict[str, float]:
    """The finite numbers of a summary (booleans, strings, NaN and infinities dropped)."""
    out: dict[str, float] = {}
    for k, v in summary.items():
        if k in exclude or isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            continue
        out[metric_key(k)] = float(v)
    return out


def flat_params(cfg: RunConfig) -> dict[str, str]:
    """The run config as MLflow params: ``{field: str(value)}`` (nested fields dotted, long values cut)."""
    raw = cfg.model_dump(mode="json") if hasattr(cfg, "model_dump") else dict(cfg)
    out: dict[str, str] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            text = "" if value is None else str(value)
            out[metric_key(prefix)] = text[:MAX_PARAM_VALUE_LENGTH]

    walk("", raw)
    return out


def _client(uri: str) -> Any:
    for var, value in HTTP_TIMEOUTS.items():
        os.environ.setdefault(var, value)
    if uri.startswith("file:"):
        # MLflow 3 keeps its file store behind an opt-in; a file: URI in the config is that opt-in.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def _experiment_id(client: Any, name: str) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:  # created by another container in between
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def mlflow_run_id(cfg: RunConfig, run_id: str, *, client: Any = None) -> str:
    """The MLflow run of a Stepwise run: found by tag, else created with the config as params."""
    from mlflow.entities import Param

    key = (cfg.mlflow_tracking_uri, cfg.mlflow_experiment_name, run_id)
    if key in _RUNS:
        return _RUNS[key]
    client = client or _client(cfg.mlflow_tracking_uri)
    exp_id = _experiment_id(client, cfg.mlflow_experiment_name)
    found = client.search_runs([exp_id], filter_string=f"tags.`{RUN_ID_TAG}` = '{run_id}'", max_results=1)
    if found:
        _RUNS[key] = found[0].info.run_id
        return _RUNS[key]
    run = client.create_run(exp_id, run_name=run_id, tags={RUN_ID_TAG: run_id, "stepwise.algorithm": cfg.algorithm})
    params = [Param(k, v) for k, v in sorted(flat_params(cfg).items())]
    for i in range(0, len(params), MAX_PARAMS_PER_BATCH):
        client.log_batch(run.info.run_id, params=params[i:i + MAX_PARAMS_PER_BATCH])
    _RUNS[key] = run.info.run_id
    return _RUNS[key]


def log_step_metrics(cfg: RunConfig, run_id: str, step: int, summary: Mapping[str, Any], *, kind: str = "train",
                     strict: bool = False) -> str | None:
    """Log a step (``kind="train"``) or eval (``kind="eval"``) summary's numbers at ``step``.

    Args:
        cfg: the run's `RunConfig`.
        summary: the summary as written to S3 (non-numeric values are skipped). Eval keys are
            already ``eval/...``; a train summary's ``epoch`` is logged as ``epoch``.

    Returns:
        The MLflow run id, or None when tracking is off (or failed and ``strict`` is false).
    """
    if not enabled(cfg):
        return None
    try:
        from mlflow.entities import Metric

        client = _client(cfg.mlflow_tracking_uri)
        mlflow_id = mlflow_run_id(cfg, run_id, client=client)
        now_ms = int(time.time() * 1000)
        metrics = [Metric(k, v, now_ms, int(step)) for k, v in sorted(numeric_metrics(summary).items())]
        for i in range(0, len(metrics), MAX_METRICS_PER_BATCH):
            client.log_batch(mlflow_id, metrics=metrics[i:i + MAX_METRICS_PER_BATCH])
        return mlflow_id
    except Exception as e:
        if strict:
            raise
        log.warning("MLflow tracking failed for run %s %s step %s: %s", run_id, kind, step, e)
        return None


def summary_warning(cfg: RunConfig, run_id: str, step: int, summary: Mapping[str, Any], *, kind: str = "train") -> str | None:
    """Log a summary like `log_step_metrics`; a failure comes back as one line of text, else None.

    The text names the tracking URI and the error (``MLflow tracking to URI failed at train step 3:
    RestException: PERMISSION_DENIED ...``): an IAM grant that is missing, a server that is down.
    """
    try:
        log_step_metrics(cfg, run_id, step, summary, kind=kind, strict=True)
        return None
    except Exception as e:
        text = f"MLflow tracking to {cfg.mlflow_tracking_uri} failed at {kind} step {step}: {type(e).__name__}: {e}"
        log.warning("%s", text[:2000])
        return text[:1000]


def finish_run(cfg: RunConfig, run_id: str, status: str = "FINISHED", *, strict: bool = False) -> str | None:
    """Mark the MLflow run ended: ``status`` is FINISHED (succeeded), FAILED or KILLED (stopped)."""
    if not enabled(cfg):
        return None
    if status not in ("FINISHED", "FAILED", "KILLED"):
        raise ValueError(f"status must be FINISHED, FAILED or KILLED, got {status!r}")
    try:
        client = _client(cfg.mlflow_tracking_uri)
        mlflow_id = mlflow_run_id(cfg, run_id, client=client)
        client.set_terminated(mlflow_id, status=status)
        return mlflow_id
    except Exception as e:
        if strict:
            raise
        log.warning("MLflow tracking could not end run %s: %s", run_id, e)
        return None


def log_summary(cfg: RunConfig, run_id: str, kind: str, step: int, summary: Mapping[str, Any],
                table: Mapping[str, Any] | None = None) -> str | None:
    """Track's call (`stepwise.views.publish.Tracker.log`): `log_step_metrics`, raising what MLflow
    raises (the table is W&B's; MLflow gets the summary's numbers)."""
    return log_step_metrics(cfg, run_id, step, summary, kind=kind, strict=True)


def finish_tracking(cfg: RunConfig, run_id: str, status: str, ended: Mapping[str, Any] | None = None) -> str | None:
    """Track's call at the run's end: `finish_run` with the run's end status (FINISHED, KILLED, else
    FAILED), raising what MLflow raises."""
    return finish_run(cfg, run_id, status if status in ("FINISHED", "FAILED", "KILLED") else "FAILED", strict=True)
