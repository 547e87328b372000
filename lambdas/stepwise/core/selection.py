"""Model selection, pure: which of a run's models is the best, when its eval stopped improving, and
which of its model packages retention deletes.

The selection metric is ``early_stopping``'s ``metric`` / ``mode`` / ``min_delta`` when the run sets
that block, else the accuracy of the run's first eval set (``eval/accuracy`` for the unnamed
``eval_dataset_path``, else ``eval/NAME/accuracy`` of the first of ``eval_datasets``: the key its eval
summaries hold), higher is better, any gain counts (`criterion`). Every eval of a
training run (the baseline at step 0 included) appends one `stepwise.records.EvalPoint` to
``state.eval_history``: the metric's value and the model package the eval sampled from, which is the
sampler's weights after that step (SubmitTrain's ``save_weights`` after every optimizer step, so
every eval past step 0 already has its model package; at step 0 it is the base model, ``""``).

- *Improves*: a value beats the best so far by more than ``min_delta`` (Keras' ``EarlyStopping``
  and ``ModelCheckpoint(save_best_only=True)`` rule, with one threshold for both). A tie keeps the
  earlier eval, so the best is the first eval that reached the plateau.
- *Best*: the eval that last improved (`best_of`); its package is the run's best model package.
  Because an eval evaluates a model package that exists, marking the best saves nothing: no extra
  ``save_weights`` between steps, so it never meets the ahead batch of ``max_staleness`` 1, which a
  checkpoint planned at that step would have to wait for (`stepwise.core.phases.plan_checkpoint`).
- *Early stopping* (`early_stopping_rule`, one of `stepwise.core.stopping.RULES`, asked before each
  step after the evals due ran): ``patience`` evals in a row after the best that do not improve end
  the run gracefully; its stop reason names the metric, the best and the history.
- *Retention* ``best_and_last`` (`packages_to_delete`): at a successful end, every package the run
  created except the best, the final weights and the final ``save_state`` checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from stepwise.records import BatchRef, EvalPoint, RunState, Usage

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = ["Criterion", "best_of", "criterion", "early_stopping_rule", "evals_since_best", "history_text",
           "improves", "mark_deleted", "packages_to_delete", "record_eval_point", "refresh_best"]

#: History points a stop reason lists at most (the newest; the rest are summarised).
HISTORY_SHOWN = 12


class Criterion(NamedTuple):
    """The selection metric (an eval summary key), its direction and the minimum change that counts."""

    metric: str
    mode: str  # "max" | "min"
    min_delta: float


def criterion(cfg: RunConfig) -> Criterion:
    """``early_stopping``'s metric, mode and min_delta, else the first eval set's accuracy, max, 0:
    ``eval/accuracy`` for the unnamed set, ``eval/NAME/accuracy`` when the run has only named sets
    (`stepwise.config.RunConfig.eval_set_paths` order; `stepwise.core.evals.metric_key`)."""
    from stepwise.core.evals import metric_key

    es = cfg.early_stopping
    if es is not None:
        return Criterion(es.metric, es.mode, es.min_delta)
    first = next(iter(cfg.eval_set_paths), "")
    return Criterion(metric_key(first, "accuracy"), "max", 0.0)


def improves(value: float, best: float | None, mode: str, min_delta: float) -> bool:
    """``value`` beats ``best`` by more than ``min_delta`` in direction ``mode`` (any value beats None)."""
    if best is None:
        return True
    return value > best + min_delta if mode == "max" else value < best - min_delta


def best_of(history: Sequence[EvalPoint], mode: str, min_delta: float) -> EvalPoint | None:
    """The eval that last improved on the ones before it (the first of a plateau); None for no history."""
    best: EvalPoint | None = None
    for point in history:
        if improves(point.value, None if best is None else best.value, mode, min_delta):
            best = point
    return best


def evals_since_best(history: Sequence[EvalPoint], mode: str, min_delta: float) -> int:
    """Evals after the best one (`best_of`): how long the metric has not improved."""
    best = best_of(history, mode, min_delta)
    return 0 if best is None else len(history) - 1 - history.index(best)


def record_eval_point(state: RunState, cfg: RunConfig, step: int, summary: dict, model_package_arn: str) -> bool:
    """Append the eval at ``step`` to ``state.eval_history`` (replacing one recorded at that step) and
    update ``state.best``; returns True when it is the new best. An eval-only run, or a summary without
    the metric (a metric of no rollout), records nothing and returns False. Mutates ``state``."""
    if state.eval_only:
        return False
    c = criterion(cfg)
    value = summary.get(c.metric)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    point = EvalPoint(step=step, value=float(value), model_package_arn=model_package_arn)
    state.eval_history = [p for p in state.eval_history if p.step != step] + [point]
    state.eval_history.sort(key=lambda p: p.step)
    state.best = best_of(state.eval_history, c.mode, c.min_delta)
    return state.best == point


def refresh_best(state: RunState, cfg: RunConfig) -> None:
    """Recompute ``state.best`` from ``state.eval_history`` (after a resume rewound the history)."""
    c = criterion(cfg)
    state.best = best_of(state.eval_history, c.mode, c.min_delta)


def history_text(history: Sequence[EvalPoint], shown: int = HISTORY_SHOWN) -> str:
    """``"step 0: 0.1, step 2: 0.4, ..."`` (the newest ``shown`` points; older ones counted)."""
    head = f"{len(history) - shown} earlier evals, " if len(history) > shown else ""
    return head + ", ".join(f"step {p.step}: {p.value:.4g}" for p in history[-shown:])


def early_stopping_rule(state: RunState, cfg: RunConfig, now: float) -> str | None:
    """``early_stopping`` (a `stepwise.core.stopping` rule): the stop reason once ``patience`` evals after
    the best have not improved on it, naming the metric, the best eval and the history; else None.

    In a projection of the next step (`stepwise.core.stopping.projected_state`) whose eval is due and
    not recorded yet, it answers when that eval could be the last straw (``patience - 1`` evals since
    the best already), so no batch is rolled out ahead of the eval that may end the run."""
    es = cfg.early_stopping
    if es is None or state.eval_only:
        return None
    history = state.eval_history
    since = evals_since_best(history, es.mode, es.min_delta)
    if cfg.should_eval(state.step) and state.last_eval_step != state.step:
        if since + 1 >= es.patience and history:
            return (f"early_stopping: the eval due at step {state.step} may end the run ({es.metric} has not "
                    f"improved for {since} of {es.patience} evals)")
        return None
    if since < es.patience:
        return None
    best = best_of(history, es.mode, es.min_delta)
    assert best is not None
    return (f"early_stopping: {es.metric} has not improved by more than {es.min_delta:g} ({es.mode}) for {since} "
            f"evals (patience {es.patience}); best {best.value:.4g} at step {best.step}; history: "
            f"{history_text(history)}")


def packages_to_delete(state: RunState) -> tuple[list[str], list[str]]:
    """``(to delete, kept)`` under retention ``best_and_last``: of the packages the run created
    (``state.created_packages``), keep the best (``state.best``), the final weights
    (`stepwise.core.phases.final_weights`) and the newest ``save_state`` checkpoint (the one a resume
    loads); delete the others not deleted yet. Each list in creation order."""
    from stepwise.core.phases import final_weights

    final = final_weights(state)
    keep = {state.best.model_package_arn if state.best else "", final.model_package_arn if final else ""}
    states = [c for c in state.checkpoints if c.kind == "state"]
    if states:
        keep.add(max(states, key=lambda c: c.step).model_package_arn)
    keep.discard("")
    created = list(dict.fromkeys(state.created_packages))
    delete = [arn for arn in created if arn not in keep and arn not in state.deleted_packages]
    return delete, [arn for arn in created if arn in keep]


def mark_deleted(state: RunState, arns: Sequence[str]) -> None:
    """Record that retention deleted the model packages ``arns`` (mutates ``state``): each joins
    ``state.deleted_packages`` once (in the order given), and every checkpoint of one is marked
    ``deleted``, so a listing of the run's checkpoints never offers a package that is gone."""
    gone = set(arns)
    state.deleted_packages += [a for a in dict.fromkeys(arns) if a not in state.deleted_packages]
    for c in state.checkpoints:
        if c.model_package_arn in gone:
            c.deleted = True


def record_eval(state: RunState, cfg: RunConfig, batch: BatchRef, *, usage: Usage, summary: Mapping[str, Any],
                evaluated: str) -> None:
    """RecordEval's transition of the run state (mutated): eval batch ``batch`` is done (``usage``, its
    rollouts', joins the ledger; its step is marked evaluated, the final eval done when it was the final
    one) and its ``summary`` joins model selection's history and best for the model package ``evaluated``
    (`record_eval_point`). Not idempotent: a retry after the write is answered
    from the summary written (the batch is no longer planned).

    Raises:
        BatchMismatch: ``batch`` is not the planned batch (`stepwise.core.steps.check_batch`).
    """
    from stepwise.core.steps import check_batch

    check_batch(state, batch)
    state.current_batch = None
    state.ledger.usage.add(usage)
    state.last_eval_step = batch.step
    state.eval_steps = sorted({*state.eval_steps, batch.step})
    if batch.final:
        state.final_eval_done = True
    record_eval_point(state, cfg, batch.step, dict(summary), evaluated)
