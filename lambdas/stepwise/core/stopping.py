"""The one way to end a run early: stopping rules, evaluated before each training step (pure).

A run ends gracefully when its epochs are done, when DAPO's ``max_num_gen_batches`` cap is hit, or
when a rule here says so. Ending gracefully means the same path for all of them
(`stepwise.core.planning.decide`): ``state.stop_reason`` is set, then the final eval (when the run
has an eval dataset), the final checkpoint (``save_state``), ``save_weights_at_end`` when asked, the
training session stopped, and the execution SUCCEEDED with the stop reason in ``state.json``.

When the rules are asked:

- `stepwise.core.planning.decide`, at the start of every training step (generation batch 0), after
  the evals due at that step ran and before the step's first generation batch is planned. The first
  rule that answers sets ``state.stop_reason``;
- `stepwise.core.planning.plan_ahead` (``max_staleness`` 1), for the step it would roll out while the
  current one trains. It asks `ahead_reason`, which runs the same rules on the state *projected* to
  that step's start (`projected_state`); when one answers, nothing is rolled out ahead (the step's
  own start then asks again). A step whose first batch was rolled out ahead runs: the rules were
  asked for it when its batch was planned, so no batch is ever rolled out for a step that does
  not run.

Adding a rule (the extension point). A rule is a pure function ``(state, cfg, now) -> str | None``:

- ``state`` (`stepwise.records.RunState`) is the run at the start of the step about to run, or a
  projection of it (`projected_state`); ``state.step`` is the number of steps completed;
- ``cfg`` is the run's `stepwise.config.RunConfig`; a rule that is off in the config returns None;
- ``now`` is epoch seconds (the step's start, or the projected start);
- it returns None to go on, or the stop reason: a string that starts with the rule's name (the
  config field, e.g. ``max_steps``) and gives its figures (``"max_steps: 20 steps done, limit 20"``).
  A stop reason never starts with ``failed`` or ``execution `` (`stepwise.core.phases.is_failure_stop`:
  those are failures, which ``stepwise resume`` clears); `stop_reason` refuses one that does.

Append it to `RULES`; nothing in the planner changes. A rule that reads an eval's result should
also answer while an eval due at ``state.step`` is not yet recorded (``cfg.should_eval(state.step)
and state.last_eval_step != state.step``): `decide` runs the due evals before it asks, so that case
only arises in a projection, where answering keeps the next step's batch from being rolled out
before the eval that may stop the run.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from stepwise.records import RunState

if TYPE_CHECKING:
    from stepwise.config import RunConfig

#: A stopping rule: ``(state at a step's start, config, now in epoch seconds) -> stop reason or None``.
StopRule = Callable[[RunState, "RunConfig", float], "str | None"]


class BadStopReason(ValueError):
    """A rule answered a stop reason that reads as a failure (``failed...``/``execution ...``): a resume
    would clear it and train past the limit."""


def max_steps_rule(state: RunState, cfg: RunConfig, now: float) -> str | None:
    """``max_steps``: stop before a step when ``max_steps`` steps are done (skipped steps count: they
    are steps of the run, each rolled out and billed)."""
    if cfg.max_steps is None or state.step < cfg.max_steps:
        return None
    return f"max_steps: {state.step} steps done, limit {cfg.max_steps}"


# ---------------------------------------------------------------------------- budget limits

#: The budget limits that project the next step from the ledger (`stepwise.core.ledger`): config
#: field -> unit shown in messages.
BUDGETS = {"max_cost_usd": "USD", "max_session_hours": "session-hours", "max_run_hours": "hours"}


def budget_checks(state: RunState, cfg: RunConfig, now: float) -> dict[str, dict[str, float]]:
    """Each budget limit the config sets, with the figures its rule judges: ``limit``, ``spent`` by
    ``now``, ``next_step`` (one step projected: the largest of the last steps',
    `stepwise.core.ledger.step_projection`; 0 before a step has ended), ``steps`` (how many steps the
    projection adds: 1, or 2 in a projection made while the current step still trains) and
    ``projected`` = ``spent + steps x next_step``.

    - ``max_cost_usd``: the ledger's total in USD (session, agent and stack);
    - ``max_session_hours``: the training sessions' hours, waits included;
    - ``max_run_hours``: wall-clock hours since the run started (``ledger.run_started_at``).
    """
    from stepwise.core import ledger

    limits = {"max_cost_usd": cfg.max_cost_usd, "max_session_hours": cfg.max_session_hours,
              "max_run_hours": cfg.max_run_hours}
    if all(v is None for v in limits.values()):
        return {}
    per = ledger.step_projection(state)
    steps = 1 + state.ledger.pending_steps
    out: dict[str, dict[str, float]] = {}
    for name, limit in limits.items():
        if limit is None:
            continue
        if name == "max_cost_usd":
            spent, nxt = ledger.totals(state, cfg, now)["total"], per.usd if per else 0.0
        elif name == "max_session_hours":
            spent, nxt = ledger.session_seconds(state, now) / 3600, per.session_seconds / 3600 if per else 0.0
        else:
            started = state.ledger.run_started_at or state.session_created_at or now
            spent, nxt = max(0.0, now - started) / 3600, per.wall_seconds / 3600 if per else 0.0
        out[name] = {"limit": float(limit), "spent": spent, "next_step": nxt, "steps": float(steps),
                     "projected": spent + steps * nxt}
    return out


def _figure(value: float, unit: str, scale: float) -> str:
    """``value`` in ``unit``, every figure of one message at the precision its limit (``scale``) needs."""
    if unit == "USD":
        return f"${value:,.4f}" if scale < 100 else f"${value:,.2f}"
    return f"{value:.4f} {unit}" if scale < 100 else f"{value:,.2f} {unit}"


def describe_check(name: str, check: dict[str, float], n_recent: int) -> str:
    """``"$4.1200 spent, the next step projected at $0.6100 each (the largest of the last 3 step(s)): $4.7300
    against the limit $4.5000"``: a budget check's figures in words."""
    unit, scale = BUDGETS[name], check["limit"]
    steps = int(check["steps"])
    nxt = "the next step" if steps == 1 else f"the next {steps} steps"
    basis = f"the largest of the last {n_recent} step(s)" if n_recent else "no step has ended yet"
    return (f"{_figure(check['spent'], unit, scale)} spent, {nxt} projected at {_figure(check['next_step'], unit, scale)} "
            f"each ({basis}): {_figure(check['projected'], unit, scale)} against the limit "
            f"{_figure(check['limit'], unit, scale)}")


