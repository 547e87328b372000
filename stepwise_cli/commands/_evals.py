"""What `stepwise eval`, `stepwise compare` and `stepwise screen` share: a run's evals wherever the run
is, starting an eval-only run (on the deployed stack or the local stack), and the eval table.

A run is named as `stepwise watch` and `stepwise runs` name it: its run id on the deployed stack, or,
for a run of the local stack, its run folder (``runs-local/RUN_ID``, written by `stepwise run-local`,
which keeps each eval's ``summary.json`` and per-prompt ``results.json`` under ``evals/{step}/``).
`open_run` tells them apart: an existing folder is a local run, anything else a run id.

Kept light like `stepwise_cli.commands._runs`: the local stack (torch, moto) is imported only when a
command runs there (``--local``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from stepwise import layout
from stepwise.core.evals import metric_key
from stepwise.executions import TERMINAL_STATUSES
from stepwise.records import EvalResults
from stepwise_cli.commands._runs import (
    CommandError,
    Deployment,
    deployment,
    failure_message,
    get_json,
    run_config,
    run_state,
    step_folders,
    validate_run_id,
)

#: Where `stepwise run-local` writes run folders (``local.run.DEFAULT_OUT``; not imported: it pulls torch).
LOCAL_RUNS = Path("runs-local")


# ------------------------------------------------------------------------------ where a run's evals are


@dataclass
class RunEvals:
    """A run's evals: ``label`` (how it is named), its eval steps, each eval's summary and per-prompt
    results, its state and config. `LocalRunEvals` and `DeployedRunEvals` read them."""

    label: str

    def eval_steps(self) -> list[int]:
        raise NotImplementedError

    def summary(self, step: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def results_json(self, step: int) -> dict[str, Any] | None:
        raise NotImplementedError

    def state(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def config(self) -> dict[str, Any] | None:
        raise NotImplementedError

    def results(self, step: int) -> EvalResults:
        """The eval's per-prompt results. Raises CommandError when the eval has none (an eval recorded
        before per-prompt results existed, or a run folder written before it kept them)."""
        body = self.results_json(step)
        if body is None:
            raise CommandError(f"{self.label}: eval at step {step} has no per-prompt results (evals/{step}/results.json)")
        try:
            return EvalResults.model_validate(body)
        except ValidationError as e:
            first = e.errors()[0]
            where = ".".join(map(str, first["loc"])) or "the document"
            raise CommandError(f"{self.label}: evals/{step}/results.json is not an eval's per-prompt results "
                               f"({e.error_count()} errors; {where}: {first['msg']})") from None

    def _object(self, body: Any, step: int, name: str) -> dict[str, Any] | None:
        """``body`` when it is a JSON object or None (absent); CommandError naming the file otherwise."""
        if body is None or isinstance(body, dict):
            return body
        raise CommandError(f"{self.label}: evals/{step}/{name} is not a JSON object (got {type(body).__name__})")

    def last_eval(self) -> int:
        """The newest eval's step. Raises CommandError when the run has no eval."""
        steps = self.eval_steps()
        if not steps:
            raise CommandError(f"{self.label}: no eval recorded (no evals/STEP/summary.json)")
        return steps[-1]


@dataclass
class LocalRunEvals(RunEvals):
    """A local run folder (``runs-local/RUN_ID``)."""

    folder: Path = Path(".")

    def _json(self, *parts: str, strict: bool = False) -> Any | None:
        """The file's JSON; None when it cannot be read, or (``strict`` False) is not JSON."""
        path = self.folder.joinpath(*parts)
        try:
            return json.loads(path.read_text())
        except OSError:
            return None
        except ValueError as e:
            if strict:
                raise CommandError(f"{path}: not JSON ({str(e)[:200]})") from None
            return None

    def eval_steps(self) -> list[int]:
        evals = self.folder / "evals"
        return sorted(int(p.name) for p in evals.iterdir() if p.name.isdigit() and (p / "summary.json").is_file()) \
            if evals.is_dir() else []

    def summary(self, step: int) -> dict[str, Any] | None:
        return self._object(self._json("evals", str(step), "summary.json", strict=True), step, "summary.json")

    def results_json(self, step: int) -> dict[str, Any] | None:
        return self._object(self._json("evals", str(step), "results.json", strict=True), step, "results.json")

    def state(self) -> dict[str, Any] | None:
        return self._json("state.json")

    def config(self) -> dict[str, Any] | None:
        return self._json("run_config.json") or self._json("config.json")


