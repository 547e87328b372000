"""The cost ledger, pure: what a run has used, what that costs by part, each step's share, and the
projection of the next step that the budget limits check (`stepwise.core.stopping`).

Where the figures come from (counted where the work happens, `stepwise.metering`):

- **training session**: seconds from the session's CreationTime (``RunState.session_created_at``)
  to its stop, waits included, summed over the sessions of the run (a resume opens a new one);
  priced by the config's ``session_usd_per_hour`` (unset: hours only, no dollars);
- **Lambda**: each invocation's own duration x its configured memory (the Lambda context's
  ``memory_limit_in_mb``), one request each, per function;
- **Step Functions**: state transitions of the parent executions counted from their own histories
  (`transitions_in`), and of each rollout's child execution from its states and the retries its
  context object reports (`task_transitions`);
- **S3**: requests by price class, counted by the client as each is made (`stepwise.core.prices`);
- **ACR**: each rollout's session-seconds, from the invoke to the session's end, times the config's
  ``acr_vcpus`` and ``acr_memory_gb`` at the ACR prices (`acr_usage`);
- **the group judge** (a config with ``judge``): its Bedrock requests and the input and output tokens each
  Converse answer reports, carried in the groups' judge records, at the judge model's price per million
  tokens (`stepwise.config.JudgeConfig.usd_per_million`: the config's, else the price table's; unknown: tokens only).

Parts: ``session`` (the training session), ``agent`` (ACR), ``judge`` (Bedrock, with a judge), and the
stack's own ``lambda``, ``step_functions`` and ``s3`` (together ``stack``). Prices: `stepwise.core.prices`. The ledger
lives in ``RunState.ledger`` (`stepwise.records.Ledger`), so it survives continue-as-new and
``stepwise resume`` and is never reset.

Steps: the ledger is marked at the first training step's start and at each step's end (Rebind, or
ComputeAdvantages for a skipped or capped step); a step's cost is the difference between two marks
(evals and checkpoints between steps belong to the step after them; the run's start-up, session
wait and baseline eval only to the total). The summary keys (`close_step`) are ``cost/step_usd``,
``cost/total_usd``, one ``cost/{part}_usd`` per part (this step's), ``cost/session_seconds`` (this
step's) and ``cost/session_hours`` (the run's), and the step's units beside them (with a judge, its
``cost/judge_requests``, ``cost/judge_input_tokens`` and ``cost/judge_output_tokens``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from stepwise.core import prices
from stepwise.records import CostMark, RunState, StepCost, Usage

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: The parts of a run's cost, in the order they are shown.
PARTS = ("session", "agent", "judge", "lambda", "step_functions", "s3")
#: The stack's own parts.
STACK_PARTS = ("lambda", "step_functions", "s3")
#: The budget limits project the next step from the costliest of this many last steps.
PROJECTION_WINDOW = 5
#: The instruction set the stack's functions run on (`stepwise.functions.LAMBDA_ARCHITECTURE`).
DEFAULT_ARCHITECTURE = "x86_64"


# ---------------------------------------------------------------------------- pricing


def session_seconds(state: RunState, now: float) -> float:
    """Seconds of training session the run has used by ``now``: the stopped sessions', plus the
    current one's from its creation when it still runs."""
    current = 0.0 if state.session_stopped or not state.session_created_at else max(0.0, now - state.session_created_at)
    return state.ledger.sessions_closed_seconds + current


