"""`stepwise screen CONFIG --k K --out PATH [--local]`: drop the training prompts that cannot teach.

An eval-only run over CONFIG's training prompts (``dataset_path``, its first ``max_prompts`` rows when
the config sets it) at group size K and the training temperature, with the base model (or
``--model-package``, the policy a run would continue from). Each distinct prompt is rolled out K times
once, however many rows repeat it (its payloads are written beside PATH as ``.prompts.jsonl``, the
eval set of the run), and its pass rate decides every row holding it (`stepwise.core.screening`):
always solved (all-pass) and never solved (all-fail) prompts give GRPO all-equal groups, so they are
removed. It writes:

- ``PATH``: the screened dataset, JSON Lines of ``{"payload": ...}`` rows, the kept rows in dataset
  order or ``--order easy_first`` / ``hard_first`` (by pass rate, a curriculum). A run config names it
  as its ``dataset_path``;
- ``PATH`` with ``.screen.json`` for its suffix: K, the figures (rows kept and removed, the fraction of
  groups mixed at K before and after) and every prompt's rows, rollouts, successes, pass rate,
  mixed@K, verdict and payload.

``--min-pass-rate`` / ``--max-pass-rate`` widen the verdicts (e.g. 0.95 also drops prompts solved 31
times of 32). The eval's rollouts (distinct prompts x K) must fit one Distributed Map run (10,000
children): screen a larger dataset in parts with ``--set max_prompts=N``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stepwise.core.screening import ORDERS, Screening, screen
from stepwise_cli.commands._evals import add_launch_arguments, launch
from stepwise_cli.grammar import parse_sets
from stepwise_cli.commands._runs import EXIT_OK, CommandError


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="the training run config whose dataset_path is screened")
    parser.add_argument("--k", type=int, required=True, help="group size to screen at (the run's responses_per_prompt)")
    from stepwise_cli.grammar import add_json, add_out

    add_out(parser, "the screened dataset to this file (JSON Lines); its report goes beside it (.screen.json)",
            dest="output", type=Path, required=True)
    add_json(parser, "the screen's report (what FILE.screen.json holds) instead of its summary lines")
    parser.add_argument("--order", choices=ORDERS, default="dataset", help="order of the kept rows (default: dataset)")
    parser.add_argument("--min-pass-rate", type=float, default=0.0, help="too hard at or below this (default 0: all-fail)")
    parser.add_argument("--max-pass-rate", type=float, default=1.0, help="too easy at or above this (default 1: all-pass)")
    parser.add_argument("--model-package", metavar="ARN", help="screen with this model package (default: the base model)")
    parser.add_argument("--temperature", type=float, help="sampling temperature (default: the config's temperature)")
    add_launch_arguments(parser, old_runs_dir=("--runs-out",))


def screen_overrides(raw: dict[str, Any], k: int, temperature: float | None, model_package: str | None,
                     prompts_path: Path) -> dict[str, Any]:
    """The config fields that make a training config an eval-only run over ``prompts_path`` (its
    distinct training prompts) at group size ``k``."""
    if k < 1:
        raise CommandError(f"--k must be at least 1, got {k}")
    return {"eval_only": True, "eval_model_package_arn": model_package or "", "resume_from_model_package": "",
            "eval_dataset_path": str(prompts_path.resolve()), "eval_datasets": {}, "eval_max_prompts": 0,
            "eval_group_size": k, "eval_temperature": raw.get("temperature", 1.0) if temperature is None else temperature,
            "eval_pass_k": sorted({1, k}), "eval_every": 0, "eval_before_train": None}


def read_dataset(path: str, limit: int, config_dir: Path, local: bool) -> list[dict[str, Any]]:
    """The first ``limit`` payloads (0 = all) of the dataset at ``path``: a local file (resolved as
    run-local resolves it with ``local``, else as given) or ``s3://`` (your credentials)."""
    from stepwise.datasets import iter_payloads

    source, s3 = path, None
    if path.startswith("s3://"):
        import boto3

        s3 = boto3.client("s3")
    elif local:
        from local.datasets import resolve_dataset

        source = str(resolve_dataset(path, config_dir))
    out: list[dict[str, Any]] = []
    for payload in iter_payloads(source, s3_client=s3):
        out.append(payload)
        if limit and len(out) >= limit:
            break
    return out


