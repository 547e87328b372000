"""A judged run's report page in a real browser (headless Chromium, `tests.support.browser`): a rollout of the
judged step shows the judge's score, the agent's own reward and the judge's one-line reason beside its reward,
and expands to its turns; the Judge panel draws the step's judge figures; the console has no error."""

from __future__ import annotations

from pathlib import Path

import pytest

from stepwise.views.run import rebuild_page
from stepwise_cli.sources import DirStore
from tests.support.browser import Browser, chromium_path
from tests.support.judge import JUDGED_GOOD, JUDGED_METRICS, write_judged_run
from tests.support.runs import sid_of

RUN = "judged-browser-run"

pytestmark = pytest.mark.skipif(chromium_path() is None and not __import__("os").environ.get("CI"),
                                reason="chromium is not installed (.ci/run installs it)")


def test_a_person_sees_the_judge_s_score_and_reason_beside_a_rollout_s_reward(tmp_path: Path):
    store = DirStore(tmp_path)
    write_judged_run(store, RUN)
    page = tmp_path / "report.html"
    page.write_text(rebuild_page(store, RUN, updated_at="test"), encoding="utf-8")
    sid = sid_of(1, "train", 0)
    with Browser(width=1280, height=1400) as b:
        b.open(page.as_uri())
        row = f"document.querySelector('#train-1 details.rollout[data-sid=\"{sid}\"]')"
        summary = b.js(f"{row}.querySelector('summary').innerText")
        assert "reward 0.800 · judge 8.00 · agent 1.000 · adv +1.000" in summary
        assert summary.endswith(f"judge's reason {JUDGED_GOOD}")
        b.click(f'#train-1 details.rollout[data-sid="{sid}"] > summary')  # a real mouse click
        assert b.js(f"{row}.open") is True and b.js(f"{row}.querySelectorAll('.msg').length") > 0
        for key in JUDGED_METRICS:  # a line, or a marker for a one-point series
            drawn = f"document.querySelectorAll('g[id=\"curve-{key}\"] path, g[id=\"curve-{key}\"] use').length"
            assert b.js(drawn) >= 1, key
        assert b.console_errors() == []