@dataclass
class DeployedRunEvals(RunEvals):
    """A run of the deployed stack, read from its bucket."""

    dep: Deployment | None = None
    run_id: str = ""

    def eval_steps(self) -> list[int]:
        assert self.dep is not None
        return step_folders(self.dep.s3, self.dep.bucket, layout.summaries_prefix(self.run_id, "evals"))

    def summary(self, step: int) -> dict[str, Any] | None:
        assert self.dep is not None
        return self._object(get_json(self.dep.s3, self.dep.bucket, layout.eval_summary_key(self.run_id, step)), step,
                            "summary.json")

    def results_json(self, step: int) -> dict[str, Any] | None:
        assert self.dep is not None
        return self._object(get_json(self.dep.s3, self.dep.bucket, layout.eval_results_key(self.run_id, step)), step,
                            "results.json")

    def state(self) -> dict[str, Any] | None:
        assert self.dep is not None
        return run_state(self.dep, self.run_id)

    def config(self) -> dict[str, Any] | None:
        assert self.dep is not None
        return run_config(self.dep, self.run_id)


def is_run_folder(ref: str) -> bool:
    """``ref`` names a local run folder (a directory holding ``state.json``, ``evals/`` or ``config.json``)."""
    path = Path(ref)
    return path.is_dir() and any((path / name).exists() for name in ("state.json", "evals", "config.json"))


def open_run(ref: str, args: argparse.Namespace, dep: Deployment | None = None) -> RunEvals:
    """The run ``ref`` names: a local run folder, else a run id of the deployment ``args`` name.

    Raises:
        CommandError: neither a run folder nor a usable run id, or the deployment cannot be found.
    """
    if is_run_folder(ref):
        return LocalRunEvals(label=ref, folder=Path(ref))
    if "/" in ref or ref.startswith("."):
        raise CommandError(f"{ref}: not a local run folder (no state.json or evals/ in it)")
    validate_run_id(ref)
    return DeployedRunEvals(label=ref, dep=dep or deployment(args), run_id=ref)


# ------------------------------------------------------------------------------ the eval table


def set_label(name: str) -> str:
    return name or "(default)"


def eval_sets_of(summary: dict[str, Any]) -> list[str]:
    """The eval sets a summary reports (``eval_sets``; an older summary has the unnamed set only)."""
    sets = summary.get("eval_sets")
    return list(sets) if isinstance(sets, list) else [""]


def set_metrics_of(summary: dict[str, Any], eval_set: str) -> dict[str, float]:
    """``{metric: value}`` of one set in a summary (keys without the ``eval/`` or ``eval/NAME/`` prefix)."""
    prefix = metric_key(eval_set, "")
    named = {n for n in eval_sets_of(summary) if n}
    out: dict[str, float] = {}
    for key, value in summary.items():
        if not key.startswith(prefix) or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        rest = key[len(prefix):]
        if not eval_set and "/" in rest and rest.split("/", 1)[0] in named:
            continue  # a named set's key under eval/
        out[rest] = float(value)
    return out


#: Columns of the eval table, in order (those a summary lacks are left out; pass@k etc. follow).
_FIRST = ("prompts", "rollouts", "failed_rollouts", "accuracy")


_FAMILIES = ("mean", "pass", "all_pass", "all_fail", "mixed")


def metric_order(names: set[str]) -> list[str]:
    """Metrics in table order: counts and accuracy, mean@n, then pass@k, all_pass@k, all_fail@k, mixed@k by k."""
    def key(name: str) -> tuple[int, int, int, str]:
        family, _, k = name.partition("@")
        rank = _FAMILIES.index(family) if family in _FAMILIES else len(_FAMILIES)
        return (family != "mean", int(k) if k.isdigit() else 0, rank, name)

    return [m for m in _FIRST if m in names] + sorted(
        (m for m in names if m not in _FIRST and m not in ("n", "group_size")), key=key)


def eval_table(summary: dict[str, Any]) -> list[str]:
    """The eval's metrics, one line per eval set."""
    sets = eval_sets_of(summary)
    per_set = {s: set_metrics_of(summary, s) for s in sets}
    columns = metric_order({m for metrics in per_set.values() for m in metrics})
    titles = [_TITLES.get(c, c) for c in columns]
    width = max([len(set_label(s)) for s in sets] + [9])
    lines = [f"  {'eval set':<{width}}" + "".join(f"  {t:>{max(8, len(t))}}" for t in titles)]
    for s in sets:
        cells = []
        for c, t in zip(columns, titles):
            v = per_set[s].get(c)
            text = "-" if v is None else (f"{v:g}" if c in _COUNTS else f"{v:.3f}")
            cells.append(f"  {text:>{max(8, len(t))}}")
        lines.append(f"  {set_label(s):<{width}}" + "".join(cells))
    return lines


_COUNTS = ("prompts", "rollouts", "failed_rollouts")
_TITLES = {"failed_rollouts": "failed"}


