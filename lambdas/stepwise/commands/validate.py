"""`stepwise validate CONFIG.json [--check-datasets] [--json]`: check a run config without starting anything.

Prints ``ok`` and a one-screen summary (steps per epoch, rollouts per step, ...), or every
problem at once and exits 2. JSON or YAML; the reference loop's ``config.yaml`` loads, with a
warning (on stderr, and under ``warnings`` with ``--json``) for each field that cannot apply serverless. ``--check-datasets`` also reads the train (and eval) dataset,
local or ``s3://`` (default AWS credentials), requires at least ``batch_size`` train rows, and
adds the row counts to the summary — the same check Init runs before creating a session.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from stepwise.config import ConfigError, RunConfig, load_run_config
from stepwise.datasets import DatasetError, check_dataset

EXIT_INVALID = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config, JSON (or YAML) file")
    parser.add_argument("--check-datasets", action="store_true",
                        help="also read dataset_path / eval_dataset_path and count their rows")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def check_datasets(cfg: RunConfig, *, s3_client: Any | None = None) -> tuple[dict[str, int], list[str]]:
    """Row counts of the train and eval datasets, and every problem found (``field: message``)."""
    rows: dict[str, int] = {}
    errors: list[str] = []
    checks = [("dataset_path", cfg.dataset_path, cfg.batch_size)]
    if cfg.eval_dataset_path:
        checks.append(("eval_dataset_path", cfg.eval_dataset_path, 1))
    for field, path, min_rows in checks:
        try:
            rows[field] = check_dataset(path, min_rows, s3_client=s3_client)
        except DatasetError as e:
            errors.append(f"{field}: {e}")
    return rows, errors


def _format_summary(summary: dict[str, Any]) -> str:
    width = max(len(k) for k in summary)
    return "\n".join(f"  {k:<{width}}  {json.dumps(v) if isinstance(v, dict) else v}" for k, v in summary.items())


def run(args: argparse.Namespace) -> int:
    warnings: list[str] = []
    try:
        cfg = load_run_config(args.config, warnings=warnings)
    except ConfigError as e:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
        print(str(e), file=sys.stderr)
        return EXIT_INVALID
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    train_rows: int | None = None
    if args.check_datasets:
        rows, errors = check_datasets(cfg)
        if errors:
            print(str(ConfigError(errors, args.config)), file=sys.stderr)
            return EXIT_INVALID
        train_rows = rows["dataset_path"]
    summary = cfg.summary(train_rows)
    if args.check_datasets and cfg.eval_dataset_path:
        eval_rows = rows["eval_dataset_path"]
        summary["eval_prompts"] = min(eval_rows, cfg.eval_max_prompts) if cfg.eval_max_prompts > 0 else eval_rows
    if args.json:
        print(json.dumps({"ok": True, "warnings": warnings, "summary": summary}, indent=2))
    else:
        print(f"ok: {args.config}")
        print(_format_summary(summary))
    return 0
