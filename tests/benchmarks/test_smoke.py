"""The benchmark scripts in trivially small modes, so they cannot rot (benchmarks/README.md has the figures).

Full runs of ``reference_vs_pipeline`` and ``scaling`` start the whole local stack and take minutes;
here their pure parts run on real inputs (the toolkit's Config, a real-shaped history) and the two
fast scripts run end to end.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from benchmarks import (cost_model, dapo_vs_grpo, dataset_memory, gateway_overhead, reference_vs_pipeline, sampler_binding,
                        scaling)
from benchmarks._common import percentile

REPO = Path(__file__).resolve().parents[2]


def test_cost_model_prints_rows_that_grow_with_the_step(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert cost_model.main(["--sizes", "8x4,32x4", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "cost_model.json").read_text())["rows"]
    assert [r["size"] for r in rows] == ["8x4", "32x4"]
    assert rows[1]["lambda_gb_seconds"] > rows[0]["lambda_gb_seconds"] > 0
    assert rows[1]["usd_pipeline"] > rows[0]["usd_pipeline"] > 0
    assert "8x4" in capsys.readouterr().out


def test_gateway_overhead_measures_both_gateways(tmp_path: Path) -> None:
    assert gateway_overhead.main(["--turns", "3", "--kinds", "short", "--out", str(tmp_path)]) == 0
    row = json.loads((tmp_path / "gateway_overhead.json").read_text())["short"]
    assert row["ours_ms"]["50"] > 0 and row["toolkit_ms"]["50"] > 0
    assert row["s3_bytes_per_turn"] > 100  # the captured turn object


def test_sampler_binding_counts_each_bindings_requests_per_turn(tmp_path: Path) -> None:
    assert sampler_binding.main(["--rounds", "2", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "sampler_binding.json").read_text())["per_turn"]
    assert rows["per_rollout"]["binding_requests_per_turn"] == {}
    assert rows["turn_gate"]["binding_requests_per_turn"] == {"PUT lease": 1.0, "GET sampler": 1.0, "DELETE lease": 1.0}
    assert set(rows["next_turn"]["binding_requests_per_turn"]) <= {"GET sampler"}


def test_reference_config_maps_the_toy_config_onto_the_toolkit_config() -> None:
    cfg = json.loads((REPO / "examples" / "toy.json").read_text())
    config = reference_vs_pipeline.reference_config(cfg, steps=3, evals=False)
    assert config.max_prompts == 3 * cfg["batch_size"]
    assert (config.batch_size, config.responses_per_prompt, config.loss) == (
        cfg["batch_size"], cfg["responses_per_prompt"], cfg["loss"])
    assert config.agent_runtime_arn == reference_vs_pipeline.REF_AGENT_ARN and config.eval_every == 0
    assert Path(config.dataset_path).is_file()


def test_step_clock_reads_the_reference_loop_log_lines() -> None:
    clock = reference_vs_pipeline._StepClock()
    for t, msg in [(0.0, "=== Epoch 0 | Step 0 [x] ==="), (2.0, "  Training on 64 datums…"),
                   (3.0, "  step=0  reward=0.2500"), (3.0, "=== Epoch 0 | Step 1 [x] ==="),
                   (7.5, "  step=1  reward=0.5000"), (8.0, "Epoch 0 complete (2 steps)")]:
        rec = logging.LogRecord("x", logging.INFO, __file__, 0, msg, None, None)
        rec.created = t
        clock.emit(rec)
    assert clock.step_seconds() == [3.0, 5.0]
    assert clock.rewards == [0.25, 0.5] and clock.rollout_s == [2.0]


def test_events_per_step_counts_between_plans_and_sizes_parse() -> None:
    def entered(name: str) -> dict:
        return {"type": "TaskStateEntered", "stateEnteredEventDetails": {"name": name}}

    history = [entered("Initialize run")] + [entered("Plan next action"), {"type": "X"}, {"type": "Y"}] * 3
    got = scaling.events_per_step([history], steps=2)
    assert got["per_step"] == 3 and got["steps_before_limit"] == scaling.HISTORY_LIMIT // 3
    assert scaling.parse_size("128x4") == (128, 4)
    with pytest.raises(ValueError, match="BATCHxRESPONSES"):
        scaling.parse_size("128")
    assert percentile([1, 2, 3, 4], 50) == 2.5


def test_dapo_vs_grpo_arms_are_valid_configs_with_the_same_rollout_budget() -> None:
    from stepwise.config import load_run_config

    budgets = set()
    for arm, (config, sets) in dapo_vs_grpo.ARMS.items():
        raw = json.loads((REPO / config).read_text())
        raw.update({k: json.loads(v) for k, v in (s.split("=", 1) for s in sets)})
        cfg = load_run_config(raw)
        assert cfg.algorithm == ("dapo" if arm.startswith("dapo") else "grpo"), arm
        budgets.add(cfg.max_prompts * cfg.epochs * cfg.responses_per_prompt)
    assert budgets == {1280}  # every arm gets the same rollout budget


def test_dapo_vs_grpo_mix_task_arms_are_mix_configs_with_the_toy_arms_dapo_fields() -> None:
    from stepwise.config import load_run_config

    for arm in dapo_vs_grpo.ARMS:
        config, sets = dapo_vs_grpo.task_arm(arm, "mix")
        assert config == REPO / "examples" / "mix.json"
        raw = json.loads(config.read_text())
        raw.update({k: json.loads(v) for k, v in (s.split("=", 1) for s in sets)})  # later --set wins
        cfg = load_run_config(raw)
        assert cfg.algorithm == ("dapo" if arm.startswith("dapo") else "grpo"), arm
        assert cfg.dataset_path.endswith("mix_train.jsonl") and cfg.learning_rate == raw["learning_rate"]
        if arm in ("dapo", "dapo-cap8", "dapo-k4"):  # toy_dapo.json's loss and cap came along
            assert cfg.loss == "ppo" and cfg.clip_high_threshold == 1.28 and cfg.max_num_gen_batches >= 4
    assert dapo_vs_grpo.task_arm("dapo-cap8", "mix")[1][-1] == "max_num_gen_batches=8"


def test_dapo_vs_grpo_reads_curves_by_rollouts_consumed(tmp_path: Path) -> None:
    rows = [{"kind": "train", "step": 0, "sampler/num_rollouts": 128, "sampler/mean_reward": 0.25,
             "sampling/generation_batches": 2, "sampling/filtered_fraction": 0.1},
            {"kind": "train", "step": 1, "sampler/num_rollouts": 64, "sampler/mean_reward": 0.5,
             "sampling/generation_batches": 1, "sampling/filtered_fraction": 0.0},
            {"kind": "eval", "step": 2, "eval/accuracy": 1.0},
            {"kind": "train", "step": 2, "sampler/num_rollouts": 64, "sampler/mean_reward": 1.0}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    curve = dapo_vs_grpo.read_curve(tmp_path)
    assert [s["cum_rollouts"] for s in curve["steps"]] == [128, 192, 256]
    assert curve["evals"] == [{"step": 2, "cum_rollouts": 192, "accuracy": 1.0}]
    # window (0, 256]: 128 rollouts at 0.25, 64 at 0.5, 64 at 1.0
    assert dapo_vs_grpo.reward_at(curve["steps"], 256) == pytest.approx((128 * 0.25 + 64 * 0.5 + 64 * 1.0) / 256)
    assert dapo_vs_grpo.reward_at(curve["steps"], 512) is None
    assert dapo_vs_grpo.rollouts_to(curve["steps"], 0.5) == 256  # the window (0, 256] averages 0.5
    assert dapo_vs_grpo.rollouts_to(curve["steps"], 0.3, window=128) == 192  # (64, 192]: 0.375; (0, 128]: 0.25
    assert dapo_vs_grpo.rollouts_to(curve["steps"], 0.9) is None


def test_dapo_vs_grpo_counts_a_grpo_runs_useful_rollouts_by_its_zero_groups(tmp_path: Path) -> None:
    # GRPO steps report sampling/* too (kept 8 of 8, nothing filtered); its all-equal groups carry no signal.
    (tmp_path / "run_config.json").write_text(json.dumps({"algorithm": "grpo", "responses_per_prompt": 8}))
    row = {"kind": "train", "step": 0, "sampler/num_rollouts": 64, "sampler/mean_reward": 0.4,
           "sampling/kept_groups": 8, "sampling/filtered_fraction": 0.0, "advantages/zero_groups_fraction": 0.75}
    (tmp_path / "metrics.jsonl").write_text(json.dumps(row) + "\n")
    (step,) = dapo_vs_grpo.read_curve(tmp_path)["steps"]
    assert step["useful_rollouts"] == 16 and step["filtered_fraction"] == 0.75
    (tmp_path / "run_config.json").write_text(json.dumps({"algorithm": "dapo", "responses_per_prompt": 8}))
    (step,) = dapo_vs_grpo.read_curve(tmp_path)["steps"]
    assert step["useful_rollouts"] == 64 and step["filtered_fraction"] == 0.0


def test_dataset_memory_measures_init_and_plan_step_in_child_processes(tmp_path: Path) -> None:
    assert dataset_memory.main(["--sizes", "1", "--formats", "jsonl,parquet", "--data", str(tmp_path / "data"),
                                "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "dataset_memory.json").read_text())["rows"]
    assert [(r["size_mb"], r["format"]) for r in rows] == [(1, "jsonl"), (1, "parquet")]
    for r in rows:
        assert r["init"]["rows"] == r["rows"] > 1000 and r["plan"]["num_items"] == 32 * 4
        assert r["init"]["peak_mb"] >= r["init"]["baseline_mb"] > 10


def test_latency_flags_parse_and_reach_the_simulator_process() -> None:
    """``--latency KIND=SECONDS`` : parsed once, given to the simulator as its own flags."""
    from local.stack import SimulatorProcess

    latency = reference_vs_pipeline.parse_latency(["forward_backward=3", "optim_step=0.5"])
    assert latency == {"forward_backward": 3.0, "optim_step": 0.5}
    for bad in (["optim_step"], ["optim_step=-1"], ["=2"], ["optim_step=x"], ["optim_step=1", "optim_step=2"]):
        with pytest.raises(ValueError, match="--latency"):
            reference_vs_pipeline.parse_latency(bad)
    sim = SimulatorProcess(region="us-east-1", options={"latency": latency})
    try:
        assert sim.state()["latency"] == latency
    finally:
        sim.stop()


def test_table_puts_the_pipeline_at_each_staleness_beside_the_reference() -> None:
    run = {"steps": 3, "rewards": [0.1, 0.2], "load_average": "1.0/1.0/1.0"}
    result = {"reference": {**run, "step_seconds": [4.0, 4.0, 5.0]},
              "pipelines": [{**run, "max_staleness": 0, "step_seconds": [6.0, 6.0], "session_idle_seconds": [3.0]},
                            {**run, "max_staleness": 1, "step_seconds": [3.0, 3.0], "session_idle_seconds": []},
                            {"steps": 0, "max_staleness": 1, "status": "FAILED", "step_seconds": []}]}
    lines = reference_vs_pipeline.table(result)
    assert lines[1].split()[:6] == ["reference", "3", "4.00", "4.80", "1.00", "-"]
    assert lines[2].split()[:7] == ["pipeline", "s=0", "3", "6.00", "6.00", "1.50", "3.00"]
    assert lines[3].split()[:6] == ["pipeline", "s=1", "3", "3.00", "3.00", "0.75"]
    assert "FAILED" in lines[4]
    assert result["pipelines"][1]["ratio_to_reference"] == 0.75


def test_cpu_monitor_charges_a_child_s_cpu_to_its_role_within_the_window() -> None:
    import subprocess
    import sys
    import time

    from benchmarks._common import CpuMonitor, process_role

    assert [process_role(c) for c in ("python -m local.workers --port 0", "python -m stepwise.gateway",
                                      "python -m local.agents.serve x:app", "cli.main()) simulator --port 0",
                                      "node x")] == ["workers", "gateway", "agent", "simulator", "other"]
    with CpuMonitor(interval=0.1) as cpu:
        time.sleep(0.3)
        idle_until = time.time()
        t0 = time.time()
        # a child that burns ~0.5 s of CPU; "simulator" in its command line names its role
        subprocess.run([sys.executable, "-c", "import time\nt = time.process_time()\n"
                        "while time.process_time() - t < 0.5: pass", "simulator"], check=True)
        time.sleep(0.3)
        t1 = time.time()
    busy = cpu.window(t0, t1)
    assert 0.4 <= busy["simulator"] <= 1.0 and busy["total"] >= busy["simulator"]
    # before the child: nothing charged to it (samples nearest to the bounds, 0.1 s apart)
    assert cpu.window(idle_until - 0.3, idle_until - 0.15).get("simulator", 0.0) == 0.0
    assert cpu.window(t1, t0) == {}
    per_step = reference_vs_pipeline.cpu_per_step(cpu, [t0, (t0 + t1) / 2, t1])
    assert per_step["simulator"] == pytest.approx(busy["simulator"] / 2, abs=0.01)
    assert reference_vs_pipeline.cpu_per_step(None, [t0, t1]) == {}


def test_credit_two_turn_counts_steps_to_the_threshold_and_reprints_a_result(tmp_path: Path, capsys) -> None:
    from benchmarks import credit_two_turn

    assert credit_two_turn.steps_to([0.2, 0.5, 0.9, 0.8, 0.95], 0.8, 2) == 4
    assert credit_two_turn.steps_to([0.2, 0.9], 0.8, 2) is None
    runs = [{"arm": "per_turn", "seed": 0, "rewards": [0.3, 0.9, 0.9]},
            {"arm": "trajectory", "seed": 0, "rewards": [0.3, 0.4, 0.5]}]
    table = credit_two_turn.summarize(runs, 0.8, 2, [1, 3])
    assert "| per_turn | s0: 3 | 3.0 | 0.30 | 0.90 |" in table and "| trajectory | s0: never (3) | 4.0 |" in table
    result = tmp_path / "r.json"
    result.write_text(json.dumps({"runs": runs, "threshold": 0.8, "window": 2}))
    assert credit_two_turn.main(["--report", str(result), "--at-steps", "1,3"]) == 0
    assert "s0: never (3)" in capsys.readouterr().out
    config = json.loads((REPO / "examples" / "two_turn.json").read_text())
    assert (config["advantage_estimator"], config["reward_granularity"]) == ("per_turn_rloo", "per_turn")



def test_ledger_overhead_measures_the_ledgers_cpu_and_bytes(tmp_path: Path) -> None:
    from benchmarks import ledger_overhead

    timing = tmp_path / "timing.json"
    timing.write_text(json.dumps({"lambdas": {"FinishRollout": {"count": 64}, "PlanStep": {"count": 2}},
                                  "s3_requests": {"total": 900, "by_kind": {"PUT state": 12}}}))
    out = ledger_overhead.main(["--timing", str(timing), "--steps", "2", "--out", str(tmp_path)])
    m, per = out["measured"], out["per_step"]
    assert 0 < m["seconds_per_invocation"] < 0.05 and m["seconds_per_s3_request"] < 0.01
    assert m["usage_bytes"]["rollout record"] > m["usage_bytes"]["turn or session record"] > 100
    assert m["state_bytes"]["ledger"] > 1000  # the ledger of a 2-step run in state.json
    assert per["invocations"] == 66 and per["cpu_seconds_per_step"] > 0


def test_gateway_memory_reads_a_processs_resident_and_peak_memory() -> None:
    import os

    from benchmarks.gateway_memory import proc_memory_mb

    mem = proc_memory_mb(os.getpid())
    assert 10 < mem["rss"] <= mem["peak"]


def test_run_end_at_scale_measures_retention_and_a_stop_and_the_paths_before(tmp_path: Path,
                                                                              capsys: pytest.CaptureFixture) -> None:
    from benchmarks import run_end_at_scale

    assert run_end_at_scale.main(["--packages", "12", "--in-flight", "8", "--tps", "8", "--before", "2",
                                  "--before-rollouts", "2", "--delete-latency", "0", "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "run_end_at_scale.json").read_text())["rows"]
    assert rows["retention"][0]["deleted"] == 9 and rows["retention"][0]["DescribeModelPackage"] == 0
    assert rows["stop"][0]["rollouts_ended"] == 8 and rows["stop"][0]["sessions_left"] == 0
    assert rows["retention_before"][0]["packages"] == 2 and rows["stop_before"][0]["rollouts"] == 2
    assert "stop with 8 in flight" in capsys.readouterr().out


def test_rollouts_at_scale_plans_full_batches_and_finds_missing_and_doubled_records(tmp_path: Path) -> None:
    """benchmarks/rollouts_at_scale.py: 128x8 and 8x8 overrides give the toy config exactly the steps asked
    (two epochs of the 200-row set for 128 prompts a step); a run folder's items without a record, or with two,
    are counted."""
    from benchmarks import rollouts_at_scale as bench
    from stepwise.config import load_run_config

    toy = json.loads((Path(__file__).resolve().parents[2] / "examples" / "toy.json").read_text())
    for batch, k in ((128, 8), (8, 8)):
        cfg = load_run_config({**toy, **bench.overrides(batch, k, 2)})
        assert cfg.total_steps(bench.TOY_ROWS) == 2 and cfg.batch_size * cfg.responses_per_prompt == batch * k
        assert not cfg.has_evals and cfg.acr_tps_limit == toy["acr_tps_limit"]
    gen = tmp_path / "s3" / "runs" / "r" / "steps" / "0" / "gen0"
    (gen / "rollouts").mkdir(parents=True)
    (gen / "items.json").write_text(json.dumps([{"i": i} for i in range(4)]))
    for name, i, sid in (("a", 0, "s0"), ("b", 1, "s1"), ("c", 1, "s1b"), ("d", 3, "s3")):
        (gen / "rollouts" / f"{name}.json").write_text(json.dumps({"i": i, "sid": sid, "status": "ok"}))
    held = bench.records_held(tmp_path, "r", 1, 4)
    assert (held["items"], held["records"], held["missing"], held["duplicated"], held["expected"]) == (4, 4, 1, 1, 4)


def test_advantages_read_times_both_reads_and_counts_every_get(tmp_path: Path, capsys) -> None:
    from benchmarks import advantages_read

    assert advantages_read.main(["--rollouts", "12", "--latency-ms", "0,5", "--pools", "4", "--repeats", "1",
                                 "--out", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "advantages_read.json").read_text())["rows"]
    assert [r["latency_ms"] for r in rows] == [0.0, 5.0]
    for r in rows:
        assert r["before"]["gets_counted"] == r["after"]["gets_counted"] == 12


def test_judge_toy_reads_a_run_folder_and_measures_the_judge_against_the_answer_key(tmp_path: Path) -> None:
    """benchmarks/judge_toy.py on a one-step run folder laid out as run-local leaves it: one group of two, the
    judge right about one member and wrong about the other."""
    from benchmarks import judge_toy
    from stepwise import layout
    from stepwise.records import JudgeRecord, Usage
    from tests.support.judge import toy_turn

    run = tmp_path / "toy_judge-1"
    s3 = run / "s3"
    cfg = json.loads((REPO / "examples" / "toy_judge.json").read_text())

    def put(key: str, obj) -> None:
        (s3 / key).parent.mkdir(parents=True, exist_ok=True)
        (s3 / key).write_text(json.dumps(obj))

    put(layout.config_key(run.name), cfg)
    for sid, reply in (("a", "4"), ("b", "9")):
        put(f"{layout.turns_prefix(run.name, sid)}0001.json", toy_turn(sid, 3, reply))
    record = JudgeRecord(input_id="s0g0p0", step=0, sids_G=["a", "b"], members_G=[0, 1], judged_G=[True, True],
                         scores_G=[10.0, 10.0], reasons_G=["x", "y"], judged_chars_G=[13, 13],
                         usage=Usage(judge_requests=1, judge_input_tokens=600, judge_output_tokens=100))
    put(layout.judge_record_key(run.name, 0, 0, "s0g0p0"), record.model_dump())
    (run / "steps" / "0").mkdir(parents=True)
    (run / "steps" / "0" / "summary.json").write_text(json.dumps({"sampler/mean_reward": 1.0}))
    out = judge_toy.analyse(run)
    [row] = out["steps"]
    assert (row["judged"], row["correct"], row["agree"], row["groups"]) == (1.0, 0.5, 0.5, 1)
    assert row["input_tokens_per_group"] == 600 and row["usd_per_group"] == pytest.approx((600 * 0.035 + 100 * 0.14) / 1e6)
    assert "0.500" in judge_toy.table(out)


def test_toy_run_profile_names_each_process_and_prints_the_parts_per_step() -> None:
    from benchmarks import toy_run_profile as trp

    assert trp.kind_of("python -m local.workers --port 0 --beside-loop") == "Track worker (niced)"
    assert trp.kind_of("python -m local.workers --port 0") == "loop workers (handlers)"
    assert trp.kind_of("python -m local.no_aws stepwise.gateway --port 0") == "gateway"
    assert trp.kind_of("python -m stepwise_cli run-local examples/toy.json") == "run-local (moto, ASL, ACR emulator)"
    timing = {"steps": 2, "per_step": {"rollouts": 4.0, "wall": 5.0}, "seconds": {"session_start": 3.0},
              "phases": {"start_up": 10.0, "execution": 20.0, "end": 1.0}, "end_seconds": {"mirror": 0.1},
              "lambdas": {"Track": {"count": 3, "errors": 0, "seconds": 8.0}},
              "acr": {"invocations": 10, "throttled": 2, "stop_calls": 8}, "s3_requests": {"per_rollout": {"total": 17}}}
    text = trp.table({"wall_seconds": 31.0, "load_before": "1/1/1", "load_after": "2/2/2", "timing": timing,
                      "cpu_seconds": {"gateway": 4.0}})
    assert "| Track | 3 (0 errors) | 4.00 |" in text and "| gateway | 4.0 | 2.00 |" in text
    assert "2 throttled" in text and "rollouts 4.00" in text


def test_async_depth_reads_a_run_and_predicts_with_the_agent_s_own_durations(tmp_path: Path) -> None:
    """benchmarks/async_depth.py's pure parts: a run's metrics.jsonl measured (its cold first step left
    out), and the model's ratios fed the sleepy agent's very durations."""
    from benchmarks import async_depth

    run = tmp_path / "r"
    run.mkdir()
    rows = [{"kind": "train", "step": s, "decision": "train", "time/step_wall": 30.0 if s == 0 else 10.0,
             "time/session_busy": 8.0, "staleness/hist/0": 8.0, "staleness/hist/1": 8.0, "staleness/max": 1,
             "sampler/mean_reward": 0.1 * s, "sampler/num_rollouts": 16, "rollouts/discarded": 0.0} for s in range(5)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    m = async_depth.measure(run)
    assert m["s_per_step"] == 10.0 and m["session_busy"] == pytest.approx(0.8)
    assert m["staleness_hist"] == {"0": 40.0, "1": 40.0} and m["max_staleness_seen"] == 1
    assert m["mean_reward_last"] == pytest.approx(0.3) and m["discarded"] == 0.0
    setting = async_depth.SETTINGS["rollout"]
    sync = [{**m, "arm": "sync", "seed": 0, "s_per_step": 60.0, "session_busy_step": 9.0}]
    ratios = async_depth.predicted_ratios(setting, ["sync", "overlap", "d2k3-cispo"], sync, steps=6)
    assert ratios["sync"] == 1.0 and ratios["d2k3-cispo"] < ratios["overlap"] <= 1.0
    table = async_depth.summarize([{**sync[0]}, {**m, "arm": "d2k3-cispo", "seed": 0}], setting,
                                  ["sync", "d2k3-cispo"], steps=6)
    assert [r["arm"] for r in table] == ["sync", "d2k3-cispo"] and table[1]["ratio_to_sync"] == pytest.approx(10 / 60)
    assert "d2k3-cispo" in async_depth.format_table(table)
    # the sleepy agent's durations are a function of the prompt and the rollout's place only
    from local.agents.sleepy_agent import turn_seconds

    a = turn_seconds("What digit comes after 7?", "s0g0p1", 2, 0, mean_s=4.0, sigma=1.0, seed="0")
    assert a == turn_seconds("What digit comes after 7?", "s0g0p1", 2, 0, mean_s=4.0, sigma=1.0, seed="0") > 0
    assert a != turn_seconds("What digit comes after 7?", "s0g0p1", 3, 0, mean_s=4.0, sigma=1.0, seed="0")