def price(*, lambda_gb_seconds: float = 0.0, lambda_requests: float = 0.0, state_transitions: float = 0.0,
          s3_put_class: float = 0.0, s3_get_class: float = 0.0, acr_vcpu_seconds: float = 0.0,
          acr_gb_seconds: float = 0.0, judge_input_tokens: float = 0.0, judge_output_tokens: float = 0.0,
          judge_usd_per_million: tuple[float, float] | None = None, session_seconds: float = 0.0,
          session_usd_per_hour: float | None = None, architecture: str = DEFAULT_ARCHITECTURE) -> dict[str, float]:
    """USD of billable units at `stepwise.core.prices`: the one pricing function of the ledger (`part_usd`,
    measured units) and the estimate (`stepwise_cli.cost`, projected units, which may be fractional).

    Units: GB-seconds and requests of Lambda, Standard state transitions, S3 requests by price class,
    ACR vCPU- and GB-seconds, the group judge's input and output tokens at ``judge_usd_per_million``
    (input, output), seconds of training session at ``session_usd_per_hour``.

    Returns:
        ``lambda_duration``, ``lambda_requests`` (the two halves of ``lambda``), and per part
        (`PARTS`): ``agent``, ``lambda``, ``step_functions``, ``s3``, ``session`` only when
        ``session_usd_per_hour`` is given (unset: hours only, no dollars, and ``total`` leaves it out) and
        ``judge`` only when ``judge_usd_per_million`` is;
        plus ``stack`` (Lambda + Step Functions + S3) and ``total``.

    Raises:
        KeyError: an ``architecture`` the price table has no Lambda price for (x86_64, arm64).
    """
    out: dict[str, float] = {}
    if session_usd_per_hour is not None:
        out["session"] = session_seconds / 3600 * session_usd_per_hour
    out["agent"] = acr_vcpu_seconds / 3600 * prices.ACR_USD_PER_VCPU_HOUR + acr_gb_seconds / 3600 * prices.ACR_USD_PER_GB_HOUR
    if judge_usd_per_million is not None:
        out["judge"] = (judge_input_tokens * judge_usd_per_million[0] + judge_output_tokens * judge_usd_per_million[1]) / 1e6
    out["lambda_duration"] = lambda_gb_seconds * prices.LAMBDA_USD_PER_GB_SECOND[architecture]
    out["lambda_requests"] = lambda_requests * prices.LAMBDA_USD_PER_REQUEST
    out["lambda"] = out["lambda_duration"] + out["lambda_requests"]
    out["step_functions"] = state_transitions * prices.SFN_USD_PER_TRANSITION
    out["s3"] = s3_put_class * prices.S3_USD_PER_PUT_CLASS + s3_get_class * prices.S3_USD_PER_GET_CLASS
    out["stack"] = sum(out[p] for p in STACK_PARTS)
    out["total"] = sum(out[p] for p in PARTS if p in out)
    return out


def part_usd(usage: Usage, session_s: float, cfg: RunConfig, *,
             architecture: str = DEFAULT_ARCHITECTURE) -> dict[str, float]:
    """USD per part of ``usage`` and ``session_s`` seconds of training session (`price` at the config's
    rates): ``session`` (absent when the config has no ``session_usd_per_hour``), ``agent``, ``judge`` (absent
    without a judge of known price), ``lambda``, ``step_functions``, ``s3``, plus ``stack`` (Lambda + Step
    Functions + S3) and ``total``."""
    usd = price(lambda_gb_seconds=sum(usage.lambda_gb_seconds.values()),
                lambda_requests=sum(usage.lambda_requests.values()), state_transitions=usage.state_transitions,
                s3_put_class=usage.s3_put_class, s3_get_class=usage.s3_get_class,
                acr_vcpu_seconds=usage.acr_vcpu_seconds, acr_gb_seconds=usage.acr_gb_seconds,
                judge_input_tokens=usage.judge_input_tokens, judge_output_tokens=usage.judge_output_tokens,
                judge_usd_per_million=judge_usd_per_million(cfg), session_seconds=session_s,
                session_usd_per_hour=cfg.session_usd_per_hour, architecture=architecture)
    return {k: v for k, v in usd.items() if k in PARTS or k in ("stack", "total")}


def judge_usd_per_million(cfg: RunConfig) -> tuple[float, float] | None:
    """The group judge's ``(input, output)`` USD per million tokens, or None without a judge or a known price."""
    judge = getattr(cfg, "judge", None)
    return judge.usd_per_million if judge is not None else None


def totals(state: RunState, cfg: RunConfig, now: float) -> dict[str, float]:
    """The run's cost so far: `part_usd` of the ledger, plus ``session_seconds`` and ``session_hours``."""
    s = session_seconds(state, now)
    return {**part_usd(state.ledger.usage, s, cfg), "session_seconds": s, "session_hours": s / 3600}


def acr_usage(session_s: float, cfg: RunConfig) -> Usage:
    """One ACR session of ``session_s`` seconds: its seconds, and the vCPU- and GB-seconds billed at the
    config's ``acr_vcpus`` and ``acr_memory_gb``."""
    s = max(0.0, session_s)
    return Usage(acr_sessions=1, acr_session_seconds=s, acr_vcpu_seconds=s * cfg.acr_vcpus,
                 acr_gb_seconds=s * cfg.acr_memory_gb)


def lambda_usage(function: str, memory_mb: int, seconds: float, *, requests: int = 1) -> Usage:
    """One function's invocation time: ``memory_mb / 1024 x seconds`` GB-seconds and ``requests``."""
    return Usage(lambda_gb_seconds={function: memory_mb / 1024 * max(0.0, seconds)},
                 lambda_requests={function: requests} if requests else {})


