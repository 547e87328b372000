"""The S3 run store: key layout, JSON objects, and the run state with conditional writes.

Layout (DESIGN.md section 3, refined in docs/internals.md)::

    runs/{run_id}/config.json                               validated RunConfig, written once by Init
    runs/{run_id}/state.json                                RunState; every write conditional on the ETag
    runs/{run_id}/tokenizer/                                tokenizer files cached for the gateway
    runs/{run_id}/dataset/{kind}/index.json                 DatasetIndex of the run's dataset snapshot (Init)
    runs/{run_id}/dataset/{kind}/{shard:05d}.jsonl          its payloads, one JSON object per line (~1 MiB each)
    runs/{run_id}/steps/{step}/gen{g}/items.json            Distributed Map items (references only)
    runs/{run_id}/steps/{step}/gen{g}/prompts.json          {input_id: payload} for the items
    runs/{run_id}/steps/{step}/gen{g}/starts/{i}.json       {sid} item i was started with (the timeout path needs it)
    runs/{run_id}/steps/{step}/gen{g}/rollouts/{sid}.json   rollout record (reward, status, TraceRecords)
    runs/{run_id}/steps/{step}/datums/{chunk:04d}.json      forward_backward datum chunks
    runs/{run_id}/steps/{step}/summary.json                 the step's metrics
    runs/{run_id}/evals/{step}/...                          eval generation batches (same shape as gen{g})
    runs/{run_id}/sessions/{sid}/task_token.json            task token of a rollout started before it moved into sessions/{sid}.json
    runs/{run_id}/sessions/{sid}/turns/{key}.json           captured gateway turns
    sessions/{sid}.json                                     gateway session record (+ the rollout's task token)
    rollout-results/{run_id}/{input_id}/{sid}.json          written by the agent (toolkit result key)

`RunState` writes use S3 conditional requests (``IfMatch`` on the ETag read, ``IfNoneMatch="*"``
for the first write); moto 5.2.5 honours both with ``PreconditionFailed`` like S3 does.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any, Literal

import boto3
from botocore.exceptions import ClientError
from pydantic import BaseModel, ConfigDict, Field

RESULTS_PREFIX = "rollout-results"
#: Object tag of bulky per-step data under runs/ (the stack's lifecycle rule expires it).
BULK_TAGGING = "stepwise-class=bulk"


class RunStoreError(RuntimeError):
    """Base class of run-store errors."""


class RunNotFound(RunStoreError):
    """``runs/{run_id}/state.json`` does not exist."""


class RunOwnedElsewhere(RunStoreError):
    """Another execution owns the run: this one must not change its state."""


class StateConflict(RunStoreError):
    """The state changed under us more often than the retry budget allows."""


# ---------------------------------------------------------------------------- keys


def run_prefix(run_id: str) -> str:
    return f"runs/{run_id}/"


def config_key(run_id: str) -> str:
    return f"runs/{run_id}/config.json"


def state_key(run_id: str) -> str:
    return f"runs/{run_id}/state.json"


def tokenizer_prefix(run_id: str) -> str:
    return f"runs/{run_id}/tokenizer/"


def dataset_index_key(run_id: str, kind: str) -> str:
    """The `stepwise.datasets.DatasetIndex` of the run's ``kind`` ("train" | "eval") dataset snapshot."""
    return f"runs/{run_id}/dataset/{kind}/index.json"


def dataset_shard_key(run_id: str, kind: str, shard: int) -> str:
    """Shard ``shard`` of the run's ``kind`` dataset snapshot (written once by Init, read by PlanStep)."""
    return f"runs/{run_id}/dataset/{kind}/{shard:05d}.jsonl"


def batch_prefix(run_id: str, step: int, generation_batch: int, kind: str = "train") -> str:
    """Prefix of one generation batch: ``steps/{step}/gen{g}/`` (train) or ``evals/{step}/`` (eval)."""
    if kind == "eval":
        return f"runs/{run_id}/evals/{step}/"
    return f"runs/{run_id}/steps/{step}/gen{generation_batch}/"


def items_key(run_id: str, step: int, generation_batch: int, kind: str = "train") -> str:
    return batch_prefix(run_id, step, generation_batch, kind) + "items.json"


def prompts_key(run_id: str, step: int, generation_batch: int, kind: str = "train") -> str:
    return batch_prefix(run_id, step, generation_batch, kind) + "prompts.json"


