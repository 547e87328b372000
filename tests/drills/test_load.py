"""Load drill: 256 rollouts in one step through the whole local stack (moto's engine, the real
handlers, the gateway, the ACR emulator with the toy agent, the simulator), then account for
everything: every rollout has a record, every session's turns were captured and replayed, every
datum the step computed was sent to forward_backward, one optimizer step was applied, every ACR
session started was stopped (none left billing), the cost ledger counted every invocation the engine
dispatched (ACR's throttled invokes and their retries included), and no session is left running. The
counts are printed (run with ``-s`` to see them). 1,024 rollouts a step: benchmarks/rollouts_at_scale.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local.run import run_local

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy.json"
LOAD = {"batch_size": 32, "responses_per_prompt": 8, "max_prompts": 32, "epochs": 1, "eval_every": 0,
        "eval_dataset_path": "", "save_every": -1, "acr_tps_limit": 64, "max_new_tokens": 512}


@pytest.mark.e2e
def test_256_rollouts_in_one_step_are_all_captured_and_accounted_for(tmp_path):
    result = run_local(TOY, run_id="drill-load", out_root=tmp_path, progress=False, overrides=LOAD,
                       timeout=900, quiet=True, mirror_s3=True)
    assert result.status == "SUCCEEDED", result.failure
    root = result.run_dir / "s3" / "runs" / "drill-load"
    records = [json.loads(p.read_text()) for p in (root / "steps" / "0" / "gen0" / "rollouts").glob("*.json")]
    assert len(records) == 256 and len({r["sid"] for r in records}) == 256
    statuses = {s: sum(r["status"] == s for r in records) for s in {r["status"] for r in records}}
    turn_files = {r["sid"]: len(list((root / "sessions" / r["sid"] / "turns").glob("*.json"))) for r in records}
    assert all(r["num_turns"] == turn_files[r["sid"]] for r in records)  # every captured turn was replayed
    assert sum(1 for n in turn_files.values() if n == 0) == statuses.get("timeout", 0) + statuses.get("error", 0)
    summary = json.loads((root / "steps" / "0" / "summary.json").read_text())
    chunks = sorted((root / "steps" / "0" / "datums").glob("*.json"))
    sent = sum(len(json.loads(p.read_text())) for p in chunks)
    trajectories = sum(len(r["records"]) for r in records)
    assert sent == summary["sampler/num_datums"] <= trajectories
    counters = result.simulator_counters
    assert counters["optim_step"] == 1 and counters["forward_backward"] == len(chunks)
    assert result.session_status in ("Stopping", "Stopped")
    acr = result.timing["acr"]
    assert acr["sessions_started"] == acr["sessions_stopped"] == 256 and acr["sessions_active"] == 0
    assert not result.billing.get("acr_active")
    ran = {name: row for name, row in result.timing["ledger_check"]["lambda_seconds"].items() if "local_requests" in row}
    assert ran["StartRollout"]["local_requests"] >= 256
    counted = {name: row["requests"] for name, row in ran.items() if name != "SweepSessions"}  # after the run's end
    assert counted == {name: row["local_requests"] for name, row in ran.items() if name != "SweepSessions"}
    print(f"\nload drill: {len(records)} rollouts {statuses}, {sum(turn_files.values())} turns captured, "
          f"{trajectories} trajectories, {sent} datums in {len(chunks)} chunk(s), "
          f"mean reward {summary.get('sampler/mean_reward'):.3f}, samples {counters.get('sample')}, "
          f"wall {result.wall_seconds:.0f} s, rollout {summary.get('time/rollout', 0):.0f} s; ACR sessions "
          f"{acr['sessions_started']} started, {acr['sessions_stopped']} stopped, peak {acr.get('peak_active_sessions')}, "
          f"{acr.get('throttled')} invokes throttled; StartRollout {counted['StartRollout']} counted")