# ---------------------------------------------------------------------------- state transitions

#: History event types that start a task attempt (a retry starts another; Step Functions bills each).
_SCHEDULED = ("LambdaFunctionScheduled", "TaskScheduled", "ActivityScheduled")


def transitions_in(events: Iterable[Mapping[str, Any]]) -> int:
    """State transitions billed for a slice of an execution's history (GetExecutionHistory events):
    one per state entered (``*StateEntered``), plus one per task retry (a task state's attempts
    beyond its first: ``*Scheduled`` events past the number of task states entered).

    Source: Step Functions pricing ("a state transition each time a step of your workflow is
    executed", retries included) and the history event types of the Step Functions API.
    """
    entered = scheduled = task_entered = 0
    for e in events:
        kind = str(e.get("type", ""))
        if kind.endswith("StateEntered"):
            entered += 1
            task_entered += kind == "TaskStateEntered"
        elif kind in _SCHEDULED:
            scheduled += 1
    return entered + max(0, scheduled - task_entered)


#: A rollout child execution's states, each entered once (Pace start, Start rollout, Finish rollout): the
#: ASL's ItemProcessor (`state_machine/training_loop.asl.json`); tests/core/test_ledger.py checks the count.
CHILD_STATES = 3
#: The child's states before its first task, entered once and never retried ("Pace start", a Wait):
#: StartRollout counts them with its own (`task_transitions`).
PACE_STATES = 1


def task_transitions(retry_count: int | None) -> int:
    """State transitions of one task state of a rollout's child execution: entered once, plus its
    retries (``$$.State.RetryCount`` as the context object handed it to the handler; None = 0).

    StartRollout and FinishRollout each count their own state this way, so a child's transitions are
    what its own history would show, counted without reading it: moto runs Distributed Map children
    inside the parent with no history of their own (``ListExecutions(mapRunArn)`` answers 500), and
    one GetExecutionHistory per rollout would spend the account's API rate on every rollout.
    """
    return 1 + max(0, retry_count or 0)


#: The Start rollout state's retries of ACR's refusals (``MaxAttempts`` of its Retry in the ASL;
#: tests/core/test_ledger.py checks it), and the errors StartRollout raises that it retries.
START_ROLLOUT_RETRIES = 8
START_ROLLOUT_RETRIED_ERRORS = frozenset({"AgentRuntimeThrottled", "AgentRuntimeUnavailable"})


def start_retried(error: str, retry_count: int | None) -> bool:
    """Whether the Start rollout state retries a StartRollout attempt that raised ``error`` (the
    exception's class name, which Step Functions matches against ``ErrorEquals``) at ``$$.State.RetryCount``
    ``retry_count`` (None = 0). A retried attempt's session record is read by nobody: the retry opens a
    fresh session (`stepwise.handlers.rollout`), and only the last attempt's reaches FinishRollout."""
    return error in START_ROLLOUT_RETRIED_ERRORS and (retry_count or 0) < START_ROLLOUT_RETRIES


#: S3 requests Step Functions makes for each Distributed Map run: the ItemReader's GET of
#: ``items.json``, and the ResultWriter's PUTs of its manifest and one results file (ASL ``ResultWriter``).
MAP_RUN_S3 = {"put": 2, "get": 1}


def batch_usage(rollouts: Iterable[Any]) -> Usage:
    """What a generation batch used: its rollout records' ``usage`` (`stepwise.records.RolloutRecord`),
    plus the S3 requests of its Map run (`MAP_RUN_S3`)."""
    out = Usage(s3_put_class=MAP_RUN_S3["put"], s3_get_class=MAP_RUN_S3["get"])
    for r in rollouts:
        out.add(getattr(r, "usage", None))
    return out


def count_parent_history(state: RunState, newest_event: int | None, events: Iterable[Mapping[str, Any]]) -> int:
    """Add the transitions of the parent execution's history events not counted yet to the ledger
    (mutates ``state``); returns how many. ``events`` are the execution's events newer than
    ``state.ledger.history_event`` when the ledger's segment is the run's current one (all of them
    otherwise: event ids restart with each execution); ``newest_event`` the newest id read.
    """
    led = state.ledger
    after = led.history_event if led.history_segment == state.segment else 0
    fresh = [e for e in events if int(e.get("id", 0)) > after]
    n = transitions_in(fresh)
    led.usage.state_transitions += n
    if newest_event is not None:
        led.history_segment, led.history_event = state.segment, max(after, newest_event)
    return n


