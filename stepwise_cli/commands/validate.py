"""`stepwise validate CONFIG.json [--check-datasets] [--check-aws] [--json]`: check a run config without starting anything.

Prints ``ok`` and a one-screen summary (steps per epoch, rollouts per step, ...), or every
problem at once and exits 2. JSON or YAML; the reference loop's ``config.yaml`` loads, with a
warning (on stderr, and under ``warnings`` with ``--json``) for each field that cannot apply serverless. ``--check-datasets`` also reads the train (and eval) dataset,
local or ``s3://`` (default AWS credentials), requires at least ``batch_size`` train rows, and
adds the row counts to the summary — the same check Init runs before creating a session.

``--check-aws`` (implies ``--check-datasets``) runs every refusal Init makes before billing
(`stepwise.core.preflight`) against the deployed stack (``--stack`` / ``--bucket`` /
``--state-machine-arn`` / ``--region``, as the other commands find it): the run's region is the
stack's, the agent runtime exists (GetAgentRuntime), is READY and is one the stack may invoke, and
every S3 location is in a bucket the stack grants and reachable, and the tokenizer can be loaded (the summary's
``tokenizer_source`` says from where; a gated Hugging Face repository is refused unless the stack's secret,
``huggingFaceTokenSecretArn``, holds a token with access: the tokens Init will have, not this shell's). The stack's grants
(``STEPWISE_DATA_BUCKETS``, ``STEPWISE_AGENT_RUNTIME_ARNS``) are read from the deployed Init
function's environment (found through the state machine's definition), else from this environment.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any

from stepwise.config import ConfigError, RunConfig
from stepwise.datasets import DatasetError, check_dataset

if TYPE_CHECKING:
    from stepwise_cli.commands._runs import Deployment
    from stepwise.core.preflight import StackScope

EXIT_INVALID = 2


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="run config, JSON (or YAML) file")
    parser.add_argument("--check-datasets", action="store_true",
                        help="also read dataset_path / eval_dataset_path and count their rows")
    parser.add_argument("--check-aws", action="store_true",
                        help="also run Init's refusals against the deployed stack: region, agent runtime (GetAgentRuntime), "
                             "S3 locations and the stack's grants (implies --check-datasets; calls AWS, read-only)")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    from stepwise_cli.grammar import add_set

    add_set(parser)
    from stepwise_cli.commands._runs import add_stack_arguments

    add_stack_arguments(parser)


def check_datasets(cfg: RunConfig, *, s3_client: Any | None = None) -> tuple[dict[str, int], list[str]]:
    """Row counts of the train and eval datasets, and every problem found (``field: message``)."""
    rows: dict[str, int] = {}
    errors: list[str] = []
    checks = [("dataset_path", cfg.dataset_path, cfg.batch_size)]
    if cfg.eval_dataset_path:
        checks.append(("eval_dataset_path", cfg.eval_dataset_path, 1))
    checks += [(f"eval_datasets.{name}", path, 1) for name, path in cfg.eval_datasets.items()]
    for field, path, min_rows in checks:
        try:
            rows[field] = check_dataset(path, min_rows, s3_client=s3_client)
        except DatasetError as e:
            errors.append(f"{field}: {e}")
    return rows, errors


def init_function_environment(dep: "Deployment") -> dict[str, str]:
    """The deployed Init function's environment: the state machine's first state names the function.

    Returns {} when it cannot be read (no permission, another definition); the caller falls back.
    """
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        definition = json.loads(dep.sfn.describe_state_machine(stateMachineArn=dep.state_machine_arn)["definition"])
        init_arn = definition["States"][definition["StartAt"]]["Resource"]
        lam = boto3.client("lambda", region_name=dep.info.region or None)
        return dict(lam.get_function_configuration(FunctionName=init_arn).get("Environment", {}).get("Variables", {}))
    except (ClientError, BotoCoreError, KeyError, TypeError, ValueError):
        return {}


def deployed_scope(dep: "Deployment") -> "StackScope":
    """What the deployed stack grants its functions (see the module doc)."""
    from stepwise.core.preflight import StackScope, arn_account
    from stepwise.settings import (ENV_AGENT_RUNTIME_ARNS, ENV_BUCKET, ENV_DATA_BUCKETS, ENV_GATEWAY_CONCURRENCY,
                                   ENV_JUDGE_MODEL_IDS, ENV_REGION)

    env = init_function_environment(dep)
    grants = {k: env.get(k, os.environ.get(k, "")) for k in (ENV_DATA_BUCKETS, ENV_AGENT_RUNTIME_ARNS,
                                                              ENV_JUDGE_MODEL_IDS, ENV_GATEWAY_CONCURRENCY)}
    return StackScope.from_env({ENV_REGION: dep.info.region, ENV_BUCKET: dep.bucket, **grants},
                               account=arn_account(dep.state_machine_arn))


def check_aws(cfg: RunConfig, args: argparse.Namespace) -> tuple["StackScope", list[str]]:
    """Init's refusals against the deployed stack: ``(scope, problems)``; CommandError if no stack is found."""
    from stepwise_cli.commands._runs import deployment
    from stepwise.aws.s3_probe import probes
    from stepwise.core.preflight import refusals

    from stepwise.aws.hub import token_sources
    from stepwise.settings import ENV_HF_TOKEN_SECRET

    dep = deployment(args)
    scope = deployed_scope(dep)
    # The tokens Init will have: the stack's secret (read here with these credentials), not this shell's HF_TOKEN.
    init_env = init_function_environment(dep)
    found = probes(dep.s3, token_sources({ENV_HF_TOKEN_SECRET: init_env.get(ENV_HF_TOKEN_SECRET, "")}))
    problems = refusals(cfg, scope, found)
    args._tokenizer_source = found.found.get("tokenizer")
    return scope, problems


