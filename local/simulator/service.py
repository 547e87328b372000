"""The simulated services' state and semantics, independent of HTTP.

``Simulator.call(service, operation, params) -> dict`` answers one botocore operation of the
``sagemaker`` control plane (training sessions, the Hub and model-registry lookups the SDK
makes) or of the ``sagemakertrainingsessionruntime`` service, raising ``ApiError`` with the
service's error code. Semantics (docs/internals.md, the simulator):

* Sessions go ``Created`` -> ``Running`` (after ``session_start_seconds``) -> ``Stopping`` ->
  ``Stopped``; a stop from Stopping/Stopped/Failed/Expired is a ``ValidationException`` naming the
  transition (the SDK's ``_stop_already_done`` reads it, Expired excepted); only terminal sessions
  delete. An ``expire`` fault (or `Simulator.expire_session`) moves a session to ``Expired``.
* For ``warmup_seconds`` after a session turns ``Running`` its runtime answers 503 (the SDK's
  "transient unavailability while the runtime finishes warming up"), and for ``binding_seconds``
  after ``save_weights`` registers a model package, sampling operations naming it answer 503 (the
  SDK's "the service may still be binding to the new checkpoint"); ``unavailable`` faults do the
  same on demand (`local.simulator.faults`).
* Operations are asynchronous: Execute* answers an ``operationId`` at once; a worker moves the
  operation ``Pending`` -> ``InProgress`` -> ``Completed`` | ``Failed`` (``Skipped`` when the
  session stops first). Get*OperationResult long-polls up to ``result_wait_seconds`` (the
  SDK polls every 2 s, so an answer that waits for completion keeps the local stack fast).
* Training operations run strictly in ``sequenceNumber`` order starting at 1; a gap blocks
  every later one. A repeated (sequenceNumber, clientToken) returns the original operation;
  the same sequence number with another token is a ``ConflictException``.
* Saves register model packages (ARNs in the session's model package group) holding exact
  copies of the weights (and, for saveState, the optimizer state).
* What a session samples once it loaded new weights (``loadWeightsForSampling``), which the service
  does not document, is the ``serving`` option (`SERVING`, `stepwise.core.sampler_binding` names the
  same behaviours): ``several`` (default) samples the package a sample names, whatever was loaded;
  ``latest`` samples only the package loaded last (``modelPackageArn`` absent = that one) and refuses
  a sample naming another with a ``ValidationException``; ``switching`` answers every sample with the
  package loaded last, whatever it names; ``disturbing`` samples the named package like ``several``,
  but a sample in flight while a load begins or ends answers garbage logprobs (the second half of each
  sequence's are 1.0 lower than the model's). A sample is in flight from its ``ExecuteSamplingOperation``
  to its completion and samples the weights it was accepted with. ``sampling_contention_seconds``
  slows every sampling operation that runs while a training operation of its session runs.
"""

from __future__ import annotations

import collections
import fnmatch
import itertools
import json
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from local.simulator import engine
from local.simulator.faults import CALL_KINDS, FaultPlan
from local.simulator.model import ASSETS_DIR
from local.simulator.validation import CONTROL, RUNTIME, error, validate

BASE_MODEL_NAME = "stepwise-tiny"
BASE_MODEL_VERSION = "1.0.0"
#: The same tiny model published as a *gated* hub model (its document says ``GatedBucket``, as the hub marks
#: models whose license must be accepted): CreateTrainingSession refuses it without ``ModelConfig.AcceptEula``,
#: so the refusal before billing has a drill. Its published id is its own folder, ``tiny-model-gated`` beside the
#: assets: a symlink to the same files (tracked; made on start when ``STEPWISE_TINY_MODEL_DIR`` points elsewhere).
#: The SDK's catalogue needs one id per model, and a listing shows two models, not one folder spelled twice.
GATED_MODEL_NAME = "stepwise-tiny-gated"
GATED_MODEL_DIR = ASSETS_DIR.with_name(f"{ASSETS_DIR.name}-gated")
#: Hub content name -> (display name, gated, published id): the models this simulator serves.
HUB_MODELS: dict[str, tuple[str, bool, str]] = {
    BASE_MODEL_NAME: ("Stepwise tiny byte-level LM (simulator)", False, str(ASSETS_DIR)),
    GATED_MODEL_NAME: ("Stepwise tiny byte-level LM, gated: accept its EULA (simulator)", True, str(GATED_MODEL_DIR)),
}
PUBLIC_HUB = "SageMakerPublicHub"
TRAINING_CAPABILITY_KEYWORD = "@capability:training_session"

RUNTIME_OPERATIONS = frozenset(
    {"ExecuteTrainingOperation", "GetTrainingOperationResult", "ExecuteSamplingOperation", "GetSamplingOperationResult"}
)
_ACTIVE = ("Created", "Scheduled", "Running")
_STOP_NOOP = ("Stopping", "Stopped", "Failed", "Expired", "Deleting", "DeletionFailed")
_DELETABLE = ("Stopped", "Failed", "Expired", "DeletionFailed")

#: What a session samples once it loaded new weights (module docstring).
SERVING = ("several", "latest", "switching", "disturbing")
#: How much lower the garbage logprobs of a disturbed sample are (``serving="disturbing"``).
DISTURBED_LOGPROB_SHIFT = 1.0

TRAINING_KINDS = {
    "forward": "forward",
    "forwardBackward": "forward_backward",
    "optimizerStep": "optim_step",
    "saveWeights": "save_weights",
    "saveState": "save_state",
    "loadState": "load_state",
}
SAMPLING_KINDS = {
    "sample": "sample",
    "computeLogprobs": "compute_logprobs",
    "loadWeightsForSampling": "load_weights_for_sampling",
}


