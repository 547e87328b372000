"""SageMaker training-session operations from stateless Lambdas.

The SDK's `TrainingClient` keeps the session's sequence counter in memory and stamps a random
client token per operation, and every client built by a `ServiceClient` stops the session when
garbage-collected (FINDINGS.md). A Lambda can rely on neither, so here:

- the session is created with the SDK's own request builder but *without* its blocking wait
  (the state machine polls DescribeTrainingSession instead), and a `ServiceClient` is built only
  for create and stop, never handed to a training or sampling client;
- every training operation gets a sequence number allocated write-ahead in ``state.json`` and a
  client token derived with uuid5 from (run, session, step, operation, chunk): a retried or
  redriven submit re-sends the same pair, so the runtime applies it once;
- datums are built and chunked by the SDK (``_utils.batch_to_datum_list``, ``chunk_datum_list``),
  optimizer params by ``AdamParams``, and results parsed with the SDK's result types.

Wire shapes: ``botocore/data/sagemakertrainingsessionruntime`` (ExecuteTrainingOperation,
GetTrainingOperationResult, ExecuteSamplingOperation, GetSamplingOperationResult) and the
``sagemaker`` control plane (Create/Describe/StopTrainingSession).
"""

from __future__ import annotations

import hashlib
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from botocore.exceptions import ClientError

from stepwise.records import PendingOperation, RunState

#: Namespace of the deterministic client tokens (uuid5).
CLIENT_TOKEN_NAMESPACE = uuid.UUID("6f0b6c1e-5d0a-4f4e-9a51-5e8f3b1f2c7d")

RUNNING = "Running"
FAILED_SESSION_STATUSES = frozenset({"Failed", "Stopped", "Stopping", "Blocked", "Deleting", "DeletionFailed"})
OP_DONE = "Completed"
OP_FAILED = frozenset({"Failed", "Skipped"})


class SessionFailed(RuntimeError):
    """The training session reached a terminal status before (or while) the run used it."""


class OperationFailed(RuntimeError):
    """A training or sampling operation ended Failed/Skipped (message carries errorDetails)."""


class OperationTimedOut(TimeoutError):
    """An operation did not complete within ``train_op_timeout`` seconds of its submit."""


# ---------------------------------------------------------------------------- clients


def control_plane(region: str) -> Any:
    """The SDK's ``sagemaker`` control-plane client (honours SAGEMAKER_TRAINING_SESSION_ENDPOINT)."""
    from sagemaker.train.training_session._clients import _control_plane_client

    return _control_plane_client(region)


def runtime(region: str) -> Any:
    """The SDK's runtime client (honours SAGEMAKER_TRAINING_SESSION_RUNTIME_ENDPOINT)."""
    from sagemaker.train.training_session._clients import _runtime_client

    return _runtime_client(region)


# ---------------------------------------------------------------------------- names and tokens


def session_name_for(run_id: str) -> str:
    """Deterministic training-session name of a run (a retried Init never creates a second one).

    Shape: ``stepwise-{sanitized run id, <= 44 chars}-{8 hex of sha256(run id)}``, within the
    API's ``[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}``.
    """
    clean = re.sub(r"[^a-zA-Z0-9]+", "-", run_id).strip("-")[:44].strip("-") or "run"
    return f"stepwise-{clean}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}"


def client_token(run_id: str, session_name: str, step: int, operation: str) -> str:
    """uuid5 over ``run/session/step/operation`` (operation includes the chunk, e.g. ``forward_backward/3``)."""
    return str(uuid.uuid5(CLIENT_TOKEN_NAMESPACE, f"{run_id}/{session_name}/{step}/{operation}"))


def plan_training_ops(state: RunState, names: list[str], *, tag: int | str) -> list[PendingOperation]:
    """Allocate consecutive sequence numbers and deterministic tokens for ``names`` (write-ahead).

    Mutates ``state`` (``last_sequence_number``, ``pending``); the caller persists it before
    submitting anything. ``tag`` (usually the step) scopes the client tokens.
    """
    ops = []
    for name in names:
        state.last_sequence_number += 1
        ops.append(
            PendingOperation(
                name=name,
                kind="training",
                sequence_number=state.last_sequence_number,
                client_token=client_token(state.run_id, state.training_session_name, tag, name),
            )
        )
    state.pending = ops
    return ops


