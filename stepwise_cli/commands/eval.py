"""`stepwise eval CONFIG (--base | --model-package ARN) [--local]`: evaluate a model without training.

Starts an eval-only run of CONFIG (``eval_only``: an execution of the same state machine that creates
the training session, loads the weights of the model package, or keeps the base model with
``--base``, rolls out the config's eval sets once, writes the eval's summary and per-prompt results,
and stops the session; no training step, no checkpoint), waits for its end and prints the eval
table: one line per eval set with accuracy (mean reward), mean@n, pass@k and the group outcomes
(``eval_group_size``, ``eval_pass_k``, ``eval_success_threshold`` of the config, or ``--set``).

With ``--local`` it runs on the local stack (the run folder is ``runs-local/RUN_ID``); the simulator
there keeps the model packages of earlier local runs (``runs-local/.simulator/``), so the checkpoint
ARN a ``make run`` printed evaluates here. Otherwise it runs on the deployed stack (local datasets are
uploaded as `stepwise start` does). Two evals (or a training run's last eval) side by side:
`stepwise compare RUN_A RUN_B`. Exit code 0 when the eval ran, 1 when it failed, 2 for a bad config.
"""

from __future__ import annotations

import argparse
import json

from stepwise_cli.commands._evals import add_launch_arguments, eval_table, evaluated_text, launch
from stepwise_cli.commands._runs import EXIT_OK


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="a run config (JSON or YAML) naming the agent, base model and eval sets")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--base", action="store_true", help="evaluate the base model (base_model_arn)")
    which.add_argument("--model-package", metavar="ARN",
                       help="evaluate this model package (a checkpoint or the final weights of a run)")
    parser.add_argument("--json", action="store_true", help="print the eval's summary as JSON")
    add_launch_arguments(parser)


def eval_overrides(model_package: str | None) -> dict[str, object]:
    """The config fields that make a training config an eval-only run of ``model_package`` (None = base)."""
    return {"eval_only": True, "eval_model_package_arn": model_package or "", "eval_every": 0,
            "eval_before_train": None, "resume_from_model_package": ""}


def run(args: argparse.Namespace) -> int:
    evals = launch(args, eval_overrides(None if args.base else args.model_package), "eval")
    step = evals.last_eval()
    summary = evals.summary(step) or {}
    if args.json:
        print(json.dumps(summary, indent=2))
        return EXIT_OK
    base = (evals.config() or {}).get("base_model_arn", "")
    print(f"eval of {evaluated_text(summary, base)} (run {evals.label}):")
    print("\n".join(eval_table(summary)))
    print(f"compare it with another run: stepwise compare {evals.label} OTHER_RUN")
    return EXIT_OK
