"""`stepwise agent check|deploy|config`: your own agent folder, from its local environment to a training runtime.

An agent folder (`infra.agent_folder`) holds the agent's code (its ``MODULE:ATTR``, default ``agent:app``) and its
own requirements (default ``requirements.txt``), nothing of this repository.

- ``stepwise agent check FOLDER``: builds (or finds cached) the folder's own environment and imports the agent in
  it, exactly as ``stepwise run-local CONFIG --agent FOLDER`` does (`local.agent_env`); prints what the image
  will install and the deploy command. No AWS call.
- ``stepwise agent deploy FOLDER [--synth] [--dry-run] [-c KEY=VALUE ...]``: the check, then ``cdk deploy`` (or
  ``cdk synth``) of this repository's app with ``-c agentDir=FOLDER -c agentEntrypoint=... -c
  agentRequirements=...`` (`infra.agent_runtime`: the folder's arm64 image through the CDK's
  ``DockerImageAsset``, its ``AWS::BedrockAgentCore::Runtime`` and execution role, StartRollout's grant, the
  ``AgentRuntimeArn`` output) plus any more context values (``-c createSageMakerRole=true``).
  Needs the CDK CLI on ``PATH`` (``npm install -g aws-cdk``) and, to deploy, Docker with buildx able to build
  linux/arm64 images. ``--dry-run`` prints the command instead.
- ``stepwise agent config CONFIG [--out FILE]``: the run config with ``agent_runtime_arn`` set to the deployed
  stack's ``AgentRuntimeArn`` output (``--math-agent``: ``MathAgentRuntimeArn``) and, when the stack created it,
  ``role_arn`` to ``SageMakerRoleArn`` (reads the stack's outputs: ``cloudformation:DescribeStacks``).
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

from local import REPO_ROOT
from stepwise_cli.commands._runs import EXIT_OK, EXIT_USAGE

#: Stack outputs `config` reads (``infra.stack.OUTPUT_*``; tests/cli pins that they agree).
OUTPUT_AGENT_RUNTIME = "AgentRuntimeArn"
OUTPUT_MATH_AGENT_RUNTIME = "MathAgentRuntimeArn"
OUTPUT_SAGEMAKER_ROLE = "SageMakerRoleArn"


def _folder_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("folder", help="the agent folder (its code and its own requirements)")
    p.add_argument("--entrypoint", help="MODULE:ATTR of its AgentCoreRLApp (default agent:app)")
    p.add_argument("--requirements", help="its pip requirements file or hashed lock (default requirements.txt)")


def configure(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", metavar="ACTION")
    sub.required = True
    check = sub.add_parser("check", help="build (or reuse) the folder's environment and import the agent in it")
    _folder_arguments(check)
    deploy = sub.add_parser("deploy", help="the check, then cdk deploy with -c agentDir=FOLDER (the training runtime)")
    _folder_arguments(deploy)
    deploy.add_argument("--synth", action="store_true", help="cdk synth instead of cdk deploy (no account needed)")
    deploy.add_argument("--dry-run", action="store_true", help="print the cdk command instead of running it")
    deploy.add_argument("--skip-check", action="store_true", help="do not build the local environment first")
    deploy.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE",
                        help="more CDK context, as cdk's own -c (repeatable), e.g. -c createSageMakerRole=true")
    config = sub.add_parser("config", help="a run config with the stack's training runtime (and session role) filled in")
    config.add_argument("config", help="the run config to fill in (JSON), e.g. examples/aws/gsm8k.json")
    config.add_argument("--out", metavar="FILE", help="write the filled config to this file (default: print it)")
    config.add_argument("--math-agent", action="store_true", help="the example math agent's runtime (MathAgentRuntimeArn)")
    from stepwise_cli.grammar import add_set

    add_set(config)
    from stepwise_cli.commands._runs import add_stack_arguments

    add_stack_arguments(config)


def folder_of(args: argparse.Namespace):
    """The `infra.agent_folder.AgentFolder` the arguments name (raises AgentFolderError)."""
    from infra.agent_folder import AgentFolder

    return AgentFolder.of(args.folder, args.entrypoint, args.requirements)


def check(args: argparse.Namespace) -> int:
    from local.agent_env import prepare

    agent = folder_of(args)
    extra = agent.extra_requirements()
    launch = prepare(agent, log=lambda m: print(m, file=sys.stderr, flush=True))
    print(f"agent folder   {agent.folder}")
    print(f"entrypoint     {agent.entrypoint} ({agent.module_file.relative_to(agent.folder)})")
    print(f"requirements   {agent.requirements.name}" + (f" + {' '.join(extra)} (not named there)" if extra else ""))
    print(f"environment    {launch.venv} ({'built now' if launch.built_s else 'cached'})")
    print(f"import         ok ({launch.python})")
    print(f"train locally  stepwise run-local CONFIG --agent {shlex.quote(str(agent.folder))}")
    print(f"deploy         {' '.join(map(shlex.quote, cdk_command(agent, 'deploy')))}")
    return EXIT_OK


def cdk_command(agent, verb: str, extra: list[str] | None = None) -> list[str]:
    """``cdk VERB -c agentDir=... -c agentEntrypoint=... -c agentRequirements=... EXTRA`` (run in the repository)."""
    cmd = ["cdk", verb, "-c", f"agentDir={agent.folder}", "-c", f"agentEntrypoint={agent.entrypoint}"]
    if agent.requirements:
        cmd += ["-c", f"agentRequirements={agent.requirements.name}"]
    return cmd + list(extra or [])


def deploy(args: argparse.Namespace) -> int:
    agent = folder_of(args)
    agent.extra_requirements()  # a hashed lock without the toolkit: refused here, not by docker build
    if not args.skip_check and not args.dry_run:
        check(args)
    cmd = cdk_command(agent, "synth" if args.synth else "deploy", [a for kv in args.context for a in ("-c", kv)])
    if args.dry_run:
        print(f"(cd {shlex.quote(str(REPO_ROOT))} && {' '.join(map(shlex.quote, cmd))})")
        return EXIT_OK
    if shutil.which("cdk") is None:
        print("stepwise agent: the CDK CLI is not on PATH: npm install -g aws-cdk (Node.js 22 or 24)", file=sys.stderr)
        return EXIT_USAGE
    return subprocess.run(cmd, cwd=REPO_ROOT).returncode


def fill_config(raw: dict, outputs: dict[str, str], *, math_agent: bool = False) -> tuple[dict, list[str]]:
    """``raw`` with ``agent_runtime_arn`` (and ``role_arn``) from the stack's ``outputs``; returns
    ``(config, what was set)``. Raises LookupError naming the missing output."""
    key = OUTPUT_MATH_AGENT_RUNTIME if math_agent else OUTPUT_AGENT_RUNTIME
    if key not in outputs:
        how = "-c deployMathAgent=true" if math_agent else "stepwise agent deploy FOLDER (-c agentDir=FOLDER)"
        raise LookupError(f"the stack has no {key} output: deploy it with {how}")
    out, changed = dict(raw), [f"agent_runtime_arn = {outputs[key]} ({key})"]
    out["agent_runtime_arn"] = outputs[key]
    if OUTPUT_SAGEMAKER_ROLE in outputs:
        out["role_arn"] = outputs[OUTPUT_SAGEMAKER_ROLE]
        changed.append(f"role_arn = {outputs[OUTPUT_SAGEMAKER_ROLE]} ({OUTPUT_SAGEMAKER_ROLE})")
    return out, changed


def config(args: argparse.Namespace) -> int:
    import os

    import boto3

    from stepwise.stackinfo import DEFAULT_STACK_NAME, ENV_STACK, StackNotFound, stack_outputs

    name = args.stack or os.environ.get(ENV_STACK) or DEFAULT_STACK_NAME
    try:
        outputs = stack_outputs(name, boto3.client("cloudformation", region_name=args.region or None))
        from stepwise_cli.grammar import parse_sets

        raw = {**json.loads(Path(args.config).read_text()), **parse_sets(args.set)}
        filled, changed = fill_config(raw, outputs, math_agent=args.math_agent)
    except (StackNotFound, LookupError, OSError, ValueError) as e:
        print(f"stepwise agent config: {e}", file=sys.stderr)
        return EXIT_USAGE
    text = json.dumps(filled, indent=2) + "\n"
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}: " + "; ".join(changed), file=sys.stderr)
    else:
        sys.stdout.write(text)
        print("; ".join(changed), file=sys.stderr)
    return EXIT_OK


def run(args: argparse.Namespace) -> int:
    return {"check": check, "deploy": deploy, "config": config}[args.action](args)
