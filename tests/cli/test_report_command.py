"""`stepwise report RUN --step N`: one step's sample table as a page of its own (the run's page inlines its
newest tables and links the older ones to these pages)."""

from __future__ import annotations

from local.report import mirror_run_objects
from stepwise_cli.commands._runs import EXIT_FAILED
from stepwise_cli.main import main
from tests.cli.test_damaged_run_files import RUN, _one_line
from tests.support.runs import write_to_s3


def test_report_step_writes_one_steps_page_from_a_folder_and_from_the_bucket(moto_dep, capsys, tmp_path):
    """``stepwise report RUN --step N``: the step's page of its own (the run's page links older steps there)."""
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    folder = tmp_path / RUN
    mirror_run_objects(moto_dep.s3, moto_dep.bucket, RUN, folder / "s3", results=False)
    assert main(["report", str(folder), "--step", "1"]) == 0
    page = (folder / "report-step-1.html").read_text()
    assert page.count('<section class="step"') == 1 and 'id="train-1"' in page
    assert main(["report", str(folder), "--step", "1", "--eval", "--out", str(tmp_path / "e.html")]) == 0
    assert 'id="eval-1"' in (tmp_path / "e.html").read_text()
    capsys.readouterr()
    assert main(["report", RUN, "--step", "1", *moto_dep.flags]) == EXIT_FAILED  # Track has not published it
    assert "no page for train step 1 yet" in _one_line(capsys)
    assert main(["report", str(folder), "--step", "9"]) == EXIT_FAILED
    assert "no train rollouts at step 9" in _one_line(capsys)
