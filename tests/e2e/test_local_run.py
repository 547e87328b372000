"""End to end through the local stack: the real state machine on moto, the real handlers, the
gateway process, the ACR emulator with the toy agent, and the SageMaker simulator.

Asserts on what the run leaves in S3 (state, summaries, rollout records, datums), on the
optimizer steps the simulator applied, on the budget limit that ends it (``max_steps``) and the cost
ledger against the local stack's own counts, and that the training session ends Stopped -- on a
successful run and on one whose training session never starts.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from local.run import run_local

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "examples" / "toy.json"

pytestmark = pytest.mark.e2e

SMALL = {
    "batch_size": 4,
    "responses_per_prompt": 8,
    "max_prompts": 12,  # 3 steps of data ...
    "max_steps": 2,  # ... of which the budget limit lets 2 run
    "session_usd_per_hour": 5.0,
    "eval_every": 2,
    "eval_max_prompts": 4,
    "save_every": 1,
    "acr_tps_limit": 32,
}


def _json(path: Path):
    return json.loads(path.read_text())


@pytest.mark.timeout(600)  # about 90 s on an idle 2-core machine; 325 s at a load average of 20
def test_toy_run_trains_two_steps_and_stops_the_session(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="urllib3.connectionpool")
    result = run_local(TOY, run_id="e2e-toy", out_root=tmp_path, progress=False, overrides=SMALL,
                       mirror_s3=True, timeout=540, quiet=True)
    assert result.status == "SUCCEEDED", result.failure
    s3 = result.run_dir / "s3" / "runs" / "e2e-toy"

    state = _json(s3 / "state.json")
    assert state["step"] == 2 and state["finished"] is True
    assert state["session_stopped"] is True
    assert state["checkpoints"], "a checkpoint was saved"
    # max_steps ended it, gracefully (final eval, final checkpoint, session stopped, SUCCEEDED)
    assert state["stop_reason"] == "max_steps: 2 steps done, limit 2"
    assert state["checkpoints"][-1]["reason"] == "final" and state["checkpoints"][-1]["step"] == 2

    # The cost ledger agrees with what the local stack counted itself (local.report.ledger_check): the
    # simulator's session seconds, the dispatcher's invocations and their handler time.
    check = result.timing["ledger_check"]
    sessions = check["training_session_seconds"]
    assert sessions["sessions"] == 1 and abs(sessions["difference"]) < 0.5, sessions
    for name, row in check["lambda_seconds"].items():
        if name == "Gateway":  # another process: no local figure, one request per captured turn
            assert row["requests"] >= 64
            continue
        if name == "SweepSessions":  # the stack's sweeper, invoked after the run: it works for no one run
            continue
        assert row["requests"] == row["local_requests"], (name, row)
        # the dispatcher's time also holds the hand-off to a worker process; the ledger misses the
        # last invocations' tails (after their last write)
        assert 0.5 * row["local"] - 0.5 <= row["ledger"] <= row["local"] + 0.05, (name, row)
    final = state["ledger"]["final"]
    assert final["usage"]["acr_sessions"] >= 64 and final["usd"]["session"] > 0
    assert final["line"].startswith("this run cost $") and final["estimate_line"].startswith("estimated $")

    summaries = [_json(s3 / "steps" / str(step) / "summary.json") for step in (0, 1)]
    for summary in summaries:
        assert summary["sampler/num_rollouts"] == 32
        assert 0.0 <= summary["sampler/mean_reward"] <= 1.0
    trained = [s for s in summaries if s["decision"] == "train"]
    assert trained, "with 4 groups of 8 at a 15% base rate, at least one step has reward variance"

    rollouts = sorted((s3 / "steps" / "0" / "gen0" / "rollouts").glob("*.json"))
    assert len(rollouts) == 32
    record = _json(rollouts[0])
    assert {"sid", "reward"} <= set(record)
    results = list((result.run_dir / "s3" / "rollout-results" / "e2e-toy").rglob("*.json"))
    assert len(results) >= 64  # every train rollout's agent result (plus eval rollouts)

    datum_steps = {p.parent.parent.name for p in s3.glob("steps/*/datums/*.json")}
    assert datum_steps == {str(i) for i, s in enumerate(summaries) if s["decision"] == "train"}
    datums = _json(next(s3.glob("steps/*/datums/*.json")))
    assert datums, "a datum chunk holds datums"

    counters = result.simulator_counters
    assert counters.get("optim_step", 0) == len(trained)  # one optimizer step per trained step, no repeats
    assert counters.get("forward_backward", 0) >= len(trained)
    assert counters.get("save_state", 0) >= 1
    assert counters.get("StopTrainingSession", 0) >= 1
    assert result.session_status == "Stopped"

    assert result.evals, "an eval ran"
    assert (result.run_dir / "reward.png").stat().st_size > 0
    lines = [json.loads(x) for x in (result.run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines if x["kind"] == "train"] == [0, 1]
    assert result.timing["per_step"]["rollouts"] > 0
    # every client's pool is sized to the concurrency it serves (stepwise.aws.clients): none overflowed
    gateway_log = (result.run_dir / "logs" / "gateway.log").read_text()
    assert not [r for r in caplog.records if "pool is full" in r.getMessage()] and "pool is full" not in gateway_log
    s3_requests = result.timing["s3_requests"]
    assert s3_requests["rollouts"] >= 64 and s3_requests["by_kind"].get("GET state", 0) < s3_requests["rollouts"]


def test_session_that_never_starts_fails_the_run_and_is_stopped(tmp_path):
    result = run_local(TOY, run_id="e2e-fail", out_root=tmp_path, progress=False, overrides=SMALL,
                       simulator_options={"session_start": "fail"}, timeout=120, quiet=True)
    assert result.status == "FAILED"
    assert result.failure is not None and result.failure.state
    assert result.failure.error
    assert result.simulator_counters.get("sample", 0) == 0  # nothing was rolled out
    assert result.session_status in ("Failed", "Stopped")