# ---------------------------------------------------------------------------- operation configs


def datum_chunks(datums: list[dict[str, Any]], loss_fn: str) -> list[list[dict[str, Any]]]:
    """Validate datums for ``loss_fn`` and chunk them exactly as ``TrainingClient.forward_backward`` does."""
    from sagemaker.train.training_session._utils import batch_to_datum_list, chunk_datum_list
    from sagemaker.train.training_session.types import LossFunction

    datum_list = batch_to_datum_list(datums, loss_fn_name=LossFunction(loss_fn).value)
    return chunk_datum_list(datum_list)


def forward_backward_config(
    chunk: list[dict[str, Any]], loss_fn: str, loss_fn_config: dict[str, float] | None
) -> dict[str, Any]:
    """``operationConfig`` of one forward_backward chunk (``TrainingClient._submit_forward_backward``)."""
    fb: dict[str, Any] = {"lossFnName": loss_fn, "datumList": chunk}
    if loss_fn_config is not None:
        fb["lossFnConfig"] = loss_fn_config
    return {"forwardBackward": fb}


def optim_step_config(learning_rate: float) -> dict[str, Any]:
    """``operationConfig`` of optim_step with the reference's ``AdamParams(learning_rate=...)``."""
    from sagemaker.train.training_session.types import AdamParams

    return {"optimizerStep": {"adamParamsConfig": AdamParams(learning_rate=learning_rate)._to_api()}}


def save_weights_config(description: str = "") -> dict[str, Any]:
    return {"saveWeights": {"description": description} if description else {}}


def save_state_config(description: str = "") -> dict[str, Any]:
    return {"saveState": {"description": description} if description else {}}


def load_state_config(model_package_arn: str, *, with_optimizer: bool) -> dict[str, Any]:
    return {"loadState": {"modelPackageArn": model_package_arn, "loadOptimizer": with_optimizer}}


def load_weights_for_sampling_config(model_package_arn: str) -> dict[str, Any]:
    return {"loadWeightsForSampling": {"modelPackageArn": model_package_arn}}


# ---------------------------------------------------------------------------- submit and poll

#: Attempts per runtime call. The SDK's runtime client sends each call once (its retry loops live
#: in TrainingClient/futures, which Lambdas do not use), so throttling and 5xx are retried here with
#: the SDK's own full-jitter backoff (0.5 s doubling, capped at 4 s: about 12 s at most).
RUNTIME_CALL_ATTEMPTS = 6


def _with_retry(fn: Any) -> Any:
    """``fn()`` retried on ThrottlingException / InternalServerException / 429 / 5xx
    (``sagemaker.train.training_session.futures.call_with_transient_retry``). Safe for training
    submits (same sequenceNumber + clientToken), polls, and sampling submits (loading weights twice
    is harmless)."""
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


