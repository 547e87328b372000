"""A finished toy run, read as a person reads it: `stepwise rollouts` (local folder and the deployed-stack
code path on moto), the report page in a real browser, and the W&B run offline, across continue-as-new.

One run of 20 steps (4 prompts x 4 responses, continuing as new every 8 steps: 3 executions) through the
local stack with ``wandb_project`` set (run-local logs W&B offline into the run folder).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local.run import run_local
from stepwise.core.advantages import compute_grpo_advantages
from stepwise_cli.main import main
from tests.support.browser import Browser, chromium_path
from tests.support.wandb_reader import history

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy.json"
ARTIFACTS = ROOT / "artifacts"
RUN = "e2e-inspect"
STEPS = 20

# ~2 minutes on an idle 2-core machine; the bounds leave room for a loaded one
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800)]

OVERRIDES = {"batch_size": 4, "responses_per_prompt": 4, "max_prompts": 4 * STEPS, "eval_every": 10,
             "eval_max_prompts": 4, "save_every": 10, "steps_per_execution": 8, "acr_tps_limit": 32,
             "wandb_project": "stepwise-e2e", "wandb_run_name": "toy"}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs")
    result = run_local(TOY, run_id=RUN, out_root=out, progress=False, overrides=OVERRIDES, timeout=1500, quiet=True)
    assert result.status == "SUCCEEDED", result.failure
    return result


def skip_if_wandb_hung(run_dir: Path) -> None:
    """Skip, naming it, when W&B itself hung in the Track worker: its ``wandb.init`` stopped at "starting run
    threads in backend" (wandb 0.31's ``deliver_run_start``) and never returned, so Track's queue stood still
    behind W&B's process-wide lock. Seen in 2 of 4 clean CI runs on 2026-12-07; every other
    cause of a missing Track page or W&B point still fails these tests."""
    log = run_dir / "wandb" / "debug.log"
    lines = log.read_text(errors="replace").splitlines() if log.is_file() else []
    if lines and "starting run threads in backend" in lines[-1]:
        pytest.skip(f"W&B hung in wandb.init in the Track worker ({lines[-1][:23]}): a W&B wait, not ours")


def _json(capsys, *argv):
    assert main(["rollouts", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_rollouts_show_groups_and_a_conversation_on_the_local_folder_and_through_the_bucket(finished, capsys, moto_dep):
    folder = finished.run_dir
    out = _json(capsys, str(folder), "--step", "5", "--informative", "-n", "1")
    (group,) = out["groups"]
    rewards = [r["reward"] for r in group["rollouts"]]
    assert len(rewards) == 4 and [r["advantage"] for r in group["rollouts"]] == pytest.approx(compute_grpo_advantages(rewards))
    sid = group["rollouts"][0]["sid"]
    shown = _json(capsys, str(folder), "--step", "5", "--show", sid[:10])
    assert [m["role"] for m in shown["messages"]] == ["system", "user", "assistant"]
    assert shown["messages"][-1]["trained"] is True and shown["tokenizer"] is True
    trained = [s for s in shown["records"][0] if s["trained"]]
    assert trained and trained[-1]["text"].endswith("<|im_end|>")
    assert shown["records"][0][0]["region"] == "prompt" and "What digit comes after" in shown["records"][0][0]["text"]

    # the deployed-stack code path: the same objects in a bucket, read through S3 (moto)
    for path in (folder / "s3").rglob("*"):
        if path.is_file():
            moto_dep.s3.put_object(Bucket=moto_dep.bucket, Key=path.relative_to(folder / "s3").as_posix(),
                                   Body=path.read_bytes())
    for argv in (["--step", "5", "--informative", "-n", "1"], ["--step", "5", "--show", sid]):
        local = _json(capsys, str(folder), *argv)
        deployed = _json(capsys, RUN, *argv, *moto_dep.flags)
        local.pop("source"), deployed.pop("source")
        assert deployed == local


def test_the_report_page_is_kept_in_the_run_folder_and_draws_in_a_browser(finished):
    page = finished.run_dir / "report.html"
    assert finished.report == page
    text = page.read_text()
    from stepwise.views.index import RECENT

    inline = [f"train-{s}" for s in range(STEPS - RECENT + 1, STEPS)] + ["eval-20"]  # the newest 5 tables
    assert all(f'id="{i}"' in text for i in inline) and 'id="train-0"' not in text
    lambdas = finished.timing["lambdas"]
    skip_if_wandb_hung(finished.run_dir)
    assert lambdas["Track"]["errors"] == 0 and lambdas["Track"]["count"] >= STEPS + 3 + 1  # steps, evals, the end
    if chromium_path() is None:
        pytest.skip("chromium is not installed (.ci/run installs it)")
    with Browser(width=1280, height=1500) as b:
        b.open(page.as_uri())
        assert b.js("document.getElementById('run-status').textContent") == "FINISHED"
        points = b.js("document.querySelector('g[id=\"curve-sampler/mean_reward\"] path').getAttribute('d').split('L').length")
        assert points == STEPS
        assert b.js("document.querySelectorAll('section.step').length") == RECENT
        links = b.js("[...document.querySelectorAll('#older a')].map(a => a.getAttribute('href'))")
        assert len(links) == STEPS + 3 - RECENT  # every older step and eval a link away, each a page of its own
        assert all((page.parent / href).is_file() for href in links), links
        b.click("#train-19 details.rollout summary")
        assert b.js("[...document.querySelectorAll('#train-19 details.rollout')][0].querySelectorAll('.msg').length") == 3
        assert b.js("document.querySelector('#train-19 details.rollout mark.trained').checkVisibility()") is True
        b.screenshot(ARTIFACTS / "report-page-toy-run.png")
        assert b.console_errors() == []


def test_one_wandb_run_holds_every_step_and_sample_table_across_continue_as_new(finished):
    assert len(finished.executions) == 3  # steps 0-7, 8-15, 16-19
    skip_if_wandb_hung(finished.run_dir)
    ids, rows, exits = history(finished.run_dir, RUN)
    assert ids == {RUN}
    assert sorted(r["step"] for r in rows if "sampler/mean_reward" in r) == list(range(STEPS))
    assert sorted(r["step"] for r in rows if r.get("samples/train._type") == "table-file") == list(range(STEPS))
    assert sorted(r["step"] for r in rows if "eval/accuracy" in r) == [0, 10, 20]
    assert exits and all(code == 0 for code in exits)


def test_no_step_waits_for_a_lost_wake_up_across_the_hand_overs(finished):
    """Every rollout's outcome reached its task (none ended by its timeout, none scored late), and no step
    came near ``max_rollout_time``, across the continue-as-new hand-overs of the run's 3 executions. A lost
    wake-up (moto ending a task its SendTaskSuccess already answered at the task's timeout,
    `local.engine.early_task_outcomes`) made a step last the whole ``max_rollout_time`` (120 s here, against
    2-3 s a step on an idle machine). The bound is half of it, not a multiple of the median step: a loaded CI
    machine once made one step 9.7 s against a 2.6 s median, which is load, not a lost wake-up."""
    rows = [json.loads(line) for line in (finished.run_dir / "metrics.jsonl").read_text().splitlines()]
    walls = {r["step"]: r["time/step_wall"] for r in rows if r.get("kind") == "train" and "time/step_wall" in r}
    assert sorted(walls) == list(range(STEPS))
    max_rollout_time = json.loads(TOY.read_text())["max_rollout_time"]
    assert max(walls.values()) < max_rollout_time / 2, {s: round(w, 2) for s, w in walls.items()}
    records = [json.loads(p.read_text()) for p in (finished.run_dir / "s3").rglob("rollouts/*.json")]
    assert len(records) >= STEPS * 16
    assert [r["sid"] for r in records if r["status"] == "timeout" or r.get("late")] == []
