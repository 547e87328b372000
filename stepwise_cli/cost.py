"""The cost model: what a training step, and a whole run, is projected to cost before it starts.

Parts, named as the run's cost ledger names them (`stepwise.core.ledger`), priced from the one price
table (`stepwise.core.prices`, dated ``PRICES_AS_OF``, region ``REGION``):

- **session**: the SageMaker training session's hours per step (`session_per_step`: sequential at
  ``max_staleness`` 0, overlapped at 1, from the step's rollout, training and rebind times), priced
  by the config's ``session_usd_per_hour`` (unset: hours only);
- **agent**: the ACR sessions of the step's rollouts, each ``Assumptions.agent_seconds`` long, at the
  config's ``acr_vcpus`` and ``acr_memory_gb``;
- **judge** (a config with ``judge``): one Converse request per group (``Assumptions.judge_attempts_per_group``)
  of the judged text (``Assumptions.judge_chars_per_member`` per member, at most ``include.max_member_chars``,
  plus the rubric and the instructions, `JUDGE_PROMPT_CHARS`) at `CHARS_PER_TOKEN`, and
  ``Assumptions.judge_output_tokens_per_member``, at the judge model's price (`judge_per_step`);
- the stack's own **lambda** (GB-seconds, memory from `stepwise.functions`, durations from
  `Assumptions`, and requests, per rollout: StartRollout, OnRolloutResult, FinishRollout, the gateway
  once per LLM call; per step: PlanStep, ComputeAdvantages, SubmitTrain, PollOperation, Rebind),
  **step_functions** (Standard state transitions, counted by walking the deployed ASL
  ``state_machine/training_loop.asl.json`` along a training step's path, plus each rollout child's
  states and the Wait/Poll loops the training and rebind operations take) and **s3** (PUT-class and
  GET-class requests, counted from what the handlers and the gateway do per rollout, per LLM call and
  per step: constants below).

Eval batches (``eval_max_prompts`` rollouts every ``eval_every`` steps) are spread over the steps.
DAPO's extra generation batches multiply the rollout part (``Assumptions.gen_batches_per_step``;
the cap ``max_num_gen_batches`` gives the upper bound). The whole run (`estimate` with
``total_steps``) is the steps plus the start-up: the session's ``session_start_seconds`` before the
first step. `estimate_record` is what a run keeps of it (``stepwise start`` writes it beside the
run's uploads; StopSession compares the ledger with it at the end). Free tiers are ignored.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from stepwise.core import ledger
from stepwise.core.prices import PRICES_AS_OF, REGION

if TYPE_CHECKING:
    from stepwise.config import RunConfig

# ---------------------------------------------------------------------------- S3 requests (from the handlers)

#: StartRollout: PUT task token, start marker, session record; GET state.json, prompts.json.
S3_START_ROLLOUT = {"put": 3, "get": 2}
#: Gateway, per LLM call: GET the session record, LIST the session's turns (turn budget), PUT the turn.
S3_GATEWAY_TURN = {"put": 1, "list": 1, "get": 1}
#: The agent's result object (PUT) and OnRolloutResult's GET of the task token.
S3_RESULT = {"put": 1, "get": 1}
#: FinishRollout: GET result and session record, PUT the closed record and the rollout record,
#: LIST the turns; plus one GET per captured turn (``S3_FINISH_PER_TURN``).
S3_FINISH_ROLLOUT = {"put": 2, "list": 1, "get": 2}
S3_FINISH_PER_TURN = {"get": 1}
#: The group judge, per group: its record and the cache (GET the record, GET the cache, PUT both) and per
#: judged member: LIST its turns, GET the result (its turns' GETs: ``S3_FINISH_PER_TURN`` again).
S3_JUDGE_PER_GROUP = {"put": 2, "get": 2}
S3_JUDGE_PER_MEMBER = {"list": 1, "get": 1}
#: Characters per token the judge's estimate assumes (English text), and the judge's own prompt around the
#: judged text (instructions, the task's framing, the tool's schema), in characters.
CHARS_PER_TOKEN = 4.0
JUDGE_PROMPT_CHARS = 1600.0
#: ComputeAdvantages reads every rollout record of the batch once (``get`` per rollout, counted per rollout).
S3_ADVANTAGES_PER_ROLLOUT = {"get": 1}
#: Per generation batch: PlanStep (state read/write, prompts + items PUT), the Map's ItemReader GET,
#: ComputeAdvantages (LIST rollouts, state read/write, summary PUT).
S3_PER_GENERATION_BATCH = {"put": 5, "list": 1, "get": 4}
#: Per trained step: SubmitTrain/PollOperation/Rebind state reads and conditional writes, datum
#: chunks (PUT then GET, counted as 2 chunks), summary merges.
S3_PER_TRAIN_STEP = {"put": 10, "get": 14}
S3_PER_POLL = {"put": 1, "get": 1}

# ---------------------------------------------------------------------------- the step's path in the ASL

#: The branch a plain training step takes at each Choice (the loops are counted separately).
TRAIN_STEP_CHOICES = {
    "What comes next?": "Roll out generation batch",
    "Train or eval batch?": "Compute advantages and filter groups",
    "Enough groups to train?": "Submit training step",
    "Training step done?": "Rebind sampler to new weights",
    "Sampler rebound?": "Plan next action",
}
EVAL_CHOICES = {**TRAIN_STEP_CHOICES, "Train or eval batch?": "Record eval accuracy"}
STEP_START = "Plan next action"
TRAIN_POLL_LOOP = ("Training step done?", "Wait for training step")  # (choice, its waiting branch)
REBIND_POLL_LOOP = ("Sampler rebound?", "Wait for sampler")
GENERATION_BATCH_END = "Enough groups to train?"
#: ``max_staleness`` 1: the path of a step whose batch was rolled out ahead, into the Parallel state,
#: and each branch's path through it (its poll loops counted like the sequential ones).
OVERLAPPED_STEP_CHOICES = {
    "What comes next?": "Train or eval batch?",
    "Train or eval batch?": "Compute advantages and filter groups",
    "Enough groups to train?": "Train this step while rolling out the next",
    # sampler_binding turn_gate (the default): the rebind runs after both branches join
    "Rebound while rolling out?": "Rebind sampler to new weights",
    "Sampler rebound?": "Plan next action",
}
OVERLAP_PARALLEL = "Train this step while rolling out the next"
#: A run with a judge: the states a generation batch adds between its rollouts and its advantages (no wait).
JUDGE_START, JUDGE_END = "Judge groups", "Compute advantages and filter groups"
JUDGE_CHOICES = {"Groups judged?": JUDGE_END}
OVERLAP_BRANCH_CHOICES = {
    "This step's training done?": "Rebind in this branch?",
    "Rebind in this branch?": "This step trained",
    "Next step's rollouts planned?": "Roll out the next step's generation batch",
}
#: ``admission: group``: a step's path (admit, wait for a batch of groups, advantages, admit, train, rebind).
GROUP_STEP_CHOICES = {
    "What comes next?": "Admit groups",
    "Train the chosen groups?": "Submit training step",
    "Training step done?": "Rebind sampler to new weights",
    "Sampler rebound?": "Plan next action",
}
#: Per group (admission: group): its execution's own states besides its members' (the Map, "Judge the
#: group?", Record group complete; `stepwise.handlers.advantages.GROUP_TRANSITIONS`), and its S3 requests:
#: AdmitGroups' items and prompt PUTs, the buffer's read and conditional write at admission and at its
#: record, its records read by RecordGroupComplete and its complete.json.
GROUP_OWN_TRANSITIONS = 3
S3_PER_GROUP = {"put": 5, "list": 2, "get": 4}


@dataclass(frozen=True)
class Assumptions:
    """What the estimate cannot know from the config; each can be set from `stepwise cost` flags.

    Attributes:
        turns_per_rollout: LLM calls per rollout (gateway invocations); capped by ``max_turns_per_rollout``.
        seconds_per_turn: gateway Lambda duration per LLM call (render + sample + capture), seconds.
        gen_batches_per_step: DAPO generation batches per step, on average (GRPO: 1).
        train_seconds: wall time of a step's training operations (forward_backward, optim_step,
            save_weights) on the session, seconds; sets how many poll rounds the loop takes.
        rebind_seconds: wall time of load_weights_for_sampling, seconds.
        rollout_seconds: wall time of one generation batch's rollouts (the Map, slowest rollout
            included), seconds; with ``train_seconds`` and ``rebind_seconds`` it sets the session-hours.
            None (the default): derived from the batch, its limits and ``rollouts_per_second``
            (`rollout_flow`); given, it also sets how long the batch's rollouts stay in flight.
        rollouts_per_second: the rate rollouts can finish at beyond the config's own limits (the training
            session's sampling throughput; on the local stack, the machine), per second; None = no such
            bound. When it binds, the Map's rollouts wait in flight, each holding its ACR session.
        orchestration_seconds: the rest of a step's wall time (PlanStep, the Map's start, state
            transitions; ComputeAdvantages' reads are ``advantages_seconds_per_rollout``), seconds.
        advantages_seconds_per_rollout: ComputeAdvantages' time per rollout of the batch (its record's GET,
            in parallel, and its share of the step's computation), seconds.
        poll_seconds / inline_wait_seconds: ``STEPWISE_POLL_SECONDS`` / ``STEPWISE_INLINE_WAIT_SECONDS``.
        agent_seconds: one rollout's ACR session, seconds (None = its LLM calls, ``turns_per_rollout x
            seconds_per_turn``, plus ``agent_overhead_seconds`` to start and write the result).
        session_start_seconds: the training session's seconds before the first step (creation, waiting
            for Running, Init, the baseline eval), counted once per run.
        rollout_sigma: the log-sd of a rollout's duration around ``agent_seconds`` (lognormal: a heavy
            tail; 0 = every rollout alike): what the asynchrony model (`async_table`) draws from.
        handler_seconds: mean duration per invocation of each handler, seconds.
        judge_chars_per_member: characters of each member's part of the judged text (capped by the config's
            ``judge.include.max_member_chars``).
        judge_output_tokens_per_member: tokens of the judge's answer per member (a score and a one-line reason).
        judge_attempts_per_group: Converse answers read per group (1 = every first answer valid).
        judge_seconds_per_group: wall time of one group's Converse request, seconds (the JudgeGroups function's
            duration is the batch's groups over ``judge.concurrency`` of these).
    """

    turns_per_rollout: float = 1.0
    seconds_per_turn: float = 5.0
    gen_batches_per_step: float = 1.0
    train_seconds: float = 60.0
    rebind_seconds: float = 10.0
    rollout_seconds: float | None = None
    rollouts_per_second: float | None = None
    orchestration_seconds: float = 5.0
    advantages_seconds_per_rollout: float = 0.004
    poll_seconds: float = 10.0
    inline_wait_seconds: float = 30.0
    agent_seconds: float | None = None
    agent_overhead_seconds: float = 2.0
    session_start_seconds: float = 300.0
    rollout_sigma: float = 0.5
    handler_seconds: dict[str, float] = field(default_factory=lambda: {
        "PlanStep": 0.5, "StartRollout": 0.5, "OnRolloutResult": 0.15, "FinishRollout": 0.6,
        "ComputeAdvantages": 2.0, "RecordEval": 1.0, "AdmitGroups": 0.5, "AwaitGroups": 0.3,
        "RecordGroupComplete": 0.6,
    })
    judge_chars_per_member: float = 2000.0
    judge_output_tokens_per_member: float = 40.0
    judge_attempts_per_group: float = 1.05
    judge_seconds_per_group: float = 5.0


@dataclass
class Usage:
    """Billable units: Lambda GB-seconds and requests, state transitions, S3 request classes."""

    lambda_gb_seconds: float = 0.0
    lambda_requests: float = 0.0
    state_transitions: float = 0.0
    s3_put_class: float = 0.0
    s3_get_class: float = 0.0

    def add(self, other: "Usage", times: float = 1.0) -> "Usage":
        for k in asdict(self):
            setattr(self, k, getattr(self, k) + times * getattr(other, k))
        return self

    def lambda_call(self, memory_mb: int, seconds: float, times: float = 1.0) -> "Usage":
        self.lambda_gb_seconds += times * memory_mb / 1024 * seconds
        self.lambda_requests += times
        return self

    def s3(self, requests: dict[str, float], times: float = 1.0) -> "Usage":
        self.s3_put_class += times * (requests.get("put", 0) + requests.get("list", 0))
        self.s3_get_class += times * requests.get("get", 0)
        return self

    def dollars(self, architecture: str = "x86_64") -> dict[str, float]:
        """USD per service of the stack (`stepwise.core.ledger.price`, the ledger's own pricing):
        ``lambda_duration``, ``lambda_requests``, ``step_functions``, ``s3_requests`` and ``total``."""
        usd = ledger.price(**asdict(self), architecture=architecture)
        return {"lambda_duration": usd["lambda_duration"], "lambda_requests": usd["lambda_requests"],
                "step_functions": usd["step_functions"], "s3_requests": usd["s3"], "total": usd["stack"]}


# ---------------------------------------------------------------------------- transitions from the ASL


def _walk(states: dict[str, Any], start: str, choices: dict[str, str], stop: str) -> list[str]:
    """State names entered from ``start`` until ``stop`` is entered again (or a terminal state).

    Raises:
        KeyError: a state or a choice branch is not in the ASL (names it): the model is out of date.
    """
    path: list[str] = []
    name = start
    for _ in range(200):
        if name not in states:
            raise KeyError(f"state {name!r} is not in the ASL; update stepwise_cli.cost's path")
        path.append(name)
        s = states[name]
        if s["Type"] == "Choice":
            if name not in choices:
                raise KeyError(f"no branch chosen for Choice {name!r} in stepwise_cli.cost")
            nxt = choices[name]
            targets = [c["Next"] for c in s.get("Choices", [])] + [s.get("Default")]
            if nxt not in targets:
                raise KeyError(f"Choice {name!r} has no branch to {nxt!r} (has {targets})")
        elif s.get("End") or s["Type"] in ("Succeed", "Fail"):
            return path
        else:
            nxt = s["Next"]
        if nxt == stop:
            return path
        name = nxt
    raise RuntimeError(f"no way back to {stop!r} from {start!r} in 200 states")


def asl_step_counts(asl: dict[str, Any] | None = None) -> dict[str, int]:
    """Transition counts read off the ASL.

    Returns ``{"train_step", "eval_batch", "generation_batch", "train_poll", "rebind_poll",
    "rollout_child"}``: a training step with no waiting, an eval batch, one extra (DAPO)
    generation batch, one extra round of each Wait/Poll loop, and one rollout child execution.
    """
    if asl is None:
        from state_machine.definition import load_asl

        asl = load_asl()
    states = asl["States"]
    train = _walk(states, STEP_START, TRAIN_STEP_CHOICES, STEP_START)
    evals = _walk(states, STEP_START, EVAL_CHOICES, STEP_START)
    gen = train[: train.index(GENERATION_BATCH_END) + 1]
    loops = {}
    for key, (choice, wait) in (("train_poll", TRAIN_POLL_LOOP), ("rebind_poll", REBIND_POLL_LOOP)):
        if choice not in states or wait not in states:
            raise KeyError(f"poll loop {choice!r} -> {wait!r} is not in the ASL; update stepwise_cli.cost")
        loops[key] = len(_walk(states, wait, {}, choice)) + 1  # the wait branch, then the Choice again
    mapstate = states[train[train.index("Roll out generation batch")]]
    processor = mapstate.get("ItemProcessor") or mapstate.get("Iterator") or {}
    child = _walk(processor["States"], processor["StartAt"], {}, "")
    judge = _walk(states, JUDGE_START, JUDGE_CHOICES, JUDGE_END)
    overlapped = _walk(states, STEP_START, OVERLAPPED_STEP_CHOICES, STEP_START)
    if OVERLAP_PARALLEL not in overlapped:
        raise KeyError(f"the overlapped step's path does not reach {OVERLAP_PARALLEL!r}; update stepwise_cli.cost")
    for branch in states[OVERLAP_PARALLEL]["Branches"]:
        overlapped += _walk(branch["States"], branch["StartAt"], OVERLAP_BRANCH_CHOICES, "")
    group = _walk(states, STEP_START, GROUP_STEP_CHOICES, STEP_START)
    return {"train_step": len(train), "eval_batch": len(evals), "generation_batch": len(gen),
            "train_poll": loops["train_poll"], "rebind_poll": loops["rebind_poll"], "rollout_child": len(child),
            "overlapped_step": len(overlapped), "judge": len(judge), "group_step": len(group)}


# ---------------------------------------------------------------------------- the estimate


def handler_seconds(a: Assumptions, name: str) -> float:
    """A handler's mean seconds per invocation: the assumptions', else the default assumptions' (a set of
    assumptions written before the handler existed)."""
    return a.handler_seconds.get(name, Assumptions().handler_seconds[name])


def poll_rounds(op_seconds: float, a: Assumptions) -> int:
    """Wait/Poll rounds an operation of ``op_seconds`` takes: the submit polls inline for
    ``inline_wait_seconds``, then each round waits ``poll_seconds`` and polls inline again."""
    rest = max(0.0, op_seconds - a.inline_wait_seconds)
    return math.ceil(rest / (a.poll_seconds + a.inline_wait_seconds)) if rest > 0 else 0


# ---------------------------------------------------------------------------- a generation batch's rollouts in flight

#: The Start rollout state's Retry of ACR's refusals, as the ASL has it (`start_retry` reads it off the ASL).
START_ROLLOUT_STATE = "Start rollout"


def start_retry(asl: dict[str, Any] | None = None) -> dict[str, float]:
    """The Start rollout state's Retry of ``AgentRuntimeThrottled`` in the ASL: ``interval`` (s),
    ``backoff``, ``max_delay`` (s) and ``attempts`` (retries). Raises KeyError when the ASL has none."""
    if asl is None:
        from state_machine.definition import load_asl

        asl = load_asl()
    mapstate = asl["States"]["Roll out generation batch"]
    task = (mapstate.get("ItemProcessor") or mapstate["Iterator"])["States"][START_ROLLOUT_STATE]
    for r in task.get("Retry", []):
        if "AgentRuntimeThrottled" in r["ErrorEquals"]:
            return {"interval": float(r.get("IntervalSeconds", 1)), "backoff": float(r.get("BackoffRate", 2.0)),
                    "max_delay": float(r.get("MaxDelaySeconds", 10**9)), "attempts": float(r.get("MaxAttempts", 3))}
    raise KeyError(f"{START_ROLLOUT_STATE!r} does not retry AgentRuntimeThrottled; update stepwise_cli.cost")


def refused_invokes(rollouts: int, concurrency: int, tps: float, latency: float, retry: dict[str, float], *,
                    dt: float = 0.1) -> float:
    """Expected InvokeAgentRuntime attempts ACR refuses (throttles) in one generation batch: each is one more
    StartRollout invocation and one more state transition (the Start rollout state's Retry).

    A fluid model in ``dt``-second slices: the Map starts ``concurrency`` children at once, each invoking after
    its item's ``start_after_seconds`` (`stepwise.core.planning.start_offsets`), then one as each
    rollout ends (``latency`` s after its invoke was admitted); ACR admits ``tps`` invokes in any second (a
    bucket of ``tps`` tokens refilled at ``tps`` a second: a burst of ``tps`` passes at once); a refused
    attempt k (0 = the first) is retried after a delay drawn uniformly up to ``min(max_delay, interval x
    backoff**k)`` (the Retry's full jitter), at most ``attempts`` times, after which the child ends (a failed
    rollout: a place frees). Source: the Step Functions developer guide, "Retrying after an error"
    (IntervalSeconds, BackoffRate, MaxDelaySeconds, JitterStrategy FULL)."""
    from collections import defaultdict

    from stepwise.core.planning import start_offsets

    if rollouts <= 0 or tps <= 0:
        return 0.0
    tokens = tps
    lat = max(1, round(latency / dt))
    arrivals: defaultdict[int, defaultdict[int, float]] = defaultdict(lambda: defaultdict(float))
    ends: defaultdict[int, float] = defaultdict(float)
    first = min(concurrency, rollouts)
    for second in start_offsets(first, concurrency, max(1, int(tps))):  # PlanStep's pacing ("Pace start")
        arrivals[round(second / dt)][0] += 1.0
    waiting = float(rollouts - first)
    refused = 0.0
    t = 0
    limit = int((rollouts / min(tps, max(concurrency, 1) / max(latency, dt)) + latency) * 20 / dt) + 10_000
    while (arrivals or ends) and t < limit:
        freed = ends.pop(t, 0.0)
        if freed and waiting > 0:
            new = min(freed, waiting)
            waiting -= new
            arrivals[t][0] += new
        tokens = min(tps, tokens + tps * dt)
        now = arrivals.pop(t, None)
        if now:
            total = sum(now.values())
            admitted = min(1.0, tokens / total) if total > 0 else 1.0
            tokens -= total * admitted
            ends[t + lat] += total * admitted
            for k, amount in now.items():
                out = amount * (1.0 - admitted)
                if out <= 1e-9:
                    continue
                refused += out
                if k >= retry["attempts"]:
                    ends[t + 1] += out  # retries spent: the child ends (failed), its place frees
                    continue
                spread = max(1, round(min(retry["max_delay"], retry["interval"] * retry["backoff"] ** k) / dt))
                for b in range(t + 1, t + spread + 1):
                    arrivals[b][k + 1] += out / spread
        t += 1
    return refused


#: A measured Map time within this share of what the rate limits allow is theirs (the paced starts, not a
#: queue after the invoke): `rollout_flow` reads it as bound by them.
MEASURED_RATE_TOLERANCE = 0.1


@dataclass(frozen=True)
class RolloutFlow:
    """How one generation batch's rollouts move through the Map (`rollout_flow`).

    Attributes:
        rollouts: the batch's rollouts.
        concurrency: the Map's ``MaxConcurrency`` (`stepwise.core.planning.map_concurrency`).
        rate: rollouts finished per second.
        bound: what sets ``rate``: ``acr_tps_limit``, ``concurrency`` (each child holds its place for an ACR
            session of ``agent_seconds``), ``rollouts_per_second``, or ``rollout_seconds`` (given, and slower
            than the config's limits allow).
        latency: seconds one rollout is in flight, from its invoke to FinishRollout's stop of its session: its
            ACR session as the cost ledger counts it (`stepwise.core.ledger.acr_usage`).
        wall: seconds of the batch's Map.
        refused: StartRollout attempts ACR refuses and the state machine retries (`refused_invokes`).
    """

    rollouts: int
    concurrency: int
    rate: float
    bound: str
    latency: float
    wall: float
    refused: float


def rollout_flow(cfg: RunConfig, a: Assumptions, rollouts: int | None = None, *,
                 retry: dict[str, float] | None = None) -> RolloutFlow:
    """A generation batch of ``rollouts`` (default the config's ``batch_size x responses_per_prompt``) in the
    Map: the rate rollouts finish at is the lowest of ``acr_tps_limit`` x `START_PACE` (each rollout's invoke and
    stop share the quota; PlanStep paces a batch's first invokes there), the Map's concurrency over one
    rollout's ACR session (``agent_seconds``: Little's law) and ``Assumptions.rollouts_per_second``; the Map
    then takes ``rollouts / rate`` plus the last rollout's own time, unless ``Assumptions.rollout_seconds``
    says how long it takes.

    When what bounds the rate comes after the invoke (``rollouts_per_second``, or a given ``rollout_seconds``
    slower than the config's limits), the Map still keeps its ``concurrency`` children in flight, so each
    rollout stays in flight ``concurrency / rate`` seconds, its ACR session with it: at 1,024 rollouts a
    step on the local stack, 25 s each where the agent needs under one (the ledger counts each session from
    its invoke to its stop)."""
    from stepwise.core.planning import START_PACE, map_concurrency

    n = rollouts if rollouts is not None else cfg.batch_size * cfg.responses_per_prompt
    per = agent_seconds(a, min(a.turns_per_rollout, float(cfg.max_turns_per_rollout)))
    concurrency = map_concurrency(max(1, n), cfg.acr_tps_limit, cfg.acr_max_active_sessions)
    # the quota bounds starts at START_PACE of it: each rollout's stop shares it with its invoke, and PlanStep
    # paces a batch's first invokes there ("Pace start", before the invoke: no ACR session waits)
    limits = {"acr_tps_limit": START_PACE * float(cfg.acr_tps_limit),
              "concurrency": concurrency / per if per > 0 else float("inf")}
    if a.rollouts_per_second:
        limits["rollouts_per_second"] = float(a.rollouts_per_second)
    bound = min(limits, key=lambda k: limits[k])
    rate = limits[bound]
    wall = n / rate + per if n else 0.0
    if a.rollout_seconds is not None:
        wall = a.rollout_seconds
        observed = n / max(wall - per, 1e-9)  # the rate ``wall = n / rate + per`` says
        if observed < rate * (1.0 - MEASURED_RATE_TOLERANCE):
            bound, rate = "rollout_seconds", observed
    queued = bound in ("rollouts_per_second", "rollout_seconds")
    latency = max(per, min(concurrency, n) / rate) if queued and rate > 0 else per
    refused = refused_invokes(n, concurrency, float(cfg.acr_tps_limit), latency, retry or start_retry())
    return RolloutFlow(rollouts=n, concurrency=concurrency, rate=rate, bound=bound, latency=latency, wall=wall,
                       refused=refused)


def _memory() -> dict[str, int]:
    from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION

    return {f.name: f.memory_mb for f in (*FUNCTIONS, GATEWAY_FUNCTION)}


def rollout_usage(turns: float, a: Assumptions, counts: dict[str, int], mem: dict[str, int]) -> Usage:
    """One rollout: its child execution, three handler calls, ``turns`` gateway calls, its S3 requests."""
    u = Usage(state_transitions=counts["rollout_child"])
    u.lambda_call(mem["StartRollout"], a.handler_seconds["StartRollout"])
    u.lambda_call(mem["OnRolloutResult"], a.handler_seconds["OnRolloutResult"])
    u.lambda_call(mem["FinishRollout"], a.handler_seconds["FinishRollout"])
    u.lambda_call(mem["Gateway"], a.seconds_per_turn, times=turns)
    u.s3(S3_START_ROLLOUT).s3(S3_RESULT).s3(S3_FINISH_ROLLOUT).s3(S3_ADVANTAGES_PER_ROLLOUT)
    u.s3(S3_GATEWAY_TURN, times=turns).s3(S3_FINISH_PER_TURN, times=turns)
    return u


def overlapped_fraction(cfg: RunConfig) -> float:
    """The share of steps whose first generation batch rolls out while the previous step trains, at
    ``max_staleness`` 1 (`stepwise.core.staleness.roll_out_ahead_blocker`): all but the steps after
    which a ``save_every`` checkpoint or a new execution (``steps_per_execution``) comes first (and
    the run's first step, trained on the base model's sampler: one step of the run, not counted)."""
    blocked = 1.0 / cfg.steps_per_execution + (1.0 / cfg.save_every if cfg.save_every > 0 else 0.0)
    return max(0.0, 1.0 - blocked)


def session_per_step(cfg: RunConfig, a: Assumptions, max_staleness: int, gen_batches: float = 1.0, *,
                     flow: RolloutFlow | None = None) -> dict[str, float]:
    """The training session's time per step at ``max_staleness`` (0 or 1), in seconds and session-hours.

    The session is billed for the whole wall time of a step, busy or not. Sequential (0): rollouts
    of every generation batch (``flow.wall``, `rollout_flow` of the config's batch unless given),
    orchestration and ComputeAdvantages (``advantages_seconds_per_rollout`` per rollout), then training and
    rebind, one after the other: ``wall = gen_batches x (rollout + orchestration + advantages) + train +
    rebind``. Overlapped (1): the next step's first generation batch rolls out during training, so that part
    costs ``max(rollout, train) + rebind`` instead of their sum (the rebind waits for both: no rollout
    samples while the sampler loads the next package; DAPO's further generation batches stay
    sequential), on the `overlapped_fraction` of steps; the others are sequential.

    Returns ``{"wall_seconds", "busy_seconds", "idle_seconds", "session_hours"}`` per step
    (busy = training + rebind; idle = wall - busy).
    """
    flow = flow or rollout_flow(cfg, a)
    rollout_s = flow.wall
    orchestration = a.orchestration_seconds + flow.rollouts * a.advantages_seconds_per_rollout
    busy = a.train_seconds + a.rebind_seconds
    per_batch = rollout_s + orchestration
    sequential = gen_batches * per_batch + busy
    wall = sequential
    if max_staleness >= 1:
        overlapped = (max(rollout_s, a.train_seconds) + a.rebind_seconds + orchestration
                      + (gen_batches - 1) * per_batch)
        f = overlapped_fraction(cfg)
        wall = f * overlapped + (1 - f) * sequential
    return {"wall_seconds": wall, "busy_seconds": busy, "idle_seconds": wall - busy, "session_hours": wall / 3600}


def estimate(cfg: RunConfig, a: Assumptions | None = None, *, total_steps: int | None = None,
             asl: dict[str, Any] | None = None) -> dict[str, Any]:
    """The cost of one training step (and of the run when ``total_steps`` is known).

    Returns a dict: ``assumptions``, ``rollouts_per_step``, ``flow`` (the batch in the Map: `RolloutFlow`),
    ``usage_per_step`` (`Usage` fields), ``session_per_step`` (`session_per_step` at max_staleness "0" and
    "1"), ``max_staleness``, ``usd_per_step`` (the stack's, per service and total), ``usd_per_step_upper``
    (DAPO at the generation-batch cap; equal to the estimate for GRPO), ``parts_per_step`` (USD by ledger
    part: ``session`` when the config prices it, ``agent``, ``lambda``, ``step_functions``, ``s3``,
    ``stack``, ``total``, and ``session_hours``), ``prices_as_of``, ``region``; with ``total_steps`` also
    ``total_steps``, ``usd_per_run`` (the stack's) and ``run`` (the whole run by part, start-up included:
    `run_totals`).
    """
    a = a or Assumptions()
    counts = asl_step_counts(asl)
    retry = start_retry(asl)
    mem = _memory()
    turns = min(a.turns_per_rollout, float(cfg.max_turns_per_rollout))
    rollouts_per_batch = cfg.batch_size * cfg.responses_per_prompt
    flow = rollout_flow(cfg, a, rollouts_per_batch, retry=retry)
    eval_n = ((cfg.eval_max_prompts or cfg.batch_size) * len(cfg.eval_set_paths) * cfg.eval_group_size
              if cfg.has_evals and cfg.eval_every > 0 else 0)
    # an eval batch is a batch of its own: its own concurrency, waits and refusals (not the train batch's wall)
    eval_flow = rollout_flow(cfg, replace(a, rollout_seconds=None), eval_n, retry=retry) if eval_n else None

    def batch(u: Usage, f: RolloutFlow, times: float) -> None:
        """``times`` generation batches like ``f``: their rollouts, and the invokes ACR refuses (each one
        more StartRollout with its two PUTs, one more transition of the Start rollout state)."""
        u.add(rollout_usage(turns, a, counts, mem), times=f.rollouts * times)
        u.lambda_call(mem["StartRollout"], a.handler_seconds["StartRollout"], times=f.refused * times)
        u.state_transitions += f.refused * times
        u.s3({"put": 2}, times=f.refused * times)

    def step(gen_batches: float) -> Usage:
        u = Usage()
        batch(u, flow, gen_batches)
        if cfg.admission == "group":
            # the group engine's step path, and each group's own execution, admission and record
            groups = cfg.batch_size * gen_batches
            u.state_transitions += counts["group_step"] + GROUP_OWN_TRANSITIONS * groups
            u.lambda_call(mem["PlanStep"], handler_seconds(a, "PlanStep"))
            u.lambda_call(mem["AdmitGroups"], handler_seconds(a, "AdmitGroups"), times=2)
            u.lambda_call(mem["AwaitGroups"], handler_seconds(a, "AwaitGroups"))
            u.lambda_call(mem["RecordGroupComplete"], handler_seconds(a, "RecordGroupComplete"), times=groups)
            u.lambda_call(mem["ComputeAdvantages"], handler_seconds(a, "ComputeAdvantages")
                          + rollouts_per_batch * gen_batches * a.advantages_seconds_per_rollout)
            u.s3(S3_PER_GENERATION_BATCH).s3(S3_PER_GROUP, times=groups)
        else:
            # the step's fixed path (overlapped steps take the Parallel's, and one more PlanStep: the
            # plan ahead), and the extra generation batches' part of it
            f = overlapped_fraction(cfg) if cfg.max_staleness >= 1 else 0.0
            u.state_transitions += (f * counts["overlapped_step"] + (1 - f) * counts["train_step"]
                                    + counts["generation_batch"] * (gen_batches - 1))
            u.lambda_call(mem["PlanStep"], a.handler_seconds["PlanStep"], times=gen_batches + f)
            u.lambda_call(mem["ComputeAdvantages"], a.handler_seconds["ComputeAdvantages"]
                          + rollouts_per_batch * a.advantages_seconds_per_rollout, times=gen_batches)
            u.s3(S3_PER_GENERATION_BATCH, times=gen_batches)
        if cfg.judge is not None:  # the "Judge groups" state, its function and reads, per generation batch
            groups = cfg.batch_size * gen_batches
            if cfg.admission == "group":  # each group's own "Judge the group" and "Group judged?", one call each
                u.state_transitions += counts["judge"] * groups
                u.lambda_call(mem["JudgeGroups"], a.judge_seconds_per_group, times=groups)
            else:
                u.state_transitions += counts["judge"] * gen_batches  # "Judge groups" and "Groups judged?"
                seconds = cfg.batch_size * a.judge_seconds_per_group / min(cfg.judge.concurrency, cfg.batch_size)
                u.lambda_call(mem["JudgeGroups"], seconds, times=gen_batches)
            u.s3(S3_JUDGE_PER_GROUP, times=groups).s3(S3_JUDGE_PER_MEMBER, times=rollouts_per_batch * gen_batches)
            u.s3(S3_FINISH_PER_TURN, times=rollouts_per_batch * gen_batches * turns)
        # training: submit (polls inline), Wait/Poll rounds, rebind (inline, then its own rounds)
        train_rounds, rebind_rounds = poll_rounds(a.train_seconds, a), poll_rounds(a.rebind_seconds, a)
        u.lambda_call(mem["SubmitTrain"], min(a.train_seconds, a.inline_wait_seconds) + 0.5)
        u.lambda_call(mem["PollOperation"], a.inline_wait_seconds, times=train_rounds)
        u.lambda_call(mem["Rebind"], min(a.rebind_seconds, a.inline_wait_seconds) + 0.3, times=1 + rebind_rounds)
        u.state_transitions += counts["train_poll"] * train_rounds + counts["rebind_poll"] * rebind_rounds
        u.s3(S3_PER_TRAIN_STEP).s3(S3_PER_POLL, times=train_rounds + rebind_rounds)
        # evals (every eval set's first eval_max_prompts prompts, eval_group_size rollouts each), spread
        # over the steps between them
        if eval_flow is not None:
            share = 1.0 / cfg.eval_every
            batch(u, eval_flow, share)
            u.state_transitions += counts["eval_batch"] * share
            u.lambda_call(mem["PlanStep"], a.handler_seconds["PlanStep"], times=share)
            u.lambda_call(mem["RecordEval"], a.handler_seconds["RecordEval"], times=share)
            u.s3(S3_PER_GENERATION_BATCH, times=share)
        return u

    gen = a.gen_batches_per_step if cfg.algorithm == "dapo" else 1.0
    per_step = step(gen)
    upper = step(float(cfg.max_num_gen_batches)) if cfg.algorithm == "dapo" else per_step
    sessions = {str(m): session_per_step(cfg, a, m, gen, flow=flow) for m in (0, 1)}
    table = async_table(cfg, a, turns)
    this = next((r for r in table if r["this_config"]), None)
    session_hours = (this["session_hours_per_step"] if cfg.admission == "group" and this is not None
                     else sessions[str(min(cfg.max_staleness, 1))]["session_hours"])
    # each rollout's ACR session lasts as long as it is in flight (the ledger counts invoke to stop)
    acr_seconds = rollouts_per_batch * gen * flow.latency
    if eval_flow is not None:
        acr_seconds += eval_flow.rollouts * eval_flow.latency / cfg.eval_every
    out: dict[str, Any] = {
        "assumptions": {**asdict(a), "turns_per_rollout": turns, "agent_seconds": agent_seconds(a, turns),
                        "rollout_seconds": flow.wall},
        "rollouts_per_step": rollouts_per_batch * gen,
        "flow": asdict(flow),
        "transition_counts": counts,
        **({"judge_per_step": judge_per_step(cfg, a, gen)} if cfg.judge is not None else {}),
        "usage_per_step": asdict(per_step),
        "usd_per_step": per_step.dollars(),
        "usd_per_step_upper": upper.dollars(),
        "parts_per_step": parts(cfg, per_step, session_hours, acr_seconds, judge_per_step(cfg, a, gen)),
        "prices_as_of": PRICES_AS_OF,
        "region": REGION,
        # both modes, whatever the config says: what overlapping would save (or does)
        "session_per_step": sessions,
        "max_staleness": cfg.max_staleness,
        # what deep asynchrony would be worth on this config (a discrete-event model, `async_table`)
        "asynchrony": table,
    }
    if total_steps is not None:
        out["total_steps"] = total_steps
        out["usd_per_run"] = {k: v * total_steps for k, v in out["usd_per_step"].items()}
        out["run"] = run_totals(cfg, out["parts_per_step"], total_steps, a)
    return out


#: The arms of the asynchrony table: (arm, engine, d, k), the benchmark's (``benchmarks/async_depth.py``).
ASYNC_ARMS = (("sync", "sync", 0, 0), ("overlap", "overlap", 0, 1), ("d1k2", "group", 1, 2), ("d2k3", "group", 2, 3))
#: Steps the asynchrony model simulates per arm (the first, a cold start for every arm, is left out).
ASYNC_MODEL_STEPS = 20


def async_table(cfg: RunConfig, a: Assumptions, turns: float | None = None) -> list[dict[str, Any]]:
    """Per arm (`ASYNC_ARMS`, and this config's own group engine when it uses one), what the discrete-event
    model (`stepwise_cli.asyncmodel`) predicts for a step: its wall seconds, the session's busy fraction, its
    session-hours, the ratio to ``sync``, and the mean staleness of what it trains.

    Rollouts last ``agent_seconds`` on average, lognormal with log-sd ``rollout_sigma``; the session trains
    ``train_seconds``, rebinds ``rebind_seconds``; ``orchestration_seconds`` between. DAPO's extra
    generation batches are not modelled (one batch a step)."""
    from stepwise_cli.asyncmodel import Timing, lognormal_durations, simulate

    turns = min(a.turns_per_rollout, float(cfg.max_turns_per_rollout)) if turns is None else turns
    durations = lognormal_durations(mean_s=agent_seconds(a, turns), sigma=a.rollout_sigma, seed=cfg.seed,
                                    group_size=cfg.responses_per_prompt)
    timing = Timing(train_s=a.train_seconds, rebind_s=a.rebind_seconds, orchestration_s=a.orchestration_seconds)
    arms = list(ASYNC_ARMS)
    mine = (f"d{cfg.steps_ahead}k{cfg.max_staleness}", "group", cfg.steps_ahead, cfg.max_staleness)
    if cfg.admission == "group" and mine[0] not in {x[0] for x in arms}:
        arms.append(mine)
    rows = []
    for arm, kind, d, k in arms:
        r = simulate(kind, steps=ASYNC_MODEL_STEPS, batch_size=cfg.batch_size, group_size=cfg.responses_per_prompt,
                     durations=durations, timing=timing, steps_ahead=d, max_staleness=k,
                     max_in_flight=cfg.rollouts_in_flight_cap if kind == "group" else None)
        this = (arm == mine[0] and cfg.admission == "group") or (
            cfg.admission == "batch" and arm == ("overlap" if cfg.max_staleness >= 1 else "sync"))
        rows.append({"arm": arm, "engine": kind, "sampling_steps_ahead": d, "max_staleness": k,
                     "s_per_step": r.s_per_step, "busy_fraction": r.busy_fraction,
                     "session_hours_per_step": r.s_per_step / 3600,
                     "mean_staleness": sum(r.staleness_G) / len(r.staleness_G) if r.staleness_G else 0.0,
                     "this_config": this})
    sync = rows[0]["s_per_step"]
    for row in rows:
        row["ratio_to_sync"] = row["s_per_step"] / sync if sync else 0.0
    return rows


def agent_seconds(a: Assumptions, turns: float) -> float:
    """One rollout's ACR session, seconds (`Assumptions.agent_seconds`)."""
    return a.agent_seconds if a.agent_seconds is not None else turns * a.seconds_per_turn + a.agent_overhead_seconds


def judge_per_step(cfg: RunConfig, a: Assumptions, gen_batches: float = 1.0) -> dict[str, float] | None:
    """The group judge's share of a step: ``{"requests", "input_tokens", "output_tokens"}`` and, when the judge
    model has a price (`stepwise.config.JudgeConfig.usd_per_million`), ``usd``; None without a judge. One request
    per group and attempt: the instructions and rubric, then each member's judged text, at `CHARS_PER_TOKEN`."""
    judge = cfg.judge
    if judge is None:
        return None
    n = cfg.responses_per_prompt
    member_chars = min(a.judge_chars_per_member, float(judge.include.max_member_chars))
    requests = cfg.batch_size * gen_batches * a.judge_attempts_per_group
    tokens_in = requests * (JUDGE_PROMPT_CHARS + len(judge.rubric) + n * member_chars) / CHARS_PER_TOKEN
    tokens_out = requests * n * a.judge_output_tokens_per_member
    out = {"requests": requests, "input_tokens": tokens_in, "output_tokens": tokens_out}
    if judge.usd_per_million is not None:
        out["usd"] = ledger.price(judge_input_tokens=tokens_in, judge_output_tokens=tokens_out,
                                  judge_usd_per_million=judge.usd_per_million)["judge"]
    return out


def parts(cfg: RunConfig, stack: Usage, session_hours: float, acr_session_seconds: float,
          judge: dict[str, float] | None = None) -> dict[str, float]:
    """USD by ledger part (`stepwise.core.ledger.PARTS`) of a step: the stack's ``stack`` usage, the
    training session's ``session_hours``, the ACR sessions' ``acr_session_seconds`` and the judge's
    (`judge_per_step`); plus ``stack``, ``total`` and ``session_hours``. ``session`` only when the config has
    ``session_usd_per_hour``, ``judge`` only when the run has a judge with a known price. Priced by
    `stepwise.core.ledger.price`, as the ledger prices what a run used."""
    judge = judge or {}
    usd = ledger.price(**asdict(stack), acr_vcpu_seconds=acr_session_seconds * cfg.acr_vcpus,
                       acr_gb_seconds=acr_session_seconds * cfg.acr_memory_gb, session_seconds=session_hours * 3600,
                       judge_input_tokens=judge.get("input_tokens", 0.0), judge_output_tokens=judge.get("output_tokens", 0.0),
                       judge_usd_per_million=ledger.judge_usd_per_million(cfg) if "usd" in judge else None,
                       session_usd_per_hour=cfg.session_usd_per_hour)
    out = {k: v for k, v in usd.items() if k in ledger.PARTS or k in ("stack", "total")}
    out["session_hours"] = session_hours
    return out


def startup_parts(cfg: RunConfig, a: Assumptions) -> dict[str, float]:
    """The run's start-up by part, counted once: the training session's ``Assumptions.session_start_seconds``
    before the first step (creation, waiting for Running, Init, the baseline eval), priced like the rest of
    the session (``session`` and ``total`` only when the config has ``session_usd_per_hour``)."""
    hours = a.session_start_seconds / 3600
    out = {"session_hours": hours}
    if cfg.session_usd_per_hour is not None:
        out["session"] = out["total"] = hours * cfg.session_usd_per_hour
    return out


def run_totals(cfg: RunConfig, per_step: dict[str, float], steps: int, a: Assumptions) -> dict[str, float]:
    """The whole run by part: ``steps`` x ``per_step``, plus the start-up (`startup_parts`)."""
    out = {k: v * steps for k, v in per_step.items()}
    for part, value in startup_parts(cfg, a).items():
        if part in out:
            out[part] += value
    out["steps"] = steps
    return out


def estimate_record(est: dict[str, Any], cfg: RunConfig | None = None, a: Assumptions | None = None) -> dict[str, Any]:
    """What a run keeps of its estimate (``datasets/{run_id}/estimate.json``; `stepwise.core.ledger.
    compare_with_estimate` reads ``per_step`` and ``startup``): the per-step parts, the start-up's (with
    ``cfg`` and ``a``: `startup_parts`), the run's totals when known, the assumptions, the batch's flow and
    the prices' date and region."""
    out = {"per_step": est["parts_per_step"], "assumptions": est["assumptions"], "prices_as_of": est["prices_as_of"],
           "region": est["region"], "rollouts_per_step": est["rollouts_per_step"], "flow": est.get("flow")}
    if cfg is not None:
        out["startup"] = startup_parts(cfg, a or Assumptions())
    if "run" in est:
        out["run"] = est["run"]
    return out


def put_estimate(s3: Any, bucket: str, run_id: str, cfg: RunConfig, total_steps: int | None,
                 a: Assumptions | None = None) -> dict[str, Any]:
    """Estimate the run (`estimate`) and write what it keeps of it (`estimate_record`) to
    ``datasets/{run_id}/estimate.json`` (`stepwise.layout.estimate_key`), beside the run's uploads;
    StopSession compares the ledger with it at the run's end. Returns the estimate."""
    import json

    from stepwise.layout import estimate_key

    est = estimate(cfg, a, total_steps=total_steps)
    s3.put_object(Bucket=bucket, Key=estimate_key(run_id), Body=json.dumps(estimate_record(est, cfg, a)).encode(),
                  ContentType="application/json")
    return est
