"""`stepwise start CONFIG.json [--run-id ID] [--resume]`: validate, upload local data, start the run.

1. The config (JSON or YAML, e.g. the reference loop's ``config.yaml``: the fields that cannot apply
   serverless are dropped with a warning) is validated (`stepwise.config.load_run_config`) and its datasets checked
   (`stepwise.datasets.check_dataset`: readable, a ``payload`` on every row, >= ``batch_size``
   train rows) -- the checks Init repeats before it creates a billed training session.
2. Local files are uploaded to the stack's bucket and the config rewritten to point at them:
   ``dataset_path`` / ``eval_dataset_path`` -> ``s3://BUCKET/datasets/{run_id}/{file name}``, and a
   local ``tokenizer_path`` directory -> ``s3://BUCKET/datasets/{run_id}/tokenizer/``. ``s3://`` paths are
   kept as they are.
3. One execution of the training loop is started, named after the run id, with the rewritten
   config as its input. The run id and the execution's console link are printed.

Before anything starts, the run's projected cost (`stepwise_cli.cost.estimate`, as ``stepwise cost`` shows it)
is printed, with a warning (`cap_warnings`) when nothing caps the run's spending (neither ``max_cost_usd`` nor
``max_session_hours``) or when its session price is the price table's unconfirmed default.

With ``--local`` the whole run goes on this machine instead (`local.run`: moto, the SageMaker simulator, the
gateway, the ACR emulator), followed to its end with a progress bar, in a run folder under ``--runs-dir``;
``stepwise run-local`` is its old spelling.

An existing run id (an execution of that name, or ``runs/{run_id}/state.json``) is refused,
unless ``--resume`` is given, which hands over to `stepwise resume` (the config is then ignored:
the run continues with the config it started with).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from stepwise import layout
from stepwise.executions import default_run_id
from stepwise_cli.commands._runs import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Deployment,
    add_stack_arguments,
    console_url,
    deployment,
    execution_lines,
    run_executions,
    run_state,
    validate_run_id,
)

DATASET_FIELDS = ("dataset_path", "eval_dataset_path")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config, JSON (or YAML) file; see docs/config.md")
    parser.add_argument("--run-id", help="run id = execution name (default: CONFIG-STEM-YYYYMMDD-HHMMSS, UTC)")
    parser.add_argument("--resume", action="store_true",
                        help="if the run id exists, resume that run (as `stepwise resume RUN`) instead of refusing")
    parser.add_argument("--json", action="store_true", help="print {run_id, execution_arn, console_url} as JSON "
                                                            "(--local: the run's result)")
    from stepwise_cli.grammar import add_local, add_set, add_timeout

    add_set(parser)
    add_timeout(parser)
    # `stepwise run-local` was this command with --local: its --out (the run folders' parent) still works
    add_local(parser, old_runs_dir=("--out",), simulator=True)
    add_stack_arguments(parser)


def run_exists(dep: Deployment, run_id: str) -> bool:
    """An execution of the run, or its state in the bucket, exists."""
    return bool(run_executions(dep, run_id)) or run_state(dep, run_id) is not None


def upload_inputs(raw: dict[str, Any], *, s3: Any, bucket: str, run_id: str) -> tuple[dict[str, Any], list[str]]:
    """Upload local dataset files and a local tokenizer directory; returns ``(rewritten config, uploaded URIs)``.

    Raises:
        CommandError: a local path does not exist.
    """
    out = dict(raw)
    uploaded: list[str] = []

    def upload(field: str, value: Any, prefix: str = "") -> Any:
        if not value or str(value).startswith("s3://"):
            return value
        path = Path(str(value))
        if not path.is_file():
            raise CommandError(f"{field}: {value} is not a file")
        key = layout.upload_key(run_id, prefix + path.name)
        s3.upload_file(str(path), bucket, key)
        uploaded.append(f"s3://{bucket}/{key}")
        return uploaded[-1]

    for field in DATASET_FIELDS:
        if out.get(field):
            out[field] = upload(field, out[field])
    if isinstance(out.get("eval_datasets"), dict):  # named eval sets: the name keeps equal file names apart
        out["eval_datasets"] = {name: upload(f"eval_datasets.{name}", path, f"eval-{name}-")
                                for name, path in out["eval_datasets"].items()}
    tok = out.get("tokenizer_path")
    if tok and not str(tok).startswith("s3://") and Path(str(tok)).is_dir():
        prefix = layout.upload_tokenizer_prefix(run_id)
        files = [p for p in sorted(Path(str(tok)).iterdir()) if p.is_file()]
        if not files:
            raise CommandError(f"tokenizer_path: {tok} holds no files")
        for p in files:
            s3.upload_file(str(p), bucket, prefix + p.name)
        out["tokenizer_path"] = f"s3://{bucket}/{prefix}"
        uploaded.append(out["tokenizer_path"])
    return out, uploaded


def cap_warnings(cfg: Any, estimate: dict[str, Any]) -> list[str]:
    """Warnings about what caps the run's spending (`stepwise.core.stopping` ends a run at ``max_cost_usd`` or
    ``max_session_hours``): none when either is set, with a known price; else what the projection says it may
    cost and how to cap it. ``estimate``: `stepwise_cli.cost.estimate`'s result for the run."""
    from stepwise.core.ledger import usd
    from stepwise.core.prices import SESSION_DEFAULT_USD_PER_HOUR, is_unconfirmed_default, session_price

    out = []
    run = estimate.get("run") or estimate["parts_per_step"]
    span = f"for its {run['steps']} steps" if "steps" in run else "per step"
    projected = (f"projected {usd(run['total'])} and {run['session_hours']:.2f} session-hours {span}"
                 + ("" if "session" in run else " (the session not priced: no session_usd_per_hour)"))
    if cfg.max_cost_usd is None and cfg.max_session_hours is None:
        price = session_price(cfg.base_model_arn)
        out.append(f"this run has no dollar or hour cap ({projected}): nothing but its steps ends it. Set max_cost_usd "
                   f"(with session_usd_per_hour; the price table says {price.usd_per_hour:g} USD/h for this model"
                   f"{'' if price.confirmed else ', a default to confirm'}) or max_session_hours")
    if is_unconfirmed_default(cfg.session_usd_per_hour):
        out.append(f"session_usd_per_hour is the price table's default ({SESSION_DEFAULT_USD_PER_HOUR:g} USD/h, "
                   f"deliberately high: AWS publishes no figure for training sessions), so max_cost_usd ends the run "
                   f"early rather than late; replace it with your account's figure (docs/my-agent.md, 'What a "
                   f"session costs')")
    return out


