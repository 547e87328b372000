"""Optional Weights & Biases tracking (filled in below)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stepwise.config import RunConfig


def enabled(cfg: RunConfig) -> bool:
    return bool(getattr(cfg, "wandb_project", ""))


def step_warning(cfg: RunConfig, run_id: str, kind: str, step: int, summary: Any, table: Any) -> str | None:
    return None


def finish(cfg: RunConfig, run_id: str, status: str, ended: Any = None) -> str | None:
    return None