def check_writable(output: Path) -> None:
    """Refuse, before anything is rolled out, an ``--out`` that cannot be written: a folder, or a path whose
    folder cannot be made or written (checked by creating the three files, then removing the ones that
    were not there).

    Raises:
        CommandError: naming the path and why.
    """
    if output.is_dir():
        raise CommandError(f"--out {output} is a folder: name the screened dataset's file (e.g. {output}/screened.jsonl)")
    for path in (output, prompts_path(output), report_path(output)):
        existed = path.exists()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            with path.open("a"):
                pass
        except OSError as e:
            raise CommandError(f"cannot write --out {path}: {e.strerror or e}") from e
        if not existed:
            path.unlink()


def prompts_path(output: Path) -> Path:
    """Where the distinct prompts the screen rolls out are written (beside the screened dataset)."""
    return output.with_suffix(".prompts.jsonl")


def report_path(output: Path) -> Path:
    return output.with_suffix(".screen.json")


def write_outputs(output: Path, result: Screening, payloads: dict[int, dict[str, Any]], meta: dict[str, Any]) -> Path:
    """Write the screened dataset and its report; returns the report's path."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as fh:
        for row in result.kept_rows:
            fh.write(json.dumps({"payload": payloads[row]}, ensure_ascii=False) + "\n")
    report = {**meta, **result.figures(), "order": meta.get("order"), "prompts": [
        {"fingerprint": p.fingerprint, "rows": p.rows, "rollouts": p.n, "successes": p.successes,
         "pass_rate": p.pass_rate, f"mixed@{result.k}": p.mixed_at_k, "verdict": p.verdict,
         "payload": payloads.get(p.rows[0])} for p in result.prompts]}
    path = report_path(output)
    path.write_text(json.dumps(report, indent=2, ensure_ascii=False))
    return path


def run(args: argparse.Namespace) -> int:
    from stepwise.config import drop_unsupported, read_config_file
    from stepwise.core.screening import distinct_rows


    if args.k < 1:
        raise CommandError(f"--k must be at least 1, got {args.k}")
    check_writable(args.output)
    raw = read_config_file(args.config)
    if not isinstance(raw, dict) or not raw.get("dataset_path"):
        raise CommandError(f"{args.config}: needs a dataset_path to screen")
    # --set applies to the rows screened too (max_prompts, dataset_path), not only to the eval-only run
    raw = {**drop_unsupported(raw)[0], **parse_sets(args.set)}
    if not 0.0 <= args.min_pass_rate < args.max_pass_rate <= 1.0:
        raise CommandError("need 0 <= --min-pass-rate < --max-pass-rate <= 1")
    payloads = read_dataset(str(raw["dataset_path"]), int(raw.get("max_prompts") or 0), Path(args.config).parent,
                            args.local)
    first, rows_of = distinct_rows(payloads)
    distinct = prompts_path(args.output)
    distinct.parent.mkdir(parents=True, exist_ok=True)
    distinct.write_text("".join(json.dumps({"payload": payloads[r]}, ensure_ascii=False) + "\n" for r in first))
    print(f"screen: {len(payloads)} rows, {len(first)} distinct prompts x {args.k} rollouts ({distinct})",
          file=sys.stderr)
    overrides = screen_overrides(raw, args.k, args.temperature, args.model_package, distinct)
    evals = launch(args, overrides, "screen")
    results = evals.results(evals.last_eval())
    result = screen(results.prompts, args.k, rows_of=rows_of, min_pass_rate=args.min_pass_rate,
                    max_pass_rate=args.max_pass_rate, order=args.order)
    report = write_outputs(args.output, result, dict(enumerate(payloads)), {
        "config": str(args.config), "run": evals.label, "dataset_path": raw["dataset_path"],
        "model_package_arn": results.model_package_arn, "temperature": overrides["eval_temperature"],
        "min_pass_rate": args.min_pass_rate, "max_pass_rate": args.max_pass_rate, "order": args.order,
        "rollouts": sum(p.n for p in results.prompts)})
    if args.json:
        print(Path(report).read_text())
        return EXIT_OK
    f = result.figures()
    print(f"screened {f['rows']} rows ({f['prompts']} prompts, {args.k} rollouts each) (run {evals.label}):")
    print(f"  kept {f['kept_rows']} rows ({f['kept_prompts']} prompts); removed {f['removed_too_easy_rows']} always "
          f"solved, {f['removed_too_hard_rows']} never solved")
    print(f"  groups of {args.k} with mixed outcomes: {f[f'mixed@{args.k}_before']:.3f} of the dataset's, "
          f"{f[f'mixed@{args.k}_after']:.3f} of the screened dataset's")
    print(f"  screened dataset: {args.output} (dataset_path of a run config); report: {report}")
    return EXIT_OK
