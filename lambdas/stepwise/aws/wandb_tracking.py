"""Optional Weights & Biases tracking: every step's and eval's metrics and sample table, one W&B run per run.

On when the run config sets ``wandb_project`` (the reference loop's field, `train_grpo.py`'s
``wandb.init(project=config.wandb_project, name=config.wandb_run_name)``), with ``wandb_run_name``
(default: the run id) and ``wandb_entity``. Called only by the Track function, beside the training
loop, once per step or eval summary and once at the run's end, by one Track invocation of a run at a
time (`stepwise.views.publish`: the report index's lease), so two calls never write one W&B run at once.

One run, however many executions: Lambdas are stateless, so every call opens the W&B run with
``wandb.init(id=wandb_run_id(run_id), resume="allow")`` (a deterministic id, the run id itself), logs,
and finishes it; a continue-as-new execution or a `stepwise resume` logs into the same W&B run. Steps
are logged against the metric ``step`` (``define_metric("*", step_metric="step")``), so an eval logged
after the next step's summary, or a step re-logged after a resume, lands at its own step instead of
being dropped as out of order.

What is logged per summary: its finite numbers (the summary's own slash-namespaced names, as MLflow
gets them: `stepwise.aws.tracking.numeric_metrics`), ``step``, and the step's sample table as a
``wandb.Table`` under ``samples/train`` or ``samples/eval`` (one row per rollout of the sampled groups:
the columns of `stepwise.views.columns.ROLLOUT_COLUMNS`, the group's mark, the conversation and the
trained text).

The API key: ``wandb.Settings(api_key=...)`` from the Secrets Manager secret the stack names
(``STEPWISE_WANDB_API_KEY_SECRET_ARN``, CDK context ``wandbApiKeySecretArn``; `stepwise.aws.secrets`);
without one, W&B's own ``WANDB_API_KEY`` / ``WANDB_MODE`` apply (the local stack sets
``WANDB_MODE=offline`` and ``WANDB_DIR`` to the run folder). W&B writes only under ``/tmp`` here
(``WANDB_DIR``, ``WANDB_CACHE_DIR``, ``WANDB_CONFIG_DIR``, ``WANDB_DATA_DIR`` default there: a Lambda's
only writable place).

**Files.** Each call makes a run folder (``run-{time}-{id}``, with its logs, history and the table's
file) under ``WANDB_DIR``. Where this module chose ``WANDB_DIR`` itself (`WANDB_ROOT`, under the Lambda's
``/tmp``, whose 512 MB a container keeps across invocations) the folder is removed once the call
finished (W&B uploaded it), and so is the table's staging copy; where the environment names
``WANDB_DIR`` (the local stack: the run folder, where an offline run is the data) it is kept.

**One process per call.** Each call runs W&B in a fresh Python process of its own (`_call`: the
request on its stdin, its error on its stderr), stopped with its process group once it has taken
`CHILD_SECONDS`. W&B keeps process-wide state (``wandb.run``, its service process), and a ``wandb.init``
that hangs in it ("starting run threads in backend", wandb 0.31's ``deliver_run_start``; seen locally
in Track's long-lived worker) never returns: in-process it held this module's lock, and every later
call of that process (a warm Lambda container, the local Track worker) waited on it and failed. A
killed child frees it; the next call starts clean. The cost: a Python start and ``import wandb`` per
call (about a second of CPU), beside the loop.

**Timeouts.** `SETTINGS_TIMEOUTS` bound W&B's own waits (its start, its finish, its GraphQL and file
uploads, each with few retries), so a call ends within `CALL_SECONDS`; a child past `CHILD_SECONDS` is
killed, and Track abandons a call past `CALL_SECONDS` (a warning). A W&B server that hangs costs the
W&B point, never the page.

A failure is never silent and never fails a step: Track keeps it as a warning on the report page (as
MLflow's); `step_warning` returns it as one line of text.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepwise.config import RunConfig

log = logging.getLogger(__name__)

#: Where W&B keeps its files when the environment does not say (a Lambda may write only /tmp).
WANDB_ROOT = os.path.join(tempfile.gettempdir(), "wandb")
#: One W&B call at a time per process, so two W&B processes never write one W&B run at once (the local
#: stack runs several Track invocations on threads of one worker process); held at most `CHILD_SECONDS`.
_LOCK = threading.Lock()
#: W&B's own waits (`wandb.Settings`): its start and finish, GraphQL requests and file uploads, seconds
#: and retries. W&B's defaults wait 90 s to start and retry uploads for minutes.
SETTINGS_TIMEOUTS: dict[str, Any] = {
    "init_timeout": 30.0, "finish_timeout": 30.0, "finish_timeout_raises": True,
    "x_graphql_timeout_seconds": 10.0, "x_graphql_retry_max": 2,
    "x_file_stream_timeout_seconds": 10.0, "x_file_stream_retry_max": 2,
    "x_file_transfer_timeout_seconds": 20.0, "x_file_transfer_retry_max": 2,
}
#: The most one `log_step` or `finish_run` may take in Track before it is abandoned with a warning (its
#: start, log and finish under `SETTINGS_TIMEOUTS`).
CALL_SECONDS = 75.0
#: How long a call waits for another call of this process to let W&B's global run go.
LOCK_SECONDS = 30.0
#: The most one call's W&B process may run before it is killed with its process group (under
#: `CALL_SECONDS`, so the lock is free again before Track gives up on the call).
CHILD_SECONDS = CALL_SECONDS - 5.0
#: The prefix of the line a W&B process writes on its stderr when W&B raised.
ERROR_PREFIX = "stepwise-wandb-error: "


class WandbCallFailed(RuntimeError):
    """A W&B call's process failed (the message: W&B's exception type and text) or was killed at
    `CHILD_SECONDS`."""


def _columns() -> list[str]:
    from stepwise.views.columns import ROLLOUT_COLUMNS

    return [c.key for c in ROLLOUT_COLUMNS]


#: Sample table columns (one row per rollout of the step's sampled groups): the rollout row's
#: (`stepwise.views.columns.ROLLOUT_COLUMNS`) between the group's and the texts.
TABLE_COLUMNS = ["step", "kind", "group_label", "group", "selection", *_columns(), "conversation", "trained_text"]


def enabled(cfg: RunConfig) -> bool:
    """Whether the run config asks for W&B (``wandb_project`` set)."""
    return bool(getattr(cfg, "wandb_project", ""))


def wandb_run_id(run_id: str) -> str:
    """The W&B run id of a Stepwise run: the run id itself (letters, digits, ``_`` and ``-``, none of
    the characters W&B reserves), so every execution and resume of the run logs into one W&B run."""
    return run_id


def table_rows(table: Mapping[str, Any]) -> list[list[Any]]:
    """A sample table (`stepwise.views.tables.sample_table`) as `TABLE_COLUMNS` rows."""
    rows = []
    keys = _columns()
    for g in table.get("groups") or []:
        for r in g.get("rollouts") or []:
            values = r.get("row") if isinstance(r.get("row"), Mapping) else r
            convo = "\n".join(f"[{m.get('role')}] {m.get('content', '')}" for m in r.get("messages") or [])
            trained = "".join(s.get("text") or "" for spans in r.get("records") or [] for s in spans if s.get("trained"))
            rows.append([table.get("step"), table.get("kind"), g.get("label"), g.get("input_id"), g.get("selection"),
                         *[values.get(k) for k in keys], convo, trained])
    return rows


def _api_key() -> str | None:
    from stepwise import settings

    arn = settings.current().wandb_api_key_secret
    if not arn:
        return None
    from stepwise.aws.secrets import secret_string

    return secret_string(arn)


def _ours() -> bool:
    """W&B's folder is the one this module chose under the Lambda's ``/tmp`` (`WANDB_ROOT`), not one the
    environment named (the local stack's run folder)."""
    return os.path.realpath(os.environ.get("WANDB_DIR", WANDB_ROOT)) == os.path.realpath(WANDB_ROOT)


def _remove_files(run: Any) -> None:
    """Remove what one call left under `WANDB_ROOT`: the run's folder and the staging copies of its
    table (W&B has uploaded both by the time ``finish`` returns)."""
    if not _ours():
        return
    sync_dir = getattr(getattr(run, "settings", None), "sync_dir", None)
    for path in (sync_dir, os.environ.get("WANDB_DATA_DIR"), os.environ.get("WANDB_ARTIFACT_DIR")):
        if path and os.path.realpath(path).startswith(os.path.realpath(WANDB_ROOT) + os.sep):
            shutil.rmtree(path, ignore_errors=True)


def _remove_service_logs() -> None:
    """Remove the log W&B's service process wrote under `WANDB_ROOT` (``cache/wandb/logs/core-debug-*.log``,
    one per W&B process, so one per call here)."""
    if not _ours():
        return
    logs = os.path.join(os.environ.get("WANDB_CACHE_DIR", os.path.join(WANDB_ROOT, "cache")), "wandb", "logs")
    if os.path.realpath(logs).startswith(os.path.realpath(WANDB_ROOT) + os.sep) and os.path.isdir(logs):
        for name in os.listdir(logs):
            if name.startswith("core-debug-") and name.endswith(".log"):
                try:
                    os.remove(os.path.join(logs, name))
                except OSError:
                    pass


def _locked() -> Any:
    class _Held:
        def __enter__(self) -> None:
            if not _LOCK.acquire(timeout=LOCK_SECONDS):
                raise TimeoutError(f"another W&B call of this process held W&B for {LOCK_SECONDS:.0f} s")

        def __exit__(self, *exc: Any) -> None:
            _LOCK.release()

    return _Held()


def _request(cfg: RunConfig, run_id: str, part: str) -> dict[str, Any]:
    """What a W&B process needs to open the run's W&B run (`_open`); ``part`` names the call's local
    folder (``train3``, ``eval10``, ``end``: W&B names it by the second it started, which two calls can
    share). The API key is read here, in the caller, and travels on the child's stdin, not its environment."""
    return {"project": cfg.wandb_project, "entity": cfg.wandb_entity or None, "id": wandb_run_id(run_id),
            "name": cfg.wandb_run_name or run_id, "config": cfg.model_dump(mode="json"),
            "tags": ["stepwise", cfg.algorithm], "part": part, "api_key": _api_key(), "root": WANDB_ROOT}


def _open(request: Mapping[str, Any]) -> Any:
    """``wandb.init`` of the run's W&B run, in a W&B process (`_serve`)."""
    import wandb

    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        os.environ.setdefault(var, os.path.join(WANDB_ROOT, sub))
    os.makedirs(os.environ["WANDB_DIR"], exist_ok=True)
    extra: dict[str, Any] = {"api_key": request["api_key"]} if request.get("api_key") else {}
    run = wandb.init(
        project=request["project"], entity=request["entity"], id=request["id"], name=request["name"],
        resume="allow", dir=os.environ["WANDB_DIR"], config=request["config"], tags=request["tags"],
        settings=wandb.Settings(console="off", silent=True, x_disable_stats=True, x_disable_meta=True,
                                x_disable_machine_info=True, save_code=False, x_sync_dir_suffix=request["part"],
                                **SETTINGS_TIMEOUTS, **extra))
    run.define_metric("step")
    run.define_metric("*", step_metric="step")
    return run


def _serve(request: Mapping[str, Any]) -> None:
    """One W&B call, in its own process: open the run, log a row (``op`` ``log``) or mark its end
    (``finish``), finish it and remove what it left under `WANDB_ROOT`."""
    global WANDB_ROOT
    WANDB_ROOT = request["root"]
    import wandb

    run = _open(request)
    try:
        if request["op"] == "log":
            row = dict(request["row"])
            if request.get("table") is not None:
                row[f"samples/{request['kind']}"] = wandb.Table(columns=TABLE_COLUMNS, data=table_rows(request["table"]))
            run.log(row)
        else:
            run.summary["stop_status"] = request["status"]
            run.summary["stop_reason"] = request["reason"]
    finally:
        try:
            run.finish(**({"exit_code": request["exit_code"]} if request["op"] == "finish" else {}))
        finally:
            _remove_files(run)


def _child_main() -> None:
    """The W&B process's entry point: a request (JSON) on stdin; on failure, `ERROR_PREFIX` and W&B's
    exception on the last line of stderr and exit code 1."""
    try:
        _serve(json.load(sys.stdin))
    except BaseException as e:  # noqa: BLE001 - every failure is the caller's warning
        sys.stderr.write(f"\n{ERROR_PREFIX}{type(e).__name__}: {e}\n".replace("\r", " "))
        sys.stderr.flush()
        os._exit(1)
    os._exit(0)  # W&B's service threads do not hold the process open


def _call(request: dict[str, Any]) -> None:
    """Run one W&B call (`_serve`) in a fresh Python process; kill it and its process group at
    `CHILD_SECONDS`. Raises `WandbCallFailed` with W&B's error, or on the kill."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    code = "from stepwise.aws.wandb_tracking import _child_main; _child_main()"
    with _locked():
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, env=env, start_new_session=True)
        try:
            _, err = proc.communicate(json.dumps(request, default=str).encode(), timeout=CHILD_SECONDS)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.communicate()
            raise WandbCallFailed(f"W&B did not answer within {CHILD_SECONDS:.0f} s; its process was stopped") from None
        finally:
            _remove_service_logs()  # a killed call's service log too
    if proc.returncode != 0:
        lines = err.decode(errors="replace").strip().splitlines()
        said = [line[len(ERROR_PREFIX):] for line in lines if line.startswith(ERROR_PREFIX)]
        raise WandbCallFailed(said[-1] if said else f"W&B's process exited {proc.returncode}: {' '.join(lines[-3:])[:500]}")


def log_step(cfg: RunConfig, run_id: str, kind: str, step: int, summary: Mapping[str, Any],
             table: Mapping[str, Any] | None = None) -> str | None:
    """Log a step (``kind="train"``) or eval (``"eval"``) summary and its sample table at ``step``;
    returns the W&B run id, None when W&B is off. Raises what W&B raises."""
    if not enabled(cfg):
        return None
    from stepwise.aws.tracking import numeric_metrics

    row: dict[str, Any] = {"step": int(step), **numeric_metrics(summary)}
    _call({**_request(cfg, run_id, f"{kind}{int(step)}"), "op": "log", "kind": kind, "row": row,
           "table": dict(table) if table is not None else None})
    return wandb_run_id(run_id)


def _describe(e: Exception) -> str:
    return str(e) if isinstance(e, WandbCallFailed) else f"{type(e).__name__}: {e}"


def step_warning(cfg: RunConfig, run_id: str, kind: str, step: int, summary: Mapping[str, Any],
                 table: Mapping[str, Any] | None = None) -> str | None:
    """`log_step`; a failure comes back as one line of text naming the project and the error, else None."""
    try:
        log_step(cfg, run_id, kind, step, summary, table)
        return None
    except Exception as e:
        text = f"W&B tracking to project {cfg.wandb_project} failed at {kind} step {step}: {_describe(e)}"
        log.warning("%s", text[:2000])
        return text[:1000]


def finish_run(cfg: RunConfig, run_id: str, status: str, ended: Mapping[str, Any] | None = None) -> str | None:
    """Mark the W&B run's end: ``stop_status`` and ``stop_reason`` in its summary, exit code 0 for
    FINISHED, 1 otherwise. Returns the W&B run id (None when off); raises what W&B raises."""
    if not enabled(cfg):
        return None
    _call({**_request(cfg, run_id, "end"), "op": "finish", "status": status,
           "reason": str((ended or {}).get("reason") or ""), "exit_code": 0 if status == "FINISHED" else 1})
    return wandb_run_id(run_id)


def finish(cfg: RunConfig, run_id: str, status: str, ended: Mapping[str, Any] | None = None) -> str | None:
    """`finish_run`; a failure's text (logged) instead of an exception, None on success or when off."""
    try:
        finish_run(cfg, run_id, status, ended)
        return None
    except Exception as e:
        text = f"W&B tracking to project {cfg.wandb_project} could not end run {run_id}: {_describe(e)}"
        log.warning("%s", text[:2000])
        return text[:1000]
