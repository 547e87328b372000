"""The run report page in a real browser (Debian's headless Chromium over the DevTools protocol).

The page of a run written as the pipeline writes it (`tests.support.runs`: two steps and an eval of a
calculator agent, a timed-out rollout, a zeroed reward) is rendered by the same code the Track function
runs, opened from a file (no network), and checked as a person sees it: the curves are drawn, a step's
table is there, a rollout expands to its turns with the trained tokens highlighted, and the console has
no error. Screenshots are kept in ``artifacts/`` (``report-page.png``, ``report-page-expanded.png``;
CI leaves them in its clone).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwise.views.page import CURVE_PANELS
from stepwise.views.run import rebuild_page
from stepwise_cli.sources import DirStore
from tests.support.browser import Browser, chromium_path
from tests.support.runs import write_run

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
RUN = "browser-run"

pytestmark = pytest.mark.skipif(chromium_path() is None and not __import__("os").environ.get("CI"),
                                reason="chromium is not installed (.ci/run installs it)")


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bucket")
    store = DirStore(root)
    write_run(lambda k, o: store.put_bytes(k, json.dumps(o).encode()), store.put_bytes, RUN)
    store.put_bytes(f"runs/{RUN}/summary.json", json.dumps({
        "status": "FINISHED", "reason": "finished", "execution_arn": "arn:exec",
        "final_weights": {"step": 2, "kind": "state", "reason": "final",
                          "model_package_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/2"}}).encode())
    path = root / "report.html"
    path.write_text(rebuild_page(store, RUN, updated_at="test"), encoding="utf-8")
    return path


def test_a_person_sees_the_curves_a_steps_table_and_an_expanded_rollout(page):
    with Browser(width=1280, height=1400) as b:
        b.open(page.as_uri())
        assert b.js("document.title") == f"Stepwise run {RUN}"
        assert b.js("document.getElementById('run-status').textContent") == "FINISHED"
        # the curves: one SVG panel each, the reward line drawn through both steps, the eval point drawn
        assert b.js("document.querySelectorAll('#charts svg').length") == len(CURVE_PANELS)
        reward = b.js("""(() => { const p = document.querySelector('g[id="curve-sampler/mean_reward"] path');
                         const r = p.getBoundingClientRect(); return [p.getAttribute('d').split('L').length, r.width]; })()""")
        assert reward[0] == 2 and reward[1] > 100  # two points, drawn across the plot
        assert b.js("document.querySelectorAll('g[id=\"curve-eval/accuracy\"] use, g[id=\"curve-eval/accuracy\"] path').length") >= 1
        # a step's table: step 0's best and worst groups, each rollout a row
        assert b.js("[...document.querySelectorAll('#train-0 .label')].map(e => e.textContent)") == ["best", "worst"]
        assert b.js("document.querySelectorAll('#train-0 details.rollout').length") == 4
        assert b.js("document.querySelector('#eval-1') !== null && document.querySelector('#train-1') !== null")
        assert "timeout" in b.js("document.getElementById('failures').innerText")
        ARTIFACTS.mkdir(exist_ok=True)
        b.screenshot(ARTIFACTS / "report-page.png")

        # a person clicks the best rollout of step 1: its turns open, trained tokens highlighted
        first = "#train-1 details.rollout summary"
        assert b.js(f"document.querySelector('{first}').parentElement.open") is False
        assert b.js("document.querySelector('#train-1 details.rollout .msg').checkVisibility()") is False
        b.click(first)
        assert b.js(f"document.querySelector('{first}').parentElement.open") is True
        roles = b.js("""[...document.querySelectorAll('#train-1 details.rollout')][0].querySelectorAll('.msg')
                        .length""")
        assert roles == 5  # system, user, assistant (tool call), tool, assistant
        shown = b.js("""(() => { const d = document.querySelector('#train-1 details.rollout');
            const m = [...d.querySelectorAll('.msg')].map(e => [e.className, e.checkVisibility() && e.getBoundingClientRect().height > 0, e.innerText]);
            const t = [...d.querySelectorAll('mark.trained')].map(e => [e.innerText, getComputedStyle(e).backgroundColor]);
            return {m, t}; })()""")
        assert [c for c, _, _ in shown["m"]] == ["msg system", "msg user", "msg assistant", "msg tool", "msg assistant"]
        assert all(visible for _, visible, _ in shown["m"])
        assert "tool call calculator" in shown["m"][2][2] and "trained" in shown["m"][4][2]
        assert [t for t, _ in shown["t"]][-1] == "42<|im_end|>"
        assert all(bg not in ("rgba(0, 0, 0, 0)", "transparent") for _, bg in shown["t"])  # highlighted
        b.screenshot(ARTIFACTS / "report-page-expanded.png")
        assert b.console_errors() == []
