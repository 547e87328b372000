"""`stepwise cost CONFIG.json`: estimate what a run costs per step and in all: the training session,
the ACR agent and the stack's own services.

The model is `stepwise_cli.cost` (session-hours per step; ACR session-seconds per rollout; Lambda
GB-seconds and requests, Step Functions transitions read off the deployed ASL, S3 requests), at the
prices of `stepwise.core.prices` (dated, with their region) and the config's ``session_usd_per_hour``,
``acr_vcpus`` and ``acr_memory_gb``: the same table the run's cost ledger prices with. Not included:
CloudWatch, data transfer. The run total needs the number of steps: ``--steps``, or the train
dataset's rows when ``dataset_path`` is a local file (or ``--check-datasets`` for an ``s3://`` one).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stepwise_cli.commands._runs import EXIT_OK

if TYPE_CHECKING:
    from stepwise.config import RunConfig


#: The `stepwise_cli.cost.Assumptions` fields the command takes as ``--field-name SECONDS|COUNT``
#: (defaults: the dataclass's), with their help.
ASSUMPTION_FLAGS = (
    ("turns_per_rollout", "LLM calls per rollout"),
    ("seconds_per_turn", "gateway seconds per LLM call"),
    ("gen_batches_per_step", "DAPO generation batches per step on average"),
    ("train_seconds", "seconds the session takes per training step"),
    ("rollout_seconds", "wall seconds of one generation batch's rollouts (default: from the batch, acr_tps_limit, "
                        "the Map's concurrency and --rollouts-per-second)"),
    ("rollouts_per_second", "rollouts that can finish per second beyond the config's limits, e.g. the training "
                            "session's sampling throughput (default: no such bound)"),
    ("rebind_seconds", "seconds of load_weights_for_sampling per step"),
    ("orchestration_seconds", "the rest of a step's wall time (planning, transitions)"),
    ("advantages_seconds_per_rollout", "ComputeAdvantages' seconds per rollout of the batch"),
    ("session_start_seconds", "seconds of training session before the first step"),
    ("agent_overhead_seconds", "ACR session seconds of a rollout besides its LLM calls"),
    ("judge_chars_per_member", "characters of each rollout's judged text (a config with a judge)"),
    ("judge_output_tokens_per_member", "tokens of the judge's answer per rollout"),
    ("judge_attempts_per_group", "the judge's answers read per group (1 = always valid the first time)"),
    ("rollout_sigma", "log-sd of a rollout's duration (lognormal; the asynchrony model's heavy tail)"),
)


def number(lo: float = 0.0, *, above: bool = False, hi: float | None = None, integer: bool = False) -> Any:
    """An argparse type: a finite number at least ``lo`` (more than it with ``above``), at most ``hi``."""

    def parse(text: str) -> float | int:
        try:
            value: float | int = int(text) if integer else float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{'an integer' if integer else 'a number'} is needed, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"a finite number is needed, got {text!r}")
        if (value <= lo) if above else (value < lo):
            want = f"more than {lo:g}" if above else ("0 or more" if lo == 0 else f"at least {lo:g}")
            raise argparse.ArgumentTypeError(f"must be {want}, got {text}")
        if hi is not None and value > hi:
            raise argparse.ArgumentTypeError(f"must be at most {hi:g}, got {text}")
        return value

    return parse


def _session_usd_per_hour_max() -> float:
    """The config field's own upper bound (``RunConfig.session_usd_per_hour``), which the flag overrides."""
    from stepwise.config import RunConfig

    return next(m.le for m in RunConfig.model_fields["session_usd_per_hour"].metadata if getattr(m, "le", None))


