"""run-local's closing lines and progress bar: checkpoints listed, `kept` as `stepwise watch` counts it."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_the_closing_lines_end_with_where_the_runs_time_went(tmp_path):
    """A run's last lines say where its wall time went (start-up, execution, end) and a step's mean time by part;
    before, the step line sat among the checkpoints and nothing said how long start-up and the end took."""
    (tmp_path / "state.json").write_text(json.dumps({"checkpoints": [{"step": 2, "reason": "final",
                                                                      "model_package_arn": "arn:x"}]}))
    timing = {"steps": 20, "seconds": {"rollouts": 100.0, "eval_rollouts": 6.0, "advantages": 10.0, "training": 20.0,
                                       "eval_checkpoint": 1.0, "orchestration": 5.0, "session_start": 8.0},
              "per_step": {"rollouts": 5.0, "advantages": 0.5, "training": 1.0, "orchestration": 0.25, "wall": 6.75},
              "phases": {"start_up": 20.0, "execution": 150.0, "end": 3.0}}
    lines = report_module.report(_result(tmp_path, wall_seconds=173.0, timing=timing)).splitlines()
    assert lines[-2] == ("time (s): 173 = start-up 20 + execution 150 (session start 8, 20 steps 135, evals and "
                         "checkpoints 7) + end 3")
    assert lines[-1] == "per step (s): rollouts 5.00, advantages 0.50, training 1.00, orchestration 0.25, wall 6.75"


def test_the_progress_bar_and_watch_share_one_kept_groups():
    assert run_module.kept_groups is watch.kept_groups
    grpo = {"sampler/num_rollouts": 64.0, "advantages/zero_groups_fraction": 0.5}
    assert watch.kept_groups(grpo, {"responses_per_prompt": 8}) == 8  # GRPO trains on every group
    assert watch.kept_groups({"sampling/kept_groups": 3.0}, {"responses_per_prompt": 8}) == 3  # DAPO


def _ledger_run(run_dir, ledger_usd, estimate_line):
    cfg = json.loads((Path(__file__).resolve().parents[2] / "examples" / "toy.json").read_text())
    (run_dir / "config.json").write_text(json.dumps(cfg))
    (run_dir / "state.json").write_text(json.dumps({"ledger": {"final": {
        "line": f"this run cost ${ledger_usd}", "total_usd": ledger_usd, "steps": 2, "estimate_line": estimate_line}}}))


def test_the_closing_cost_line_is_estimated_at_this_machine_s_measured_timings(tmp_path):
    """The estimate a local run starts with assumes a quiet machine's timings (`LOCAL_ASSUMPTIONS`): the closing
    lines say so, and estimate again at the timings this run measured, so that difference is the cost model's,
    not the machine's load (before: the start's estimate alone, unlabelled, "+226%" on a loaded machine; this test
    fails there)."""
    from stepwise_cli.cost import estimate
    from stepwise.config import load_run_config

    nominal = "estimated $0.0100 for 2 steps; the ledger says $0.0326: +$0.0226 (+226%)"
    timing = {"per_step": {"rollouts": 40.0, "advantages": 2.0, "training": 9.0, "orchestration": 6.0, "wall": 57.0},
              "seconds": {"session_start": 55.0},
              "ledger_check": {"lambda_seconds": {"FinishRollout": {"local": 30.0, "local_requests": 10},
                                                  "Gateway": {"ledger": 12.0, "requests": 8}}}}
    cfg = load_run_config(json.loads((Path(__file__).resolve().parents[2] / "examples" / "toy.json").read_text()))
    a = report_module.calibrated_assumptions(timing, cfg)
    assert (a.rollout_seconds, a.train_seconds, a.orchestration_seconds, a.session_start_seconds) == (40.0, 9.0, 6.0, 55.0)
    assert a.handler_seconds["FinishRollout"] == 3.0 and a.seconds_per_turn == 1.5
    assert a.advantages_seconds_per_rollout == 2.0 / (cfg.batch_size * cfg.responses_per_prompt)
    # the ledger of such a run: what the model says at those timings (a calibrated estimate is then exact)
    usd = estimate(cfg, a, total_steps=2)["run"]["total"]
    _ledger_run(tmp_path, usd, nominal)
    lines = report_module.report(_result(tmp_path, timing=timing)).splitlines()
    i = lines.index(f"{nominal} [the estimate at the start: the local stack's nominal timings, not calibrated to "
                    f"this machine]")
    assert lines[i + 1].startswith("  at this machine's measured timings (57.0 s a step, start-up 55 s): estimated $")
    assert lines[i + 1].endswith("(+0%)"), lines[i + 1]


def test_without_a_measured_step_the_closing_cost_line_says_it_is_not_calibrated(tmp_path):
    nominal = "estimated $0.0100 for 2 steps; the ledger says $0.0326: +$0.0226 (+226%)"
    _ledger_run(tmp_path, 0.0326, nominal)
    lines = report_module.report(_result(tmp_path, timing={})).splitlines()
    i = lines.index(f"{nominal} [the estimate at the start: the local stack's nominal timings, not calibrated to "
                    f"this machine]")
    assert lines[i + 1] == "  no step of this machine measured: no estimate calibrated to it"
