"""`stepwise`: the operator command.

Each subcommand lives in its own module, which exposes ``configure(parser)`` (adds the
subcommand's arguments) and ``run(args) -> int`` (the exit code). Modules are imported
only when their subcommand runs, so `stepwise validate` never pays for torch or moto.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
from collections.abc import Iterator

# name -> (module, one-line help). Keep sorted by workflow, not alphabetically.
COMMANDS: dict[str, tuple[str, str]] = {
    "models": ("stepwise_cli.commands.models", "the base models training sessions offer in a region: gated or not, "
               "chat template and tool-call parsing"),
    "agent": ("stepwise_cli.commands.agent", "your own agent folder: check its environment, deploy it as a training "
              "runtime (cdk deploy -c agentDir=FOLDER), fill a config with its runtime"),
    "validate": ("stepwise_cli.commands.validate", "check a run config (and its datasets) without starting anything"),
    "start": ("stepwise_cli.commands.start", "validate a config, upload its local data, start a run on the deployed "
              "stack; or, with --local, the whole run on this machine (moto, simulator, gateway, ACR emulator)"),
    "watch": ("stepwise_cli.commands.watch", "follow a run until it ends: status, per-step reward, eval accuracy, plot"),
    "stop": ("stepwise_cli.commands.stop", "stop a run's execution and make sure its training session stops"),
    "resume": ("stepwise_cli.commands.resume", "continue a failed or stopped run from its saved state"),
    "runs": ("stepwise_cli.commands.runs", "recent runs with status and last metrics"),
    "report": ("stepwise_cli.commands.report", "the run's report page: a presigned URL, a download, or a local run's rebuilt report.html"),
    "rollouts": ("stepwise_cli.commands.rollouts", "a step's rollouts by group (reward, advantage, status), or one rollout's conversation"),
    "eval": ("stepwise_cli.commands.eval", "evaluate the base model or a model package on the eval sets (no training)"),
    "compare": ("stepwise_cli.commands.compare", "two runs' evals side by side: per eval set, per metric, per prompt"),
    "screen": ("stepwise_cli.commands.screen", "drop the training prompts always or never solved at group size K"),
    "cost": ("stepwise_cli.commands.cost", "estimate the stack's Lambda, Step Functions and S3 cost per step and per run"),
    "probe-service": ("stepwise_cli.commands.probe_service", "ask a real training session what it samples while it "
                      "loads new weights; prints the sampler_binding to run with (creates and stops its own session)"),
    "simulator": ("local.simulator.cli", "run the SageMaker Training Sessions simulator (tiny model) on a loopback port"),
    "run-local": ("local.run", "deprecated: stepwise start --local (a whole training run on this machine)"),
}

#: Old command spellings kept for one release: ``old -> the arguments that replace it`` (a warning each time).
DEPRECATED_COMMANDS: dict[str, list[str]] = {"run-local": ["start", "--local"]}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="stepwise",
        description="Serverless GRPO/DAPO training of AgentCore agents (Step Functions + SageMaker Training Sessions).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name, (module_name, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(_module=module_name)
        # Arguments are added lazily below, only for the chosen command.
    return parser


def _aws_setup_error(exc: Exception) -> str | None:
    """A one-line explanation when ``exc`` means the AWS client setup is missing, else None."""
    try:
        from botocore.exceptions import EndpointConnectionError, InvalidRegionError, NoCredentialsError, NoRegionError
    except ImportError:  # pragma: no cover - botocore is a dependency
        return None
    if isinstance(exc, EndpointConnectionError):  # no network route, a proxy, or a region without the service
        url = str(getattr(exc, "kwargs", {}).get("endpoint_url", ""))[:200]
        return f"cannot reach the AWS endpoint {url}: check the network (proxy, VPC endpoint) and the region"
    if isinstance(exc, InvalidRegionError):  # botocore's own format check of a region name (--region, AWS_REGION)
        region = str(getattr(exc, "kwargs", {}).get("region_name", ""))[:80]
        return f"{region!r} is not an AWS region name (such as us-east-1): check --region, AWS_REGION or AWS_DEFAULT_REGION"
    if isinstance(exc, NoRegionError):
        return "no AWS region configured: set AWS_REGION (or AWS_DEFAULT_REGION), or pass --region where offered"
    if isinstance(exc, NoCredentialsError):
        return ("no AWS credentials found: configure a profile (aws configure / AWS_PROFILE) or set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    return None


@contextlib.contextmanager
def aws_region_from_environment() -> Iterator[None]:
    """While a command runs, ``AWS_REGION`` (when set) is the region every AWS client of this process
    uses, as the AWS SDKs and Tools reference guide ("AWS Region" setting) and the AWS CLI v2 define it:
    ``AWS_REGION`` overrides ``AWS_DEFAULT_REGION`` and the profile's ``region``. botocore reads only ``AWS_DEFAULT_REGION``
    (and the profile), so a client built without ``region_name`` would ignore ``AWS_REGION``; copying
    it into ``AWS_DEFAULT_REGION`` reaches every client the commands build (boto3's, the SageMaker
    SDK's) in one place. The previous value is restored when the command returns.
    """
    region = os.environ.get("AWS_REGION", "")
    saved = os.environ.get("AWS_DEFAULT_REGION")
    if region:
        os.environ["AWS_DEFAULT_REGION"] = region
    try:
        yield
    finally:
        if region and os.environ.get("AWS_DEFAULT_REGION") == region:
            if saved is None:
                os.environ.pop("AWS_DEFAULT_REGION", None)
            else:
                os.environ["AWS_DEFAULT_REGION"] = saved


def command_parser(name: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser of command ``name`` (its module's arguments and the shared ``-v``) and its module."""
    from stepwise_cli.grammar import add_verbose

    module = importlib.import_module(COMMANDS[name][0])
    sub = argparse.ArgumentParser(prog=f"stepwise {name}", description=COMMANDS[name][1])
    module.configure(sub)
    add_verbose(sub)
    for action in sub._actions:  # a command's own sub-commands (stepwise agent check) take it too
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                add_verbose(child)
    return sub, module


def command_error(command: str, exc: BaseException) -> tuple[str, int] | None:
    """How the command line reports ``exc`` (the line for stderr, the exit code), or None for an error nobody
    expected (its traceback is shown). One place for every command: a usage error or a config that cannot run
    (2, the config's own multi-line message), a problem the user must fix (1, ``error: ...``), a missing AWS
    setup (2)."""
    from stepwise.config import ConfigError
    from stepwise.datasets import DatasetError
    from stepwise_cli.commands._runs import CommandError
    from stepwise_cli.grammar import UsageError

    if isinstance(exc, UsageError):
        return f"stepwise {command}: {exc}", 2
    if isinstance(exc, ConfigError):
        return str(exc), 2
    if isinstance(exc, (CommandError, DatasetError)):
        return f"error: {exc}", 1
    if type(exc).__name__ in ("AgentFolderError", "AgentEnvironmentError"):  # infra.agent_folder, local.agent_env
        return f"stepwise {command}: {exc}", 2
    message = _aws_setup_error(exc) if isinstance(exc, Exception) else None
    return None if message is None else (f"stepwise {command}: {message}", 2)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] in DEPRECATED_COMMANDS:
        from stepwise_cli.grammar import warn_deprecated

        new = DEPRECATED_COMMANDS[argv[0]]
        warn_deprecated(f"stepwise {argv[0]}", f"stepwise {' '.join(new)}")
        argv = [*new, *argv[1:]]
    # Find the subcommand first, then let its module add its own arguments.
    if argv and argv[0] in COMMANDS:
        sub, module = command_parser(argv[0])
        preparse = getattr(module, "preparse", None)  # a command's old spellings argparse cannot take
        args = sub.parse_args(preparse(argv[1:]) if preparse else argv[1:])
        command = " ".join([argv[0], *([args.action] if isinstance(getattr(args, "action", None), str) else [])])
        if getattr(args, "verbose", False):  # -v: every command's INFO lines (the local stack adds the handlers')
            import logging

            logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        try:
            with aws_region_from_environment():
                return int(module.run(args) or 0)  # type: ignore[attr-defined]
        except Exception as exc:
            handled = command_error(command, exc)
            if handled is None:
                raise
            print(handled[0], file=sys.stderr)
            return handled[1]
    parser.parse_args(argv)  # prints usage / errors for unknown commands
    return 2


if __name__ == "__main__":
    sys.exit(main())
