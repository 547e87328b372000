"""SageMaker training-session operations, pure: their configs, their results, their bookkeeping.

What a Lambda sends and reads back, without sending or reading anything (the calls are in
`stepwise.aws.sagemaker`). Built with the SDK's own helpers (``sagemaker.train.training_session``):
datums are validated and chunked by ``_utils.batch_to_datum_list`` / ``chunk_datum_list`` exactly
as ``TrainingClient.forward_backward`` does, optimizer params by ``AdamParams``, results parsed
with the SDK's result types.

Wire shapes: ``botocore/data/sagemakertrainingsessionruntime`` (ExecuteTrainingOperation's
``operationConfig``, GetTrainingOperationResult's ``operationResult``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from stepwise.records import PendingOperation

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: GetTraining/SamplingOperationResult statuses: done, and failed (``errorDetails`` says why).
OP_DONE = "Completed"
OP_FAILED = frozenset({"Failed", "Skipped"})


class OperationFailed(RuntimeError):
    """A training or sampling operation ended Failed/Skipped (message carries errorDetails)."""


class OperationTimedOut(TimeoutError):
    """An operation did not complete within ``train_op_timeout`` seconds of its submit."""


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


def datum_chunk_of(op: PendingOperation) -> int | None:
    """The datum chunk a ``forward_backward/{chunk}`` operation sends, else None."""
    if op.name.startswith("forward_backward/"):
        return int(op.name.split("/")[1])
    return None


def operation_config(op: PendingOperation, cfg: RunConfig, datums: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The ``operationConfig`` of a planned op. ``datums``: the op's datum chunk (`datum_chunk_of`),
    read back from S3 by the caller, so a retry sends the same bytes. Raises ValueError for an
    unknown operation, or a forward_backward without its datums."""
    if datum_chunk_of(op) is not None:
        if datums is None:
            raise ValueError(f"{op.name} needs its datum chunk")
        return forward_backward_config(datums, cfg.loss, cfg.loss_fn_config)
    if op.name == "optim_step":
        return optim_step_config(cfg.learning_rate)
    if op.name == "save_weights":
        return save_weights_config(op.description)
    if op.name == "save_state":
        return save_state_config(op.description)
    if op.name == "load_state":
        return load_state_config(op.argument or "", with_optimizer=True)
    if op.name == "load_weights_for_sampling":
        return load_weights_for_sampling_config(op.argument or "")
    raise ValueError(f"unknown operation {op.name!r}")


# ---------------------------------------------------------------------------- results


def compact_result(name: str, result: dict[str, Any]) -> dict[str, Any]:
    """What state.json keeps of an operation result: metrics and ARNs, never per-datum tensors."""
    out: dict[str, Any] = {}
    for key, sub in result.items():
        if isinstance(sub, dict):
            out[key] = {k: v for k, v in sub.items() if k != "lossFnOutputs"}
    return out


def record_status(op: PendingOperation, status: str, result: dict[str, Any], *, now: float, timeout_s: float) -> bool:
    """Record one poll of a submitted ``op`` (its ``status`` and ``operationResult``; a Failed or
    Skipped one raised `OperationFailed` where it was read); True when it succeeded.

    Raises:
        OperationTimedOut: still not done ``timeout_s`` seconds after its submit (``now``, epoch seconds).
    """
    if status == OP_DONE:
        op.status = "Succeeded"
        op.result = compact_result(op.name, result)
        return True
    if op.submitted_at and now - op.submitted_at > timeout_s:
        raise OperationTimedOut(
            f"{op.kind} operation {op.name} ({op.operation_id}) still {status} after {timeout_s:g}s "
            "(train_op_timeout)"
        )
    return False


def check_submit_wait(op: PendingOperation, *, refused: str, now: float, timeout_s: float) -> None:
    """Record that ``op``'s submit was refused as transient (``refused``: the error) at ``now``;
    mutates ``op.waiting_since`` (the first refusal).

    Raises:
        OperationTimedOut: the submit has been refused for more than ``timeout_s`` seconds
            (``train_op_timeout``), naming the last refusal.
    """
    if op.waiting_since is None:
        op.waiting_since = now
    if now - op.waiting_since > timeout_s:
        raise OperationTimedOut(
            f"{op.kind} operation {op.name} could not be submitted for {now - op.waiting_since:.0f}s "
            f"(train_op_timeout {timeout_s:g}s); the service still answers {refused}")


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


def weights_usage(model_package_arn: str, region: str) -> str:
    """How to sample from or deploy a ``save_weights_for_sampler`` model package (one line per way)."""
    return (
        f"sample it: ServiceClient(region={region!r}, role_arn=ROLE).create_sampling_client("
        f"model_package_arn={model_package_arn!r}) (sagemaker.train.training_session; this starts a training "
        "session: use the client in a `with` block so the session stops)\n"
        "deploy it: it is a model package version (LoRA weights) in the run's model package group; deploy it "
        "from the SageMaker Model Registry like any model package version"
    )
