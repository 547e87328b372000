"""The typed records of every seam: what crosses S3 or the state machine between two processes.

One module, so a reader finds each record's fields, defaults and meaning once (STYLE.md "Seams
are types"). Where each lives in the bucket: `stepwise.layout`.

- `RunState` (``runs/{run_id}/state.json``) and its `Phase`, the write-ahead `PendingOperation`
  list and the saved `Checkpoint` s; `PlannedBatch`, the generation batch PlanStep planned.
- `RunRef`, `SamplerPolicy`, `BatchRef`: what the state machine carries between the steps
  (``$.run``, ``$.plan.batch``), and `BatchItem`, one Distributed Map item (one rollout).
- `SessionRecord` (``sessions/{sid}.json``): what one rollout's agent may do with the gateway.
- `CapturedTurn` (``runs/{run_id}/sessions/{sid}/turns/{key}.json``): one answered LLM call.
- `RolloutRecord` (``.../rollouts/{sid}.json``): a finished rollout's reward, status and TraceRecords.
- `Usage`, `Ledger` (``RunState.ledger``), `CostMark`, `StepCost`: the cost ledger's measurements
  (carried in the records above) and its cumulative totals.
- `JudgeRecord` (``.../judge/{input_id}.json``), `JudgeVerdict` (``runs/{run_id}/judge-cache/{key}.json``)
  and `JudgeProgress`: a group's judged scores, the cached answer of the judge, a batch's judging.

Records read back from S3 are validated with these models; the pure core (`stepwise.core`)
still takes plain mappings where it must survive records of any shape (hostile-input tests).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The run's phase: which planned operations (`RunState.pending`) are being driven.
#: ``idle`` = none; ``train`` [forward_backward/0..n-1, optim_step, save_weights] -> ``rebind``
#: [load_weights_for_sampling] -> idle; ``resume`` [load_state, save_weights] -> ``resume_rebind``
#: -> idle; ``checkpoint`` [save_state | save_weights] -> idle (`stepwise.core.phases`).
Phase = Literal["idle", "train", "rebind", "checkpoint", "resume", "resume_rebind"]

#: What a batch of rollouts is for: a training step or an eval.
BatchKind = Literal["train", "eval"]

#: Why a checkpoint is saved: ``save_every`` and ``final`` -> save_state; ``weights_at_end`` ->
#: save_weights; ``sampler`` = the sampler's current weights (`stepwise.core.phases.final_weights`);
#: "" = no checkpoint pending.
CheckpointReason = Literal["", "save_every", "final", "weights_at_end", "sampler"]

#: A finished rollout's status: ``ok`` (the agent's result was read), ``error``, ``timeout``.
RolloutStatus = Literal["ok", "error", "timeout"]


# ---------------------------------------------------------------------------- cost ledger


class Usage(BaseModel):
    """Billable units some part of a run used, measured where the work happened (`stepwise.metering`):
    each Lambda invocation measures its own duration and configured memory, S3 requests are counted
    as they are made, state transitions are read from the executions' histories and paths, ACR
    session-seconds from each rollout's session, the group judge's Bedrock requests and tokens from
    each Converse answer's ``usage``. Carried in records already written (session records, captured
    turns, rollout records, judge records, ``state.json``) and summed into `Ledger.usage`.

    Units: GB-seconds (configured memory in GB x seconds of duration) and requests per function
    (logical name, `stepwise.functions`); counts; seconds; tokens. ``acr_vcpu_seconds`` and
    ``acr_gb_seconds`` are the session-seconds times the run's ``acr_vcpus`` / ``acr_memory_gb``,
    reckoned when each ACR session ends. ``judge_requests`` counts every Converse request Bedrock
    answered (a retried invalid answer is another request; a throttled one is not billed).
    """

    model_config = ConfigDict(extra="forbid")

    lambda_gb_seconds: dict[str, float] = Field(default_factory=dict)
    lambda_requests: dict[str, int] = Field(default_factory=dict)
    state_transitions: int = 0
    s3_put_class: int = 0
    s3_get_class: int = 0
    acr_sessions: int = 0
    acr_session_seconds: float = 0.0
    acr_vcpu_seconds: float = 0.0
    acr_gb_seconds: float = 0.0
    judge_requests: int = 0
    judge_input_tokens: int = 0
    judge_output_tokens: int = 0

    def add(self, other: "Usage | None") -> "Usage":
        """Add ``other`` into this usage (in place); returns self."""
        if other is None:
            return self
        for name, value in other.lambda_gb_seconds.items():
            self.lambda_gb_seconds[name] = self.lambda_gb_seconds.get(name, 0.0) + value
        for name, n in other.lambda_requests.items():
            self.lambda_requests[name] = self.lambda_requests.get(name, 0) + n
        for f in _SCALAR_USAGE:
            setattr(self, f, getattr(self, f) + getattr(other, f))
        return self

    def minus(self, other: "Usage") -> "Usage":
        """A new usage: this one less ``other`` (a step's part of two cumulative figures)."""
        out = Usage(
            lambda_gb_seconds={k: v - other.lambda_gb_seconds.get(k, 0.0) for k, v in self.lambda_gb_seconds.items()},
            lambda_requests={k: v - other.lambda_requests.get(k, 0) for k, v in self.lambda_requests.items()},
        )
        for f in _SCALAR_USAGE:
            setattr(out, f, getattr(self, f) - getattr(other, f))
        return out

    def is_empty(self) -> bool:
        return self == Usage()


#: `Usage`'s scalar fields (summed by `Usage.add`, subtracted by `Usage.minus`).
_SCALAR_USAGE = ("state_transitions", "s3_put_class", "s3_get_class", "acr_sessions", "acr_session_seconds",
                 "acr_vcpu_seconds", "acr_gb_seconds", "judge_requests", "judge_input_tokens", "judge_output_tokens")


class CostMark(BaseModel):
    """The ledger's totals at a step boundary (the first step's start, then each step's end)."""

    model_config = ConfigDict(extra="forbid")

    at: float  # epoch seconds
    session_seconds: float = 0.0
    usage: Usage = Field(default_factory=Usage)


class StepCost(BaseModel):
    """What one step cost, from one boundary to the next (the budget limits project from these)."""

    model_config = ConfigDict(extra="forbid")

    step: int
    usd: float
    session_seconds: float
    wall_seconds: float


class Ledger(BaseModel):
    """``RunState.ledger``: what the run has used so far, cumulative over every execution of the run
    (continue-as-new, ``stepwise resume``: never reset). Priced by `stepwise.core.ledger`.

    ``sessions_closed_seconds`` are the seconds of training sessions already stopped (a resume
    opens a new one); the current session's are counted from ``RunState.session_created_at`` (its
    CreationTime) until it stops. ``history_segment`` / ``history_event``: the parent execution's
    history has been counted up to that event id of that segment (event ids restart with each
    execution). ``checks``: the budget limits' figures at the last step start
    (`stepwise.core.stopping.budget_checks`); ``warned``: limits whose warning was given;
    ``estimate``: the cost estimate the run started with (`stepwise.core.costmodel`), ``final``:
    the ledger against it at the run's end.
    """

    model_config = ConfigDict(extra="forbid")

    usage: Usage = Field(default_factory=Usage)
    sessions_closed_seconds: float = 0.0
    run_started_at: float | None = None
    mark: CostMark | None = None
    recent_steps: list[StepCost] = Field(default_factory=list)
    history_segment: int = -1
    history_event: int = 0
    checks: dict[str, dict[str, float]] = Field(default_factory=dict)
    warned: list[str] = Field(default_factory=list)
    estimate: dict[str, Any] | None = None
    final: dict[str, Any] | None = None
    #: Only on a projection (`stepwise.core.stopping.projected_state`): steps still to finish before
    #: the step the rules are asked about. Never written.
    pending_steps: int = Field(0, exclude=True)


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
    waiting_since: float | None = None  # epoch seconds of the first submit refused as transient (train_op_timeout counts from it)
    argument: str | None = None  # model package ARN of load_state / load_weights_for_sampling
    description: str = ""  # saved on the model package (save_state / save_weights)
    result: dict[str, Any] | None = None


class Checkpoint(BaseModel):
    model_config = ConfigDict(extra="forbid")

    step: int
    kind: Literal["state", "weights"]
    model_package_arn: str
    reason: str = ""  # a CheckpointReason
    # Where the run stood when it was saved (a resume rewinds to it); -1 = not recorded (older state).
    epoch: int = -1
    cursor: int = -1
    policy_version: int = -1
    # Retention (keep_model_packages best_and_last) deleted its model package: listed, not usable.
    deleted: bool = False
    #: admission 'group': which groups were trained (or filtered) when it was saved (a resume redoes the rest).
    groups: GroupFrontier | None = None


class PlannedBatch(BaseModel):
    """The generation batch PlanStep planned and ComputeAdvantages / RecordEval have not consumed
    (``RunState.current_batch``): a retried PlanStep re-plans exactly this batch.

    ``rows`` are dataset row indices (eval rows for ``kind="eval"``), one prompt each, every prompt
    rolled out ``responses_per_prompt`` times; ``final`` marks the run's final eval.
    """

    model_config = ConfigDict(extra="forbid")

    kind: BatchKind
    step: int
    generation_batch: int = 0
    rows: list[int] = Field(default_factory=list)
    responses_per_prompt: int = 1
    final: bool = False
    group_engine: bool = False  # a group-engine step (admission: group): its groups come from the buffer, not rows


class EvalSetRows(BaseModel):
    """One eval set of the run, as Init snapshotted it (``RunState.eval_sets``): its name (``""`` = the
    unnamed ``eval_dataset_path``), the kind of its dataset snapshot (`stepwise.layout.dataset_index_key`:
    ``eval`` for the unnamed set, ``eval-NAME`` for a named one), its rows, and ``offset``: an eval
    batch's row ``offset + r`` is the set's row ``r`` (the sets share one row space, so one eval is one
    Map run over every set)."""

    model_config = ConfigDict(extra="forbid")

    name: str = ""
    kind: str = "eval"
    rows: int = 0
    offset: int = 0


class EvalPoint(BaseModel):
    """One eval of a training run, as model selection sees it (`stepwise.core.selection`): the step it
    ran after, the selection metric's value and the model package it evaluated (the sampler's weights
    at that step, saved by the step's save_weights; ``""`` = the base model)."""

    model_config = ConfigDict(extra="forbid")

    step: int
    value: float
    model_package_arn: str = ""


# ---------------------------------------------------------------------------- the group engine


#: A group of the group engine (``admission: group``, `stepwise.core.groups`): ``queued`` = to be rolled out
#: (again, after a resume) and not admitted yet; ``running`` = admitted, its execution rolling it out;
#: ``complete`` = every member recorded, not yet trained. A group trained or filtered leaves the buffer.
GroupStatus = Literal["queued", "running", "complete"]


class GroupEntry(BaseModel):
    """One group in the buffer (`GroupBuffer.groups`): group ``id`` (admission order = prompt order:
    `stepwise.core.groups.group_prompt`), its ``attempt`` (0, then one more each time a resume rolls it
    again), ``members`` (its rollouts), the sampler version it was admitted at (``admitted_version``, the
    lower bound of its first turn's) and, once complete, the version its members' first turns sampled
    (``first_turn_version``: the oldest; None when no member sampled a turn) and its members' durations in
    seconds. Times are epoch seconds."""

    model_config = ConfigDict(extra="forbid")

    id: int
    attempt: int = 0
    status: GroupStatus = "queued"
    members: int
    admitted_version: int | None = None
    first_turn_version: int | None = None
    admitted_at: float | None = None
    completed_at: float | None = None
    durations_s: list[float] = Field(default_factory=list)
    reused: bool = False  # a resume kept its rollouts (complete and within max_staleness of the resumed policy)


class GroupFrontier(BaseModel):
    """Which groups had been consumed (trained or filtered) at a point of the run (a `Checkpoint`'s):
    every id below ``next_group`` except ``unconsumed``."""

    model_config = ConfigDict(extra="forbid")

    next_group: int = 0
    unconsumed: list[int] = Field(default_factory=list)


class Consumption(BaseModel):
    """What one step took from the buffer (`GroupBuffer.last_consumption`): the groups it trains (id,
    attempt) and those DAPO filtered since the step before, so a retried ComputeAdvantages takes the same."""

    model_config = ConfigDict(extra="forbid")

    step: int
    trained: list[tuple[int, int]] = Field(default_factory=list)
    filtered: list[tuple[int, int]] = Field(default_factory=list)
    decision: str = "train"


class GroupBuffer(BaseModel):
    """``runs/{run_id}/buffer.json``: the group engine's groups admitted and not yet trained, its admission
    counter and the trainer's wake-up; written conditionally (If-Match) by admission, group completion,
    ComputeAdvantages and the trainer's wait (`stepwise.core.groups`). Bounded: ``groups`` holds at most
    ``(sampling_steps_ahead + 1) x batch_size`` admitted groups (plus, after a resume, the groups queued
    to be rolled again).

    ``next_update_version``: the policy version the next step's update applies to (the sampler's, or one
    more while a step trains). ``filtered``: DAPO groups with equal rewards since the last step (they count
    toward the next step's generation batches). ``trainer_token``: the task token of the trainer waiting
    for a batch (None = not waiting); ``waiting_since`` / ``data_ready_at`` time that wait (epoch seconds).
    ``stopping``: the run is ending, admit nothing more. ``discarded_rollouts``: rollouts rolled out and
    never trained nor filtered (a resume rolling a group again whose rollouts were past ``max_staleness``).
    ``waiting_version``: the version the waiting trainer's update would apply to (readiness is judged for it).
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    next_group: int = 0
    total_groups: int = 0
    groups: list[GroupEntry] = Field(default_factory=list)
    next_update_version: int = 0
    filtered: list[tuple[int, int]] = Field(default_factory=list)
    last_consumption: Consumption | None = None
    trainer_token: str | None = None
    waiting_version: int | None = None  # the policy version the waiting trainer's next update applies to
    waiting_since: float | None = None
    data_ready_at: float | None = None
    stopping: bool = False
    discarded_rollouts: int = 0
    #: What groups used that no step reads the rollout records of (DAPO's filtered groups, every group's own
    #: state transitions), added to the cost ledger by the next step's ComputeAdvantages.
    pending_usage: Usage = Field(default_factory=Usage)
    group_state_machine_arn: str = ""  # the rollout group state machine (the first admission records it)
    rewound_for: str = ""  # the training session a resume rewound the buffer for (once per resume)


class RunState(BaseModel):
    """``runs/{run_id}/state.json``: everything a fresh Lambda needs to continue the run.

    Counters: ``step`` is the number of completed steps (the reference's ``global_step``);
    ``epoch`` and ``cursor`` (row index into the epoch's prompt list) locate the next batch;
    ``generation_batch`` counts DAPO generation batches rolled out for the current step.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    owner_execution_arn: str
    # continue-as-new: the execution ContinueRun started, recorded before StartExecution; it may stop the
    # session until its Init takes the run over (then None) (`stepwise.core.sweeping.may_stop_session`)
    successor_execution_arn: str | None = None
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
    eval_rows: int = 0  # rows of every eval set (the unnamed set's alone in a state without eval_sets)
    eval_sets: list[EvalSetRows] = Field(default_factory=list)  # [] in a state written before named eval sets
    eval_only: bool = False  # an eval-only run (RunConfig.eval_only): it trains nothing and leaves no weights
    # Model selection (stepwise.core.selection): the selection metric at each eval, the best of them,
    # every model package the run created (in order) and those retention deleted.
    eval_history: list[EvalPoint] = Field(default_factory=list)
    best: EvalPoint | None = None
    created_packages: list[str] = Field(default_factory=list)
    deleted_packages: list[str] = Field(default_factory=list)
    generation_batch: int = 0
    step_cursor_start: int = 0  # cursor at the start of the current step (for DAPO generation batches)
    kept_groups: int = 0
    datum_chunks: list[int] = Field(default_factory=list)  # datums per forward_backward chunk of the step
    # admission group: each datum's staleness, in chunk order (the loss outputs are summed by it)
    datum_staleness: list[int] = Field(default_factory=list)
    empty_steps: int = 0  # consecutive steps skipped for having no datum (max_consecutive_empty_steps fails the run)
    empty_steps_report: str = ""  # what the last skipped step's rollouts reported (the failure's cause)
    step_started_at: float | None = None
    step_metrics: dict[str, Any] = Field(default_factory=dict)  # the training step's metrics until its summary is written
    last_decision: dict[str, Any] | None = None  # ComputeAdvantages' last {"batch": BatchRef, "result"} (retry idempotence)
    current_batch: PlannedBatch | None = None  # the planned, not yet consumed generation batch (PlanStep idempotence)
    # max_staleness 1: the next step's first generation batch, planned (and rolled out) while the
    # previous step trained; PlanStep hands it to ComputeAdvantages at that step's start.
    ahead_batch: PlannedBatch | None = None
    ahead_started_at: float | None = None  # when its rollouts started (the step's time/rollout counts from it)
    ahead_cursor_start: int = 0  # the cursor before it (the step's step_cursor_start)
    train_started_at: float | None = None  # the step's first training operation submitted (epoch s; session busy)
    last_rebound_at: float | None = None  # the last step's sampler rebound (epoch s; the next step's session idle)
    last_sequence_number: int = 0
    phase: Phase = "idle"
    checkpoint_reason: CheckpointReason = ""  # why the pending checkpoint is saved
    checkpoint_groups: GroupFrontier | None = None  # admission group: the frontier the pending checkpoint records
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
    ledger: Ledger = Field(default_factory=Ledger)  # the run's cost ledger (stepwise.core.ledger)


class RunLeftovers(BaseModel):
    """``leftovers/{run_id}.json`` (`stepwise.layout.leftovers_key`): clean-up a run's end left to do
    after the end itself was recorded (StopSession, Cleanup), which they do in the time left and the
    session sweeper finishes (`stepwise.handlers._leftovers`).

    ``batches``: generation batches whose rollouts in flight are not resolved to sids yet; ``groups``:
    likewise the group executions ``[id, attempt]`` (admission group) the end stopped;
    ``sids``: rollouts whose gateway and runtime sessions are still to be ended; ``retention``:
    ``keep_model_packages: best_and_last`` still to apply (what it deletes is recomputed from
    ``state.json``, where each deletion is recorded); ``failed_packages``: ARN -> the refusal of a
    package deletion that is not retried (kept, reported). ``held_until``: epoch seconds until which
    the invocation working on it holds it (its own deadline; 0 = nobody): the sweeper takes up only a
    record nobody holds, so two invocations never work one run's leftovers at once.
    """

    model_config = ConfigDict(extra="forbid")

    run_id: str
    since: float  # when the run's end handed it over (epoch seconds)
    reason: str = ""  # the run's stop reason, for the logs
    batches: list[PlannedBatch] = Field(default_factory=list)
    groups: list[list[int]] = Field(default_factory=list)
    sids: list[str] = Field(default_factory=list)
    retention: bool = False
    failed_packages: dict[str, str] = Field(default_factory=dict)
    held_until: float = 0.0
    passes: int = 0  # invocations that worked on it

    def empty(self) -> bool:
        """Nothing left to do."""
        return not (self.batches or self.groups or self.sids or self.retention)


# ---------------------------------------------------------------------------- state machine payloads


class RunRef(BaseModel):
    """The reference every step of the state machine carries: ``$.run``."""

    model_config = ConfigDict(extra="ignore")

    run_id: str
    execution_arn: str


class SamplerPolicy(BaseModel):
    """The policy a generation batch samples from, as ``state.json`` held it when PlanStep planned
    the batch. StartRollout takes it from the batch instead of re-reading ``state.json``: with
    ``max_staleness`` 1 the previous step's Rebind moves ``state.json`` to the next policy while
    this batch's rollouts still run, and every rollout of a batch must sample one policy."""

    model_config = ConfigDict(extra="ignore")

    training_session_name: str
    sampler_model_package_arn: str = ""
    policy_version: int = 0

    @classmethod
    def of(cls, state: RunState) -> "SamplerPolicy":
        """The policy ``state`` samples from now (its session, sampler model package and version)."""
        return cls(training_session_name=state.training_session_name,
                   sampler_model_package_arn=state.sampler_model_package_arn, policy_version=state.policy_version)


class RunSampler(SamplerPolicy):
    """``runs/{run_id}/sampler/current.json``: the run's current sampler and its gate, written by Rebind
    around each load (`stepwise.core.sampler_binding`); the gateway reads it for the sessions whose
    ``sampler_binding`` is ``next_turn`` or ``turn_gate``.

    ``gate`` ``closed`` holds new turns until ``gate_deadline`` (epoch seconds; Rebind renews it while the
    load runs, so a run that died with its gate closed reopens by itself). ``loading_model_package_arn``
    / ``loading_policy_version`` name the package being loaded (``""`` when none). ``closed_at``,
    ``opened_at`` (epoch seconds) and ``turns_at_load`` (turns in flight when the load started) are what
    the step reports of its gate."""

    model_config = ConfigDict(extra="allow")

    gate: Literal["open", "closed"] = "open"
    gate_deadline: float = 0.0
    closed_at: float | None = None
    opened_at: float | None = None
    turns_at_load: int | None = None
    loading_model_package_arn: str = ""
    loading_policy_version: int = 0
    updated_at: float = 0.0


class BatchRef(BaseModel):
    """One generation batch: ``$.plan.batch`` (also handed to every rollout child).

    ``policy`` is None in a batch planned before PlanStep carried it (an execution in flight
    across an upgrade): StartRollout then reads it from ``state.json``.
    """

    model_config = ConfigDict(extra="ignore")

    kind: str  # "train" | "eval"
    step: int
    generation_batch: int = 0
    #: The callback task's ``TimeoutSecondsPath`` and ``HeartbeatSecondsPath`` (`stepwise.core.liveness.
    #: rollout_timeouts`: the heartbeat always below the timeout): no heartbeat (no LLM call) for
    #: ``heartbeat_seconds`` stops the rollout as a timeout. With the heartbeat off (``heartbeat_on`` false)
    #: the gateway sends none and the heartbeat is ``max_rollout_time``, the timeout a second longer.
    timeout_seconds: int = 1800
    heartbeat_seconds: int = 1800
    #: None in a batch planned before it was carried, when off was a heartbeat equal to the timeout
    #: (`stepwise.core.liveness.RolloutTimeouts.of`); PlanStep always sets all three.
    heartbeat_on: bool | None = None
    final: bool = False
    policy: SamplerPolicy | None = None
    #: admission 'group': the group this batch is (its id and attempt; its folder is
    #: `stepwise.layout.group_prefix`); ``step`` is then the step of the synchronous loop whose batch holds the
    #: group's prompt (`stepwise.core.groups.seed_place`), which fixes its rollouts' seeds and input ids.
    group: int | None = None
    attempt: int = 0

    def timeouts(self) -> Any:
        """The callback task's `stepwise.core.liveness.RolloutTimeouts` (``heartbeat_on`` resolved)."""
        from stepwise.core.liveness import RolloutTimeouts

        return RolloutTimeouts.of(self.timeout_seconds, self.heartbeat_seconds, self.heartbeat_on)

    @property
    def folder(self) -> dict[str, Any]:
        """The keyword arguments that place this batch's objects (`stepwise.layout.batch_prefix`): a group's
        folder for the group engine's batches, else none."""
        return {"group": self.group, "attempt": self.attempt} if self.group is not None else {}

    def is_planned(self, planned: PlannedBatch | None) -> bool:
        """True when this is the batch ``planned`` (same kind, step and generation batch)."""
        return planned is not None and (planned.kind, planned.step, planned.generation_batch) == (
            self.kind, self.step, self.generation_batch)


class BatchItem(BaseModel):
    """One Distributed Map item (``items.json``): one rollout of prompt ``input_id`` (dataset row
    ``row``), group member ``member``; ``i`` is its index in the batch. ``start_after_seconds``: how long
    its Map child waits ("Pace start", a Wait state) before the rollout's first InvokeAgentRuntime, so a
    batch's first invokes stay under ``acr_tps_limit`` (`stepwise.core.planning.pace_starts`)."""

    model_config = ConfigDict(extra="ignore")

    i: int
    input_id: str
    row: int
    member: int = 0
    start_after_seconds: int = Field(default=0, ge=0)


# ---------------------------------------------------------------------------- gateway


class SessionRecord(BaseModel):
    """``sessions/{sid}.json``: what one rollout's agent may do with the gateway.

    Unknown keys are kept (``extra="allow"``) so StartRollout can add fields without a
    gateway release. ``deadline`` is epoch seconds; ``0`` disables it. ``max_turns`` and
    ``max_total_tokens`` of ``0`` disable the turn cap / sampled-token budget.
    ``chat_template_kwargs`` (optional, an extension of the contract) reaches
    ``HfTemplateRenderer(chat_template_kwargs=...)`` like the reference config's field.
    ``sampling_seed`` (optional) seeds every turn's sample (see `stepwise.gateway.session.turn_index`).
    StartRollout also writes ``input_id``, ``started_at`` and the rollout's ``task_token``
    (OnRolloutResult reads it; the gateway never serves it).
    """

    model_config = ConfigDict(extra="allow")

    sid: str
    run_id: str
    step: int = 0
    generation_batch: int = 0
    kind: str = "train"
    training_session_name: str
    sampler_model_package_arn: str = ""
    policy_version: int = 0
    region: str | None = None
    tokenizer_prefix: str = ""
    sampling_defaults: dict[str, Any] = Field(default_factory=dict)
    max_context_tokens: int = 0
    max_turns: int = 0
    max_total_tokens: int = 0
    deadline: float = 0.0
    closed: bool = False
    chat_template_kwargs: dict[str, Any] = Field(default_factory=dict)
    #: The rollout's seed (`stepwise.core.seeding.rollout_seed`); each turn samples with
    #: `turn_seed(sampling_seed, turn index)`. None = unseeded samples.
    sampling_seed: int | None = None
    #: StartRollout's measurement of itself and what its container carried (`stepwise.metering`);
    #: FinishRollout adds it to the rollout record. The gateway never serves it.
    usage: Usage | None = None
    #: The rollout task's heartbeat timeout (``BatchRef.heartbeat_seconds``); 0 = the gateway sends no
    #: heartbeat. The gateway heartbeats the task (``task_token``) on the agent's LLM calls.
    heartbeat_seconds: int = 0
    #: What a turn samples while the training session loads new weights (`stepwise.core.sampler_binding`):
    #: ``per_rollout`` (this record's package, also what a record written before the field means),
    #: ``next_turn`` or ``turn_gate`` (the run's current sampler, ``runs/{run_id}/sampler/current.json``).
    sampler_binding: Literal["per_rollout", "next_turn", "turn_gate"] = "per_rollout"

    def resolved_tokenizer_prefix(self) -> str:
        """The S3 prefix of the run's cached tokenizer (`stepwise.layout.tokenizer_prefix` by default)."""
        from stepwise.layout import tokenizer_prefix

        prefix = self.tokenizer_prefix or tokenizer_prefix(self.run_id)
        return prefix if prefix.endswith("/") else prefix + "/"


class CapturedTurn(BaseModel):
    """One captured turn (docs/internals.md, "Captured turn"): exactly what the toolkit adapters
    hand ``manager.record_turn``, plus provenance. ``turn`` is the toolkit ``TurnRecord``'s fields
    (``prompt_ids``, ``output_ids``, ``output_log_probs``, ``finish_reason``, ``ill_formed``, ...);
    ``completed_at`` is epoch seconds. FinishRollout replays these (`stepwise.core.replay`)."""

    model_config = ConfigDict(extra="allow")

    sid: str
    turn: dict[str, Any]
    prompt_messages: list[dict[str, Any]]
    response_message: dict[str, Any] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    sampler_model_package_arn: str = ""
    policy_version: int = 0
    completed_at: float = 0.0
    usage: Usage | None = None  # the gateway's measurement of the request that answered the turn (and carried ones)


# ---------------------------------------------------------------------------- rollouts


class RolloutRecord(BaseModel):
    """``.../rollouts/{sid}.json``, written once by FinishRollout: the rollout's reward (0.0 on any
    failure, docs/agent-contract.md), why it was zeroed, its status and error, the behaviour counts of
    its turns (`stepwise.core.behaviour.rollout_behaviour`), its duration in seconds (None when it
    never started) and its TraceRecords (`stepwise.core.replay.record_to_json`)."""

    model_config = ConfigDict(extra="allow")

    sid: str | None
    i: int
    input_id: str
    row: int
    member: int = 0
    kind: str = "train"
    step: int
    generation_batch: int = 0
    reward: float
    reward_reason: str | None = None
    status: RolloutStatus
    error: dict[str, Any] | None = None
    num_turns: int = 0
    sampled_tokens: int = 0
    truncated_turns: int = 0
    ill_formed_turns: int = 0
    tool_calls: int = 0
    duration_s: float | None = None
    policy_version: int | None = None  # the policy the rollout sampled with (None: written before it was recorded)
    # The policy version each LLM turn sampled, in the order the gateway recorded them (its captured turns),
    # and the first and last of them (None: no turn, or written before they were recorded). Staleness is
    # counted from the first (`stepwise.core.staleness`).
    turn_versions: list[int] | None = None
    first_turn_version: int | None = None
    last_turn_version: int | None = None
    group: int | None = None  # admission 'group': the group it belongs to (`BatchRef.group`)
    usage: Usage | None = None  # what the rollout used: its handlers, gateway turns, child transitions, ACR session
    records: list[dict[str, Any]] = Field(default_factory=list)
    # Per-turn rewards (reward_granularity per_turn): one reward per LLM turn, in the order the gateway
    # recorded the turns (`stepwise.core.rewards.extract_turn_rewards`; ``reward`` is their sum), and
    # per record of ``records`` the spans of its response region each turn produced:
    # ``[turn, start, end]`` in loss-mask positions (`stepwise.core.replay.replay_session`).
    turn_rewards: list[float] | None = None
    turn_spans: list[list[list[int]]] | None = None
    #: The result was scored although its task had timed out (its S3 notification came late or never).
    late: bool = False
    #: The group judge's verdict on this rollout, merged in when a step's groups are computed
    #: (`stepwise.core.judge.apply_judgements`; FinishRollout never writes them): the judge's score in its
    #: range (None: not scored), its one-line reason (or why the group fell back), and the reward the agent
    #: returned; ``reward`` then holds what the estimator reads (the judge's combination with it).
    judge_score: float | None = None
    judge_reason: str | None = None
    agent_reward: float | None = None


# ---------------------------------------------------------------------------- evals


class EvalPrompt(BaseModel):
    """One prompt of an eval (`stepwise.core.evals`): its eval set (``""`` = the unnamed one) and row
    there, its ``input_id`` in the batch, its identity across runs (`stepwise.core.evals.payload_fingerprint`),
    the reward and status of each of its rollouts (member order) and how many succeeded (reward at
    least the eval's success threshold)."""

    model_config = ConfigDict(extra="ignore")

    eval_set: str = ""
    row: int
    input_id: str
    fingerprint: str
    preview: str = ""  # what a person recognises it by (`stepwise.core.evals.prompt_preview`)
    rewards_G: list[float] = Field(default_factory=list)
    statuses_G: list[str] = Field(default_factory=list)
    successes: int = 0

    @property
    def n(self) -> int:
        """Rollouts of the prompt."""
        return len(self.rewards_G)

    @property
    def mean_reward(self) -> float:
        return sum(self.rewards_G) / len(self.rewards_G) if self.rewards_G else 0.0

    @property
    def pass_rate(self) -> float:
        """Successes over rollouts (the unbiased pass@1)."""
        return self.successes / len(self.rewards_G) if self.rewards_G else 0.0


class EvalResults(BaseModel):
    """``runs/{run_id}/evals/{step}/results.json``, written once by RecordEval beside the eval's summary:
    what was evaluated (the sampler's model package, ``""`` = the base model, and its policy version),
    how (group size, success threshold, the k of pass@k, the eval sets in order) and every prompt's
    rollouts (`EvalPrompt`). `stepwise compare` and `stepwise screen` read it."""

    model_config = ConfigDict(extra="ignore")

    step: int
    final: bool = False
    eval_only: bool = False
    model_package_arn: str = ""
    policy_version: int = 0
    group_size: int = 1
    success_threshold: float = 1.0
    pass_k: list[int] = Field(default_factory=list)
    eval_sets: list[str] = Field(default_factory=list)
    prompts: list[EvalPrompt] = Field(default_factory=list)


# ---------------------------------------------------------------------------- the report (what a person reads)


class TrackItem(BaseModel):
    """A summary waiting for the run's trackers (MLflow, W&B): a step's or eval's (``kind`` ``train`` |
    ``eval``, its ``step``) or the run's end (``kind`` ``run``). ``done`` names the trackers that logged it
    (a retried Track invocation skips them), ``warnings`` what failed; ``attempts`` counts the tries."""

    model_config = ConfigDict(extra="ignore")

    kind: str
    step: int | None = None
    done: list[str] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    attempts: int = 0


class TrackLease(BaseModel):
    """Which Track invocation may call the run's trackers, until when (epoch seconds: its own Lambda
    timeout, so a lease of an invocation that died lapses when its Lambda would have been stopped)."""

    holder: str
    expires_at: float


class ReportIndex(BaseModel):
    """``runs/{run_id}/report/index.json``: what the run's report page is drawn from, kept by the Track
    function as the run goes (conditional writes), so publishing a step reads this one object instead
    of every earlier step's summary and sample table (`stepwise.views.index`).

    Attributes:
        series: ``{kind: {summary key: [[first step, last step, sum, count], ...]}}``: each curve's points,
            exact for the newest steps and merged into aligned bins further back, so its size is bounded.
        failures: failed and zeroed rollouts by cause over the run (`stepwise.views.rollout.failure_groups`
            entries merged), the most common first, bounded.
        warnings: the newest tracking warnings, ``[kind, step, text]``.
        recent: the newest published ``[kind, step]`` (the page shows their sample tables inline).
        published: the ``[kind, step]`` published lately (a retried invocation adds nothing twice).
        counts: ``{kind: steps published}``; ``last``: ``{kind: newest step published}``.
        latest: ``{kind: a few figures of the newest summary}`` (the header's cost and reward).
        pending: summaries waiting for the trackers (`TrackItem`), in order.
        lease: the Track invocation calling the trackers now (`TrackLease`), None when none.
    """

    model_config = ConfigDict(extra="ignore")

    series: dict[str, dict[str, list[list[float]]]] = Field(default_factory=dict)
    failures: list[dict[str, Any]] = Field(default_factory=list)
    warnings: list[list[Any]] = Field(default_factory=list)
    recent: list[list[Any]] = Field(default_factory=list)
    published: list[list[Any]] = Field(default_factory=list)
    counts: dict[str, int] = Field(default_factory=dict)
    last: dict[str, int] = Field(default_factory=dict)
    latest: dict[str, dict[str, Any]] = Field(default_factory=dict)
    pending: list[TrackItem] = Field(default_factory=list)
    lease: TrackLease | None = None


# ---------------------------------------------------------------------------- the group judge

#: Where a group's scores came from: ``judge`` (Bedrock answered a valid verdict), ``cache`` (a verdict on
#: the same judged text, cached by an earlier attempt), ``fallback`` (no valid verdict: the config's
#: ``judge.fallback`` scored the group), ``skipped`` (no member completed: nothing to judge).
JudgeSource = Literal["judge", "cache", "fallback", "skipped"]


class JudgeVerdict(BaseModel):
    """A validated answer of the judge on one group (`stepwise.core.judge.parse_verdict`): a score in the
    config's range and a one-line reason per judged member, in the order they were shown. Cached at
    ``runs/{run_id}/judge-cache/{key}.json`` (`stepwise.layout.judge_cache_key`), ``key`` the hash of the
    judge's config and the judged text (`stepwise.core.judge.cache_key`), so a retried step pays once."""

    model_config = ConfigDict(extra="ignore")

    model_id: str
    scores: list[float]
    reasons: list[str]
    attempts: int = 1


class JudgeRecord(BaseModel):
    """``runs/{run_id}/steps/{step}/gen{g}/judge/{input_id}.json``, written once per group by the judge
    (`stepwise.judging.judge_group`); ComputeAdvantages merges it into the group's rollouts.

    Per member of the group (``_G``, member order): its sid (None: never started), whether it was shown to
    the judge (only completed rollouts are), the judge's score (None: not scored) and reason, and the
    characters of the member's part of the judged text (the length-bias check). ``fallback_reason`` says
    why a ``fallback`` group has no verdict; ``attempts`` counts Converse answers read, ``throttled`` the
    throttled requests waited out; ``usage`` is what judging the group billed (requests, tokens).
    """

    model_config = ConfigDict(extra="ignore")

    input_id: str
    step: int
    generation_batch: int = 0
    sids_G: list[str | None] = Field(default_factory=list)
    members_G: list[int] = Field(default_factory=list)
    judged_G: list[bool] = Field(default_factory=list)
    scores_G: list[float | None] = Field(default_factory=list)
    reasons_G: list[str] = Field(default_factory=list)
    judged_chars_G: list[int] = Field(default_factory=list)
    source: JudgeSource = "judge"
    fallback_reason: str | None = None
    cache_key: str = ""
    model_id: str = ""
    attempts: int = 0
    throttled: int = 0
    seconds: float = 0.0
    usage: Usage | None = None


class JudgeProgress(BaseModel):
    """``runs/{run_id}/steps/{step}/gen{g}/judge-progress.json``: the judging of one generation batch, across
    the invocations of the judge function (throttling can take several): when it started (the
    ``judge.max_wait_seconds`` deadline counts from it), how many invocations ran, whether every group has
    its record, and what the invocations themselves used (`stepwise.metering`). ``rollouts`` fingerprints the
    rollouts judged (a resumed run re-doing the step judges new ones, with a new start)."""

    model_config = ConfigDict(extra="ignore")

    step: int
    generation_batch: int = 0
    started_at: float
    rollouts: str = ""
    invocations: int = 0
    done: bool = False
    usage: Usage | None = None


Checkpoint.model_rebuild()
RunState.model_rebuild()