def _budget_rule(name: str) -> StopRule:
    def rule(state: RunState, cfg: RunConfig, now: float) -> str | None:
        check = budget_checks(state, cfg, now).get(name)
        if check is None or check["projected"] <= check["limit"]:
            return None
        n = len(state.ledger.recent_steps)
        return f"{name}: {describe_check(name, check, n)} (the run would pass it)"

    rule.__name__ = rule.__qualname__ = f"{name}_rule"
    rule.__doc__ = f"``{name}``: stop before a step whose projection (`budget_checks`) would pass the limit."
    return rule


max_cost_usd_rule = _budget_rule("max_cost_usd")
max_session_hours_rule = _budget_rule("max_session_hours")
max_run_hours_rule = _budget_rule("max_run_hours")


def record_checks(state: RunState, cfg: RunConfig, now: float) -> list[str]:
    """At a step's start: keep the budget checks' figures in ``state.ledger.checks`` (the step summary,
    ``stepwise watch``) and return a warning for each limit whose projection reached
    ``budget_warning_fraction`` of it for the first time (remembered in ``state.ledger.warned``, so
    each limit warns once per run). Mutates ``state``."""
    checks = budget_checks(state, cfg, now)
    state.ledger.checks = checks
    out = []
    n = len(state.ledger.recent_steps)
    for name, check in checks.items():
        if name in state.ledger.warned or check["projected"] < cfg.budget_warning_fraction * check["limit"]:
            continue
        state.ledger.warned.append(name)
        share = check["projected"] / check["limit"] if check["limit"] else 0.0
        out.append(f"{name} at {share:.0%} of its limit after step {state.step} "
                   f"(budget_warning_fraction {cfg.budget_warning_fraction:g}): {describe_check(name, check, n)}")
    return out


# ---------------------------------------------------------------------------- model selection


def _early_stopping_rule(state: RunState, cfg: RunConfig, now: float) -> str | None:
    """``early_stopping``: `stepwise.core.selection.early_stopping_rule` (the eval has stopped improving)."""
    from stepwise.core.selection import early_stopping_rule

    return early_stopping_rule(state, cfg, now)


#: The rules, asked in this order; the first answer stops the run.
RULES: tuple[StopRule, ...] = (max_steps_rule, max_cost_usd_rule, max_session_hours_rule, max_run_hours_rule,
                                _early_stopping_rule)


def stop_reason(state: RunState, cfg: RunConfig, now: float, rules: tuple[StopRule, ...] | None = None) -> str | None:
    """The first stop reason ``rules`` (default `RULES`) give for the step about to start (``state.step``
    completed), or None.

    Raises:
        BadStopReason: a rule answered a reason that reads as a failure (see the module doc).
    """
    from stepwise.core.phases import is_failure_stop

    for rule in RULES if rules is None else rules:
        reason = rule(state, cfg, now)
        if reason is not None:
            if is_failure_stop(reason) or not reason.strip():
                raise BadStopReason(f"stopping rule {rule.__name__} answered {reason!r}: a stop reason must name its "
                                    "rule and must not start with 'failed' or 'execution '")
            return reason
    return None


def projected_state(state: RunState, next_step: int) -> RunState:
    """``state`` as it will be when step ``next_step`` starts (a copy; ``state`` is not changed), for
    `plan_ahead`, which runs while step ``next_step - 1`` trains: ``step`` is ``next_step``, and the
    budget limits add the steps still to end before it (``ledger.pending_steps``) to their projection."""
    out = state.model_copy(update={"step": next_step}, deep=True)
    out.ledger.pending_steps = max(0, next_step - state.step)
    return out


def ahead_reason(state: RunState, cfg: RunConfig, now: float, next_step: int,
                 rules: tuple[StopRule, ...] | None = None) -> str | None:
    """The stop reason the rules would give at the start of step ``next_step`` (`projected_state`),
    or None: `plan_ahead` rolls nothing out ahead when there is one."""
    return stop_reason(projected_state(state, next_step), cfg, now, rules)