@dataclass
class Operation:
    id: str
    kind: str
    member: str  # the operationConfig union member, also the operationResult member
    config: dict[str, Any]
    seq: int | None = None
    token: str | None = None
    status: str = "Pending"
    result: dict[str, Any] | None = None
    error_details: str | None = None
    tokens: int = 0
    done: threading.Event = field(default_factory=threading.Event)

    def finish(self, status: str, result: dict[str, Any] | None = None, error_details: str | None = None) -> None:
        self.status, self.result, self.error_details = status, result, error_details
        self.done.set()

    def answer(self) -> dict[str, Any]:
        out: dict[str, Any] = {"status": self.status}
        if self.status == "Completed" and self.result is not None:
            out["operationResult"] = {self.member: self.result}
        if self.error_details:
            out["errorDetails"] = self.error_details
        if self.tokens and self.kind in ("forward", "forward_backward"):
            out["tokenUsage"] = {"trainingTokens": self.tokens}
        return out


@dataclass
class Session:
    name: str
    arn: str
    request: dict[str, Any]
    group_name: str
    group_arn: str
    created: float
    ready_at: float
    start_mode: str  # "ok" | "hang" | "fail"
    status: str = "Created"
    modified: float = 0.0
    end_time: float | None = None
    error_details: str | None = None
    stop_at: float | None = None
    running_at: float | None = None
    trainer: engine.TrainerState | None = None
    training_ops: dict[int, Operation] = field(default_factory=dict)
    ops: dict[str, Operation] = field(default_factory=dict)
    next_seq: int = 1
    last_received_seq: int | None = None
    cond: threading.Condition = field(default_factory=threading.Condition)
    worker: threading.Thread | None = None
    tokens: collections.Counter = field(default_factory=collections.Counter)
    serving: str | None = None  # this session's serving mode (None = the simulator's)
    contention_seconds: float | None = None  # this session's sampling contention (None = the simulator's)
    loaded_arn: str = ""  # the package loaded for sampling last ("" = the base model)
    loads_begun: int = 0
    loads_done: int = 0
    training_busy: bool = False


