"""The run's end as the execution's output and the run summary say it: shared by the stop paths
(StopSession, Cleanup) and the session sweeper, which records the end of a run whose execution ended
without a stop path (`write_run_summary`)."""

from __future__ import annotations

from typing import Any

from stepwise.core.operations import weights_usage
from stepwise.core.phases import final_weights
from stepwise.handlers._common import now
from stepwise.layout import run_summary_key
from stepwise.records import RunState


def tracking_status(reason: str) -> str:
    """The run's end status (MLflow's run statuses) for a stop reason: finished, stopped by the user, or failed."""
    if reason == "finished":
        return "FINISHED"
    if reason == "execution ABORTED":
        return "KILLED"
    return "FAILED"


def run_end(rs: Any, state: RunState, cfg: Any, cost: dict[str, Any], *, retention: bool) -> dict[str, Any]:
    """The execution's output and the run summary's body: ``stopped``, the session, `weights_report`
    (checkpoints marked ``deleted`` as retention records them), the cost, an eval-only run's
    `eval_report`, the packages deleted so far and, while retention is under way, how many it still
    deletes (``model_packages_to_delete``)."""
    from stepwise.core.selection import packages_to_delete

    out = {"stopped": True, "training_session_name": state.training_session_name, **weights_report(state, cfg.region),
           "cost": cost}
    if state.eval_only:
        out["eval"] = eval_report(rs, state.run_id, state)
    if state.deleted_packages:
        out["deleted_model_packages"] = list(state.deleted_packages)
    if retention:
        to_delete = len(packages_to_delete(state)[0])
        if to_delete:
            out["model_packages_to_delete"] = to_delete
    return out


def eval_report(rs: Any, run_id: str, state: RunState) -> dict[str, Any]:
    """An eval-only run's result for the execution's output: what was evaluated (``evaluated_model_package_arn``,
    ``""`` = the base model), the eval sets and their ``eval/*`` metrics (the eval's summary), where its
    summary and per-prompt results are; ``{}`` before the eval was recorded."""
    from stepwise.layout import eval_results_key, eval_summary_key

    if state.last_eval_step is None:
        return {}
    summary = rs.get_json_or(eval_summary_key(run_id, state.last_eval_step)) or {}
    metrics = {k: v for k, v in summary.items() if k.startswith("eval/") and isinstance(v, (int, float))}
    return {"evaluated_model_package_arn": summary.get("evaluated_model_package_arn", state.sampler_model_package_arn),
            "eval_sets": summary.get("eval_sets", []), "metrics": metrics,
            "summary_key": eval_summary_key(run_id, state.last_eval_step),
            "results_key": eval_results_key(run_id, state.last_eval_step)}


def weights_report(state: RunState, region: str) -> dict[str, Any]:
    """What the run leaves behind, for the execution's output: every checkpoint (step, kind, reason,
    model package ARN, ``deleted`` when retention deleted its package), the final weights (`stepwise.core.phases.final_weights`; ``None`` = nothing trained),
    the best model (`stepwise.core.selection`: ``{step, value, model_package_arn}`` of the eval that scored
    best, ``""`` = the base model; ``None`` without an eval) and how to sample or deploy the final weights."""
    final = final_weights(state)
    out: dict[str, Any] = {
        "checkpoints": [c.model_dump(include={"step", "kind", "reason", "model_package_arn", "deleted"})
                        for c in state.checkpoints],
        "final_weights": final.model_dump(include={"step", "kind", "reason", "model_package_arn", "policy_version"})
        if final else None,
        "best_model": state.best.model_dump() if state.best is not None and not state.eval_only else None,
    }
    if final is not None:
        out["use_final_weights"] = weights_usage(final.model_package_arn, region)
    return out


def write_run_summary(rs: Any, state: RunState, cfg: Any, *, reason: str, execution_arn: str, cost: dict[str, Any],
                      retention: bool = False) -> dict[str, Any]:
    """Write ``runs/{run_id}/summary.json``, the run's end (status `tracking_status`, reason, execution,
    step, policy version, `run_end`): its S3 notification runs Track, which ends the run's MLflow and W&B
    runs and renders the report page's last state, off the stop path. Returns `run_end`'s dict."""
    out = run_end(rs, state, cfg, cost, retention=retention)
    rs.put_json(run_summary_key(state.run_id), {
        "status": tracking_status(reason), "reason": reason if reason != "finished" else (state.stop_reason or "finished"),
        "execution_arn": execution_arn, "step": state.step, "policy_version": state.policy_version, "ended_at": now(),
        **{k: v for k, v in out.items() if k not in ("stopped", "training_session_name")}})
    return out
