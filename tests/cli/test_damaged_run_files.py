"""A hand-damaged ``state.json`` or ``config.json``: `stepwise report` and `stepwise rollouts` print one
error line naming the file and exit 1 (`stepwise_cli.commands._runs.EXIT_FAILED`, as every command error),
from a local run folder and from the deployed stack's bucket. Before, each of these was a Python
traceback (json.JSONDecodeError, pydantic's ValidationError, AttributeError on a list)."""

from __future__ import annotations

import pytest

from local.report import mirror_run_objects
from stepwise import layout
from stepwise_cli.commands._runs import EXIT_FAILED
from stepwise_cli.main import main
from tests.support.runs import write_to_s3

RUN = "damaged"
DAMAGE = {"truncated": b'{"run_id": "damaged", "step": ', "a list": b"[1, 2]", "wrong types": b'{"step": "three"}'}
COMMANDS = {"report": ["report"], "rollouts": ["rollouts", "--step", "0"]}


def _one_line(capsys) -> str:
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in captured.err, captured.err
    return lines[0]


@pytest.mark.parametrize(("command", "file"), [("report", "state.json"), ("report", "config.json"),
                                               ("rollouts", "config.json")])
def test_a_damaged_run_file_is_one_line_naming_it(moto_dep, capsys, tmp_path, command, file):
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    key = layout.state_key(RUN) if file == "state.json" else layout.config_key(RUN)
    folder = tmp_path / RUN
    mirror_run_objects(moto_dep.s3, moto_dep.bucket, RUN, folder / "s3", results=False)
    argv = COMMANDS[command]
    for damage in sorted(DAMAGE):
        (folder / "s3" / key).write_bytes(DAMAGE[damage])
        moto_dep.s3.put_object(Bucket=moto_dep.bucket, Key=key, Body=DAMAGE[damage])
        out = ["--out", str(tmp_path / "p.html")] if command == "report" else []
        assert main([argv[0], str(folder), *argv[1:], *out]) == EXIT_FAILED, damage
        line = _one_line(capsys)
        assert str(folder / "s3" / key) in line and "damaged" in line, (damage, line)

        deployed = [argv[0], RUN, *argv[1:], *moto_dep.flags]
        if command == "report":
            deployed += ["--rebuild", "--out", str(tmp_path / "q.html")]
        assert main(deployed) == EXIT_FAILED, damage
        line = _one_line(capsys)
        assert f"s3://{moto_dep.bucket}/{key}" in line, (damage, line)