def compact_result(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """What state.json keeps of an operation result: metrics and ARNs, never per-datum tensors."""
    out: dict[str, Any] = {}
    for key, sub in result.items():
        if isinstance(sub, dict):
            out[key] = {k: v for k, v in sub.items() if k != "lossFnOutputs"}
    return out


def forward_backward_metrics(results: list[dict[str, Any]], datum_counts: list[int]) -> dict[str, float]:
    """Whole-batch metrics of chunked forward_backward results, combined as the SDK combines them."""
    from sagemaker.train.training_session._utils import combine_forward_backward_results
    from sagemaker.train.training_session.types import ForwardBackwardOutput

    parsed = [ForwardBackwardOutput._from_api(r) for r in results]
    if len(parsed) == 1:
        return dict(parsed[0].metrics)
    return dict(combine_forward_backward_results(parsed, datum_counts=datum_counts).metrics)


def saved_weights_arn(result: dict[str, Any]) -> str:
    from sagemaker.train.training_session.types import SaveWeightsResponse

    arn = SaveWeightsResponse._from_api(result).model_package_arn
    if not arn:
        raise OperationFailed("save_weights completed without a model package ARN; nothing to sample from")
    return arn


def saved_state_arn(result: dict[str, Any]) -> str:
    from sagemaker.train.training_session.types import SaveStateResponse

    arn = SaveStateResponse._from_api(result).model_package_arn
    if not arn:
        raise OperationFailed("save_state completed without a model package ARN")
    return arn


def advance_pending(rt: Any, state: RunState, *, timeout_s: float, now: float | None = None) -> bool:
    """Poll every submitted, unfinished op in ``state.pending``; record results. True when all succeeded.

    Raises:
        OperationFailed: an op ended Failed/Skipped.
        OperationTimedOut: an op is still running ``timeout_s`` after it was submitted.
    """
    now = time.time() if now is None else now
    all_done = True
    for op in state.pending:
        if op.status == "Succeeded":
            continue
        if op.operation_id is None:
            all_done = False
            continue
        status, result = read_op(rt, state.training_session_name, op)
        if status == OP_DONE:
            op.status = "Succeeded"
            op.result = compact_result(op.name, result)
        else:
            all_done = False
            if op.submitted_at and now - op.submitted_at > timeout_s:
                raise OperationTimedOut(
                    f"{op.kind} operation {op.name} ({op.operation_id}) still {status} after {timeout_s:g}s "
                    "(train_op_timeout)"
                )
    return all_done


# ---------------------------------------------------------------------------- session lifecycle


@dataclass(frozen=True)
class CreatedSession:
    name: str
    base_model_arn: str
    hf_model_id: str | None
    model_package_group_arn: str


def service_client(cfg: Any) -> Any:
    """A `ServiceClient` for create/stop only. Never build a Training/SamplingClient from it: the
    clients it builds share a handle whose finalizer stops the session (FINDINGS.md)."""
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
    import os

    base = os.environ.get("STEPWISE_DEFAULT_S3_OUTPUT_PATH", "")
    if not base:
        return None
    return f"{base if base.endswith('/') else base + '/'}{run_id}/"


def create_session(cfg: Any, session_name: str, run_id: str = "") -> CreatedSession:
    """CreateTrainingSession as ``ServiceClient.create_lora_training_client`` builds it, without its wait.

    Idempotent: a session of that name that already exists (a retried Init) is adopted.
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
    try:
        svc._sagemaker_client.create_training_session(**args)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "ResourceInUse":
            raise
    return CreatedSession(session_name, base_arn, hf_id, mpg)


def describe_session(cp: Any, session_name: str) -> tuple[str, str]:
    """``(status, failure reason or "")`` from DescribeTrainingSession."""
    resp = cp.describe_training_session(TrainingSessionName=session_name)
    detail = resp.get("TrainingSessionDetail", resp)
    reason = detail.get("ErrorDetails") or detail.get("ErrorMessage") or detail.get("FailureReason") or ""
    return str(detail.get("TrainingSessionStatus", "")), str(reason)


def stop_session(cfg: Any, session_name: str) -> None:
    """``ServiceClient.stop_session``: idempotent (already stopping/stopped, or never created, is fine)."""
    try:
        service_client(cfg).stop_session(session_name)
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") != "ResourceNotFound":
            raise


def weights_usage(model_package_arn: str, region: str) -> str:
    """How to sample from or deploy a ``save_weights_for_sampler`` model package (one line per way)."""
    return (
        f"sample it: ServiceClient(region={region!r}, role_arn=ROLE).create_sampling_client("
        f"model_package_arn={model_package_arn!r}) (sagemaker.train.training_session; this starts a training "
        "session: use the client in a `with` block so the session stops)\n"
        "deploy it: it is a model package version (LoRA weights) in the run's model package group; deploy it "
        "from the SageMaker Model Registry like any model package version"
    )