def configure(parser: argparse.ArgumentParser) -> None:
    from stepwise_cli.cost import Assumptions

    d = Assumptions()
    parser.add_argument("config", help="run config, JSON (or YAML) file")
    parser.add_argument("--steps", type=number(1, integer=True), help="training steps of the run (default: from the dataset's rows)")
    parser.add_argument("--check-datasets", action="store_true", help="count the rows of an s3:// dataset too")
    for name, help_text in ASSUMPTION_FLAGS:
        default = getattr(d, name)
        lo, above = (1, False) if name == "gen_batches_per_step" else (0, name == "rollouts_per_second")
        parser.add_argument(f"--{name.replace('_', '-')}", type=number(lo, above=above), default=default,
                            help=help_text if default is None else f"{help_text} (default {default:g})")
    parser.add_argument("--session-usd-per-hour", type=number(0, above=True, hi=_session_usd_per_hour_max()), default=None,
                        help="the training session's price per hour, to turn session-hours into dollars (default: the "
                             "config's session_usd_per_hour; it depends on the instance)")
    parser.add_argument("--json", action="store_true", help="print the estimate as JSON")
    from stepwise_cli.grammar import add_set

    add_set(parser)


def total_steps(cfg: RunConfig, args: argparse.Namespace) -> int | None:
    if args.steps is not None:
        return args.steps
    path = cfg.dataset_path
    if path.startswith("s3://") and not args.check_datasets:
        return None
    if not path.startswith("s3://") and not Path(path).is_file():
        return None
    from stepwise.datasets import DatasetError, check_dataset

    try:
        rows = check_dataset(path, 1)
    except DatasetError as e:
        print(f"note: cannot count dataset rows ({e}); pass --steps", file=sys.stderr)
        return None
    return cfg.total_steps(rows)


def format_estimate(est: dict[str, Any]) -> str:
    u, usd = est["usage_per_step"], est["usd_per_step"]
    a = est["assumptions"]
    lines = [
        f"per training step ({est['rollouts_per_step']:g} rollouts, {a['turns_per_rollout']:g} LLM call(s) each, "
        f"{a['seconds_per_turn']:g} s per call, {a['train_seconds']:g} s of training):",
        f"  Lambda duration   {u['lambda_gb_seconds']:>12.1f} GB-s        ${usd['lambda_duration']:.5f}",
        f"  Lambda requests   {u['lambda_requests']:>12.0f}             ${usd['lambda_requests']:.5f}",
        f"  Step Functions    {u['state_transitions']:>12.0f} transitions ${usd['step_functions']:.5f}",
        f"  S3 requests       {u['s3_put_class']:>6.0f} PUT/LIST {u['s3_get_class']:>5.0f} GET  ${usd['s3_requests']:.5f}",
        f"  total per step                                ${usd['total']:.5f}",
    ]
    if est["usd_per_step_upper"]["total"] != usd["total"]:
        lines.append(f"  DAPO upper bound (every step hits max_num_gen_batches): ${est['usd_per_step_upper']['total']:.5f}")
    if "usd_per_run" in est:
        lines.append(f"run of {est['total_steps']} steps: ${est['usd_per_run']['total']:.4f}")
    else:
        lines.append("run total: pass --steps N (or use a local dataset file) to get it")
    lines.append(f"list prices {est['region']} as of {est['prices_as_of']} (stepwise.core.prices); not included "
                 "here: CloudWatch, data transfer")
    f = est["flow"]
    bound = {"acr_tps_limit": "acr_tps_limit", "concurrency": "the Map's concurrency",
             "rollouts_per_second": "--rollouts-per-second", "rollout_seconds": "--rollout-seconds"}[f["bound"]]
    lines.append(f"a generation batch of {f['rollouts']} rollouts: at most {f['concurrency']} in flight, "
                 f"{f['rate']:.3g} finish per second (set by {bound}), {f['wall']:.1f} s of Map, each in flight "
                 f"{f['latency']:.1f} s (its ACR session); about {f['refused']:.0f} invokes throttled and retried")
    lines.extend(format_parts(est))
    lines.append(f"training session per step ({a['rollout_seconds']:g} s of rollouts, {a['train_seconds']:g} s of "
                 f"training, {a['rebind_seconds']:g} s of rebind, {a['orchestration_seconds']:g} s of orchestration):")
    price = est.get("session_usd_per_hour")
    for mode, sess in est["session_per_step"].items():
        name = {"0": "sequential (max_staleness 0)", "1": "overlapped (max_staleness 1)"}[mode]
        mark = "  <- this config" if int(mode) == est["max_staleness"] else ""
        usd = f"  ${sess['session_hours'] * price:.4f}" if price is not None else ""
        lines.append(f"  {name:<29} {sess['wall_seconds']:>7.1f} s wall, {sess['idle_seconds']:>6.1f} s idle, "
                     f"{sess['session_hours']:.4f} session-hours{usd}{mark}")
    lines.extend(format_asynchrony(est, price))
    return "\n".join(lines)


