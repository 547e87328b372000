"""Init: validate everything, then create (or adopt) the training session; write config.json and state.json.

Order matters (refuse before billing, README): config, dataset (>= batch_size rows with a payload column),
eval dataset and bucket, the model package a run resumes from or evaluates (it still exists), and the
session name (no session of another run or stack holds it) are all checked *before*
CreateTrainingSession, so bad input never starts a billed session. The run is claimed in state.json
(``IfNoneMatch``) before the session is created, and the session name is derived from the run id, so
a retried Init adopts the session its first attempt created instead of starting a second one; a
session of that name is adopted only when its tags name this bucket, this run and this execution
(`stepwise.core.sweeping.adoption_problem`), otherwise the run is refused and the session left alone.

A continuation execution (continue-as-new) takes the run over from its parent: it becomes the
owner only if the parent still is. A continuation with ``"resume": true`` (``stepwise resume``,
docs/internals.md "Resuming a run") also clears a failure ``stop_reason`` and, when the run's
session was stopped, rewinds the run to its newest ``save_state`` checkpoint on a new session
(`stepwise.core.phases.rewind_to_checkpoint`); PollSession then loads that checkpoint with its optimizer.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepwise.aws import sagemaker
from stepwise.aws.runstore import RunNotFound, RunOwnedElsewhere, RunStore
from stepwise.core.sweeping import take_over as take_over_run
from stepwise.core import ledger
from stepwise.core.phases import resume_session_name, session_name_for
from stepwise.core.sweeping import Resumed, resume_run
from stepwise.events import InitEvent
from stepwise.executions import resolve_run, run_id_problem
from stepwise.handlers import _groups
from stepwise.handlers._common import bind, entrypoint, logger, now, poll_seconds, run_config, settings, store
from stepwise.layout import config_key, dataset_index_key, dataset_shard_key, tokenizer_prefix
from stepwise.records import Checkpoint, EvalSetRows, Ledger, RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig


def _output(run_id: str, execution_arn: str, *, ready: bool) -> dict[str, Any]:
    return {
        "run": {"run_id": run_id, "execution_arn": execution_arn},
        "session": {"ready": ready, "wait_seconds": poll_seconds()},
    }


def take_over(rs: RunStore, run_id: str, execution_arn: str, continuation: dict[str, Any]) -> RunState:
    """Make ``execution_arn`` the owner of ``run_id`` if its parent owns it (or it already does)."""
    parent = continuation.get("parent_execution_arn")
    return rs.update_state(run_id, lambda s: take_over_run(s, execution_arn, parent), execution_arn=None)


def resume(rs: RunStore, run_id: str, execution_arn: str, state: RunState) -> RunState:
    """Apply ``"resume": true``: clear a failure stop; a stopped session is replaced (see module doc)."""
    found: list[Resumed] = []
    session_name = resume_session_name(run_id, state.segment)
    cfg = run_config(run_id)

    if state.session_stopped and cfg.admission == "group":
        # first the buffer (marked with the new session: a retried Init does not rewind it twice), then the state
        rewind_groups(rs, run_id, cfg, newest_state_checkpoint(state), session_name)
    at = now()

    def change(s: RunState) -> None:
        found[:] = [resume_run(s, cfg, session_name=session_name, at=at)]

    state = rs.update_state(run_id, change, execution_arn=execution_arn)
    if found[0].rewound:
        ckpt = found[0].checkpoint
        logger.info("resuming on a new training session", extra={
            "training_session_name": session_name, "step": state.step, "epoch": state.epoch, "cursor": state.cursor,
            "checkpoint": ckpt.model_package_arn if ckpt else None})
    if state.session_status == "Creating":  # also a retried Init: CreateTrainingSession adopts by name
        create_own_session(rs, cfg, run_id, execution_arn, state.training_session_name)
        state = session_clock(rs, run_id, execution_arn, cfg, state.training_session_name)
    return state


def refuse_foreign_session(cfg: RunConfig, run_id: str, execution_arn: str, session_name: str) -> None:
    """Refuse the run, before it claims anything, when a training session named ``session_name``
    exists and is not this run's (`stepwise.aws.sagemaker.adoption_problem`; none, or this run's own
    from an earlier attempt of this Init, passes).

    Raises:
        RunRefused: naming the session, whose run and stack it is, and what to do.
    """
    from stepwise.core.preflight import RunRefused

    detail = sagemaker.existing_session(sagemaker.control_plane(cfg.region), session_name)
    problem = sagemaker.adoption_problem(session_name, detail, run_id, settings().bucket, execution_arn)
    if problem:
        raise RunRefused([f"training session: {problem}"])


def create_own_session(rs: RunStore, cfg: RunConfig, run_id: str, execution_arn: str,
                       session_name: str) -> sagemaker.CreatedSession:
    """CreateTrainingSession for the run (`stepwise.aws.sagemaker.create_session`). When the name turns
    out to be taken by a session that is not this run's (created between `refuse_foreign_session`
    and here), the state records it as refused (`stepwise.core.sweeping.REFUSED`, session stopped: no
    stop path or sweep touches it for this run) and the run is refused.

    Raises:
        RunRefused: the session is not this run's.
    """
    from stepwise.core.preflight import RunRefused
    from stepwise.core.sweeping import mark_refused

    try:
        return sagemaker.create_session(cfg, session_name, run_id, execution_arn)
    except sagemaker.SessionNotOurs as e:
        why = str(e)
        rs.update_state(run_id, lambda s: mark_refused(s, session_name, why), execution_arn=execution_arn)
        raise RunRefused([f"training session: {e}"]) from None


def newest_state_checkpoint(state: RunState) -> Checkpoint | None:
    """The checkpoint a resume rewinds to (`stepwise.core.phases.rewind_to_checkpoint`'s choice)."""
    states = [c for c in state.checkpoints if c.kind == "state"]
    return max(states, key=lambda c: c.step) if states else None


def rewind_groups(rs: RunStore, run_id: str, cfg: RunConfig, ckpt: Checkpoint | None, session_name: str) -> None:
    """The group engine's buffer of a run resumed at ``ckpt`` (None: its start) on session ``session_name``:
    every group the checkpoint had not consumed is redone, reused from S3 when complete within
    ``max_staleness`` of the resumed policy, else rolled again (`stepwise.core.groups.rewind`). Its
    executions were stopped with the run (Cleanup); an execution of an old attempt that still records its
    group changes nothing. Once per session: the buffer remembers the session it was rewound for."""
    from concurrent.futures import ThreadPoolExecutor

    from stepwise.core import groups as engine
    from stepwise.layout import group_complete_key, groups_prefix

    at = ckpt.groups if ckpt is not None else None
    version = 0 if ckpt is None else (ckpt.policy_version if ckpt.policy_version >= 0 else ckpt.step)
    before, _ = rs.read_buffer(run_id)
    if before.rewound_for == session_name:
        return
    redo = sorted(set(at.unconsumed if at else []) | set(range(at.next_group if at else 0, before.next_group)))

    def mark(group: int) -> tuple[int, engine.CompleteMark | None]:
        keys = [k for k in rs.list_keys(f"{groups_prefix(run_id)}{group}/") if k.endswith("/complete.json")]
        attempts = sorted(int(k.rsplit("/", 2)[-2].removeprefix("a")) for k in keys)
        if not attempts:
            return group, None
        body = rs.get_json(group_complete_key(run_id, group, attempts[-1]))
        return group, engine.CompleteMark(attempt=attempts[-1], members=int(body["members"]),
                                          first_turn_version=body.get("first_turn_version"),
                                          last_turn_version=body.get("last_turn_version"),
                                          informative=bool(body.get("informative", True)),
                                          durations_s=tuple(body.get("durations_s") or ()))

    with ThreadPoolExecutor(max_workers=8) as pool:
        marks = {g: m for g, m in pool.map(mark, redo) if m is not None}
    kn = _groups.knobs(cfg)
    buffer, _ = rs.update_buffer(run_id, lambda b: engine.rewind_for_session(b, at, version=version, knobs=kn,
                                                                              marks=marks, session_name=session_name))
    logger.info("group engine rewound", extra={
        "reused": sum(1 for g in buffer.groups if g.reused), "rolled_again": sum(1 for g in buffer.groups if g.status == "queued"),
        "discarded_rollouts": buffer.discarded_rollouts, "policy_version": version})


def session_clock(rs: RunStore, run_id: str, execution_arn: str, cfg: RunConfig, session_name: str,
                  status: str | None = None) -> RunState:
    """Record the new session's own CreationTime as ``session_created_at`` (the cost ledger counts its
    seconds from it; Init's clock stood in until now) and, when given, its ``status``; one state write."""
    created_at = sagemaker.creation_time(sagemaker.control_plane(cfg.region), session_name)
    return rs.update_state(run_id, lambda s: ledger.session_clock(s, session_name, created_at=created_at, status=status),
                           execution_arn=execution_arn)


def refuse_on_this_stack(cfg: RunConfig, rs: RunStore, execution_arn: str = "") -> RunConfig:
    """`stepwise.core.preflight.refuse_before_billing` against this function's stack (its environment,
    and the account of the execution ARN); returns the config with its region resolved.

    Raises:
        RunRefused: every problem at once (region, runtime, S3 locations).
    """
    from stepwise.aws.s3_probe import probes
    from stepwise.core.preflight import StackScope, arn_account, refuse_before_billing

    s = settings()
    scope = StackScope(region=s.region, bucket=s.bucket, data_buckets=s.data_buckets,
                       agent_runtime_arns=s.agent_runtime_arns, account=arn_account(execution_arn),
                       judge_model_ids=s.judge_model_ids, gateway_concurrency=s.gateway_concurrency)
    return refuse_before_billing(cfg, scope, probes(rs.s3))


def validate_inputs(raw_config: Any, rs: RunStore, run_id: str | None = None,
                    execution_arn: str = "") -> tuple[RunConfig, int, list[EvalSetRows]]:
    """``(RunConfig, dataset rows, eval sets)``; raises ConfigError / RunRefused / DatasetError / ClientError first.

    The datasets are streamed, so memory does not grow with their size. With ``run_id``, each is also
    written once as the run's snapshot (`snapshot_dataset`), which PlanStep reads batch by batch: the
    training dataset as kind ``train`` (not read at all by an eval-only run, whose rows are 0), the
    unnamed eval set as ``eval``, a named one as ``eval-NAME``. The eval sets share one row space
    (`stepwise.records.EvalSetRows`), and one eval (every set's first ``eval_max_prompts`` rows x
    ``eval_group_size``) must fit one Distributed Map run. No SageMaker call happens here.
    """
    from stepwise.config import load_run_config
    from stepwise.datasets import check_dataset

    cfg = refuse_on_this_stack(load_run_config(raw_config), rs, execution_arn)
    rs.s3.head_bucket(Bucket=rs.bucket)

    def rows_of(path: str, min_rows: int, kind: str) -> int:
        if run_id is None:
            return check_dataset(path, min_rows, s3_client=rs.s3)
        return snapshot_dataset(rs, run_id, kind, path, min_rows).rows

    rows = 0 if cfg.eval_only else rows_of(cfg.dataset_path, cfg.batch_size, "train")
    eval_sets: list[EvalSetRows] = []
    offset = 0
    for name, path in cfg.eval_set_paths.items():
        kind = eval_snapshot_kind(name)
        n = rows_of(path, 1, kind)
        eval_sets.append(EvalSetRows(name=name, kind=kind, rows=n, offset=offset))
        offset += n
    check_eval_fits(cfg, eval_sets)
    return cfg, rows, eval_sets


def eval_snapshot_kind(name: str) -> str:
    """The dataset snapshot kind of eval set ``name``: ``eval`` (unnamed), ``eval-NAME``."""
    return f"eval-{name}" if name else "eval"


def check_eval_fits(cfg: RunConfig, eval_sets: list[EvalSetRows]) -> None:
    """Refuse (before billing) an eval whose rollouts do not fit one Distributed Map run.

    Raises:
        RunRefused: naming the sets, their prompts and the limit.
    """
    from stepwise.core.evals import eval_batch_rows
    from stepwise.core.preflight import RunRefused
    from stepwise.core.service_limits import DISTRIBUTED_MAP_MAX_CHILDREN

    prompts = len(eval_batch_rows(eval_sets, cfg.eval_max_prompts))
    rollouts = prompts * cfg.eval_group_size
    if rollouts > DISTRIBUTED_MAP_MAX_CHILDREN:
        raise RunRefused([f"eval_group_size: an eval rolls out {prompts} prompts of {len(eval_sets)} eval set(s) x "
                          f"{cfg.eval_group_size} = {rollouts} rollouts in one Map run, more than "
                          f"{DISTRIBUTED_MAP_MAX_CHILDREN}; lower eval_max_prompts or eval_group_size"])


def snapshot_dataset(rs: RunStore, run_id: str, kind: str, path: str, min_rows: int) -> Any:
    """Validate ``path`` while writing it as shards under ``runs/{run_id}/dataset/{kind}/``, then its index.

    The index is written last, so a PlanStep never sees a partial snapshot; a retried Init rewrites
    the same shards. Returns the `stepwise.datasets.DatasetIndex`. Raises DatasetError as
    `stepwise.datasets.shard_dataset`.
    """
    from stepwise.datasets import shard_dataset

    index = shard_dataset(path, min_rows, lambda i, body: rs.put_bytes(dataset_shard_key(run_id, kind, i), body),
                          s3_client=rs.s3)
    rs.put_json(dataset_index_key(run_id, kind), index.model_dump())
    logger.info("dataset snapshot written", extra={"kind": kind, "rows": index.rows, "shards": len(index.shard_starts)})
    return index


def cache_tokenizer(cfg: RunConfig, created: sagemaker.CreatedSession, rs: RunStore, run_id: str) -> int:
    """Copy the tokenizer files to ``runs/{run_id}/tokenizer/`` for the gateway; returns files written.

    Source: ``cfg.tokenizer_path`` (an ``s3://`` prefix of tokenizer files, or a model id / local
    directory), else the SDK's own resolution for the base model (``_utils.load_tokenizer``:
    Hub lookup of the HuggingFace id, then ``AutoTokenizer.from_pretrained``).
    """
    prefix = tokenizer_prefix(run_id)
    if cfg.tokenizer_path.startswith("s3://"):
        from stepwise.config import parse_s3_uri
        from stepwise.aws.s3_probe import as_prefix

        bucket, key = parse_s3_uri(cfg.tokenizer_path)
        key = as_prefix(key)
        n = 0
        for page in rs.s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=key):
            for obj in page.get("Contents", []):
                name = obj["Key"][len(key):]
                if name and "/" not in name:
                    rs.s3.copy_object(Bucket=rs.bucket, Key=prefix + name, CopySource={"Bucket": bucket, "Key": obj["Key"]})
                    n += 1
        if n == 0:
            raise ValueError(f"tokenizer_path {cfg.tokenizer_path!r} holds no files")
        return n
    from sagemaker.train.training_session._utils import load_tokenizer

    if cfg.tokenizer_path:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(cfg.tokenizer_path)
    else:
        from stepwise.aws.hub import hf_token_environment

        svc = sagemaker.service_client(cfg)
        with hf_token_environment():  # a gated repository: HF_TOKEN, else the stack's secret (refusals checked it)
            tokenizer = load_tokenizer(created.base_model_arn, svc._get_hub_client(), created.hf_model_id)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save_pretrained(tmp)
        files = [p for p in Path(tmp).iterdir() if p.is_file()]
        for p in files:
            rs.put_bytes(prefix + p.name, p.read_bytes())
    return len(files)


