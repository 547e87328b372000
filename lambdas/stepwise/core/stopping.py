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


#: The rules, asked in this order; the first answer stops the run.
RULES: tuple[StopRule, ...] = (max_steps_rule,)


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
    `plan_ahead`, which runs while step ``next_step - 1`` trains: ``step`` is ``next_step``."""
    return state.model_copy(update={"step": next_step}, deep=True)


def ahead_reason(state: RunState, cfg: RunConfig, now: float, next_step: int,
                 rules: tuple[StopRule, ...] | None = None) -> str | None:
    """The stop reason the rules would give at the start of step ``next_step`` (`projected_state`),
    or None: `plan_ahead` rolls nothing out ahead when there is one."""
    return stop_reason(projected_state(state, next_step), cfg, now, rules)