def history_after(state: RunState) -> int:
    """The newest parent history event id already counted in the current execution (0 = none)."""
    return state.ledger.history_event if state.ledger.history_segment == state.segment else 0


# ---------------------------------------------------------------------------- steps


def open_first_step(state: RunState, now: float) -> None:
    """Mark the ledger at the run's first training step's start (no-op once marked): what came before
    (start-up, session wait, the baseline eval) is in the total only, never a step's cost."""
    if state.ledger.mark is None:
        state.ledger.mark = CostMark(at=now, session_seconds=session_seconds(state, now),
                                     usage=state.ledger.usage.model_copy(deep=True))


def close_step(state: RunState, cfg: RunConfig, now: float, step: int) -> dict[str, float]:
    """The end of step ``step``: its cost since the last mark, the run's total, the mark moved to
    ``now`` and the step appended to the projection window (mutates ``state.ledger``). Returns the
    step summary's ``cost/*`` keys (see the module doc)."""
    led = state.ledger
    open_first_step(state, state.step_started_at or now)
    assert led.mark is not None
    s_now = session_seconds(state, now)
    step_usage = led.usage.minus(led.mark.usage)
    step_session = max(0.0, s_now - led.mark.session_seconds)
    step_usd = part_usd(step_usage, step_session, cfg)
    total = part_usd(led.usage, s_now, cfg)
    wall = max(0.0, now - led.mark.at)
    led.recent_steps = (led.recent_steps + [StepCost(step=step, usd=step_usd["total"], session_seconds=step_session,
                                                     wall_seconds=wall)])[-PROJECTION_WINDOW:]
    led.mark = CostMark(at=now, session_seconds=s_now, usage=led.usage.model_copy(deep=True))
    out = {"cost/step_usd": step_usd["total"], "cost/total_usd": total["total"]}
    out.update({f"cost/{p}_usd": step_usd[p] for p in PARTS if p in step_usd})
    out.update({
        "cost/stack_usd": step_usd["stack"],
        "cost/session_seconds": step_session,
        "cost/session_hours": s_now / 3600,
        "cost/lambda_gb_seconds": sum(step_usage.lambda_gb_seconds.values()),
        "cost/lambda_requests": float(sum(step_usage.lambda_requests.values())),
        "cost/state_transitions": float(step_usage.state_transitions),
        "cost/s3_put_requests": float(step_usage.s3_put_class),
        "cost/s3_get_requests": float(step_usage.s3_get_class),
        "cost/acr_session_seconds": step_usage.acr_session_seconds,
        "cost/step_wall_seconds": wall,
    })
    if getattr(cfg, "judge", None) is not None:
        out.update({"cost/judge_requests": float(step_usage.judge_requests),
                    "cost/judge_input_tokens": float(step_usage.judge_input_tokens),
                    "cost/judge_output_tokens": float(step_usage.judge_output_tokens)})
    return out


def check_metrics(state: RunState) -> dict[str, float]:
    """The budget checks made at the step's start (``ledger.checks``), as summary keys
    ``budget/{limit}_{figure}`` (``limit``, ``spent``, ``next_step``, ``projected``)."""
    return {f"budget/{name}_{k}": v for name, check in state.ledger.checks.items() for k, v in check.items()
            if k != "steps"}


def step_projection(state: RunState) -> StepCost | None:
    """The next step, projected from the last `PROJECTION_WINDOW` steps: the largest cost, session-seconds
    and wall-seconds any of them took (each on its own), or None before a step has ended."""
    recent = state.ledger.recent_steps[-PROJECTION_WINDOW:]
    if not recent:
        return None
    return StepCost(step=state.step, usd=max(s.usd for s in recent),
                    session_seconds=max(s.session_seconds for s in recent),
                    wall_seconds=max(s.wall_seconds for s in recent))


def close_session(state: RunState, now: float) -> None:
    """The current training session stopped at ``now``: its seconds join the closed sessions'
    (mutates ``state``; call before setting ``session_stopped``; no-op once stopped)."""
    if not state.session_stopped and state.session_created_at:
        state.ledger.sessions_closed_seconds += max(0.0, now - state.session_created_at)


def session_clock(state: RunState, session_name: str, *, created_at: float | None, status: str | None = None) -> None:
    """Record session ``session_name``'s own CreationTime (``created_at``, epoch seconds; None: unknown) as
    ``session_created_at``, the start this ledger counts its seconds from (Init's clock stood in until now),
    while the run still names that session and it is not stopped; and, when given, its ``status``.
    Mutates ``state``; idempotent."""
    if created_at is not None and state.training_session_name == session_name and not state.session_stopped:
        state.session_created_at = created_at
    if status is not None:
        state.session_status = status