def _read_raw(path: str) -> dict[str, Any]:
    """The config file's fields (JSON or YAML), without the reference fields that cannot apply
    serverless (`stepwise.config.drop_unsupported`: warned about by the validation before)."""
    from stepwise.config import drop_unsupported, read_config_file

    raw = read_config_file(path)
    if not isinstance(raw, dict):
        raise CommandError(f"{path}: must be a JSON object of fields")
    return drop_unsupported(raw)[0]


def start(args: argparse.Namespace, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Validate, upload, start; returns ``{run_id, execution_arn, console_url, uploaded}``.

    ``overrides``: fields set over the config file's (`stepwise eval` and `stepwise screen` start
    eval-only runs of a training config this way).

    Raises:
        ConfigError: the config or a dataset is invalid (every problem at once).
        CommandError: the run exists (without ``--resume``) or the deployment cannot be found.
    """
    from stepwise_cli.commands.validate import check_datasets
    from stepwise.config import ConfigError, load_run_config

    warnings: list[str] = []
    raw = {**_read_raw(args.config), **(overrides or {})}
    if overrides:
        cfg = load_run_config(raw)
    else:
        cfg = load_run_config(args.config, warnings=warnings)
    for w in warnings:
        print(f"warning: {w}", file=sys.stderr)
    run_id = validate_run_id(args.run_id or default_run_id(args.config))
    dep = deployment(args)
    if run_exists(dep, run_id):
        raise CommandError(
            f"run {run_id!r} already exists; resume it with `stepwise resume {run_id}` (or start --resume), "
            "or choose another --run-id"
        )
    from stepwise.core.preflight import StackScope, region_errors

    # Init would refuse it (stepwise.core.preflight); say so before uploading anything.
    errors = region_errors(cfg, StackScope(region=dep.info.region, bucket=dep.bucket)) if dep.info.region else []
    rows, dataset_errors = check_datasets(cfg, s3_client=dep.s3)
    errors += dataset_errors
    if errors:
        raise ConfigError(errors, args.config)
    rewritten, uploaded = upload_inputs(raw, s3=dep.s3, bucket=dep.bucket, run_id=run_id)
    load_run_config(rewritten)  # still valid with s3:// paths
    # the run's cost estimate, kept beside its uploads: the ledger is compared with it at the end
    from stepwise_cli.cost import put_estimate

    est = put_estimate(dep.s3, dep.bucket, run_id, cfg, cfg.total_steps(rows["dataset_path"]) if "dataset_path" in rows else None)
    for w in cap_warnings(cfg, est):  # before the execution starts: the last moment to cap it
        print(f"warning: {w}", file=sys.stderr)
    resp = dep.sfn.start_execution(stateMachineArn=dep.state_machine_arn, name=run_id, input=json.dumps(rewritten))
    arn = resp["executionArn"]
    return {"run_id": run_id, "execution_arn": arn, "console_url": console_url(arn), "uploaded": uploaded,
            "config_region": cfg.region or dep.info.region, "stack_region": dep.info.region,
            "estimate": est.get("run") or est["parts_per_step"]}


def run(args: argparse.Namespace) -> int:
    from stepwise_cli.grammar import UsageError, local_only, parse_sets

    if args.local:  # the whole run on this machine, followed to its end (local.run)
        if args.resume:
            raise UsageError("--resume continues a deployed run; a local run starts afresh (give another --run-id)")
        from local.run import run as run_on_local_stack

        return run_on_local_stack(args)
    local_only(args, "start")
    if args.timeout is not None:
        raise UsageError("--timeout needs --local: a deployed run's start returns once it started "
                         "(`stepwise watch RUN --timeout SECONDS` gives up watching it)")
    if args.resume and args.run_id:
        from stepwise_cli.commands import resume

        dep = deployment(args)
        if run_exists(dep, validate_run_id(args.run_id)):
            return resume.run(argparse.Namespace(**{**vars(args), "run": args.run_id}))
    out = start(args, parse_sets(args.set))
    if args.json:
        print(json.dumps(out, indent=2))
        return EXIT_OK
    for uri in out["uploaded"]:
        print(f"uploaded {uri}")
    print(f"started run {out['run_id']}")
    est = out["estimate"]
    from stepwise.core.ledger import usd

    print(f"estimated {usd(est['total'])} and {est['session_hours']:.2f} session-hours"
          + (f" for {est['steps']} steps" if "steps" in est else " per step")
          + ("" if "session" in est else " (the session not priced: no session_usd_per_hour)")
          + "; `stepwise cost` explains it")
    print("\n".join(execution_lines(out["run_id"], out["execution_arn"])))
    return EXIT_OK if out["execution_arn"] else EXIT_FAILED