def _compact_projection(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary with `projection`'s keys merged into at most three lines for the text form (one screen):
    ``projected_step`` (USD and session-hours per step, and the assumptions), ``projected_run`` (the whole
    run's, and what the USD excludes) and ``projected_limits`` (the budget limits that would end the run
    early). Every value is kept; ``--json`` keeps the keys of `projection` apart."""
    out = {k: v for k, v in summary.items() if not (k.startswith("projected") or k.endswith("_ends_run_after")
                                                     or k == "projection_assumptions")}
    excludes = summary.get("projected_usd_excludes")
    step = f"{summary['projected_usd_per_step']}, {summary['projected_session_hours_per_step']} session-hours"
    if "projected_usd" in summary:
        out["projected_step"] = step
        run = f"{summary['projected_usd']}, {summary['projected_session_hours']} session-hours"
        out["projected_run"] = run + (f"; excludes {excludes}" if excludes else "")
    else:
        out["projected_step"] = step + (f"; excludes {excludes}" if excludes else "")
    limits = [f"{k.removesuffix('_ends_run_after')} ends the run after {v}" for k, v in summary.items()
              if k.endswith("_ends_run_after")]
    if limits:
        out["projected_limits"] = "; ".join(limits)
    out["projected_step"] += f" ({summary['projection_assumptions']})"
    return out


def _format_summary(summary: dict[str, Any]) -> str:
    if "projected_usd_per_step" in summary:
        summary = _compact_projection(summary)
    width = max(len(k) for k in summary)
    return "\n".join(f"  {k:<{width}}  {json.dumps(v) if isinstance(v, dict) else v}" for k, v in summary.items())


def projection(cfg: RunConfig, total_steps: int | None) -> dict[str, Any]:
    """The cost model's projection (`stepwise_cli.cost.estimate` at its default assumptions, from the price
    table the run's ledger uses): per step, and for the whole run when its steps are known."""
    from stepwise.core.ledger import usd
    from stepwise_cli.cost import estimate

    est = estimate(cfg, total_steps=total_steps)
    per = est["parts_per_step"]
    out: dict[str, Any] = {"projected_usd_per_step": usd(per["total"]),
                           "projected_session_hours_per_step": round(per["session_hours"], 4)}
    if "run" in est:
        out["projected_usd"] = usd(est["run"]["total"])
        out["projected_session_hours"] = round(est["run"]["session_hours"], 3)
    if cfg.session_usd_per_hour is None:
        out["projected_usd_excludes"] = "the training session (no session_usd_per_hour)"
    limits = {"max_cost_usd": (cfg.max_cost_usd, per["total"]),
              "max_session_hours": (cfg.max_session_hours, per["session_hours"])}
    for name, (limit, each) in limits.items():
        if limit is not None and each > 0 and (total_steps is None or limit < each * total_steps):
            out[f"{name}_ends_run_after"] = f"about {int(limit // each)} step(s) (projected)"
    out["projection_assumptions"] = "stepwise cost's defaults; `stepwise cost CONFIG` shows and changes them"
    return out


def run(args: argparse.Namespace) -> int:
    from stepwise_cli.commands._runs import load_config

    warnings: list[str] = []
    try:  # an invalid config: stepwise_cli.main prints it (exit 2) after these warnings
        cfg = load_config(args.config, args.set, warnings=warnings)
    finally:
        for w in warnings:
            print(f"warning: {w}", file=sys.stderr)
    train_rows: int | None = None
    scope = None
    if args.check_aws:
        from stepwise.core.preflight import RunRefused, resolve_region

        scope, refused = check_aws(cfg, args)  # a CommandError: stepwise_cli.main prints it, exit 1
        if refused:  # with the datasets' own problems, except where a refusal already names the field
            named = {e.split(":", 1)[0] for e in refused}
            refused += [e for e in check_datasets(cfg)[1] if e.split(":", 1)[0] not in named]
            print(str(RunRefused(refused, args.config)), file=sys.stderr)
            return EXIT_INVALID
        cfg = resolve_region(cfg, scope)
    if args.check_datasets or args.check_aws:
        rows, errors = check_datasets(cfg)
        if errors:
            print(str(ConfigError(errors, args.config)), file=sys.stderr)
            return EXIT_INVALID
        train_rows = rows["dataset_path"]
    summary = cfg.summary(train_rows)
    if scope is not None:
        summary["stack_region"] = scope.region
        summary["granted_buckets"] = ", ".join(scope.buckets)
        source = getattr(args, "_tokenizer_source", None)
        summary["tokenizer_source"] = source.describe() if source else (
            f"tokenizer_path (s3) {cfg.tokenizer_path}" if cfg.tokenizer_path.startswith("s3://") else "not looked up")
    if (args.check_datasets or args.check_aws) and cfg.has_evals:
        eval_rows = [v for k, v in rows.items() if k.startswith("eval_")]
        summary["eval_prompts"] = sum(min(n, cfg.eval_max_prompts) if cfg.eval_max_prompts > 0 else n for n in eval_rows)
        summary["eval_rollouts"] = summary["eval_prompts"] * cfg.eval_group_size
    summary.update(projection(cfg, summary.get("total_steps")))
    from stepwise.core.prices import SESSION_PRICE_HOWTO, is_unconfirmed_default

    if is_unconfirmed_default(cfg.session_usd_per_hour):
        warnings.append(f"session_usd_per_hour is the price table's unconfirmed default ({cfg.session_usd_per_hour:g} "
                        f"USD/h, deliberately high): to read your account's figure, {SESSION_PRICE_HOWTO}")
        print(f"warning: {warnings[-1]}", file=sys.stderr)
    if args.json:
        print(json.dumps({"ok": True, "warnings": warnings, "summary": summary}, indent=2))
    else:
        print(f"ok: {args.config}")
        print(_format_summary(summary))
    return 0
