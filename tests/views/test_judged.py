"""What a person reads of a judged run: the group judge's score, the agent's own reward and the judge's reason
(or the group's fallback) beside each rollout's reward, in `stepwise rollouts` (text and ``--json``) and in
the report page's sample table, merged from the judge's records as ComputeAdvantages merges them, and the
step's ``judge/*`` figures in the page's Judge panel.

The run is a local run folder written as the pipeline writes it (`tests.support.judge.write_judged_run`: two
steps of a calculator agent, real TraceRecords) with a ``judge`` in its config and the judge's records of step
1: group ``s1p0`` (the agent rewarded both members 1.0) scored 8 and 3 by the judge, group ``s1p1`` fallen back.
With ``combine: replace`` the rewards trained on are the judge's, mapped to [0, 1]: 0.8 and 0.3, so the group
the agent's reward left uninformative is trained, its members' advantages of opposite signs.
"""

from __future__ import annotations

import html
import json
import re
from pathlib import Path

import pytest

from stepwise.core.advantages import compute_grpo_advantages
from stepwise.views.run import rebuild_page
from stepwise_cli.main import main
from stepwise_cli.sources import DirStore
from tests.support.judge import JUDGED_FALLBACK, JUDGED_GOOD, JUDGED_METRICS, JUDGED_POOR, write_judged_run
from tests.support.runs import sid_of, write_run

RUN = "judged-run"
GOOD, POOR, FALLBACK = JUDGED_GOOD, JUDGED_POOR, JUDGED_FALLBACK


@pytest.fixture(scope="module")
def folder(tmp_path_factory) -> Path:
    """``runs-local/RUN`` as run-local leaves it: the bucket's objects of the run under ``s3/``."""
    folder = tmp_path_factory.mktemp("runs-local") / RUN
    write_judged_run(DirStore(folder / "s3"), RUN)
    return folder


def _rollouts(capsys, folder: Path, *argv: str) -> dict:
    assert main(["rollouts", str(folder), "--step", "1", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_rollouts_json_shows_the_judge_s_score_reason_and_the_agent_s_reward_beside_the_reward_trained(folder, capsys):
    out = _rollouts(capsys, folder)
    groups = {g["input_id"]: g for g in out["groups"]}
    judged = groups["s1p0"]["rollouts"]
    assert [(r["judge_score"], r["judge_reason"], r["agent_reward"]) for r in judged] == [(8.0, GOOD, 1.0),
                                                                                        (3.0, POOR, 1.0)]
    assert [r["reward"] for r in judged] == pytest.approx([0.8, 0.3])  # combine replace: the score in [0, 1]
    assert groups["s1p0"]["selection"] == "trained"  # the agent's equal rewards alone carried no signal
    assert [r["advantage"] for r in judged] == pytest.approx(compute_grpo_advantages([0.8, 0.3]))
    fallen = groups["s1p1"]["rollouts"]
    assert all(r["judge_score"] is None and r["judge_reason"] == f"fallback (agent_reward): {FALLBACK}"
               for r in fallen)
    assert [r["reward"] for r in fallen] == [r["agent_reward"] for r in fallen] == [1.0, 0.0]
    shown = _rollouts(capsys, folder, "--show", sid_of(1, "train", 0))["rollout"]
    assert (shown["judge_score"], shown["judge_reason"], shown["agent_reward"]) == (8.0, GOOD, 1.0)


def test_rollouts_prints_the_judge_s_columns_and_its_reason_under_each_rollout(folder, capsys):
    assert main(["rollouts", str(folder), "--step", "1", "--group", "s1p0"]) == 0
    text = capsys.readouterr().out
    header = next(line for line in text.splitlines() if line.lstrip().startswith("member"))
    assert header.split()[:5] == ["member", "sid", "reward", "judge", "agent"]
    assert re.search(r"0\.800\s+8\.00\s+1\.000\s+\+1\.000", text)
    assert f"judge's reason: {GOOD}" in text and f"judge's reason: {POOR}" in text
    assert main(["rollouts", str(folder), "--step", "1", "--show", sid_of(1, "train", 1)[:8]]) == 0
    assert f"judge score 3.00  the agent's reward 1.000  judge's reason: {POOR}" in capsys.readouterr().out
    assert main(["rollouts", str(folder), "--step", "0"]) == 0  # step 0 was not judged: its fallback shows
    assert "judge's reason: fallback (agent_reward): no judge record for this group" in capsys.readouterr().out


def test_the_page_s_sample_table_shows_the_judge_s_score_and_reason_and_its_panel_the_step_s_figures(folder):
    page = rebuild_page(DirStore(folder / "s3"), RUN, updated_at="test")
    step = re.search(r'<section class="step" id="train-1".*?</section>', page, re.S)
    assert step is not None
    rows = re.findall(r'<details class="rollout" data-sid="([^"]+)"><summary>(.*?)</summary>', step.group(0))
    by_sid = {sid: html.unescape(re.sub(r"<[^>]+>", "", summary)) for sid, summary in rows}
    good, poor = by_sid[sid_of(1, "train", 0)], by_sid[sid_of(1, "train", 1)]
    assert "reward 0.800 · judge 8.00 · agent 1.000 · adv +1.000" in good and good.endswith(f"judge's reason {GOOD}")
    assert "reward 0.300 · judge 3.00 · agent 1.000 · adv -1.000" in poor and poor.endswith(f"judge's reason {POOR}")
    for key in JUDGED_METRICS:
        assert f'id="curve-{key}"' in page, key


def test_a_run_without_a_judge_shows_no_judge_column(tmp_path):
    """The same run without a judge in its config: its page and lines read as they did before the judge."""
    from stepwise.views.run import read_step

    store = DirStore(tmp_path)
    write_run(lambda k, o: store.put_bytes(k, json.dumps(o).encode()), store.put_bytes, "plain")
    page = rebuild_page(store, "plain", updated_at="test")
    assert " · judge " not in page and "judge&#x27;s reason" not in page and " · agent " not in page
    view = read_step(store, "plain", 1)
    assert all(r.record.judge_score is None and r.to_json()["agent_reward"] == r.record.reward for r in view.rollouts)
