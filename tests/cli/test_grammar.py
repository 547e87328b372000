"""The command line's one grammar (`stepwise_cli.grammar`, docs/operating.md "The command line's grammar"): every
command's help is walked and each shared flag checked for its one meaning. Before, ``--out`` meant a run folders'
parent, a dataset or a page; ``--set`` was missing on start, validate and cost; the local stack was a command for
training and a flag for evals; ``--json`` was missing on 6 commands and a file path on one; the same error wrapper
was copied into 10 command modules (these tests fail there)."""

from __future__ import annotations

import argparse
import ast
import json
from pathlib import Path

import pytest

from stepwise_cli import grammar
from stepwise_cli.main import COMMANDS, DEPRECATED_COMMANDS, command_parser, main

ROOT = Path(__file__).resolve().parents[2]

#: Commands that take a run config (a positional ``config``, or probe-service's optional ``--config``).
CONFIG_COMMANDS = {"validate", "start", "eval", "screen", "cost", "probe-service", "agent config"}
#: Commands that print data (a person or a script reads it): each has --json.
DATA_COMMANDS = {"models", "validate", "start", "runs", "report", "rollouts", "eval", "compare", "screen", "cost",
                 "probe-service", "stop", "resume", "watch"}
#: Commands that can run on the local stack: each takes --local and --runs-dir the same way.
LOCAL_COMMANDS = {"start", "eval", "screen"}
#: Commands that act or serve (agent check/deploy; agent config prints a config, JSON already; the simulator).
NOT_DATA = {"agent", "simulator"}


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser as `stepwise_cli.main` builds it, sub-commands (``agent check``) included."""
    out = {}
    for name in COMMANDS:
        if name in DEPRECATED_COMMANDS:
            continue
        parser, _ = command_parser(name)
        out[name] = parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                out.update({f"{name} {sub}": p for sub, p in action.choices.items()})
    return out


def _option(parser: argparse.ArgumentParser, flag: str) -> argparse.Action | None:
    return parser._option_string_actions.get(flag)


PARSERS = _parsers()


def test_every_command_is_walked():
    assert set(COMMANDS) - set(DEPRECATED_COMMANDS) <= {n.split()[0] for n in PARSERS}
    assert DATA_COMMANDS | NOT_DATA == set(COMMANDS) - set(DEPRECATED_COMMANDS)


@pytest.mark.parametrize("name", sorted(PARSERS))
def test_each_shared_flag_has_its_one_meaning(name, capsys):
    parser = PARSERS[name]
    verbose = _option(parser, "-v")
    assert verbose is not None and verbose is _option(parser, "--verbose"), f"{name}: no -v/--verbose"
    if name != "simulator":  # the simulator service's own --verbose (every request) predates the shared one
        assert verbose.help == grammar.VERBOSE_HELP, name
    if (out := _option(parser, "--out")) is not None and out.help != argparse.SUPPRESS:  # a file the command writes
        assert out.metavar == "FILE" and out.help.startswith("write "), f"{name}: --out {out.metavar}: {out.help}"
    if (js := _option(parser, "--json")) is not None:  # a flag: print the data as JSON on stdout
        assert js.nargs == 0 and js.help.startswith("print "), f"{name}: --json {js.help}"
    if (timeout := _option(parser, "--timeout")) is not None:
        assert timeout.help == grammar.TIMEOUT_HELP, f"{name}: --timeout {timeout.help}"
    if (sets := _option(parser, "--set")) is not None:
        assert sets.help == grammar.SET_HELP and sets.metavar == "FIELD=JSON", name
    if (local := _option(parser, "--local")) is not None:
        assert local.help == grammar.LOCAL_HELP and _option(parser, "--runs-dir").help == grammar.RUNS_DIR_HELP, name
    parser.print_help()  # the help renders
    assert capsys.readouterr().out.startswith("usage: ")


@pytest.mark.parametrize("name", sorted(CONFIG_COMMANDS))
def test_every_command_that_takes_a_config_takes_set(name):
    assert _option(PARSERS[name], "--set") is not None, name


@pytest.mark.parametrize("name", sorted(DATA_COMMANDS))
def test_every_command_that_prints_data_takes_json(name):
    assert _option(PARSERS[name], "--json") is not None, name


@pytest.mark.parametrize("name", sorted(LOCAL_COMMANDS))
def test_the_local_stack_is_chosen_the_same_way_by_every_command_that_can_use_it(name):
    parser = PARSERS[name]
    for flag in ("--local", "--runs-dir", "--no-progress", "--mirror-s3", "--agent", "--acr-fault", "--set",
                 "--timeout", "--run-id"):
        assert _option(parser, flag) is not None, f"{name} {flag}"


def test_old_spellings_work_for_one_release_with_a_warning(capsys):
    args = PARSERS["eval"].parse_args(["c.json", "--base", "--local", "--out", "/tmp/x"])
    assert args.runs_dir == Path("/tmp/x")
    assert "warning: --out /tmp/x is deprecated" in capsys.readouterr().err
    args = PARSERS["screen"].parse_args(["c.json", "--k", "4", "--out", "s.jsonl", "--local", "--runs-out", "/tmp/y"])
    assert args.runs_dir == Path("/tmp/y") and args.output == Path("s.jsonl")
    assert "use --runs-dir /tmp/y" in capsys.readouterr().err
    args = PARSERS["report"].parse_args(["r", "--download", "p.html"])
    assert args.out == Path("p.html") and "use --out p.html" in capsys.readouterr().err
    from stepwise_cli.commands import probe_service

    assert probe_service.preparse(["--json", "f.json", "--samples", "1"]) == ["--out", "f.json", "--samples", "1"]
    assert "use --out f.json" in capsys.readouterr().err


def test_run_local_is_start_local_with_a_warning(monkeypatch, capsys, tmp_path):
    seen = {}

    def run_on_local_stack(args):
        seen.update(vars(args))
        return 0

    import local.run

    monkeypatch.setattr(local.run, "run", run_on_local_stack)
    assert main(["run-local", "examples/toy.json", "--out", str(tmp_path), "--set", "batch_size=2", "-v"]) == 0
    assert seen["local"] is True and seen["runs_dir"] == tmp_path and seen["set"] == ["batch_size=2"] and seen["verbose"]
    err = capsys.readouterr().err
    assert "warning: stepwise run-local is deprecated" in err and "use stepwise start --local" in err


def test_set_reaches_the_config_of_validate_and_cost(capsys):
    config = str(ROOT / "examples" / "toy.json")
    assert main(["validate", config, "--json", "--set", "batch_size=3", "--set", "responses_per_prompt=2"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["batch_size"] == 3 and summary["responses_per_prompt"] == 2, summary
    assert main(["cost", config, "--json", "--steps", "2", "--set", "batch_size=3"]) == 0
    assert json.loads(capsys.readouterr().out)["rollouts_per_step"] == 3 * json.loads(
        (ROOT / "examples" / "toy.json").read_text())["responses_per_prompt"]
    assert main(["validate", config, "--set", "batch_size=0"]) == 2  # the config's own message, exit 2
    assert "batch_size" in capsys.readouterr().err
    assert main(["validate", config, "--set", "batch_size"]) == 2  # a usage error, one line
    assert capsys.readouterr().err.strip() == "stepwise validate: --set expects FIELD=VALUE, got 'batch_size'"


def test_local_only_flags_without_local_are_a_usage_error(capsys):
    assert main(["start", str(ROOT / "examples" / "toy.json"), "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == ("stepwise start: --no-progress only apply with --local "
                                               "(stepwise start --local ...)")


def test_usage_and_command_errors_are_handled_once_in_main():
    """No command module catches the shared errors itself: `stepwise_cli.main.command_error` reports them."""
    shared = {"CommandError", "ConfigError", "DatasetError", "AgentFolderError", "AgentEnvironmentError"}
    offenders = []
    for path in sorted((ROOT / "stepwise_cli" / "commands").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and node.name == "run":
                for handler in (h for n in ast.walk(node) if isinstance(n, ast.Try) for h in n.handlers):
                    names = {getattr(e, "id", None) for e in (handler.type.elts if isinstance(handler.type, ast.Tuple)
                                                               else [handler.type])}
                    if names & shared:
                        offenders.append(f"{path.name}: except {sorted(names & shared)}")
    assert offenders == []


def test_a_command_error_is_one_line_and_exit_1(monkeypatch, capsys):
    from stepwise_cli.commands import _runs, runs

    def refuse(args):
        raise _runs.CommandError("no stack here")

    monkeypatch.setattr(runs, "deployment", refuse)
    assert main(["runs"]) == 1
    assert capsys.readouterr().err == "error: no stack here\n"


def test_v_logs_every_command_s_info_lines(monkeypatch, capsys):
    import logging

    from stepwise_cli.commands import cost

    def run(args):
        logging.getLogger("stepwise.test").info("an INFO line")
        return 0

    monkeypatch.setattr(cost, "run", run)
    monkeypatch.setattr(logging.root, "handlers", [])
    monkeypatch.setattr(logging.root, "level", logging.WARNING)
    # the handlers' Powertools logger ("stepwise") takes POWERTOOLS_LOG_LEVEL when first imported: an earlier
    # quiet `start --local` in this process may have made it at WARNING (a fresh `stepwise -v` process makes it at INFO)
    monkeypatch.setattr(logging.getLogger("stepwise"), "level", logging.NOTSET)
    assert main(["cost", str(ROOT / "examples" / "toy.json"), "-v"]) == 0
    assert "INFO stepwise.test: an INFO line" in capsys.readouterr().err


def test_start_local_takes_the_simulator_s_latency_and_refuses_it_without_local():
    """``--simulator-latency OP=SECONDS`` (benchmarks/async_depth.py's training step) is a local run's flag: parsed
    into the simulator's options, refused without --local and when it is not a number of seconds."""
    import argparse

    from local.run import simulator_latency_options
    from stepwise_cli.commands import start
    from stepwise_cli.grammar import UsageError, local_only

    parser = argparse.ArgumentParser()
    start.configure(parser)
    args = parser.parse_args(["c.json", "--local", "--simulator-latency", "optim_step=8", "--simulator-latency",
                              "forward_backward=0.5"])
    assert simulator_latency_options(args.simulator_latency) == {"latency": {"optim_step": 8.0, "forward_backward": 0.5}}
    assert simulator_latency_options([]) is None
    with pytest.raises(UsageError, match="only apply with --local"):
        local_only(parser.parse_args(["c.json", "--simulator-latency", "optim_step=8"]), "start")
    with pytest.raises(UsageError, match="OP=SECONDS"):
        simulator_latency_options(["optim_step=soon"])