def start_marker_key(run_id: str, step: int, generation_batch: int, kind: str, i: int) -> str:
    """Which sid item ``i`` of a batch was started with (the timeout path needs it)."""
    return batch_prefix(run_id, step, generation_batch, kind) + f"starts/{i}.json"


def rollouts_prefix(run_id: str, step: int, generation_batch: int, kind: str = "train") -> str:
    return batch_prefix(run_id, step, generation_batch, kind) + "rollouts/"


def rollout_key(run_id: str, step: int, generation_batch: int, sid: str, kind: str = "train") -> str:
    return rollouts_prefix(run_id, step, generation_batch, kind) + f"{sid}.json"


def datums_key(run_id: str, step: int, chunk: int) -> str:
    return f"runs/{run_id}/steps/{step}/datums/{chunk:04d}.json"


def summary_key(run_id: str, step: int) -> str:
    return f"runs/{run_id}/steps/{step}/summary.json"


def eval_summary_key(run_id: str, step: int) -> str:
    return f"runs/{run_id}/evals/{step}/summary.json"


def session_key(sid: str) -> str:
    """The gateway session record (flat: the gateway knows only the sid)."""
    return f"sessions/{sid}.json"


def task_token_key(run_id: str, sid: str) -> str:
    """Where StartRollout stored a rollout's task token before the token moved into the session
    record (OnRolloutResult still reads it for sessions started then)."""
    return f"runs/{run_id}/sessions/{sid}/task_token.json"


def turns_prefix(run_id: str, sid: str) -> str:
    return f"runs/{run_id}/sessions/{sid}/turns/"


def results_exp_id(run_id: str) -> str:
    """The toolkit ``exp_id`` of a run: the agent writes ``{exp_id}/{input_id}/{sid}.json``."""
    return f"{RESULTS_PREFIX}/{run_id}"


def result_key(run_id: str, input_id: str, sid: str) -> str:
    return f"{results_exp_id(run_id)}/{input_id}/{sid}.json"


def parse_result_key(key: str) -> tuple[str, str, str]:
    """``rollout-results/{run_id}/{input_id}/{sid}.json`` -> ``(run_id, input_id, sid)``.

    The key must already be URL-decoded. Raises ValueError naming the expected shape.
    """
    parts = key.split("/")
    if len(parts) != 4 or parts[0] != RESULTS_PREFIX or not parts[3].endswith(".json") or not all(parts):
        raise ValueError(f"not a rollout result key: {key!r}; expected {RESULTS_PREFIX}/RUN_ID/INPUT_ID/SID.json")
    return parts[1], parts[2], parts[3][: -len(".json")]


# ---------------------------------------------------------------------------- run state


class PendingOperation(BaseModel):
    """A SageMaker operation planned in state.json before it is submitted (write-ahead).

    ``sequence_number`` and ``client_token`` are fixed when planned; a retried submit re-sends the
    same pair, so the runtime applies it once. ``operation_id`` is filled once the submit returned.
    """

    model_config = ConfigDict(extra="forbid")

    name: str  # e.g. "forward_backward/0", "optim_step", "save_weights", "load_weights_for_sampling"
    kind: Literal["training", "sampling"]
    sequence_number: int | None = None  # training ops only
    client_token: str | None = None  # training ops only
    operation_id: str | None = None
    status: str = "Planned"  # Planned | Submitted | Succeeded
    submitted_at: float | None = None  # epoch seconds of the first submit
    argument: str | None = None  # model package ARN of load_state / load_weights_for_sampling
    description: str = ""  # saved on the model package (save_state / save_weights)
    result: dict[str, Any] | None = None


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    kind: Literal["state", "weights"]
    model_package_arn: str
    reason: str = ""
    # Where the run stood when it was saved (a resume rewinds to it); -1 = not recorded (older state).
    epoch: int = -1
    cursor: int = -1
    policy_version: int = -1