def evaluated_text(summary: dict[str, Any], base_model: str = "") -> str:
    arn = summary.get("evaluated_model_package_arn")
    if arn:
        return f"model package {arn}"
    return f"the base model{f' {base_model}' if base_model else ''}" if arn == "" else "the run's policy"


# ------------------------------------------------------------------------------ running an eval-only run


def add_launch_arguments(parser: argparse.ArgumentParser, old_runs_dir: tuple[str, ...] = ("--out",)) -> None:
    """``--run-id``, ``--set``, ``--timeout``, ``--local`` and the local stack's flags (`stepwise_cli.grammar`;
    ``old_runs_dir``: the command's earlier spelling of ``--runs-dir``, kept for one release), and the
    deployment's arguments."""
    from stepwise_cli.commands._runs import add_stack_arguments
    from stepwise_cli.grammar import add_local, add_set, add_timeout

    parser.add_argument("--run-id", help="run id = execution name (default: CONFIG-STEM-KIND-UTCTIME)")
    add_set(parser)
    add_timeout(parser)
    add_local(parser, old_runs_dir=old_runs_dir)
    add_stack_arguments(parser)


def default_run_id(config: str, kind: str) -> str:
    """``{config stem}-{kind}-{YYYYMMDD-HHMMSS}`` (UTC), a valid run id."""
    from stepwise.executions import default_run_id as start_default

    stem, _, stamp = start_default(config).rpartition("-")
    stem, _, day = stem.rpartition("-")
    return f"{stem[:44].rstrip('-')}-{kind}-{day}-{stamp}"


def launch(args: argparse.Namespace, overrides: dict[str, Any], kind: str) -> RunEvals:
    """Start an eval-only run of ``args.config`` with ``overrides`` (which set ``eval_only``), wait for
    its end, and return its evals. On the local stack with ``--local`` (`local.run.run_local`: the run
    folder is ``{args.runs_dir}/{run id}``), else on the deployed stack (`stepwise_cli.commands.start.start`,
    then DescribeExecution every few seconds).

    Raises:
        CommandError: the run did not succeed (its error and cause), or ran past ``--timeout``.
        stepwise.config.ConfigError: the config with the overrides is invalid.
    """
    from stepwise_cli.grammar import parse_acr_faults, parse_sets

    overrides = {**overrides, **parse_sets(args.set)}
    run_id = validate_run_id(args.run_id or default_run_id(args.config, kind))
    from stepwise_cli.grammar import local_only

    local_only(args, kind)
    if args.local:
        from local.run import run_local

        print(f"{kind}: local run {run_id} -> {Path(args.runs_dir) / run_id}", file=sys.stderr)
        result = run_local(Path(args.config), run_id=run_id, out_root=Path(args.runs_dir), overrides=overrides,
                           progress=not args.no_progress, timeout=args.timeout, quiet=not getattr(args, "verbose", False),
                           mirror_s3=getattr(args, "mirror_s3", False), agent=getattr(args, "agent", None),
                           acr_faults=parse_acr_faults(getattr(args, "acr_fault", [])))
        if result.status != "SUCCEEDED":
            failure = result.failure
            raise CommandError(f"run {run_id} {result.status}"
                               + (f" in {failure.state!r}: {failure.error}: {str(failure.cause or '')[:1500]}"
                                  if failure else ""))
        return LocalRunEvals(label=str(result.run_dir), folder=result.run_dir)
    from stepwise_cli.commands import start

    started = start.start(argparse.Namespace(**{**vars(args), "run_id": run_id}), overrides)  # validates first
    dep = deployment(args)
    print(f"{kind}: started run {run_id} ({started['console_url']})", file=sys.stderr)
    wait_for_end(dep, started["execution_arn"], args.timeout)
    return DeployedRunEvals(label=run_id, dep=dep, run_id=run_id)


def wait_for_end(dep: Deployment, execution_arn: str, timeout: float | None, interval: float = 5.0) -> dict[str, Any]:
    """DescribeExecution until the execution ends (an eval-only run is one execution); its description.

    Raises:
        CommandError: it did not succeed, or still ran after ``timeout`` seconds.
    """
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        desc = dep.sfn.describe_execution(executionArn=execution_arn)
        if desc["status"] in TERMINAL_STATUSES:
            if desc["status"] != "SUCCEEDED":
                raise CommandError(f"execution {desc['name']} {desc['status']}: {desc.get('error')}: "
                                   f"{failure_message(desc.get('cause'))[:1500]}")
            return desc
        if deadline is not None and time.monotonic() > deadline:
            raise CommandError(f"execution {desc['name']} still {desc['status']} after {timeout:g}s "
                               f"(`stepwise watch {desc['name']}` follows it; `stepwise stop` ends it)")
        time.sleep(interval)

