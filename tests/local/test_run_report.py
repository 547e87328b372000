"""run-local's closing lines and progress bar: checkpoints listed, `kept` as `stepwise watch` counts it."""

from __future__ import annotations

import json

from local import report as report_module
from local import run as run_module
from stepwise_cli.commands import watch


def _result(run_dir, **kw):
    base = dict(run_id="r", status="SUCCEEDED", run_dir=run_dir, wall_seconds=12.0, steps=2, rewards=[0.25, 0.75],
                evals=[{"step": 2, "accuracy": 1.0}], failure=None, timing={}, simulator_counters={},
                session_status="Stopped", executions=[])
    return report_module.RunResult(**{**base, **kw})


def test_report_lists_each_checkpoint_from_the_run_state(tmp_path):
    (tmp_path / "state.json").write_text(json.dumps({"checkpoints": [
        {"step": 10, "reason": "save_every", "model_package_arn": "arn:aws:sagemaker:us-east-1:1:model-package/g/11"},
        {"step": 20, "reason": "final", "model_package_arn": "arn:aws:sagemaker:us-east-1:1:model-package/g/22"}]}))
    text = report_module.report(_result(tmp_path))
    assert "checkpoint at step 10 (save_every): arn:aws:sagemaker:us-east-1:1:model-package/g/11" in text
    assert "checkpoint at step 20 (final): arn:aws:sagemaker:us-east-1:1:model-package/g/22" in text


def test_report_without_a_state_file_lists_no_checkpoint(tmp_path):
    assert "checkpoint" not in report_module.report(_result(tmp_path))


def test_report_counts_the_runs_acr_sessions_and_flags_any_left_billing(tmp_path):
    acr = {"sessions_started": 64, "sessions_stopped": 63, "sessions_timed_out": 0, "peak_active_sessions": 25}
    text = report_module.report(_result(tmp_path, billing={"acr": acr, "acr_active": []}))
    assert "ACR runtime sessions: 64 started, 63 stopped, 0 timed out, 0 left active (peak 25 at once)" in text
    assert "still billing" not in text
    text = report_module.report(_result(tmp_path, billing={"acr": acr, "acr_active": ["s1"]}))
    assert "1 left active (peak 25 at once) <- still billing" in text


def test_the_progress_bar_and_watch_share_one_kept_groups():
    assert run_module.kept_groups is watch.kept_groups
    grpo = {"sampler/num_rollouts": 64.0, "advantages/zero_groups_fraction": 0.5}
    assert watch.kept_groups(grpo, {"responses_per_prompt": 8}) == 8  # GRPO trains on every group
    assert watch.kept_groups({"sampling/kept_groups": 3.0}, {"responses_per_prompt": 8}) == 3  # DAPO
