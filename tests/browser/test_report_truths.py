"""The report page tells the truth, read in a real browser (Debian's headless Chromium).

A run written as the pipeline writes it (`tests.support.runs`), ended: StopSession stopped its training
session (``session_stopped``, the status it last read ``Stopping``), its eval after step 1 is the best model,
its ledger closed with a final line, and a step 2 whose two groups are identical. The page (the same code
the Track function runs) shows, where a person looks:

- the session Stopped (the terminal said Stopped, the page Stopping);
- identical groups as one sample (the page labelled them BEST and WORST);
- an eval's rollouts never trained (the page tagged their turns "trained" and highlighted "tokens as trained");
- the best model and the cost (the page showed neither).

Each check failed on the page before `stepwise.views`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwise import layout
from stepwise.views.run import rebuild_page
from stepwise_cli.sources import DirStore
from tests.support.browser import Browser, chromium_path
from tests.support.runs import sid_of, turns_for, write_run

RUN = "truth-run"
BEST_ARN = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1"
COST_LINE = "this run cost $1.23: session $1.00, agent $0.20, stack $0.03"

pytestmark = pytest.mark.skipif(chromium_path() is None and not __import__("os").environ.get("CI"),
                                reason="chromium is not installed (.ci/run installs it)")


def _put(store: DirStore, key: str, obj) -> None:
    store.put_bytes(key, json.dumps(obj).encode())


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    from stepwise.core.replay import record_to_json, replay_turns

    root = tmp_path_factory.mktemp("bucket")
    store = DirStore(root)
    write_run(lambda k, o: _put(store, k, o), store.put_bytes, RUN)
    state = json.loads(store.get_bytes(layout.state_key(RUN)))
    state.update(session_status="Stopping", session_stopped=True, step=3,
                 best={"step": 1, "value": 0.5, "model_package_arn": BEST_ARN},
                 eval_history=[{"step": 1, "value": 0.5, "model_package_arn": BEST_ARN}])
    state["ledger"]["final"] = {"line": COST_LINE, "total_usd": 1.23}
    _put(store, layout.state_key(RUN), state)
    for i, (input_id, member, reward, answer) in enumerate([("s2p0", 0, 1.0, "42"), ("s2p0", 1, 0.0, "7"),
                                                             ("s2p1", 0, 1.0, "42"), ("s2p1", 1, 0.0, "7")]):
        sid = sid_of(2, "train", i)
        turns = turns_for(sid, "What is 6*7?", answer)
        for n, t in enumerate(turns):
            _put(store, layout.turns_prefix(RUN, sid) + f"{n:020d}-x.json", t)
        _put(store, layout.rollout_key(RUN, 2, 0, sid, "train"), {
            "sid": sid, "i": i, "input_id": input_id, "row": i // 2, "member": member, "kind": "train", "step": 2,
            "reward": reward, "status": "ok", "num_turns": 2, "policy_version": 2,
            "records": [record_to_json(r) for r in replay_turns(sid, turns, reward)]})
    _put(store, layout.summary_key(RUN, 2), {"step": 2, "sampler/mean_reward": 0.5, "decision": "train",
                                             "cost/total_usd": 1.1})
    _put(store, layout.run_summary_key(RUN), {"status": "FINISHED", "reason": "finished", "execution_arn": "arn:exec"})
    path = root / "report.html"
    path.write_text(rebuild_page(store, RUN, updated_at="test"), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def browser(page):
    with Browser(width=1280, height=1400) as b:
        b.open(page.as_uri())
        yield b


def header(b: Browser) -> str:
    return b.js("document.getElementById('run-header').innerText")


def test_the_session_a_run_stopped_reads_stopped(browser):
    text = header(browser)
    assert f"stepwise-{RUN} (Stopped)" in text and "Stopping" not in text


def test_identical_groups_are_not_labelled_best_and_worst(browser):
    labels = browser.js("[...document.querySelectorAll('#train-2 .label')].map(e => e.innerText.toLowerCase())")
    assert labels and "best" not in labels and "worst" not in labels, labels


def test_eval_rollouts_are_never_called_trained(browser):
    browser.click("#eval-1 details.rollout summary")
    shown = browser.js("""(() => { const d = document.querySelector('#eval-1 details.rollout');
        return {open: d.open, roles: [...d.querySelectorAll('.msg .role')].map(e => e.innerText),
                legends: [...d.querySelectorAll('.legend')].map(e => e.innerText),
                marks: d.querySelectorAll('mark.trained').length}; })()""")
    assert shown["open"] and any(r.startswith("assistant") for r in shown["roles"])
    assert not any("trained" in r for r in shown["roles"]), shown["roles"]
    assert shown["marks"] == 0 and not any("as trained" in t for t in shown["legends"]), shown


def test_the_page_shows_the_best_model_and_the_cost(browser):
    text = header(browser)
    assert BEST_ARN in text and "eval after step 1" in text, text
    assert COST_LINE in text, text
    assert browser.console_errors() == []