def format_asynchrony(est: dict[str, Any], price: float | None) -> list[str]:
    """The asynchrony model's table (`stepwise_cli.cost.async_table`): each arm's step time and the share
    of it the session is busy, what a user pays for."""
    a = est["assumptions"]
    lines = [f"asynchrony (a discrete-event model: rollouts {a['agent_seconds']:g} s on average, lognormal "
             f"log-sd {a['rollout_sigma']:g}; a group ends with its slowest rollout; docs/operating.md):"]
    for row in est.get("asynchrony", []):
        usd = f"  ${row['session_hours_per_step'] * price:.4f}/step" if price is not None else ""
        mark = "  <- this config" if row["this_config"] else ""
        lines.append(f"  {row['arm']:<8} {row['s_per_step']:>7.1f} s/step ({row['ratio_to_sync']:.2f}x sync), session "
                     f"busy {row['busy_fraction']:>4.0%}, staleness {row['mean_staleness']:.1f}{usd}{mark}")
    return lines


def format_parts(est: dict[str, Any]) -> list[str]:
    """The estimate by ledger part (session, agent, stack), per step and for the whole run."""
    from stepwise.core.ledger import usd

    def row(name: str, p: dict[str, Any]) -> str:
        session = (f"session {usd(p['session'])} ({p['session_hours']:.3f} h)" if "session" in p
                   else f"session {p['session_hours']:.3f} h (no session_usd_per_hour: not priced)")
        judge = f", judge {usd(p['judge'])}" if "judge" in p else ""
        return f"  {name:<14} {usd(p['total']):>10}: {session}, agent {usd(p['agent'])}{judge}, stack {usd(p['stack'])}"

    a = est["assumptions"]
    lines = [f"with the training session and the agent ({a['agent_seconds']:g} s of ACR session per rollout; "
             f"the session billed for each step's whole wall time):", row("per step", est["parts_per_step"])]
    if "run" in est:
        lines.append(row(f"run ({est['run']['steps']} steps)", est["run"])
                     + f" (start-up: {a['session_start_seconds']:g} s of session)")
    if (j := est.get("judge_per_step")) is not None:
        price = f"{usd(j['usd'])}" if "usd" in j else "not priced (the price table does not know the model: set "
        price += "" if "usd" in j else "judge.usd_per_million_input_tokens and ..._output_tokens)"
        lines.append(f"  the judge per step: {j['requests']:.1f} Bedrock request(s), {j['input_tokens']:,.0f} input and "
                     f"{j['output_tokens']:,.0f} output tokens ({a['judge_chars_per_member']:g} characters per rollout at "
                     f"4 per token): {price}")
    return lines


def run(args: argparse.Namespace) -> int:
    from stepwise_cli.commands._runs import load_config
    from stepwise_cli.cost import Assumptions, estimate

    cfg = load_config(args.config, args.set)  # a ConfigError: stepwise_cli.main prints it, exit 2
    a = Assumptions(**{name: getattr(args, name) for name, _ in ASSUMPTION_FLAGS})
    if args.session_usd_per_hour is not None:  # the flag stands in for (or overrides) the config's field
        cfg = cfg.model_copy(update={"session_usd_per_hour": args.session_usd_per_hour})
    est = estimate(cfg, a, total_steps=total_steps(cfg, args))
    if cfg.session_usd_per_hour is not None:
        est["session_usd_per_hour"] = cfg.session_usd_per_hour
    print(json.dumps(est, indent=2) if args.json else format_estimate(est))
    return EXIT_OK
