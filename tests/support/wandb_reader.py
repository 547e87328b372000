"""Reading back what W&B wrote offline, with W&B's own reader: ``wandb leet inspect --json`` (the
transaction-log inspector that ships with the ``wandb`` package's ``wandb-core``), one JSON record
per line; no parser of ours reads the ``.wandb`` files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

WANDB = Path(sys.executable).with_name("wandb")


def records(run_dir: Path) -> list[dict[str, Any]]:
    """Every record of one offline run folder's transaction log."""
    out = subprocess.run([str(WANDB), "leet", "inspect", "--json", str(run_dir)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def offline_runs(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline run folders W&B made for ``run_id`` under ``wandb_dir`` (``WANDB_DIR``), oldest first."""
    root = wandb_dir / "wandb" if (wandb_dir / "wandb").is_dir() else wandb_dir
    return sorted(p for p in root.glob(f"offline-run-*-{run_id}*") if p.is_dir())


def history(wandb_dir: Path, run_id: str) -> tuple[set[str], list[dict[str, Any]], list[int]]:
    """``(W&B run ids seen, history rows, exit codes)`` of every offline folder of ``run_id``."""
    ids, rows, exits = set(), [], []
    for folder in offline_runs(wandb_dir, run_id):
        for rec in records(folder):
            if rec["type"] == "run":
                ids.add(rec["run"]["run_id"])
            elif rec["type"] == "history":
                rows.append(rec["history"]["item"])
            elif rec["type"] == "exit":
                exits.append(int(rec["exit"].get("exit_code", 0)))
    return ids, rows, exits
