"""The few lines about a whole run that every place a person reads says the same way: the best model,
the training session's state, what the run cost. Pure; read by the report page's header
(`stepwise.views.page`), `stepwise runs` / `watch` and run-local's closing lines
(`stepwise_cli.commands._runs`, `local.report`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["best_model", "best_text", "cost_line", "session_text"]


def best_model(state: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The run's best model (`stepwise.core.selection`): ``{step, value, model_package_arn}`` of the eval
    that scored best (``model_package_arn`` ``""`` = the base model), or None (no eval, an eval-only run).
    ``state``: ``state.json`` as JSON."""
    if not state or state.get("eval_only") or not isinstance(state.get("best"), Mapping):
        return None
    return dict(state["best"])


def best_text(best: Mapping[str, Any], base_model: str = "") -> str:
    """``eval after step 3 (0.9): ARN`` (the base model when the best eval was of no package)."""
    arn = best.get("model_package_arn") or f"the base model{f' {base_model}' if base_model else ''} (no package)"
    return f"eval after step {best.get('step')} ({best.get('value'):.4g}): {arn}"


def session_text(state: Mapping[str, Any] | None) -> str:
    """The training session's name and state: ``Stopped`` once the run stopped it (StopSession's
    StopTrainingSession answered and the ledger closed its seconds: it bills no more), else the status
    the run last read (``Creating``, ``Running``, ...)."""
    if not state:
        return "-"
    status = "Stopped" if state.get("session_stopped") else state.get("session_status", "-")
    return f"{state.get('training_session_name', '-')} ({status})"


def cost_line(state: Mapping[str, Any] | None, latest: Mapping[str, Any] | None = None) -> str:
    """What the run cost: the ledger's final line (and its estimate's) once the session stopped, else the
    total so far from ``latest`` (the newest step summary's ``cost/total_usd``), else ``-``."""
    final = ((state or {}).get("ledger") or {}).get("final") or {}
    if final.get("line"):
        return str(final["line"]) + (f" · {final['estimate_line']}" if final.get("estimate_line") else "")
    total = (latest or {}).get("cost/total_usd")
    if isinstance(total, (int, float)) and not isinstance(total, bool):
        return f"${total:,.2f} so far (through step {(latest or {}).get('step')})"
    return "-"