class RunState(BaseModel):
    """``runs/{run_id}/state.json``: everything a fresh Lambda needs to continue the run.

    Counters: ``step`` is the number of completed steps (the reference's ``global_step``);
    ``epoch`` and ``cursor`` (row index into the epoch's prompt list) locate the next batch;
    ``generation_batch`` counts DAPO generation batches rolled out for the current step.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    owner_execution_arn: str
    segment: int = 0  # executions of this run so far (continue-as-new)
    segment_start_step: int = 0
    # The execution history at the start of the last training step (PlanStep's history budget):
    # its event id, the step and the segment it was read in (event ids restart with each execution).
    step_start_event: int = 0
    step_start_event_step: int = -1
    step_start_event_segment: int = -1
    max_step_events: int = 0  # the most history events one step (with its evals and checkpoints) used
    training_session_name: str
    session_status: str = "Creating"
    session_created_at: float = 0.0
    resume_loaded: bool = False
    sampler_model_package_arn: str = ""  # "" = base model
    policy_version: int = 0
    step: int = 0
    epoch: int = 0
    cursor: int = 0
    dataset_rows: int = 0
    eval_rows: int = 0
    generation_batch: int = 0
    step_cursor_start: int = 0  # cursor at the start of the current step (for DAPO generation batches)
    kept_groups: int = 0
    datum_chunks: list[int] = Field(default_factory=list)  # datums per forward_backward chunk of the step
    empty_steps: int = 0  # consecutive steps skipped for having no datum (max_consecutive_empty_steps fails the run)
    empty_steps_report: str = ""  # what the last skipped step's rollouts reported (the failure's cause)
    step_started_at: float | None = None
    step_metrics: dict[str, Any] = Field(default_factory=dict)  # the training step's metrics until its summary is written
    last_decision: dict[str, Any] | None = None  # ComputeAdvantages' last result (retry idempotence)
    current_batch: dict[str, Any] | None = None  # the planned, not yet consumed generation batch (PlanStep idempotence)
    last_sequence_number: int = 0
    phase: str = "idle"  # idle | train | rebind | checkpoint | resume | resume_rebind
    checkpoint_reason: str = ""  # why the pending checkpoint is saved: "save_every" | "final" | "weights_at_end"
    pending: list[PendingOperation] = Field(default_factory=list)
    checkpoints: list[Checkpoint] = Field(default_factory=list)
    last_eval_step: int | None = None
    eval_steps: list[int] = Field(default_factory=list)  # steps whose eval summary is recorded (a rewind keeps those <= its step)
    eval_step_pending: int | None = None
    stop_reason: str | None = None
    final_eval_done: bool = False
    final_checkpoint_done: bool = False
    final_weights_done: bool = False
    finished: bool = False
    session_stopped: bool = False


def final_weights(state: RunState) -> Checkpoint | None:
    """The run's final weights, as a ``kind="weights"`` `Checkpoint` (a ``save_weights_for_sampler``
    model package: LoRA weights without optimizer state, the SDK's deployable kind), or ``None``
    when no step was trained (the sampler is still the base model).

    The ``save_weights_at_end`` checkpoint when one was saved; else the sampler's current model
    package, which SubmitTrain saves after every optimizer step (``reason="sampler"``, ``step`` =
    steps completed, ``policy_version`` = optimizer steps applied).
    """
    at_end = [c for c in state.checkpoints if c.kind == "weights" and c.reason == "weights_at_end"]
    if at_end:
        return max(at_end, key=lambda c: c.step)
    if not state.sampler_model_package_arn:
        return None
    return Checkpoint(step=state.step, kind="weights", model_package_arn=state.sampler_model_package_arn,
                      reason="sampler", epoch=state.epoch, policy_version=state.policy_version)


class RunStore:
    """JSON objects and the run state in the run bucket.

    Args:
        bucket: the run bucket (``STEPWISE_BUCKET``).
        s3: a boto3 S3 client; default ``boto3.client("s3")`` with `stepwise.clients.client_config`.
    """

    def __init__(self, bucket: str, s3: Any = None) -> None:
        if not bucket:
            raise ValueError("RunStore needs a bucket name (STEPWISE_BUCKET is empty)")
        self.bucket = bucket
        if s3 is None:
            from stepwise.clients import client_config

            s3 = boto3.client("s3", config=client_config())
        self.s3 = s3

    @classmethod
    def from_env(cls) -> "RunStore":
        """The store of ``STEPWISE_BUCKET``. Raises KeyError naming the variable when unset."""
        try:
            bucket = os.environ["STEPWISE_BUCKET"]
        except KeyError:
            raise KeyError("STEPWISE_BUCKET is not set: the Lambda environment must name the run bucket") from None
        return cls(bucket)

    # -- plain objects

    def get_json(self, key: str) -> Any:
        """The JSON object at ``key``. Raises KeyError(key) when absent."""
        return self.get_json_etag(key)[0]

    def get_json_etag(self, key: str) -> tuple[Any, str]:
        try:
            resp = self.s3.get_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise KeyError(key) from None
            raise
        return json.loads(resp["Body"].read()), resp["ETag"]

    def get_json_or(self, key: str, default: Any = None) -> Any:
        try:
            return self.get_json(key)
        except KeyError:
            return default

    def put_json(
        self, key: str, obj: Any, *, if_match: str | None = None, if_none_match: bool = False, bulk: bool = False
    ) -> str:
        """Write ``obj`` as JSON; returns the new ETag. Conditional writes raise ClientError PreconditionFailed.

        ``bulk=True`` tags the object ``stepwise-class=bulk`` (Map items, rollout records, datums):
        the stack's lifecycle rule expires those; config, state and summaries are never tagged.
        """
        kwargs: dict[str, Any] = {}
        if bulk:
            kwargs["Tagging"] = BULK_TAGGING
        if if_match is not None:
            kwargs["IfMatch"] = if_match
        if if_none_match:
            kwargs["IfNoneMatch"] = "*"
        body = json.dumps(obj, separators=(",", ":"), default=_json_default).encode()
        resp = self.s3.put_object(
            Bucket=self.bucket, Key=key, Body=body, ContentType="application/json", **kwargs
        )
        return resp["ETag"]

    def put_bytes(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=self.bucket, Key=key, Body=body)

    def exists(self, key: str) -> bool:
        try:
            self.s3.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return False
            raise

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted."""
        keys: list[str] = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            keys.extend(o["Key"] for o in page.get("Contents", []))
        return sorted(keys)

    # -- run state

    def create_state(self, state: RunState) -> str:
        """First write of state.json; raises RunOwnedElsewhere if the run already exists."""
        try:
            return self.put_json(state_key(state.run_id), state.model_dump(), if_none_match=True)
        except ClientError as e:
            if _precondition_failed(e):
                existing = self.read_state(state.run_id)[0]
                raise RunOwnedElsewhere(
                    f"run {state.run_id!r} already exists (owned by {existing.owner_execution_arn}); "
                    "start the execution under a new name, or continue it from its owner"
                ) from None
            raise

    def read_state(self, run_id: str) -> tuple[RunState, str]:
        """``(state, etag)``. Raises RunNotFound."""
        try:
            obj, etag = self.get_json_etag(state_key(run_id))
        except KeyError:
            raise RunNotFound(f"run {run_id!r} has no state at s3://{self.bucket}/{state_key(run_id)}") from None
        return RunState.model_validate(obj), etag

    def update_state(
        self,
        run_id: str,
        change: Callable[[RunState], None],
        *,
        execution_arn: str | None,
        attempts: int = 8,
    ) -> RunState:
        """Read-modify-write state.json, conditional on the ETag read (S3 ``IfMatch``).

        ``change`` mutates the state in place; it is re-applied to a fresh read when another
        writer got in between, so it must be a pure function of the state it is given.

        Raises:
            RunOwnedElsewhere: ``execution_arn`` is given and is not the state's owner.
            StateConflict: still conflicting after ``attempts`` reads.
        """
        for _ in range(attempts):
            state, etag = self.read_state(run_id)
            check_owner(state, execution_arn)
            change(state)
            try:
                self.put_json(state_key(run_id), state.model_dump(), if_match=etag)
                return state
            except ClientError as e:
                if not _precondition_failed(e):
                    raise
        raise StateConflict(f"state.json of run {run_id!r} kept changing under us ({attempts} attempts)")

    def owned_state(self, run_id: str, execution_arn: str | None) -> RunState:
        """Read the state and check that ``execution_arn`` owns it."""
        state, _ = self.read_state(run_id)
        check_owner(state, execution_arn)
        return state


def check_owner(state: RunState, execution_arn: str | None) -> None:
    """Raise RunOwnedElsewhere unless ``execution_arn`` is None or the run's owner."""
    if execution_arn is not None and state.owner_execution_arn != execution_arn:
        raise RunOwnedElsewhere(
            f"run {state.run_id!r} is owned by execution {state.owner_execution_arn}, not {execution_arn}; "
            "two executions must not drive one run"
        )


def _precondition_failed(e: ClientError) -> bool:
    err = e.response.get("Error", {})
    return err.get("Code") in ("PreconditionFailed", "412", "ConditionalRequestConflict") or (
        e.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 412
    )


def _json_default(o: Any) -> Any:
    if isinstance(o, BaseModel):
        return o.model_dump()
    if hasattr(o, "tolist"):
        return o.tolist()
    if hasattr(o, "__dict__"):
        return vars(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")
