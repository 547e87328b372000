"""One run-id rule (`stepwise.executions.RUN_ID_RE`), and Init, ``stepwise start`` and ``run-local`` refusing
the same names with it, before anything bills.

A run id is its first execution's name, and continuations are named ``{run_id[:70]}--{n}``: a name Step
Functions accepts (1-80 characters) but with ``--``, more than 70 characters, or characters outside
``[A-Za-z0-9_-]`` would be cut, mistaken for a continuation, or collide with another run's executions.
``stepwise start`` refused such names; Init (an execution started from the console, the SDK or the CLI of
another tool) and ``run-local`` took them (before: ``Init`` accepted ``a--1``, 71 characters, ``run.1``).
Here, for arbitrary names (hypothesis), the rule admits exactly the names continuations can follow, every
default run id obeys it, and both commands refuse from the command line;
tests/drills/test_refusals.py::test_init_start_and_run_local_refuse_the_same_names_before_anything_bills
checks, over arbitrary names, that the three verdicts are the rule's and Init's comes before any training
session or claim (on that module's stack).
"""

from __future__ import annotations

import string
from pathlib import Path, PurePath

from hypothesis import example, given, settings
from hypothesis import strategies as st

from stepwise.executions import (
    RUN_ID_RULE,
    belongs_to,
    continuation_name,
    default_run_id,
    run_id_of_execution,
    run_id_problem,
    run_id_stem,
)

ROOT = Path(__file__).resolve().parents[2]
ALLOWED = set(string.ascii_letters + string.digits + "_-")


def usable(name: str) -> bool:
    """The rule, written out independently of its regex."""
    return (1 <= len(name) <= 70 and set(name) <= ALLOWED and name[0] in string.ascii_letters + string.digits
            and "--" not in name)


#: Arbitrary text, and names close to the rule's edges (allowed characters, lengths around 70, '-' runs).
names = st.one_of(
    st.text(max_size=90),
    st.text(alphabet=sorted(ALLOWED), min_size=0, max_size=85),
    st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_]{0,30}(-[A-Za-z0-9_]{1,20}){0,3}", fullmatch=True),
    st.integers(60, 80).map(lambda n: "r" * n),
)


@settings(max_examples=500, deadline=None)
@given(names)
@example("a--1").via("a continuation's form")
@example("r" * 71).via("71 characters")
@example("run.1").via("a dot")
@example("run\n").via("a final newline ('$' matched before it)")
@example("\u0661\u0662").via("non-ASCII digits")
def test_the_rule_admits_exactly_the_names_continuations_can_follow(name):
    problem = run_id_problem(name)
    assert (problem is None) == usable(name)
    if problem is not None:
        assert RUN_ID_RULE in problem and repr(name) in problem
        return
    for segment in (1, 2, 999_999):
        follower = continuation_name(name, segment)
        assert len(follower) <= 80 and run_id_of_execution(follower) == name and belongs_to(follower, name)
    assert run_id_of_execution(name) == name


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=120).filter(lambda s: "/" not in s and "\x00" not in s))
@example("my run.json").via("a space")
@example("_x.json").via("a leading underscore")
@example("a" * 53 + "-b.json").via("a '-' where the stem is cut")
def test_every_default_run_id_obeys_the_rule(config_name):
    from stepwise_cli.commands._evals import default_run_id as eval_run_id

    assert run_id_problem(default_run_id(config_name)) is None
    assert run_id_problem(eval_run_id(config_name, "eval")) is None
    # run-local's default: the same stem, and -2 ... -9999 for runs started in the same second (new_run_folder)
    stem = PurePath(config_name).stem
    assert run_id_problem(f"{run_id_stem(stem)}-20261207-123456-9999") is None


def test_stepwise_start_and_run_local_refuse_from_the_command_line(moto_dep, tmp_path, capsys):
    from stepwise_cli.main import main

    config = tmp_path / "c.json"
    config.write_text((ROOT / "examples" / "toy.json").read_text())
    assert main(["start", str(config), "--run-id", "a--1", *moto_dep.flags]) != 0
    assert RUN_ID_RULE in capsys.readouterr().err
    assert moto_dep.sfn.list_executions(stateMachineArn=moto_dep.state_machine_arn)["executions"] == []
    assert main(["start", "--local", str(config), "--run-id", "a--1", "--runs-dir", str(tmp_path / "runs")]) == 2
    assert RUN_ID_RULE in capsys.readouterr().err
    assert not (tmp_path / "runs" / "a--1").exists()
