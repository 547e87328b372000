"""SageMaker training-session operations from stateless Lambdas.

The SDK's `TrainingClient` keeps the session's sequence counter in memory and stamps a random
client token per operation, and every client built by a `ServiceClient` stops the session when
garbage-collected (the SDK's ``_session_handle``). A Lambda can rely on neither, so here:

- the session is created with the SDK's own request builder but *without* its blocking wait
  (the state machine polls DescribeTrainingSession instead), and a `ServiceClient` is built only
  for create and stop, never handed to a training or sampling client;
- every training operation gets a sequence number allocated write-ahead in ``state.json`` and a
  client token derived with uuid5 from (run, session, step, operation, chunk)
  (`stepwise.core.phases.plan_training_ops`): a retried or redriven submit re-sends the same pair,
  so the runtime applies it once;
- operation configs and results are built and parsed by the SDK's own helpers
  (`stepwise.core.operations`); this module only sends and reads them, and :func:`drive` runs a
  phase's operations to completion (`stepwise.core.phases.complete_phase`).

Wire shapes: ``botocore/data/sagemakertrainingsessionruntime`` (ExecuteTrainingOperation,
GetTrainingOperationResult, ExecuteSamplingOperation, GetSamplingOperationResult) and the
``sagemaker`` control plane (Create/Describe/StopTrainingSession).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from stepwise.core.operations import (OP_FAILED, OperationFailed, check_submit_wait, datum_chunk_of, operation_config,
                                      record_status)
from stepwise.core.phases import complete_phase
from stepwise.core.sweeping import session_tags
from stepwise.layout import datums_key
from stepwise.records import PendingOperation, Phase, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig
    from stepwise.aws.runstore import RunStore

RUNNING = "Running"
#: Every ``TrainingSessionStatus`` of botocore's ``sagemaker`` model falls in exactly one of these two
#: sets (tests/aws/test_session_statuses.py reads the model): a session that is *active* may bill and
#: StopTrainingSession has something to stop (``Blocked``: the runtime still accepts operations, its
#: ConflictException documentation says); an *ended* one is gone or on its way (``Stopping``,
#: ``Deleting``), so stopping it is already done.
ACTIVE_SESSION_STATUSES = frozenset({"Created", "Scheduled", "Running", "Blocked"})
ENDED_SESSION_STATUSES = frozenset({"Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed"})
#: Statuses that end the wait for ``Running`` at once: every ended one, and ``Blocked`` (the SDK's
#: own wait, ``service_client._TERMINAL_STATUSES``, gives up on it too).
FAILED_SESSION_STATUSES = ENDED_SESSION_STATUSES | {"Blocked"}


class SessionFailed(RuntimeError):
    """The training session reached a terminal status before (or while) the run used it."""


# ---------------------------------------------------------------------------- clients


#: Clients made by `control_plane` and `runtime`, one per (kind, region, endpoints, credentials):
#: building one loads botocore's service model and endpoint rules from disk (~0.1-0.2 s of CPU on
#: a Lambda-sized core), and a warm container keeps its clients (boto3 clients are thread-safe).
_CLIENTS: dict[tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()
#: Environment read into a client when it is built: a new value makes a new client.
_CLIENT_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
               "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_SAGEMAKER")


def _cached(kind: str, region: str, make: Callable[[], Any]) -> Any:
    from sagemaker.train.training_session._endpoints import _endpoint_overrides

    key = (kind, region, _endpoint_overrides(), tuple(os.environ.get(k) for k in _CLIENT_ENV))
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            client = _CLIENTS[key] = make()
        return client


def control_plane(region: str) -> Any:
    """The SDK's ``sagemaker`` control-plane client (honours SAGEMAKER_TRAINING_SESSION_ENDPOINT),
    one per container and region (built once: see ``_CLIENTS``)."""
    from sagemaker.train.training_session._clients import _control_plane_client

    return _cached("control_plane", region, lambda: _control_plane_client(region))


def runtime(region: str) -> Any:
    """The SDK's runtime client (honours SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT), one per
    container and region (built once: see ``_CLIENTS``)."""
    from sagemaker.train.training_session._clients import _runtime_client

    return _cached("runtime", region, lambda: _runtime_client(region))


# ---------------------------------------------------------------------------- submit and poll

#: Attempts per runtime call within one handler invocation. The SDK's runtime client sends each call
#: once (its retry loops live in TrainingClient/futures, which Lambdas do not use), so throttling and
#: 5xx are retried here with the SDK's own full-jitter backoff (0.5 s doubling: at most 3.5 s). A
#: call still refused after these is *not done yet* (`is_transient`): `drive` returns without
#: failing and the state machine's Wait state polls again, until the operation's own
#: ``train_op_timeout``, as the SDK itself rides out the warm-up after ``Running`` and the binding
#: after a save with 150 attempts (~5 min: ``training_client._TRAINING_SUBMIT_MAX_ATTEMPTS``,
#: ``sampling_client._SAMPLE_SUBMIT_MAX_ATTEMPTS``).
RUNTIME_CALL_ATTEMPTS = 4


def is_transient(error: BaseException) -> bool:
    """Whether a failed service call may succeed if sent again: the SDK's rule
    (``sagemaker.train.training_session.exceptions.is_retryable``): throttling, HTTP 429/5xx,
    connection errors. Everything else (a refused request) is not."""
    from sagemaker.train.training_session.exceptions import is_retryable

    return is_retryable(error)


def describe_error(error: BaseException) -> str:
    """``Code (HTTP status): message`` of a botocore error, else ``Type: message`` (for causes)."""
    if isinstance(error, ClientError):
        err = error.response.get("Error", {})
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return f"{err.get('Code', 'ClientError')} ({status}): {err.get('Message', '')}"
    return f"{type(error).__name__}: {error}"


def _with_retry(fn: Any) -> Any:
    """``fn()`` retried on ThrottlingException / InternalServerException / 429 / 5xx / connection
    errors (``sagemaker.train.training_session.futures.call_with_transient_retry``). Safe for
    training submits (same sequenceNumber + clientToken), polls, and sampling submits (loading
    weights twice is harmless)."""
    from sagemaker.train.training_session.futures import call_with_transient_retry

    return call_with_transient_retry(fn, max_attempts=RUNTIME_CALL_ATTEMPTS)


def submit_training_op(rt: Any, session_name: str, op: PendingOperation, operation_config: dict[str, Any]) -> str:
    """ExecuteTrainingOperation with the op's planned (sequenceNumber, clientToken); returns operationId.

    Re-sending a planned op is safe: the runtime deduplicates by client token.
    """
    if op.sequence_number is None or op.client_token is None:
        raise ValueError(f"training operation {op.name!r} has no planned sequence number / client token")
    resp = _with_retry(lambda: rt.execute_training_operation(
        trainingSessionName=session_name,
        sequenceNumber=op.sequence_number,
        clientToken=op.client_token,
        operationConfig=operation_config,
    ))
    return resp["operationId"]


def submit_sampling_op(rt: Any, session_name: str, operation_config: dict[str, Any]) -> str:
    """ExecuteSamplingOperation (no sequence number, no client token); returns operationId."""
    return _with_retry(lambda: rt.execute_sampling_operation(
        trainingSessionName=session_name, operationConfig=operation_config))["operationId"]


def read_op(rt: Any, session_name: str, op: PendingOperation) -> tuple[str, dict[str, Any]]:
    """``(status, operationResult)`` of a submitted op; raises OperationFailed on Failed/Skipped."""
    if op.operation_id is None:
        raise ValueError(f"operation {op.name!r} was never submitted")
    get = rt.get_training_operation_result if op.kind == "training" else rt.get_sampling_operation_result
    resp = _with_retry(lambda: get(trainingSessionName=session_name, operationId=op.operation_id))
    status = str(resp.get("status", ""))
    if status in OP_FAILED:
        raise OperationFailed(
            f"{op.kind} operation {op.name} ({op.operation_id}) ended {status}: {resp.get('errorDetails', 'no details')}"
        )
    return status, resp.get("operationResult") or {}


def advance_pending(rt: Any, state: RunState, *, timeout_s: float, now: float | None = None,
                    refusals: list[str] | None = None,
                    on_result: Callable[[PendingOperation, dict[str, Any]], dict[str, Any] | None] | None = None) -> bool:
    """Poll every submitted, unfinished op in ``state.pending``; record results. True when all succeeded.

    A poll refused as transient (`is_transient`) leaves the op running: its status reads
    ``unknown (<error>)``, its timeout still counts from the submit, and the error is appended to
    ``refusals`` when given.

    Raises:
        OperationFailed: an op ended Failed/Skipped.
        OperationTimedOut: an op is still running (or unreadable) ``timeout_s`` after it was submitted.
    """
    now = time.time() if now is None else now
    all_done = True
    for op in state.pending:
        if op.status == "Succeeded":
            continue
        if op.operation_id is None:
            all_done = False
            continue
        try:
            status, result = read_op(rt, state.training_session_name, op)
        except Exception as e:
            if not is_transient(e):
                raise
            status, result = f"unknown ({describe_error(e)})", {}
            if refusals is not None:
                refusals.append(describe_error(e))
        if not record_status(op, status, result, now=now, timeout_s=timeout_s):
            all_done = False
        elif on_result is not None and op.result is not None:
            extra = on_result(op, result)  # what the compact result keeps of the full one (e.g. loss outputs)
            if extra:
                op.result.update(extra)
    return all_done


# ---------------------------------------------------------------------------- the operation driver


def loss_outputs_hook(rs: RunStore, run_id: str, state: RunState, cfg: RunConfig
                      ) -> Callable[[PendingOperation, dict[str, Any]], dict[str, Any] | None] | None:
    """For a step whose datums carry their staleness (the group engine), what a finished forward_backward
    chunk keeps of its per-datum ``lossFnOutputs``: their KL and clip fraction summed by staleness
    (`stepwise.core.staleness.loss_outputs_by_staleness`, ``by_staleness``), read against the chunk's
    datums (one more GET of the chunk); None (no hook) otherwise."""
    if not state.datum_staleness or not state.datum_chunks:
        return None
    from stepwise.core.staleness import loss_clip_bounds, loss_outputs_by_staleness

    starts = [sum(state.datum_chunks[:i]) for i in range(len(state.datum_chunks))]

    def hook(op: PendingOperation, result: dict[str, Any]) -> dict[str, Any] | None:
        chunk = datum_chunk_of(op)
        fb = (result or {}).get("forwardBackward") or {}
        outputs = fb.get("lossFnOutputs")
        if chunk is None or not isinstance(outputs, list) or chunk >= len(starts):
            return None
        datums = rs.get_json(datums_key(run_id, state.step, chunk))
        lags = state.datum_staleness[starts[chunk]:starts[chunk] + len(datums)]
        return {"by_staleness": loss_outputs_by_staleness(datums, outputs, lags, loss_clip_bounds(cfg))}

    return hook


#: Seconds between status reads while a handler polls inline (its budget: STEPWISE_INLINE_WAIT_SECONDS).
POLL_INTERVAL_S = 0.25


def drive(rs: RunStore, rt: Any, cfg: RunConfig, run_id: str, execution_arn: str, phases: tuple[Phase, ...], *,
          budget_s: float, now: Callable[[], float] = time.time,
          sleep: Callable[[float], None] = time.sleep) -> tuple[RunState, bool, dict[str, Any]]:
    """Submit planned ops, poll submitted ones, complete finished phases, for up to ``budget_s`` seconds.

    A submit or poll the service refuses as transient (`is_transient`: throttling, 5xx, the 503 of
    a runtime warming up after ``Running`` or binding a checkpoint just saved) is *not done yet*:
    the call returns ``done=False`` at once and the state machine polls again after its Wait,
    until the operation's ``train_op_timeout`` (from its submit, or from its first refused submit:
    `check_submit_wait`) raises `OperationTimedOut` naming the service's last answer.

    ``rs``: the run store; ``rt``: the session's runtime client (`runtime`); ``cfg``: the run's
    config. Operation ids are recorded in state.json (conditional writes) before they are polled;
    a forward_backward chunk is read back from S3, so a retry sends the same bytes. Stops with
    ``done=True`` when the run leaves ``phases`` (returns to idle). Returns ``(state, done,
    metrics of completed phases)``.
    """
    deadline = time.monotonic() + budget_s
    reported: dict[str, Any] = {}
    while True:
        state = rs.owned_state(run_id, execution_arn)
        if state.phase not in phases:
            return state, True, reported
        submitted: dict[str, tuple[str, float]] = {}
        refused = ""  # a submit refused as transient: the ops still unsent wait (check_submit_wait)
        for op in sorted(state.pending, key=lambda o: (o.sequence_number or 0)):
            if op.operation_id is not None:
                continue
            chunk = datum_chunk_of(op)
            datums = rs.get_json(datums_key(run_id, state.step, chunk)) if chunk is not None else None
            config = operation_config(op, cfg, datums)
            try:
                if op.kind == "training":
                    op_id = submit_training_op(rt, state.training_session_name, op, config)
                else:
                    op_id = submit_sampling_op(rt, state.training_session_name, config)
            except Exception as e:
                if not is_transient(e):
                    raise
                refused = describe_error(e)  # later sequence numbers would only queue behind it
                break
            submitted[op.name] = (op_id, now())

        results: dict[str, Any] = {}
        poll_refusals: list[str] = []

        def change(s: RunState) -> None:
            results.clear()
            poll_refusals.clear()
            for op in s.pending:
                if op.name in submitted and op.operation_id is None:
                    op.operation_id, op.submitted_at = submitted[op.name]
                    op.status = "Submitted"
                elif refused and op.operation_id is None:
                    check_submit_wait(op, refused=refused, now=now(), timeout_s=cfg.train_op_timeout)
            if advance_pending(rt, s, timeout_s=cfg.train_op_timeout, now=now(), refusals=poll_refusals,
                               on_result=loss_outputs_hook(rs, run_id, s, cfg)):
                results.update(complete_phase(s, now=now, cfg=cfg))
                results["_completed"] = True

        state = rs.update_state(run_id, change, execution_arn=execution_arn)
        if results.pop("_completed", False):
            reported.update(results)
            continue
        if refused or poll_refusals or time.monotonic() >= deadline:
            # refused: the service is not ready; the state machine's Wait spaces the next attempt
            return state, False, reported
        sleep(POLL_INTERVAL_S)


# ---------------------------------------------------------------------------- session lifecycle


@dataclass(frozen=True)
class CreatedSession:
    name: str
    base_model_arn: str
    hf_model_id: str | None
    model_package_group_arn: str


def service_client(cfg: RunConfig) -> Any:
    """A `ServiceClient` for create/stop only. Never build a Training/SamplingClient from it: the
    clients it builds share a handle whose finalizer stops the session (the SDK's ``_session_handle``)."""
    from sagemaker.train.training_session import ServiceClient

    return ServiceClient(
        region=cfg.region,
        role_arn=cfg.role_arn,
        model_package_group_arn=cfg.model_package_group_arn or None,
        s3_output_path=cfg.s3_output_path or None,
        kms_key_arn=cfg.kms_key_arn or None,
        vpc_config=cfg.vpc_config.model_dump() if cfg.vpc_config else None,
    )


def default_output_path(run_id: str) -> str | None:
    """``{STEPWISE_DEFAULT_S3_OUTPUT_PATH}{run_id}/`` when the stack sets that variable (its bucket
    policy lets the SageMaker role write there), else None (the SDK's default bucket)."""
    from stepwise.settings import current

    base = current().default_s3_output_path
    if not base:
        return None
    return f"{base if base.endswith('/') else base + '/'}{run_id}/"


def create_session(cfg: RunConfig, session_name: str, run_id: str = "", execution_arn: str = "") -> CreatedSession:
    """CreateTrainingSession as ``ServiceClient.create_lora_training_client`` builds it, without its wait,
    plus ``ModelConfig.AcceptEula`` when the config accepts the base model's license (``accept_eula``).

    Idempotent: a session of that name that already exists (a retried Init) is adopted, only when its
    tags name this run and this stack's bucket (`stepwise.core.sweeping.adoption_problem`); otherwise
    `SessionNotOurs` is raised and nothing is created. Tagged with ``run_id`` and this stack's bucket
    (`stepwise.core.sweeping.session_tags`).
    Uses the SDK's base-model resolution, default model package group and output path, LoRA
    config and request builder (private helpers; kept in this one function).
    """
    from sagemaker.train.training_session._utils import build_lora_config, resolve_base_model
    from sagemaker.train.training_session.service_client import _build_create_session_args

    svc = service_client(cfg)
    if cfg.base_model_arn.startswith("arn:"):
        base_arn, hf_id = cfg.base_model_arn, None
    else:
        base_arn, hf_id = resolve_base_model(cfg.base_model_arn, svc._get_hub_client())
    mpg = cfg.model_package_group_arn or svc._auto_create_mpg()
    s3_path = cfg.s3_output_path or (run_id and default_output_path(run_id)) or svc._default_s3_output_path(session_name)
    args = _build_create_session_args(
        session_name=session_name,
        base_model_arn=base_arn,
        model_package_group_arn=mpg,
        lora_config=build_lora_config(cfg.lora_rank, cfg.lora_alpha),
        role_arn=cfg.role_arn,
        s3_path=s3_path,
        kms_key_arn=svc._kms_key_arn,
        vpc_config=svc._vpc_config,
    )
    from stepwise.settings import current

    bucket = current().bucket
    if run_id and bucket:  # the sweeper finds this stack's sessions by these (stepwise.core.sweeping)
        args["Tags"] = [*args.get("Tags", []), *session_tags(run_id, bucket, execution_arn)]
    if cfg.accept_eula:  # the SDK's builder never sends it (botocore's ModelConfig has it, for gated models)
        args["ModelConfig"]["AcceptEula"] = True
    try:
        svc._sagemaker_client.create_training_session(**args)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "ResourceInUse":
            raise
        # A session of that name exists: a retried Init's own (adopted), or another stack's or an
        # earlier run's of the same id (refused: never train, sample or stop on it).
        problem = adoption_problem(session_name, existing_session(control_plane(cfg.region), session_name),
                                   run_id, bucket, execution_arn)
        if problem:
            raise SessionNotOurs(problem) from None
    return CreatedSession(session_name, base_arn, hf_id, mpg)


class SessionNotOurs(RuntimeError):
    """A training session of the run's name exists and its tags do not name this run of this stack
    (`stepwise.core.sweeping.adoption_problem`): the run is refused, the session left alone."""


def existing_session(cp: Any, session_name: str) -> dict[str, Any] | None:
    """DescribeTrainingSession's ``TrainingSessionDetail`` of ``session_name``, or None when no such
    session exists (ResourceNotFound)."""
    try:
        return session_detail(cp, session_name)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ResourceNotFoundException"):
            return None
        raise


def adoption_problem(session_name: str, detail: dict[str, Any] | None, run_id: str, bucket: str,
                     execution_arn: str = "") -> str:
    """Why the existing session ``detail`` (`existing_session`) may not be used by run ``run_id`` of
    the stack whose bucket is ``bucket``, started by ``execution_arn``; '' when it may (its tags name
    them: `stepwise.core.sweeping.adoption_problem`) or when there is none."""
    from stepwise.core.sweeping import adoption_problem as problem_of

    if detail is None:
        return ""
    tags = {t["Key"]: t["Value"] for t in detail.get("Tags") or [] if "Key" in t}
    return problem_of(session_name, tags, run_id, bucket, str(detail.get("TrainingSessionStatus", "")), execution_arn)


#: The prefix of every session name Init gives (`stepwise.core.phases.session_name_for`); the stack's
#: IAM grants name ``training-session/stepwise-*`` (``infra.permissions.SESSION_NAME_PATTERN``).
SESSION_NAME_PREFIX = "stepwise-"


def list_active_sessions(cp: Any, name_prefix: str = SESSION_NAME_PREFIX) -> list[str]:
    """Names of the account's training sessions in this region that start with ``name_prefix`` and
    whose status is active (`ACTIVE_SESSION_STATUSES`): ListTrainingSessions with ``NameContains``
    and ``StatusEquals`` per active status, every page. ListTrainingSessions filters by *contains*
    only, so names holding the prefix elsewhere (a user's ``my-stepwise-x``, outside the stack's
    grant ``training-session/stepwise-*``) are dropped here: never described, never an error."""
    names: list[str] = []
    name_contains = name_prefix
    for status in sorted(ACTIVE_SESSION_STATUSES):
        token = None
        while True:
            kwargs: dict[str, Any] = {"NameContains": name_contains, "StatusEquals": status, "MaxResults": 100}
            if token:
                kwargs["NextToken"] = token
            page = cp.list_training_sessions(**kwargs)
            names += [n for n in (str(s["TrainingSessionArn"]).rsplit("/", 1)[-1]
                                  for s in page.get("TrainingSessionSummaries", [])) if n.startswith(name_prefix)]
            token = page.get("NextToken")
            if not token:
                break
    return list(dict.fromkeys(names))


def session_detail(cp: Any, session_name: str) -> dict[str, Any]:
    """DescribeTrainingSession's ``TrainingSessionDetail`` (status, tags, ...)."""
    resp = cp.describe_training_session(TrainingSessionName=session_name)
    return dict(resp.get("TrainingSessionDetail", resp))


#: Model package deletions in flight at once (retention ``best_and_last``): within the control-plane
#: client's connection pool (botocore's 10), so no call waits for a connection.
RETENTION_WORKERS = 8


def delete_model_package(cp: Any, model_package_arn: str) -> bool:
    """DeleteModelPackage of ``model_package_arn`` with the control-plane client ``cp`` (`control_plane`:
    model packages are registered on the sessions' endpoint, as the SDK's
    ``ServiceClient._get_model_registry_client`` says). True when it deleted the package, False when it
    was already gone (the SDK's ``_model_package_absent`` reading of the refusal).

    The SDK's ``ServiceClient.delete_model_package`` describes the package first, for its artifacts'
    location; retention keeps the artifacts, and DescribeModelPackage needs ``kms:Decrypt`` on the key of
    an encrypted package unless it asks ``IncludedData=MetadataOnly`` (botocore's ``sagemaker`` model),
    so the describe is skipped: one call, and no KMS permission.

    Raises:
        ClientError: any other refusal (throttling after botocore's retries, access denied, ...).
    """
    from sagemaker.train.training_session.service_client import _model_package_absent

    try:
        cp.delete_model_package(ModelPackageName=model_package_arn)
    except ClientError as e:
        if _model_package_absent(e):
            return False
        raise
    return True


def model_package_problem(region: str, model_package_arn: str) -> str:
    """'' when ``model_package_arn`` exists and is ready to load (``Completed``), else the problem in
    words: it does not exist (deleted, by retention ``best_and_last`` say), is not ready, or cannot be
    read. DescribeModelPackage with ``IncludedData=MetadataOnly``: no ``kms:Decrypt`` on the key of an
    encrypted package (botocore's ``sagemaker`` model), and the status is all this needs."""
    from sagemaker.train.training_session.service_client import _model_package_absent

    try:
        resp = control_plane(region).describe_model_package(ModelPackageName=model_package_arn,
                                                            IncludedData="MetadataOnly")
    except ClientError as e:
        if _model_package_absent(e):
            return "the model package does not exist (deleted?); name one that exists"
        return f"cannot read the model package: {describe_error(e)}"
    status = str(resp.get("ModelPackageStatus", ""))
    if status and status != "Completed":
        return f"the model package is {status}, not Completed"
    return ""


def describe_session(cp: Any, session_name: str) -> tuple[str, str]:
    """``(status, failure reason or "")`` from DescribeTrainingSession."""
    resp = cp.describe_training_session(TrainingSessionName=session_name)
    detail = resp.get("TrainingSessionDetail", resp)
    reason = detail.get("ErrorDetails") or detail.get("ErrorMessage") or detail.get("FailureReason") or ""
    return str(detail.get("TrainingSessionStatus", "")), str(reason)


def creation_time(cp: Any, session_name: str) -> float | None:
    """The session's own CreationTime (epoch seconds) from DescribeTrainingSession, or None when the
    service does not say (or does not know the session). The cost ledger counts session-seconds from it."""
    try:
        detail = cp.describe_training_session(TrainingSessionName=session_name).get("TrainingSessionDetail") or {}
    except ClientError:
        return None
    created = detail.get("CreationTime")
    if created is None:
        return None
    return created.timestamp() if hasattr(created, "timestamp") else float(created)


def stop_session(cfg: RunConfig, session_name: str) -> bool:
    """``ServiceClient.stop_session`` (its ``_stop_session_if_active``: StopTrainingSession, the SDK's
    ``_stop_already_done`` reading of a refusal) on the cached `control_plane` client, idempotent: True
    when a stop was requested, False when the
    session had already ended (any `ENDED_SESSION_STATUSES`, ``Expired`` included, which the SDK's
    ``_stop_already_done`` does not list) or was never created.

    The control plane answers a stop it cannot apply with ValidationException "invalid session
    state transition from STATUS to Stopping"; the status named is read from the message and, when
    the wording differs, from DescribeTrainingSession.

    Raises:
        ClientError: any other refusal (throttling after botocore's retries, access denied, ...).
    """
    from sagemaker.train.training_session.service_client import _stop_already_done

    try:
        # ServiceClient._stop_session_if_active's body on this container's control-plane client (the one
        # a ServiceClient builds): building a ServiceClient costs 0.6-1.8 s, which a stop path, and the
        # cost ledger's count of the session's seconds until the stop, should not pay.
        control_plane(cfg.region).stop_training_session(TrainingSessionName=session_name)
        return True
    except ClientError as e:
        if _stop_already_done(e):
            return False
        err = e.response.get("Error", {})
        if err.get("Code") == "ResourceNotFound":
            return False
        if err.get("Code") != "ValidationException":
            raise
        message = str(err.get("Message", ""))
        if any(f"transition from {status} to" in message for status in ENDED_SESSION_STATUSES):
            return False
        try:
            status, _ = describe_session(control_plane(cfg.region), session_name)
        except ClientError:
            raise e from None
        if status in ENDED_SESSION_STATUSES:
            return False
        raise