def cost_line(t: Mapping[str, float]) -> str:
    """``this run cost $X: session $A, agent $B, stack $C`` from `totals` (the session as hours when it
    has no price)."""
    session = (f"session {usd(t['session'])} ({t['session_hours']:.3f} h)" if "session" in t
               else f"session {t['session_hours']:.3f} h (not priced: no session_usd_per_hour)")
    judge = f", judge {usd(t['judge'])}" if "judge" in t else ""
    return f"this run cost {usd(t['total'])}: {session}, agent {usd(t['agent'])}{judge}, stack {usd(t['stack'])}"


def usd(value: float) -> str:
    """Dollars as people read them: cents above a dollar, four decimals below (a toy run costs fractions
    of a cent)."""
    return f"${value:,.2f}" if abs(value) >= 1 else f"${value:.4f}"


def compare_with_estimate(t: Mapping[str, float], estimate: Mapping[str, Any], steps: int) -> dict[str, Any]:
    """The ledger's totals ``t`` (`totals`) against the run's cost estimate for the ``steps`` the run
    trained: ``estimate["per_step"]`` (USD by part and ``session_hours``, `stepwise_cli.cost.estimate_record`)
    times ``steps``, plus the start-up the ledger's total holds once (``estimate["startup"]``: the session
    before the first step; absent in estimates written before it). Returns per part ``{"estimate",
    "ledger", "difference"}`` (ledger - estimate, USD) plus ``total`` with ``percent`` (of the estimate;
    None when it is 0), ``session_hours`` and ``steps``."""
    per = estimate.get("per_step") or {}
    startup = estimate.get("startup") or {}
    out: dict[str, Any] = {"steps": steps, "prices_as_of": estimate.get("prices_as_of")}
    for part in (*PARTS, "total", "session_hours"):
        if part not in per or (part != "session_hours" and part not in t):
            continue
        est = float(per[part]) * steps + float(startup.get(part) or 0.0)
        got = float(t[part])
        out[part] = {"estimate": est, "ledger": got, "difference": got - est}
    if "total" in out:
        est = out["total"]["estimate"]
        out["total"]["percent"] = (100.0 * out["total"]["difference"] / est) if est else None
    return out


def final_report(state: RunState, cfg: RunConfig, now: float, estimate: Mapping[str, Any] | None) -> dict[str, Any]:
    """What the run cost, for its end (``ledger.final``, the execution's output): ``usd`` by part,
    ``total_usd``, ``session_hours``, ``steps``, the `cost_line`, and, with the run's ``estimate``,
    the ledger against it (`compare_with_estimate`, and its line ``estimate_line``)."""
    t = totals(state, cfg, now)
    out: dict[str, Any] = {
        "usd": {p: t[p] for p in (*PARTS, "stack") if p in t}, "total_usd": t["total"],
        "session_hours": t["session_hours"], "steps": state.step, "line": cost_line(t),
        "usage": {"lambda_gb_seconds": {k: round(v, 3) for k, v in sorted(state.ledger.usage.lambda_gb_seconds.items())},
                  "lambda_requests": dict(sorted(state.ledger.usage.lambda_requests.items())),
                  "state_transitions": state.ledger.usage.state_transitions,
                  "s3_put_class": state.ledger.usage.s3_put_class, "s3_get_class": state.ledger.usage.s3_get_class,
                  "acr_sessions": state.ledger.usage.acr_sessions,
                  "acr_session_seconds": round(state.ledger.usage.acr_session_seconds, 3)},
    }
    if state.ledger.usage.judge_requests:
        out["usage"].update(judge_requests=state.ledger.usage.judge_requests,
                            judge_input_tokens=state.ledger.usage.judge_input_tokens,
                            judge_output_tokens=state.ledger.usage.judge_output_tokens)
    if estimate:
        cmp = compare_with_estimate(t, estimate, state.step)
        out["estimate"] = cmp
        if "total" in cmp:
            tot = cmp["total"]
            pct = f" ({tot['percent']:+.0f}%)" if tot.get("percent") is not None else ""
            out["estimate_line"] = (f"estimated {usd(tot['estimate'])} for {state.step} steps; the ledger says "
                                    f"{usd(tot['ledger'])}: {'+' if tot['difference'] >= 0 else '-'}"
                                    f"{usd(abs(tot['difference']))}{pct}")
    return out
