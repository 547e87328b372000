"""Which training sessions may be stopped, and by whom: the stop rule of the execution paths and the
scheduled sweeper's verdict. Pure (no I/O): the handlers read the state, the sessions and the
executions, then ask here.

Every billed session is stopped by the execution that owns the run (its stop path or catch-all), by
Cleanup when that execution ends without one (EventBridge), and, because EventBridge delivery is
best-effort (a console stop may never reach Cleanup), by the sweeper: a scheduled Lambda that stops
each active session of this stack whose run no execution still drives.

A session is *of this stack* when its tags name this stack's bucket and a run whose
``state.json`` in that bucket names the session (`run_of_session`); sessions created before the
tags are matched by name (`stepwise.core.phases.session_name_for` of a run id in the bucket).
Anything else is never touched: another stack's sessions, a user's own.

Continue-as-new: ContinueRun records the next execution (``RunState.successor_execution_arn``)
before starting it, so from that moment until the successor's Init takes the run over, both the
owner and the successor may stop the session (`may_stop_session`), and the sweeper leaves the
session alone while the successor runs: there is no window in which no execution may stop it.

No verdict on a recent change: DescribeExecution is eventually consistent (an execution just started
can read as not existing, and a hand-over is exactly that), so the sweeper stops nothing whose run
changed (``state.json`` written), or whose executions ended, less than a grace period ago
(`sweep_verdict`'s ``grace``: the Lambda's ``STEPWISE_SWEEP_GRACE_SECONDS``, default 300 s, far longer
than DescribeExecution takes to see a new execution and than a stop path takes to record its stop; an
orphaned session bills that much longer, once).

A run's session is *adopted* (a retried Init finds it already created) only when its tags name this
stack's bucket and this run (and, when it carries one, the execution that created it):
`adoption_problem`; anything else refuses the run before it bills.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

from stepwise.core.ledger import close_session, count_parent_history, final_report
from stepwise.core.phases import is_failure_stop, rewind_to_checkpoint, session_name_for
from stepwise.core.selection import refresh_best
from stepwise.records import Checkpoint, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: Tags CreateTrainingSession gives every session (``stepwise.aws.sagemaker.create_session``).
TAG_RUN_ID = "stepwise:run-id"
TAG_BUCKET = "stepwise:bucket"
#: The execution that created the session (Init; a retried Init is the same execution).
TAG_EXECUTION = "stepwise:execution"

#: DescribeExecution statuses of an execution that may still act on its run (a redrive restarts it).
LIVE_EXECUTION_STATUSES = frozenset({"RUNNING", "PENDING_REDRIVE"})
#: The status this module is given for an execution Step Functions does not know (ExecutionDoesNotExist:
#: never started, or closed more than 90 days ago): it does not run.
GONE = "GONE"
#: The prefix of a swept run's ``stop_reason``: an abnormal end, so `stepwise resume` continues it
#: (`stepwise.core.phases.is_failure_stop` reads ``execution ...``).
SWEPT_REASON_PREFIX = "execution ended without stopping its session"
#: ``RunState.session_status`` of a run whose Init found its session name taken by a session not its
#: own (`adoption_problem`): nothing may stop, use or sweep that session on the run's behalf.
REFUSED = "Refused"


def session_tags(run_id: str, bucket: str, execution_arn: str = "") -> list[dict[str, str]]:
    """The ``Tags`` of a run's session (CreateTrainingSession): the run id, this stack's bucket and,
    when known, the execution creating it (botocore's ``Tag.Value``: at most 256 characters, which an
    execution ARN never exceeds)."""
    tags = [{"Key": TAG_RUN_ID, "Value": run_id}, {"Key": TAG_BUCKET, "Value": bucket}]
    if execution_arn:
        tags.append({"Key": TAG_EXECUTION, "Value": execution_arn[:256]})
    return tags


def adoption_problem(session_name: str, tags: Mapping[str, str], run_id: str, bucket: str, status: str = "",
                     execution_arn: str = "") -> str:
    """Why run ``run_id`` of the stack of ``bucket`` (started by ``execution_arn``, when given) may not
    adopt the existing session ``session_name`` whose tags are ``tags``; '' when it may: its tags name
    this bucket and this run, and the execution that created it is this one (when the tag is there).

    CreateTrainingSession answers ResourceInUse for a name in use by anyone in the account and region:
    another stack's run of the same id, an earlier run of a reused id, or a user's own session. Using
    it would train, sample and, at the end, stop a session this run does not own.
    """
    head = f"training session {session_name!r} already exists{f' ({status})' if status else ''}"
    fix = "start the run under another run id (execution name), or stop and delete that session if it is yours"
    if TAG_BUCKET not in tags or TAG_RUN_ID not in tags:
        return f"{head} and its tags do not name a Stepwise run ({TAG_BUCKET}, {TAG_RUN_ID}): it is not this run's; {fix}"
    if tags[TAG_BUCKET] != bucket:
        return f"{head} for run {tags[TAG_RUN_ID]!r} of another stack (bucket {tags[TAG_BUCKET]!r}); {fix}"
    if tags[TAG_RUN_ID] != run_id:
        return f"{head} for run {tags[TAG_RUN_ID]!r} of this stack, not {run_id!r}; {fix}"
    if execution_arn and tags.get(TAG_EXECUTION) and tags[TAG_EXECUTION] != execution_arn[:256]:
        return (f"{head} for an earlier run of the same id (created by execution {tags[TAG_EXECUTION]}, not "
                f"{execution_arn}); {fix}")
    return ""


def run_of_session(session_name: str, tags: Mapping[str, str], bucket: str,
                   run_ids: Callable[[], Iterable[str]]) -> str | None:
    """The run id of this stack whose session ``session_name`` may be, or None (not this stack's).

    ``tags``: the session's tags (key -> value). A session tagged with another bucket is not this
    stack's; one tagged with this bucket names its run. An untagged session (created before the
    tags) is matched by name against ``run_ids()`` (this bucket's run ids, asked only then) through
    `stepwise.core.phases.session_name_for`. The caller still checks that the run's state names the
    session (`sweep_verdict`).
    """
    if TAG_BUCKET in tags or TAG_RUN_ID in tags:
        if tags.get(TAG_BUCKET) != bucket or not tags.get(TAG_RUN_ID):
            return None
        return tags[TAG_RUN_ID]
    for run_id in run_ids():
        if session_name_for(run_id) == session_name:
            return run_id
    return None


def may_stop_session(state: RunState, execution_arn: str) -> bool:
    """Whether ``execution_arn`` may stop the run's session: its owner, or the successor the owner
    started (continue-as-new) until that successor takes the run over."""
    return execution_arn in (state.owner_execution_arn, state.successor_execution_arn)


@dataclass(frozen=True)
class SweepVerdict:
    """What the sweeper does with one active session.

    Attributes:
        stop: stop it.
        mark: also record in ``state.json`` that the run's session is stopped (`mark_swept`),
            before stopping it (a resume then starts a new session instead of using this one).
        reason: why, for the log, the metric and the notification.
    """

    stop: bool
    mark: bool
    reason: str


def sweep_verdict(session_name: str, state: RunState, owner_status: str | None,
                  successor_status: str | None = None, *, state_changed_at: float | None = None,
                  owner_stopped_at: float | None = None, successor_stopped_at: float | None = None,
                  now: float = 0.0, grace: float = 0.0) -> SweepVerdict:
    """The sweeper's verdict on the active session ``session_name`` of the run ``state`` describes.

    ``owner_status`` / ``successor_status``: DescribeExecution's status of
    ``state.owner_execution_arn`` / ``state.successor_execution_arn`` (`GONE` when Step Functions
    does not know it; None when it could not be read, or, for the successor, when none is recorded).

    Stops a session the run no longer uses (it names another session, or recorded this one
    stopped), and the run's session when neither its owner nor a recorded successor can still
    stop it. Leaves it alone while either runs, or when a status could not be read.

    ``grace`` > 0: no stop until the run's last change is ``grace`` seconds old: ``state.json``'s
    (``state_changed_at``, its LastModified; unknown = now) and each execution's stop date
    (``owner_stopped_at``, ``successor_stopped_at``; epoch seconds, None while running or unknown).
    DescribeExecution is eventually consistent: a successor just started in a continue-as-new hand-over
    may read `GONE`, and ContinueRun's write of it into the state, moments before, is what the wait
    covers. ``now``: epoch seconds.
    """
    if state.session_status == REFUSED:
        return SweepVerdict(False, False, "the run was refused this session: not its own")
    if state.training_session_name != session_name:
        verdict = SweepVerdict(True, False, f"the run's state names another session ({state.training_session_name})")
    elif state.session_stopped:
        verdict = SweepVerdict(True, False, "the run recorded its session stopped, but it is still active")
    elif owner_status in LIVE_EXECUTION_STATUSES:
        return SweepVerdict(False, False, f"owner execution {state.owner_execution_arn} is {owner_status}")
    elif owner_status is None:
        return SweepVerdict(False, False, f"owner execution {state.owner_execution_arn}: status unknown")
    else:
        reason = f"owner execution {state.owner_execution_arn} ended {owner_status}"
        if state.successor_execution_arn:
            if successor_status in LIVE_EXECUTION_STATUSES:
                return SweepVerdict(False, False, f"handed over to execution {state.successor_execution_arn}, "
                                                  f"{successor_status}")
            if successor_status is None:
                return SweepVerdict(False, False, f"successor execution {state.successor_execution_arn}: status unknown")
            reason += f"; its successor {state.successor_execution_arn} ended {successor_status} before taking the run over"
        verdict = SweepVerdict(True, True, reason)
    if grace > 0:
        changed = max(t for t in (now if state_changed_at is None else state_changed_at, owner_stopped_at,
                                  successor_stopped_at) if t is not None)
        if now - changed < grace:
            return SweepVerdict(False, False, f"the run changed {max(0.0, now - changed):.0f} s ago, within the "
                                              f"{grace:g} s grace period (would stop: {verdict.reason})")
    return verdict


def mark_swept(state: RunState, session_name: str, owner: str, successor: str | None, reason: str, *,
               stopped_at: float | None = None, created_at: float | None = None) -> None:
    """Record in ``state`` that its session was stopped by the sweeper (mutates: ``session_stopped``,
    ``session_status``, a ``stop_reason`` that `stepwise resume` treats as an abnormal end) and, with
    ``stopped_at`` (epoch seconds of the stop), close its seconds in the cost ledger
    (`stepwise.core.ledger.close_session`, from ``created_at``, the session's own CreationTime, when
    given), as the stop path does: every session the sweeper stops is in the ledger.

    Raises:
        SweepConflict: the run moved on since the verdict (another owner, successor or session, or
            already stopped): nothing is marked and the session is left for the next sweep.
    """
    if (state.training_session_name, state.owner_execution_arn, state.successor_execution_arn) != \
            (session_name, owner, successor) or state.session_stopped:
        raise SweepConflict(f"run {state.run_id!r} changed since it was read (owner {state.owner_execution_arn}, "
                            f"session {state.training_session_name}, stopped {state.session_stopped})")
    if stopped_at is not None:
        if created_at is not None:
            state.session_created_at = created_at
        close_session(state, stopped_at)
    state.session_stopped = True
    state.session_status = "Stopping"
    if state.stop_reason is None:
        state.stop_reason = f"{SWEPT_REASON_PREFIX} ({reason})"


class SweepConflict(RuntimeError):
    """The run's state changed between the sweeper's read and its write (`mark_swept`)."""


class RunOwnedElsewhere(RuntimeError):
    """Another execution owns the run: this one must not change its state (raised by the transitions
    below and by `stepwise.aws.runstore`'s owner check, which imports it from here)."""


def take_over(state: RunState, execution_arn: str, parent: str | None) -> None:
    """A continuation (continue-as-new) takes the run over from its parent (Init of the next execution):
    ``execution_arn`` becomes the owner, a new segment starts at the current step, the successor mark is
    cleared. Mutates ``state``; idempotent (the owner taking it again only clears the successor mark).

    Raises:
        RunOwnedElsewhere: the run's owner is neither ``execution_arn`` nor its ``parent``.
    """
    if state.owner_execution_arn == execution_arn:
        state.successor_execution_arn = None
        return
    if state.owner_execution_arn != parent:
        raise RunOwnedElsewhere(
            f"run {state.run_id!r} is owned by {state.owner_execution_arn}, not by this continuation's parent {parent}"
        )
    state.owner_execution_arn = execution_arn
    state.successor_execution_arn = None
    state.segment += 1
    state.segment_start_step = state.step


def hand_over(state: RunState, successor: str, *, newest_event: int | None,
              events: Iterable[Mapping[str, object]], tail_transitions: int) -> None:
    """ContinueRun's write-ahead: record ``successor`` (the next execution's ARN) before it starts, so it
    may stop the session before it takes the run over (`may_stop_session`), and count this execution's
    history not counted yet (`stepwise.core.ledger.count_parent_history`, ``newest_event`` None: Step
    Functions did not know it) plus its ``tail_transitions`` (the states after this one). Mutates ``state``."""
    state.successor_execution_arn = successor
    if newest_event is not None:
        count_parent_history(state, newest_event, events)
        state.ledger.usage.state_transitions += tail_transitions


def mark_stopped(state: RunState, cfg: RunConfig, execution_arn: str, *, reason: str, stopped_at: float,
                 created_at: float | None, newest_event: int | None, events: Iterable[Mapping[str, object]],
                 tail_transitions: int, estimate: Mapping[str, object] | None) -> None:
    """Record the run's end in ``state`` (StopSession, Cleanup): the session's seconds closed in the ledger
    (from ``created_at``, the session's own CreationTime, when given and the session not already stopped),
    the execution's last history counted (as `hand_over`), the session stopped (``Stopping``, unless the run
    was `REFUSED` its session), ``finished`` for ``reason`` "finished" else the stop reason kept or set to
    ``reason``, and the ledger's final report (`stepwise.core.ledger.final_report`, against ``estimate``).
    Mutates ``state``; applied again (a retried stop) the session's seconds and the stop reason stay
    those of the first.

    Raises:
        RunOwnedElsewhere: ``execution_arn`` may no longer stop the run's session (`may_stop_session`).
    """
    if not may_stop_session(state, execution_arn):
        raise RunOwnedElsewhere(f"run {state.run_id!r} was taken over by {state.owner_execution_arn} while "
                                f"{execution_arn} stopped it")
    if created_at is not None and not state.session_stopped:
        state.session_created_at = created_at  # the session's own clock for its final seconds
    close_session(state, stopped_at)
    if newest_event is not None:
        count_parent_history(state, newest_event, events)
        state.ledger.usage.state_transitions += tail_transitions
    state.session_stopped = True
    if state.session_status != REFUSED:
        state.session_status = "Stopping"
    if reason == "finished":
        state.finished = True
    elif state.stop_reason is None:
        state.stop_reason = reason
    state.ledger.final = final_report(state, cfg, stopped_at, estimate)


def mark_refused(state: RunState, session_name: str, why: str) -> None:
    """Init's session name is taken by a session not this run's: the state records it `REFUSED` and stopped
    (no stop path or sweep touches it for this run) with a failure stop reason (kept if one is set). Only
    while the run still names that session. Mutates ``state``; idempotent."""
    if state.training_session_name == session_name:
        state.session_status, state.session_stopped = REFUSED, True
        state.stop_reason = state.stop_reason or f"failed: RunRefused ({why})"


class Resumed(NamedTuple):
    """What `resume_run` did: ``rewound`` (the session was stopped: the run moved onto a new one) and the
    checkpoint it rewound to (None: the run's start)."""
    rewound: bool
    checkpoint: Checkpoint | None


def resume_run(state: RunState, cfg: RunConfig, *, session_name: str, at: float) -> Resumed:
    """``"resume": true`` (Init of a resume continuation, after `take_over`): clear a failure stop reason (`stepwise.core.phases.is_failure_stop`);
    when the run's session was stopped, rewind onto session ``session_name`` created ``at`` (epoch seconds)
    at the newest ``save_state`` checkpoint (`stepwise.core.phases.rewind_to_checkpoint`; none and a config that saves its
    initial sampler: the new session's first sampler is its saved base weights, ``resume_loaded`` False)
    and recompute the best model from the eval history kept (`stepwise.core.selection.refresh_best`).
    Mutates ``state``; applied again to its result it changes nothing (the new session is not stopped)."""
    if is_failure_stop(state.stop_reason):
        state.stop_reason = None
    if not state.session_stopped:
        return Resumed(False, None)
    ckpt = rewind_to_checkpoint(state, session_name=session_name, created_at=at,
                                base_resume_arn=cfg.resume_from_model_package)
    if ckpt is None and cfg.saves_initial_sampler:
        state.resume_loaded = False  # the new session's first sampler: its saved base weights
    refresh_best(state, cfg)
    return Resumed(True, ckpt)