def initialize(event: InitEvent) -> dict[str, Any]:
    rs = store()
    run_id, continuation = resolve_run(event.execution_name, event.input)
    bind(run_id=run_id)
    if continuation is not None:
        state = take_over(rs, run_id, event.execution_arn, continuation)
        if continuation.get("resume"):
            state = resume(rs, run_id, event.execution_arn, state)
        logger.info("continuing run", extra={"segment": state.segment, "step": state.step})
        return _output(run_id, event.execution_arn, ready=state.session_status == sagemaker.RUNNING)

    if (problem := run_id_problem(run_id)) is not None:  # a name Step Functions takes but continuations cannot
        from stepwise.core.preflight import RunRefused

        raise RunRefused([problem])
    try:
        existing, _ = rs.read_state(run_id)
    except RunNotFound:
        existing = None
    if existing is not None and existing.owner_execution_arn != event.execution_arn:
        raise RunOwnedElsewhere(f"run {run_id!r} already exists, owned by {existing.owner_execution_arn}")

    cfg, rows, eval_sets = validate_inputs(event.input, rs, run_id, event.execution_arn)
    session_name = session_name_for(run_id)
    refuse_foreign_session(cfg, run_id, event.execution_arn, session_name)
    if existing is None:
        rs.put_json(config_key(run_id), cfg.model_dump(mode="json"))
        rs.create_state(
            RunState(
                run_id=run_id,
                owner_execution_arn=event.execution_arn,
                training_session_name=session_name,
                session_status="Creating",
                session_created_at=now(),
                dataset_rows=rows,
                eval_rows=sum(e.rows for e in eval_sets),
                eval_sets=eval_sets,
                eval_only=cfg.eval_only,
                resume_loaded=not (cfg.resume_from_model_package or cfg.eval_model_package_arn
                                   or cfg.saves_initial_sampler),
                ledger=Ledger(run_started_at=now()),  # the cost ledger; max_run_hours counts from here
            )
        )
    if cfg.admission == "group":
        _groups.create_buffer(rs, rs.read_state(run_id)[0], cfg)
    created = create_own_session(rs, cfg, run_id, event.execution_arn, session_name)
    logger.info("training session created", extra={"training_session_name": session_name})
    n = cache_tokenizer(cfg, created, rs, run_id)
    logger.info("tokenizer cached", extra={"files": n, "prefix": tokenizer_prefix(run_id)})
    # A session that is already Running (warm capacity, the local simulator) needs no Wait state;
    # a resumed one still goes through PollSession, which loads the checkpoint.
    status, _ = sagemaker.describe_session(sagemaker.control_plane(cfg.region), session_name)
    ready = status == sagemaker.RUNNING and not (cfg.resume_from_model_package or cfg.eval_model_package_arn
                                                 or cfg.saves_initial_sampler)
    session_clock(rs, run_id, event.execution_arn, cfg, session_name, status if ready else None)
    return _output(run_id, event.execution_arn, ready=ready)


handler = entrypoint(InitEvent, initialize, transient_retry=True)
