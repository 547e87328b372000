"""The `stepwise` command's one grammar: each flag that several commands share is defined here, once, with one
meaning (docs/operating.md, "The command line's grammar", is its table; ``tests/cli/test_grammar.py`` walks
every command's help against it).

| flag | meaning |
|---|---|
| ``--set FIELD=JSON`` | override a config field (every command that takes a config) |
| ``--json`` | print the command's data as JSON on stdout, nothing else there |
| ``--out FILE`` | the file the command writes (a page, a dataset, a config, findings) |
| ``--timeout SECONDS`` | give up after this long, exit 1; a run on the local stack stops with the command |
| ``--local`` | on the local stack (moto, simulator, gateway, ACR emulator) instead of the deployed one |
| ``--runs-dir DIR`` | with ``--local``: the run folders' parent (default ``runs-local``) |
| ``-v``, ``--verbose`` | log more (INFO lines; on the local stack the handlers' own) |

Old spellings are kept for one release, each with a one-line warning on stderr (`Deprecated`):
``stepwise run-local`` (now ``stepwise start --local``), ``--out DIR`` for the run folders' parent of
``run-local`` and ``eval`` and ``screen --runs-out`` (now ``--runs-dir``), ``probe-service --json PATH``
(now ``--json`` and ``--out PATH``).

Kept light: argparse and json only (`stepwise validate` never pays for torch or moto).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

#: The run folders' parent of a local run (`local.run.DEFAULT_OUT`; not imported here: it pulls moto).
LOCAL_RUNS = Path("runs-local")

SET_HELP = "override a config field (repeatable), e.g. --set batch_size=4; the value is parsed as JSON, else a string"
TIMEOUT_HELP = ("give up after this many seconds (exit 1); a run on the local stack is stopped with the command, "
                "a deployed run goes on")
LOCAL_HELP = "run on the local stack (moto, SageMaker simulator, gateway, ACR emulator) instead of the deployed stack"
RUNS_DIR_HELP = ("--local: the run folders' parent (default runs-local; its .simulator/ keeps the model packages "
                 "of earlier local runs)")
VERBOSE_HELP = "log more: INFO lines (on the local stack, the handlers' own)"


def warn_deprecated(old: str, new: str) -> None:
    """One line on stderr: ``old`` still works this release; ``new`` is its spelling from now on."""
    print(f"warning: {old} is deprecated and goes in the next release; use {new}", file=sys.stderr)


class Deprecated(argparse.Action):
    """An old flag spelling that still works for one release: stores into the new flag's ``dest`` and warns
    once on stderr (`warn_deprecated`). ``new``: the spelling to use."""

    def __init__(self, option_strings: list[str], dest: str, new: str = "", **kwargs: Any):
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        warn_deprecated(f"{option_string} {values}", f"{self.new} {values}")
        setattr(namespace, self.dest, values)


def add_set(parser: argparse.ArgumentParser) -> None:
    """``--set FIELD=JSON`` (repeatable; ``args.set``, a list; `parse_sets` reads it)."""
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", help=SET_HELP)


def parse_sets(items: list[str] | None) -> dict[str, Any]:
    """``--set FIELD=JSON`` values as ``{field: value}`` (a value that is not JSON is a string).

    Raises:
        UsageError: an item without ``=`` or without a field name.
    """
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--set expects FIELD=VALUE, got {item!r}")
        try:
            out[key] = json.loads(value)
        except ValueError:
            out[key] = value
    return out


def parse_acr_faults(items: list[str] | None) -> dict[str, int]:
    """``--acr-fault KIND=N`` values as ``{kind: n}`` (the local ACR emulator's faults, `local.acr`).

    Raises:
        UsageError: an item of another shape.
    """
    out: dict[str, int] = {}
    for item in items or []:
        kind, sep, n = item.partition("=")
        if not sep or not kind or not n.strip().isdigit():
            raise UsageError(f"--acr-fault expects KIND=N, got {item!r}")
        out[kind] = int(n)
    return out


def add_json(parser: argparse.ArgumentParser, what: str) -> None:
    """``--json``: print ``what`` as JSON on stdout (``args.json``)."""
    parser.add_argument("--json", action="store_true", help=f"print {what} as JSON on stdout")


def add_out(parser: argparse.ArgumentParser, what: str, **kwargs: Any) -> None:
    """``--out FILE``: the file the command writes (``args.out``); ``what`` says which file and its default."""
    parser.add_argument("--out", metavar="FILE", help=f"write {what}", **kwargs)


def add_timeout(parser: argparse.ArgumentParser) -> None:
    """``--timeout SECONDS`` (``args.timeout``, None = no limit)."""
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help=TIMEOUT_HELP)


def add_verbose(parser: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose`` (``args.verbose``); added by `stepwise_cli.main` to every command."""
    if "--verbose" not in parser._option_string_actions:
        parser.add_argument("-v", "--verbose", action="store_true", help=VERBOSE_HELP)


def add_local(parser: argparse.ArgumentParser, *, old_runs_dir: tuple[str, ...] = (), agent: bool = True,
              simulator: bool = False) -> None:
    """``--local`` and what only a run on the local stack takes: ``--runs-dir DIR``, ``--no-progress``,
    ``--mirror-s3``, ``--agent`` (``agent``), ``--acr-fault`` and ``--simulator-latency`` (``simulator``: a training
    run's); ``old_runs_dir``: earlier spellings of
    ``--runs-dir`` that still work (`Deprecated`)."""
    g = parser.add_argument_group("the local stack")
    g.add_argument("--local", action="store_true", help=LOCAL_HELP)
    g.add_argument("--runs-dir", type=Path, default=LOCAL_RUNS, metavar="DIR", help=RUNS_DIR_HELP)
    for old in old_runs_dir:
        g.add_argument(old, dest="runs_dir", type=Path, action=Deprecated, new="--runs-dir", help=argparse.SUPPRESS)
    g.add_argument("--no-progress", action="store_true", help="--local: no progress bar")
    g.add_argument("--mirror-s3", action="store_true",
                   help="--local: also copy the agents' result objects (rollout-results/) into the run folder "
                        "(the run's own objects under runs/ are always kept in RUN_FOLDER/s3/)")
    if agent:
        g.add_argument("--agent", metavar="FOLDER | PATH.py[:APP] | MODULE:APP",
                       help="--local: your own AgentCoreRLApp instead of the one agent_runtime_arn names: an agent "
                            "folder (its agent.py's app), a .py file of one, or a module of the current directory "
                            "(default attribute 'app'); a requirements.txt in the folder makes it run in its own "
                            "cached environment (~/.cache/stepwise-agents), checked before the stack starts")
    g.add_argument("--acr-fault", action="append", default=[], metavar="KIND=N",
                   help="--local: inject ACR faults: throttle, invoke_error, drop_result, malformed_result, error_result")
    if simulator:
        g.add_argument("--simulator-latency", action="append", default=[], metavar="OP=SECONDS",
                       help="--local: seconds the training-session simulator adds to each operation of that kind "
                            "(forward_backward, optim_step, save_weights, load_weights_for_sampling, ...): a slow "
                            "training step, as benchmarks/async_depth.py injects it")


def local_only(args: argparse.Namespace, command: str) -> None:
    """Refuse (`UsageError`) the local stack's own flags without ``--local``: they would be ignored."""
    if getattr(args, "local", False):
        return
    given = [flag for flag, dest, default in (("--runs-dir", "runs_dir", LOCAL_RUNS), ("--no-progress", "no_progress", False),
                                              ("--mirror-s3", "mirror_s3", False), ("--agent", "agent", None),
                                              ("--acr-fault", "acr_fault", []),
                                              ("--simulator-latency", "simulator_latency", []))
             if getattr(args, dest, default) != default]
    if given:
        raise UsageError(f"{', '.join(given)} only apply with --local (stepwise {command} --local ...)")


class UsageError(Exception):
    """The command line is wrong: printed as ``stepwise COMMAND: message`` by `stepwise_cli.main`, exit code 2."""