class Simulator:
    """All state of one simulator instance (thread-safe)."""

    def __init__(
        self,
        *,
        region: str = "us-west-2",
        account_id: str = "123456789012",
        result_wait_seconds: float = 5.0,
        session_start_seconds: float = 0.0,
        session_stop_seconds: float = 0.0,
        session_start: str = "ok",
        warmup_seconds: float = 0.0,
        binding_seconds: float = 0.0,
        sampling_workers: int = 2,
        fault_seed: int = 0,
        torch_threads: int | None = 1,
        state_dir: str | None = None,
        serving: str = "several",
        sampling_contention_seconds: float = 0.0,
    ) -> None:
        if session_start not in ("ok", "hang", "fail"):
            raise ValueError(f"session_start must be ok, hang or fail, got {session_start!r}")
        self.region = region
        self.account_id = account_id
        self.result_wait_seconds = float(result_wait_seconds)
        self.session_start_seconds = float(session_start_seconds)
        self.session_stop_seconds = float(session_stop_seconds)
        self.session_start = session_start
        self.warmup_seconds = float(warmup_seconds)
        self.binding_seconds = float(binding_seconds)
        self.serving = check_serving(serving)
        self.session_serving: dict[str, str] = {}  # session name -> its serving mode (`set_session_serving`)
        self.session_contention: dict[str, float] = {}  # session name -> its sampling contention, seconds
        self.sampling_contention_seconds = float(sampling_contention_seconds)
        self.faults = FaultPlan(seed=fault_seed)
        #: An IAM grant on the caller's side: a call naming a training session whose name does not match
        #: this pattern (fnmatch, like an IAM resource ``training-session/stepwise-*``) is refused with
        #: AccessDeniedException, as IAM refuses it for a role granted that pattern only. None = all.
        self.granted_sessions: str | None = None
        if torch_threads:
            # Process-wide. The model's matrices are 64 wide: intra-op threads only add
            # synchronisation, and on a loaded machine they thrash (10-50x slower sampling).
            import torch

            torch.set_num_threads(torch_threads)
        self._lock = threading.RLock()
        self._sessions: dict[str, Session] = {}
        self._packages: dict[str, engine.ModelPackage] = {}
        self._groups: dict[str, dict[str, Any]] = {}
        self._counters: collections.Counter = collections.Counter()
        self._closed = False
        self._sampling_pool = ThreadPoolExecutor(max_workers=sampling_workers, thread_name_prefix="sim-sampling")
        self._samplers: collections.OrderedDict[str, engine.Sampler] = collections.OrderedDict()
        self._sampler_lock = threading.Lock()
        self._base = engine.base_model()
        if not GATED_MODEL_DIR.exists():  # the tracked link is beside the shipped assets only
            GATED_MODEL_DIR.symlink_to(ASSETS_DIR.name, target_is_directory=True)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(str(ASSETS_DIR))
        self._eos_ids = [self.tokenizer.convert_tokens_to_ids(t) for t in ("<|im_end|>", "<|endoftext|>")]
        self._op_ids = itertools.count(1)
        self.state_dir = Path(state_dir) if state_dir else None
        if self.state_dir is not None:
            self._load_packages()
        engine.TrainerState.from_base(self._base)  # warm torch.optim's lazy imports off the request path

    # ------------------------------------------------------------ public helpers

    @property
    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def count(self, key: str, n: int = 1) -> None:
        with self._lock:
            self._counters[key] += n

    def reset_counters(self) -> None:
        with self._lock:
            self._counters.clear()

    def session_statuses(self) -> dict[str, str]:
        with self._lock:
            return {name: self._refresh(s).status for name, s in self._sessions.items()}

    def session_seconds(self) -> dict[str, dict[str, float | None]]:
        """What each session served, for the cost ledger's tests: ``created`` (its CreationTime),
        ``stop_requested`` (StopTrainingSession; None while it runs), ``ended`` (its EndTime: Stopped or
        Failed; None before) and ``seconds`` from creation to the stop request (to now while it runs):
        the seconds a run's ledger counts for it. The ``Stopping`` time after a stop request is
        ``session_stop_seconds`` (0 by default)."""
        now = time.time()
        with self._lock:
            sessions = [self._refresh(s) for s in self._sessions.values()]
        out: dict[str, dict[str, float | None]] = {}
        for s in sessions:
            requested = None if s.stop_at is None else s.stop_at - self.session_stop_seconds
            end = requested if requested is not None else (s.end_time if s.end_time is not None else now)
            out[s.name] = {"created": s.created, "stop_requested": requested, "ended": s.end_time,
                           "seconds": max(0.0, end - s.created)}
        return out

    def running_sessions(self) -> list[str]:
        """Names of sessions not yet stopped (Created, Scheduled or Running)."""
        return sorted(name for name, status in self.session_statuses().items() if status in _ACTIVE)

    def expire_session(self, name: str, reason: str = "the training session expired") -> None:
        """Move an active session to ``Expired`` (``EndTime`` and ``ErrorDetails`` set; queued
        operations end ``Skipped``). Unknown or already ended sessions are left alone."""
        with self._lock:
            s = self._sessions.get(name)
            if s is None or self._refresh(s).status not in _ACTIVE:
                return
            now = time.time()
            s.status, s.modified, s.end_time, s.error_details = "Expired", now, now, reason
        with s.cond:
            for op in s.ops.values():
                if op.status == "Pending":
                    op.finish("Skipped", error_details=f"The training session expired before this operation ran: {reason}")
            s.cond.notify_all()

    def sampling_in_flight(self, session: str | None = None) -> int:
        """Sample and computeLogprobs operations accepted and not yet answered, in ``session`` or every
        session (drills that must act while a sample is in flight wait for this to be positive)."""
        with self._lock:
            sessions = [s for s in self._sessions.values() if session is None or s.name == session]
        n = 0
        for s in sessions:
            with s.cond:
                n += sum(1 for op in s.ops.values() if op.seq is None and op.kind != "load_weights_for_sampling"
                         and op.status in ("Pending", "InProgress"))
        return n

    def session_weights(self, name: str) -> dict[str, Any]:
        """A copy of a session's current trainable weights (for tests comparing states)."""
        s = self._get_session(CONTROL, name)
        assert s.trainer is not None
        return engine.snapshot_weights(s.trainer)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            sessions = list(self._sessions.values())
        for s in sessions:
            with s.cond:
                s.cond.notify_all()
        self._sampling_pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------ dispatch

    def call(self, service: str, operation: str, params: dict[str, Any]) -> dict[str, Any]:
        """Answer one API call; raises ``ApiError``."""
        self.count(operation)
        handler: Callable[[dict[str, Any]], dict[str, Any]] | None = getattr(self, f"_op_{operation}", None)
        if handler is None or (service == RUNTIME) != (operation in RUNTIME_OPERATIONS):
            raise error(service, "validation", f"operation {operation} is not implemented by the simulator")
        injected = self.faults.take(CALL_KINDS, operation)
        if injected == "throttle":
            raise error(service, "throttle", f"Rate exceeded for {operation} (injected fault)")
        if injected == "internal":
            raise error(service, "internal", f"Internal error in {operation} (injected fault)")
        if injected == "unavailable":
            raise error(service, "unavailable", f"{operation}: the service is not ready (injected fault)")
        name = params.get("TrainingSessionName") or params.get("trainingSessionName")
        if not name and str(params.get("ResourceArn", "")).startswith(self._session_arn("")):
            name = str(params["ResourceArn"]).rsplit("/", 1)[-1]  # ListTags / AddTags of a session
        if name and self.granted_sessions and not fnmatch.fnmatchcase(str(name), self.granted_sessions):
            raise error(service, "access_denied", f"not authorized to perform {operation} on training-session/{name} "
                                                  f"(the caller is granted training-session/{self.granted_sessions})")
        if name and self.faults.take(("expire",), operation):
            self.expire_session(str(name), "the training session expired (injected fault)")
        delay = self.faults.latency(operation)
        if delay:
            time.sleep(delay)
        validate(service, operation, params)
        return handler(params)

    # ------------------------------------------------------------ sessions

    def _session_arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:training-session/{name}"

    def _refresh(self, s: Session) -> Session:
        """Advance time-driven transitions (start, stop) of ``s``; returns ``s``."""
        now = time.time()
        with self._lock:
            if s.status == "Created" and s.start_mode != "hang" and now >= s.ready_at:
                if s.start_mode == "fail":
                    s.status, s.error_details, s.end_time = "Failed", "Capacity error: the session could not start (injected fault)", now
                else:
                    s.status, s.running_at = "Running", now
                s.modified = now
            if s.status == "Stopping" and s.stop_at is not None and now >= s.stop_at:
                s.status, s.modified, s.end_time = "Stopped", now, now
            return s

    def _get_session(self, service: str, name: str) -> Session:
        with self._lock:
            s = self._sessions.get(name)
        if s is None:
            raise error(service, "not_found", f"Training session {name!r} does not exist")
        return self._refresh(s)

    def _op_CreateTrainingSession(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["TrainingSessionName"]
        base_arn = p["ModelConfig"]["BaseModelArn"]
        hub_name = base_arn.split("/")[3] if base_arn.count("/") >= 3 else ""
        if hub_name not in HUB_MODELS:
            raise error(CONTROL, "not_found", f"Base model {base_arn!r} is not served here; the simulator serves "
                                              f"{', '.join(self._hub_arn(n) for n in HUB_MODELS)}")
        if HUB_MODELS[hub_name][1] and not p["ModelConfig"].get("AcceptEula"):
            raise error(CONTROL, "validation", f"Base model {hub_name!r} is gated: its end-user license agreement must be "
                                               "accepted (ModelConfig.AcceptEula = true)")
        group_arn = p.get("ModelPackageGroupArn") or self._ensure_group("sagemaker-default")
        group_name = group_arn.rsplit("/", 1)[-1]
        lora = p["LoraConfig"]
        trainer = engine.TrainerState.from_base(self._base, int(lora["Rank"]), float(lora["Alpha"]))
        now = time.time()
        with self._lock:
            if name in self._sessions:
                raise error(CONTROL, "in_use", f"Training session {name!r} already exists")
            self._ensure_group(group_name)
            s = Session(
                name=name,
                arn=self._session_arn(name),
                request=p,
                group_name=group_name,
                group_arn=group_arn,
                created=now,
                modified=now,
                ready_at=now + self.session_start_seconds,
                start_mode=self.session_start,
                trainer=trainer,
                serving=self.session_serving.get(name),
                contention_seconds=self.session_contention.get(name),
            )
            self._sessions[name] = s
        s.worker = threading.Thread(target=self._training_worker, args=(s,), name=f"sim-train-{name}", daemon=True)
        s.worker.start()
        return {"TrainingSessionArn": s.arn}

    def _detail(self, s: Session) -> dict[str, Any]:
        r = s.request
        d: dict[str, Any] = {
            "TrainingSessionArn": s.arn,
            "TrainingSessionName": s.name,
            "TrainingSessionStatus": s.status,
            "ModelPackageGroupArn": s.group_arn,
            "CreationTime": s.created,
            "LastModifiedTime": s.modified,
            "RoleArn": r["RoleArn"],
            "LoraConfig": r["LoraConfig"],
            "ModelConfig": r["ModelConfig"],
            "OutputConfig": r["OutputConfig"],
            "BillableTokenUsage": {
                "PrefillTokenCount": s.tokens["prefill"],
                "SampleTokenCount": s.tokens["sample"],
                "TrainingTokenCount": s.tokens["training"],
            },
        }
        for key in ("VpcConfig", "Tags"):
            if key in r:
                d[key] = r[key]
        if s.end_time is not None:
            d["EndTime"] = s.end_time
        if s.error_details:
            d["ErrorDetails"] = s.error_details
        if s.last_received_seq is not None:
            d["LastReceivedSequenceNumber"] = s.last_received_seq
        return d

    def _session_of_arn(self, arn: str) -> Session:
        prefix = self._session_arn("")
        if not arn.startswith(prefix):
            raise error(CONTROL, "validation", f"ResourceArn {arn!r}: the simulator tags training sessions only")
        return self._get_session(CONTROL, arn[len(prefix):])

    def _op_ListTags(self, p: dict[str, Any]) -> dict[str, Any]:
        """ListTags of a training session's ARN: the tags it was created with and those AddTags added
        (what DescribeTrainingSession's ``Tags`` also returns)."""
        s = self._session_of_arn(p["ResourceArn"])
        with self._lock:
            tags = list(s.request.get("Tags") or [])
        page, token = _paginate(tags, p.get("NextToken"), p.get("MaxResults") or 50)
        return {"Tags": page, **({"NextToken": token} if token else {})}

    def _op_AddTags(self, p: dict[str, Any]) -> dict[str, Any]:
        """AddTags to a training session's ARN: a key already present takes the new value (botocore
        ``AddTags``: "overwrites the value"); answers the session's tags."""
        s = self._session_of_arn(p["ResourceArn"])
        with self._lock:
            tags = {t["Key"]: t["Value"] for t in s.request.get("Tags") or []}
            tags.update({t["Key"]: t["Value"] for t in p["Tags"]})
            s.request["Tags"] = [{"Key": k, "Value": v} for k, v in tags.items()]
            return {"Tags": list(s.request["Tags"])}

    def seed_model_packages(self, session_name: str, n: int) -> list[str]:
        """Register ``n`` model packages of a session's current weights, as ``n`` save_weights would
        (one weights object shared by all: a drill's thousand packages cost one copy); returns their ARNs
        in creation order. For drills that need a long run's packages (retention), not a run."""
        s = self._get_session(CONTROL, session_name)
        assert s.trainer is not None
        weights = engine.snapshot_weights(s.trainer)
        return [self._register_package(s, "weights", "", weights).arn for _ in range(n)]

    def _op_DescribeTrainingSession(self, p: dict[str, Any]) -> dict[str, Any]:
        return {"TrainingSessionDetail": self._detail(self._get_session(CONTROL, p["TrainingSessionName"]))}

    def _op_ListTrainingSessions(self, p: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            sessions = [self._refresh(s) for s in self._sessions.values()]
        sessions.sort(key=lambda s: s.created, reverse=True)
        if p.get("NameContains"):
            sessions = [s for s in sessions if p["NameContains"] in s.name]
        if p.get("StatusEquals"):
            sessions = [s for s in sessions if s.status == p["StatusEquals"]]
        for key, keep in (("CreationTimeAfter", lambda s, t: s.created > t), ("CreationTimeBefore", lambda s, t: s.created < t)):
            if p.get(key) is not None:
                t = _epoch(p[key])
                sessions = [s for s in sessions if keep(s, t)]
        page, token = _paginate(sessions, p.get("NextToken"), p.get("MaxResults") or 100)
        out: dict[str, Any] = {
            "TrainingSessionSummaries": [
                {
                    "TrainingSessionArn": s.arn,
                    "TrainingSessionStatus": s.status,
                    "CreationTime": s.created,
                    "LastModifiedTime": s.modified,
                }
                for s in page
            ]
        }
        if token:
            out["NextToken"] = token
        return out

    def _op_StopTrainingSession(self, p: dict[str, Any]) -> dict[str, Any]:
        s = self._get_session(CONTROL, p["TrainingSessionName"])
        with self._lock:
            if s.status in _STOP_NOOP:
                raise error(CONTROL, "validation", f"Training session {s.name!r}: invalid session state transition from {s.status} to Stopping")
            now = time.time()
            s.status, s.modified, s.stop_at = "Stopping", now, now + self.session_stop_seconds
        with s.cond:
            for op in s.ops.values():
                if op.status in ("Pending",):
                    op.finish("Skipped", error_details="The training session was stopped before this operation ran")
            s.cond.notify_all()
        self._refresh(s)
        return {}

    def _op_DeleteTrainingSession(self, p: dict[str, Any]) -> dict[str, Any]:
        s = self._get_session(CONTROL, p["TrainingSessionName"])
        with self._lock:
            if s.status not in _DELETABLE:
                raise error(
                    CONTROL, "validation", f"Training session {s.name!r} is {s.status}; only Stopped or Failed sessions can be deleted"
                )
            del self._sessions[s.name]
        return {}

    # ------------------------------------------------------------ hub and registry

    def _hub_arn(self, name: str = BASE_MODEL_NAME) -> str:
        return f"arn:aws:sagemaker:{self.region}:aws:hub-content/{PUBLIC_HUB}/Model/{name}/{BASE_MODEL_VERSION}"

    def _hub_summary(self, name: str) -> dict[str, Any]:
        display, _, model_id = HUB_MODELS[name]
        return {
            "HubContentName": name,
            "HubContentArn": self._hub_arn(name),
            "HubContentVersion": BASE_MODEL_VERSION,
            "HubContentType": "Model",
            "DocumentSchemaVersion": "2.4.0",
            "HubContentDisplayName": display,
            "HubContentSearchKeywords": [TRAINING_CAPABILITY_KEYWORD, f"@huggingface-id:{model_id}"],
            "HubContentStatus": "Available",
            "CreationTime": 1764460800.0,
        }

    def _op_ListHubContents(self, p: dict[str, Any]) -> dict[str, Any]:
        if p["HubName"] not in (PUBLIC_HUB,) or p["HubContentType"] != "Model":
            return {"HubContentSummaries": []}
        return {"HubContentSummaries": [self._hub_summary(name) for name in HUB_MODELS]}

    def _op_DescribeHubContent(self, p: dict[str, Any]) -> dict[str, Any]:
        if p["HubContentName"] not in HUB_MODELS or p["HubContentType"] != "Model":
            raise error(CONTROL, "not_found", f"Hub content {p['HubContentName']!r} of type {p['HubContentType']} does not exist in {p['HubName']}")
        summary = self._hub_summary(p["HubContentName"])
        _, gated, model_id = HUB_MODELS[p["HubContentName"]]
        # The SDK loads the tokenizer with AutoTokenizer.from_pretrained(HuggingfaceId): a local directory
        # path works and nothing is downloaded. GatedBucket is the flag the SDK's own trainers read
        # (sagemaker.train.common_utils.finetune_utils) to require accept_eula.
        document = {"HuggingfaceId": model_id, **({"GatedBucket": True} if gated else {})}
        return summary | {
            "HubName": PUBLIC_HUB,
            "HubArn": f"arn:aws:sagemaker:{self.region}:aws:hub/{PUBLIC_HUB}",
            "HubContentDocument": json.dumps(document),
        }

    def _group_arn(self, name: str) -> str:
        return f"arn:aws:sagemaker:{self.region}:{self.account_id}:model-package-group/{name}"

    def _ensure_group(self, name: str, description: str = "") -> str:
        with self._lock:
            if name not in self._groups:
                self._groups[name] = {"arn": self._group_arn(name), "created": time.time(), "description": description, "versions": 0}
            return self._groups[name]["arn"]

    def _op_CreateModelPackageGroup(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["ModelPackageGroupName"]
        with self._lock:
            if name in self._groups:
                raise error(CONTROL, "in_use", f"Model package group {name!r} already exists")
            return {"ModelPackageGroupArn": self._ensure_group(name, p.get("ModelPackageGroupDescription", ""))}

    def _op_DescribeModelPackageGroup(self, p: dict[str, Any]) -> dict[str, Any]:
        name = p["ModelPackageGroupName"].rsplit("/", 1)[-1]
        with self._lock:
            g = self._groups.get(name)
        if g is None:
            raise error(CONTROL, "validation", f"Model package group {name!r} does not exist.")
        return {
            "ModelPackageGroupName": name,
            "ModelPackageGroupArn": g["arn"],
            "ModelPackageGroupDescription": g["description"],
            "CreationTime": g["created"],
            "CreatedBy": {},
            "ModelPackageGroupStatus": "Completed",
        }

    def _package_summary(self, mp: engine.ModelPackage) -> dict[str, Any]:
        return {
            "ModelPackageName": mp.group_name,
            "ModelPackageGroupName": mp.group_name,
            "ModelPackageVersion": mp.version,
            "ModelPackageArn": mp.arn,
            "ModelPackageDescription": mp.description,
            "CreationTime": mp.created,
            "ModelPackageStatus": "Completed",
            "ModelApprovalStatus": "PendingManualApproval",
        }

    def _op_ListModelPackages(self, p: dict[str, Any]) -> dict[str, Any]:
        group = (p.get("ModelPackageGroupName") or "").rsplit("/", 1)[-1]
        with self._lock:
            pkgs = [mp for mp in self._packages.values() if not group or mp.group_name == group]
        reverse = p.get("SortOrder", "Ascending") == "Descending"
        pkgs.sort(key=lambda mp: (mp.created, mp.version), reverse=reverse)
        page, token = _paginate(pkgs, p.get("NextToken"), p.get("MaxResults") or 100)
        out: dict[str, Any] = {"ModelPackageSummaryList": [self._package_summary(mp) for mp in page]}
        if token:
            out["NextToken"] = token
        return out

    def _package(self, arn: str) -> engine.ModelPackage | None:
        """The package ``arn``; with a ``state_dir``, also one another simulator saved there since this
        one started (local runs share the folder: an eval of an earlier run's checkpoint)."""
        with self._lock:
            mp = self._packages.get(arn)
        if self.state_dir is not None:
            if mp is None:
                return self._load_package_of(arn)
            if not (self.state_dir / f"{mp.group_name}-{mp.version}.json").exists():  # deleted by another simulator
                with self._lock:
                    self._packages.pop(arn, None)
                return None
        return mp

    def _op_DescribeModelPackage(self, p: dict[str, Any]) -> dict[str, Any]:
        mp = self._package(p["ModelPackageName"])
        if mp is None:
            raise error(CONTROL, "validation", f"Model package {p['ModelPackageName']!r} does not exist.")
        return self._package_summary(mp) | {
            "ModelPackageStatusDetails": {"ValidationStatuses": []},
            "InferenceSpecification": {
                "Containers": [
                    {
                        "Image": "stepwise-simulator:tiny",
                        "IsCheckpoint": mp.kind == "checkpoint",
                        "BaseModel": {"HubContentName": mp.base_model_name, "HubContentVersion": mp.base_model_version},
                        "ModelDataSource": {
                            "S3DataSource": {"S3Uri": mp.s3_uri, "S3DataType": "S3Prefix", "CompressionType": "None"}
                        },
                    }
                ]
            },
        }

    def _op_DeleteModelPackage(self, p: dict[str, Any]) -> dict[str, Any]:
        """DeleteModelPackage (botocore ``sagemaker``): the package and, with a ``state_dir``, its files.
        An unknown package answers ValidationException, as the service does (the SDK's
        ``delete_model_package`` reads that as "already gone")."""
        arn = p["ModelPackageName"]
        mp = self._package(arn)
        with self._lock:
            if mp is None or self._packages.pop(arn, None) is None:
                raise error(CONTROL, "validation", f"Model package {arn!r} does not exist.")
        with self._sampler_lock:
            self._samplers.pop(arn, None)
        if self.state_dir is not None:
            stem = self.state_dir / f"{mp.group_name}-{mp.version}"
            for suffix in (".pt", ".json"):
                stem.with_suffix(suffix).unlink(missing_ok=True)
        return {}

    def _register_package(self, s: Session, kind: str, description: str, weights, optimizer_state=None) -> engine.ModelPackage:
        with self._lock:
            g = self._groups[s.group_name]
            g["versions"] += 1
            version = g["versions"]
            if self.state_dir is not None:
                version = g["versions"] = self._claim_version(s.group_name, version)
            out = s.request["OutputConfig"]["S3Location"]["Path"].rstrip("/")
            mp = engine.ModelPackage(
                arn=f"arn:aws:sagemaker:{self.region}:{self.account_id}:model-package/{s.group_name}/{version}",
                group_name=s.group_name,
                group_arn=s.group_arn,
                version=version,
                kind=kind,
                description=description or f"{'checkpoint' if kind == 'checkpoint' else 'weights'} of training session {s.name}",
                created=time.time(),
                base_model_name=s.request["ModelConfig"]["BaseModelArn"].split("/")[3],
                base_model_version=BASE_MODEL_VERSION,
                s3_uri=f"{out}/{s.name}/{'checkpoints' if kind == 'checkpoint' else 'weights'}/{version}/",
                weights=weights,
                optimizer_state=optimizer_state,
            )
            self._packages[mp.arn] = mp
        if self.state_dir is not None:
            self._save_package(mp)
        return mp

    # ------------------------------------------------------------ persistence (state_dir)

    def _save_package(self, mp: engine.ModelPackage) -> None:
        """Write a package to ``state_dir`` (``{group}-{version}.pt`` + ``.json``), so a later
        simulator started on the same directory can load or sample it (local resume)."""
        import dataclasses

        import torch

        assert self.state_dir is not None
        self.state_dir.mkdir(parents=True, exist_ok=True)
        stem = self.state_dir / f"{mp.group_name}-{mp.version}"
        torch.save({"weights": mp.weights, "optimizer_state": mp.optimizer_state}, f"{stem}.pt")
        meta = {k: v for k, v in dataclasses.asdict(mp).items() if k not in ("weights", "optimizer_state")}
        stem.with_suffix(".json").write_text(json.dumps(meta))

    def _claim_version(self, group: str, version: int) -> int:
        """The first version >= ``version`` of ``group`` no simulator sharing ``state_dir`` has taken:
        claimed by creating its ``.json`` exclusively (O_EXCL), so two local runs at once never save
        two packages under one ARN. The metadata is written into the claimed file later."""
        assert self.state_dir is not None
        self.state_dir.mkdir(parents=True, exist_ok=True)
        while True:
            try:
                with (self.state_dir / f"{group}-{version}.json").open("x"):
                    return version
            except FileExistsError:
                version += 1

    def _load_package_of(self, arn: str) -> engine.ModelPackage | None:
        """Load one package from ``state_dir`` by ARN (``model-package/{group}/{version}``), if saved there."""
        import torch

        assert self.state_dir is not None
        group, _, version = arn.rpartition("model-package/")[2].partition("/")
        meta_path = self.state_dir / f"{group}-{version}.json"
        try:
            meta = json.loads(meta_path.read_text())
            tensors = torch.load(meta_path.with_suffix(".pt"), weights_only=True)
        except (OSError, ValueError):  # absent, or claimed and not written yet
            return None
        if meta.get("arn") != arn:
            return None
        mp = engine.ModelPackage(**meta, weights=tensors["weights"], optimizer_state=tensors["optimizer_state"])
        with self._lock:
            self._packages.setdefault(arn, mp)
            self._ensure_group(mp.group_name)
        return mp

    def _load_packages(self) -> None:
        import torch

        assert self.state_dir is not None
        for meta_path in sorted(self.state_dir.glob("*.json")):
            try:
                meta = json.loads(meta_path.read_text())
                tensors = torch.load(meta_path.with_suffix(".pt"), weights_only=True)
            except (OSError, ValueError):  # claimed by a running simulator, not written yet
                continue
            mp = engine.ModelPackage(**meta, weights=tensors["weights"], optimizer_state=tensors["optimizer_state"])
            self._packages[mp.arn] = mp
            self._ensure_group(mp.group_name)
            g = self._groups[mp.group_name]
            g["versions"] = max(g["versions"], mp.version)

    # ------------------------------------------------------------ runtime: training

    def _running_session(self, name: str) -> Session:
        s = self._get_session(RUNTIME, name)
        if s.status != "Running":
            raise error(RUNTIME, "validation", f"Training session {name!r} is {s.status}; operations are accepted only while it is Running")
        self._check_warm(s)
        return s

    def _check_warm(self, s: Session) -> None:
        """503 for ``warmup_seconds`` after ``s`` turned Running."""
        if self.warmup_seconds and s.running_at is not None and time.time() - s.running_at < self.warmup_seconds:
            raise error(RUNTIME, "unavailable", f"Training session {s.name!r} is Running but its runtime is still warming up")

    def _new_op_id(self) -> str:
        return f"op-{next(self._op_ids):08d}-{uuid.uuid4().hex[:12]}"

    def _op_ExecuteTrainingOperation(self, p: dict[str, Any]) -> dict[str, Any]:
        s = self._running_session(p["trainingSessionName"])
        (member, config), = [(k, v) for k, v in p["operationConfig"].items() if v is not None]
        seq, token = p["sequenceNumber"], p.get("clientToken")
        with s.cond:
            existing = s.training_ops.get(seq)
            if existing is not None:
                if token is not None and existing.token == token:
                    return {"operationId": existing.id}
                raise error(
                    RUNTIME,
                    "conflict",
                    f"sequenceNumber {seq} of session {s.name!r} was already used by operation {existing.id} "
                    f"with a different clientToken; resend the original clientToken or use the next sequence number",
                )
            if seq < s.next_seq:
                raise error(RUNTIME, "conflict", f"sequenceNumber {seq} of session {s.name!r} is already past (next expected {s.next_seq})")
            op = Operation(id=self._new_op_id(), kind=TRAINING_KINDS[member], member=member, config=config, seq=seq, token=token)
            s.training_ops[seq] = op
            s.ops[op.id] = op
            s.last_received_seq = max(s.last_received_seq or 0, seq)
            s.cond.notify_all()
        return {"operationId": op.id}

    def _training_worker(self, s: Session) -> None:
        while True:
            with s.cond:
                while not self._closed and s.status in _ACTIVE and not (
                    s.status == "Running" and s.next_seq in s.training_ops
                ):
                    s.cond.wait(timeout=0.2)
                    self._refresh(s)
                if self._closed or s.status not in _ACTIVE:
                    return
                op = s.training_ops[s.next_seq]
            if op.status == "Pending":
                s.training_busy = True
                try:
                    self._run(op, lambda op=op: self._apply_training(s, op))
                finally:
                    s.training_busy = False
            with s.cond:
                s.next_seq += 1
                s.cond.notify_all()

    def _run(self, op: Operation, apply: Callable[[], dict[str, Any]]) -> None:
        """Run ``op`` with its latency and fault rules; count it when applied."""
        op.status = "InProgress"
        delay = self.faults.latency(op.kind)
        if delay:
            time.sleep(delay)
        if self.faults.take(("fail",), op.kind):
            op.finish("Failed", error_details=f"{op.kind} operation {op.id} failed (injected fault)")
            return
        try:
            result = apply()
        except engine.OperationFailed as e:
            op.finish("Failed", error_details=str(e))
            return
        except Exception as e:  # a simulator bug must still end the operation
            op.finish("Failed", error_details=f"internal error: {type(e).__name__}: {e}")
            return
        self.count(op.kind)
        op.finish("Completed", result)

    def _apply_training(self, s: Session, op: Operation) -> dict[str, Any]:
        st = s.trainer
        assert st is not None
        c = op.config
        if op.kind in ("forward", "forward_backward"):
            result = engine.forward_backward(st, c, backward=op.kind == "forward_backward")
            op.tokens = int(result["metrics"]["global_token_num"])
            s.tokens["training"] += op.tokens
            return result
        if op.kind == "optim_step":
            return engine.optimizer_step(st, c)
        if op.kind == "save_weights":
            mp = self._register_package(s, "model", c.get("description", ""), engine.snapshot_weights(st))
            return {"modelPackageArn": mp.arn}
        if op.kind == "save_state":
            mp = self._register_package(
                s, "checkpoint", c.get("description", ""), engine.snapshot_weights(st), engine.snapshot_optimizer(st)
            )
            return {"modelPackageArn": mp.arn}
        if op.kind == "load_state":
            mp = self._package(c["modelPackageArn"])
            if mp is None:
                raise engine.OperationFailed(f"model package {c['modelPackageArn']!r} does not exist")
            engine.load_state(st, mp, bool(c["loadOptimizer"]))
            return {}
        raise engine.OperationFailed(f"unsupported training operation {op.member}")

    def _get_op(self, name: str, op_id: str) -> Operation:
        s = self._get_session(RUNTIME, name)
        self._check_warm(s)
        op = s.ops.get(op_id)
        if op is None:
            raise error(RUNTIME, "not_found", f"Operation {op_id!r} does not exist in training session {name!r}")
        return op

    def _wait_answer(self, op: Operation) -> dict[str, Any]:
        if self.result_wait_seconds > 0:
            op.done.wait(self.result_wait_seconds)
        return op.answer()

    def _op_GetTrainingOperationResult(self, p: dict[str, Any]) -> dict[str, Any]:
        op = self._get_op(p["trainingSessionName"], p["operationId"])
        if op.seq is None:
            raise error(RUNTIME, "not_found", f"Operation {op.id!r} is a sampling operation; use GetSamplingOperationResult")
        return self._wait_answer(op)

    # ------------------------------------------------------------ runtime: sampling

    def _sampler(self, arn: str) -> engine.Sampler:
        with self._sampler_lock:
            sampler = self._samplers.get(arn)
            if sampler is not None:
                self._samplers.move_to_end(arn)
                return sampler
        weights = None
        if arn:
            mp = self._package(arn)
            if mp is None:
                raise engine.OperationFailed(f"model package {arn!r} does not exist")
            weights = mp.weights
        sampler = engine.Sampler.from_weights(self._base, weights, self._eos_ids, self._decode)
        with self._sampler_lock:
            self._samplers[arn] = sampler
            while len(self._samplers) > 8:
                self._samplers.popitem(last=False)
        return sampler

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def _op_ExecuteSamplingOperation(self, p: dict[str, Any]) -> dict[str, Any]:
        s = self._running_session(p["trainingSessionName"])
        (member, config), = [(k, v) for k, v in p["operationConfig"].items() if v is not None]
        arn = config.get("modelPackageArn") or ""
        mp = self._package(arn) if arn else None
        if arn and mp is None:
            raise error(RUNTIME, "validation", f"model package {arn!r} does not exist")
        if mp is not None and self.binding_seconds and time.time() - mp.created < self.binding_seconds:
            raise error(RUNTIME, "unavailable", f"model package {arn!r} was saved moments ago; the session is still binding it")
        kind = SAMPLING_KINDS[member]
        op = Operation(id=self._new_op_id(), kind=kind, member=member, config=config)
        if kind == "load_weights_for_sampling":
            with s.cond:
                s.ops[op.id] = op
            self._sampling_pool.submit(self._run_load, s, op)
            return {"operationId": op.id}
        with s.cond:
            serves = self._serves(s, arn)
            flight = (s.loads_begun, s.loads_done)
            s.ops[op.id] = op
        self._sampling_pool.submit(self._run, op, lambda: self._apply_sampling(s, op, serves, flight))
        return {"operationId": op.id}

    def set_session_serving(self, name: str, mode: str | None) -> None:
        """Serve the session ``name`` (existing, or created later) in ``mode`` whatever the simulator's
        ``serving`` (drills that probe several behaviours at once on one simulator); None = the simulator's again."""
        mode = None if mode is None else check_serving(mode)
        with self._lock:
            if mode is None:
                self.session_serving.pop(name, None)
            else:
                self.session_serving[name] = mode
            s = self._sessions.get(name)
            if s is not None:
                s.serving = mode

    def set_session_contention(self, name: str, seconds: float | None) -> None:
        """Slow the sampling operations of session ``name`` (existing or created later) that run beside one of
        its training operations by ``seconds`` (None: the simulator's ``sampling_contention_seconds`` again)."""
        with self._lock:
            if seconds is None:
                self.session_contention.pop(name, None)
            else:
                self.session_contention[name] = float(seconds)
            s = self._sessions.get(name)
            if s is not None:
                s.contention_seconds = None if seconds is None else float(seconds)

    def serving_of(self, s: Session) -> str:
        return s.serving or self.serving

    def _serves(self, s: Session, arn: str) -> str:
        """The package a sample naming ``arn`` runs on, by the ``serving`` option (module docstring);
        raises the ``latest`` refusal. Called with ``s.cond`` held."""
        serving = self.serving_of(s)
        if serving in ("several", "disturbing"):
            return arn
        if serving == "switching" or not arn or arn == s.loaded_arn:
            return s.loaded_arn
        raise error(RUNTIME, "validation",
                    f"model package {arn!r} is not loaded for sampling in training session {s.name!r}, which serves "
                    f"{s.loaded_arn or 'the base model'}; load it with loadWeightsForSampling")

    def _run_load(self, s: Session, op: Operation) -> None:
        """``loadWeightsForSampling``: in flight from the moment it runs (a sample accepted meanwhile
        overlaps it) to its end; completed, the session serves the package (``loaded_arn``)."""
        with s.cond:
            s.loads_begun += 1
        try:
            self._run(op, lambda: self._apply_sampling(s, op, op.config["modelPackageArn"], (0, 0)))
        finally:
            with s.cond:
                if op.status == "Completed":
                    s.loaded_arn = op.config["modelPackageArn"]
                s.loads_done += 1

    def _apply_sampling(self, s: Session, op: Operation, serves: str, flight: tuple[int, int]) -> dict[str, Any]:
        """Run a sampling operation on the package ``serves``; ``flight``: the session's (loads begun,
        loads done) when the operation was accepted (``disturbing`` compares them at its end)."""
        c = op.config
        vocab = self._base.cfg.vocab_size
        if op.kind == "load_weights_for_sampling":
            self._sampler(serves)
            return {}
        contention = self.sampling_contention_seconds if s.contention_seconds is None else s.contention_seconds
        if contention and s.training_busy:
            time.sleep(contention)
        sampler = self._sampler(serves)
        prompt = engine.model_input_tokens(c["prompt"], vocab, "prompt")
        if not prompt:
            raise engine.OperationFailed("prompt has no tokens")
        if op.kind == "compute_logprobs":
            s.tokens["prefill"] += len(prompt)
            return {"logprobs": sampler.prompt_logprobs(prompt)}
        seqs = sampler.sample(prompt, int(c["numSamples"]), c["samplingParams"])
        if self.serving_of(s) == "disturbing":
            with s.cond:
                disturbed = flight[0] != flight[1] or (s.loads_begun, s.loads_done) != flight
            if disturbed:
                self.count("disturbed_samples")
                for q in seqs:
                    half = len(q["logprobs"]) // 2
                    q["logprobs"] = q["logprobs"][:half] + [x - DISTURBED_LOGPROB_SHIFT for x in q["logprobs"][half:]]
        s.tokens["prefill"] += len(prompt)
        s.tokens["sample"] += sum(len(q["tokens"]) for q in seqs)
        self.count("sampled_sequences", len(seqs))
        out: dict[str, Any] = {"sequences": seqs}
        if c.get("includePromptLogprobs"):
            out["promptLogprobs"] = sampler.prompt_logprobs(prompt)
        if c.get("topkPromptLogprobs"):
            out["topkPromptLogprobs"] = sampler.topk_prompt_logprobs(prompt, int(c["topkPromptLogprobs"]))
        return out

    def _op_GetSamplingOperationResult(self, p: dict[str, Any]) -> dict[str, Any]:
        op = self._get_op(p["trainingSessionName"], p["operationId"])
        if op.seq is not None:
            raise error(RUNTIME, "not_found", f"Operation {op.id!r} is a training operation; use GetTrainingOperationResult")
        return self._wait_answer(op)


def check_serving(mode: str) -> str:
    """``mode`` if it is one of `SERVING`; raises ValueError naming them."""
    if mode not in SERVING:
        raise ValueError(f"serving must be one of {', '.join(SERVING)}, got {mode!r}")
    return mode


def _paginate(items: list, token: str | None, limit: int) -> tuple[list, str | None]:
    start = int(token) if token and token.isdigit() else 0
    end = start + int(limit)
    return items[start:end], (str(end) if end < len(items) else None)


def _epoch(value: Any) -> float:
    if isinstance(value, (int, float)):
        return float(value)
    from botocore.utils import parse_timestamp

    return parse_timestamp(value).timestamp()
