"""The typed events the Lambda functions take: one pydantic model per entrypoint's input.

State machine tasks hand in references only (`stepwise.records.RunRef`, `BatchRef`,
`BatchItem`); the S3 notification (OnRolloutResult) and the EventBridge execution status change
(Cleanup) are modelled by the fields the handlers read, with every other field of the AWS shapes
ignored (S3: "Event message structure" in the S3 user guide; EventBridge: "Step Functions
Execution Status Change"), so a minimal or a future event parses the same way.
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from stepwise.records import BatchItem, BatchRef, RunRef


class _Event(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RunEvent(_Event):
    """``{"run": ...}``: every task of the training loop."""

    run: RunRef


class PlanEvent(RunEvent):
    """PlanStep's input: ``$.run``, and in the overlapped step's Parallel state ``ahead_of_step``, the
    step being trained, whose successor's first generation batch is to be planned
    (`stepwise.core.planning.plan_ahead`)."""

    ahead_of_step: int | None = None


class BatchEvent(_Event):
    """``{"run", "batch"}``: ComputeAdvantages and RecordEval."""

    run: RunRef
    batch: BatchRef


class AdmitEvent(RunEvent):
    """AdmitGroups (``admission: group``): the run and the rollout group state machine to start groups of."""

    group_state_machine_arn: str


class AwaitEvent(AdmitEvent):
    """AwaitGroups (``lambda:invoke.waitForTaskToken``): the trainer's task token, resumed when a batch of
    groups is ready."""

    task_token: str


class GroupEvent(BatchEvent):
    """RecordGroupComplete: the group's batch (`stepwise.records.BatchRef` with ``group``) and its state
    machine (``$$.StateMachine.Id``: the groups it admits in turn are started there)."""

    group_state_machine_arn: str
    retry_count: int = 0  # $$.State.RetryCount: the attempts before this one (the group's transitions)


class InitEvent(_Event):
    """Init: the execution's input (a RunConfig, or a continuation) and its ARN and name."""

    input: Any
    execution_arn: str
    execution_name: str


class StartEvent(_Event):
    """StartRollout (``lambda:invoke.waitForTaskToken``): one Map item and its task token."""

    task_token: str
    run: RunRef
    batch: BatchRef
    item: BatchItem
    retry_count: int = 0  # $$.State.RetryCount: the attempts before this one (the child's transitions)


class FinishEvent(_Event):
    """FinishRollout: the item, and either the task's output or the Catch's error."""

    run: RunRef
    batch: BatchRef
    item: BatchItem
    result: dict[str, Any] | None = None  # SendTaskSuccess output {"sid", "result_key", "session"?, "usage"?}
    error: dict[str, Any] | None = None  # Catch output {"Error", "Cause"}
    retry_count: int = 0  # $$.State.RetryCount: the attempts before this one (the child's transitions)
    #: The last error of FinishRollout itself ({"Error", "Cause"}), once its retries are spent: only the
    #: failed rollout is recorded (the child's "Record failed rollout" state).
    finish_error: dict[str, Any] | None = None


class StopEvent(_Event):
    """StopSession: every terminal path (``reason``; ``error`` on the catch-all's)."""

    execution_arn: str
    execution_name: str
    input: Any = None
    reason: str = "finished"
    error: dict[str, Any] | None = None


class SweepEvent(_Event):
    """The session sweeper's input: EventBridge's scheduled event (every field ignored) or ``{}``
    (the local stack); ``dry_run`` reports the verdicts without stopping anything; ``grace_seconds``
    replaces ``STEPWISE_SWEEP_GRACE_SECONDS`` for this sweep (the local stack's sweep after a run has
    ended, when no change is in flight: 0)."""

    dry_run: bool = False
    grace_seconds: float | None = Field(None, ge=0)


class ContinueEvent(_Event):
    """ContinueRun: the run and the state machine to start its next execution of."""

    run: RunRef
    state_machine_arn: str


# ---------------------------------------------------------------------------- AWS event sources


class _S3Bucket(_Event):
    name: str = ""


class _S3Object(_Event):
    key: str = ""


class _S3Entity(_Event):
    bucket: _S3Bucket = Field(default_factory=_S3Bucket)
    object: _S3Object = Field(default_factory=_S3Object)


class _S3Record(_Event):
    s3: _S3Entity = Field(default_factory=_S3Entity)


class S3Notification(_Event):
    """An S3 ObjectCreated notification delivered straight to a Lambda (OnRolloutResult)."""

    records: list[_S3Record] = Field(default_factory=list, alias="Records")

    def objects(self) -> list[tuple[str, str]]:
        """``(bucket, URL-decoded key)`` of every record (S3 event keys arrive URL-encoded, '+' = space)."""
        return [(r.s3.bucket.name, urllib.parse.unquote_plus(r.s3.object.key)) for r in self.records]


class RecheckRequest(_Event):
    """The state machine's re-check of one rollout ("Wait for rollout result", ``lambda:invoke.waitForTaskToken``):
    its task heard nothing for ``rollout_recheck_seconds`` (`stepwise.core.liveness`)."""

    task_token: str
    run: RunRef
    batch: BatchRef
    item: BatchItem
    retry_count: int = 0  # $$.State.RetryCount: the attempts before this one (the child's transitions)


class ResultEvent(S3Notification):
    """OnRolloutResult's input: the S3 notification of result objects (``Records``), or the re-check of one
    rollout whose notification may have come late or never (``recheck``)."""

    recheck: RecheckRequest | None = None


class _ExecutionDetail(_Event):
    status: str | None = None
    executionArn: str = ""
    name: str = ""
    input: Any = None


class ExecutionStatusChange(_Event):
    """EventBridge "Step Functions Execution Status Change" (Cleanup): ``detail.status``,
    ``detail.executionArn``, ``detail.name`` and ``detail.input`` (the execution's input JSON)."""

    detail: _ExecutionDetail = Field(default_factory=_ExecutionDetail)

    @field_validator("detail", mode="before")
    @classmethod
    def _no_detail(cls, value: Any) -> Any:
        return {} if value is None else value

    @property
    def execution_name(self) -> str:
        """``detail.name``, else the ARN's last part."""
        return self.detail.name or self.detail.executionArn.rsplit(":", 1)[-1]
