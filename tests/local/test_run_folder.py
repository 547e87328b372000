"""run-local's run folder: an earlier run's folder is never overwritten (as `stepwise start` refuses a run id
the stack has run), and two runs started in the same second get two ids."""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import pytest

from local.run import RunFolderExists, new_run_folder, run

NOW = datetime(2026, 12, 7, 14, 30, 5, tzinfo=timezone.utc)


def test_a_given_run_id_whose_folder_exists_is_refused_and_the_earlier_run_is_kept(tmp_path):
    earlier = tmp_path / "my-run"
    (earlier / "s3").mkdir(parents=True)
    (earlier / "report.html").write_text("the earlier run's page")
    with pytest.raises(RunFolderExists, match="my-run exists"):
        new_run_folder(tmp_path, "my-run", "toy")
    assert (earlier / "report.html").read_text() == "the earlier run's page" and (earlier / "s3").is_dir()


def test_runs_started_in_the_same_second_get_their_own_folders(tmp_path):
    got: list[str] = []
    barrier = threading.Barrier(6)

    def start() -> None:
        barrier.wait()
        got.append(new_run_folder(tmp_path, None, "toy", now=NOW)[0])

    threads = [threading.Thread(target=start) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    base = "toy-20261207-143005"
    assert sorted(got) == sorted([base] + [f"{base}-{n}" for n in range(2, 7)])
    assert all((tmp_path / run_id).is_dir() for run_id in got)


def test_run_local_says_so_in_one_line_and_exits_2_before_starting_anything(tmp_path, capsys):
    import argparse

    from local.run import configure

    (tmp_path / "taken").mkdir()
    parser = argparse.ArgumentParser()
    configure(parser)
    args = parser.parse_args(["examples/toy.json", "--run-id", "taken", "--runs-dir", str(tmp_path), "--no-progress"])
    assert run(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("checking ") and len(err) == 2 and "taken exists" in err[1], err  # what it does, then why not
    assert list((tmp_path / "taken").iterdir()) == []
