"""Drills of a run's end at the scale the examples name: retention of a long run's 1,200 model packages,
and a stop with 500 rollouts in flight. Each end runs as Lambda runs it: through the function's entrypoint
under its own timeout and memory (`local.engine.run_handler`, `local.limits`), against the SageMaker
simulator, moto's S3 and the ACR emulator with a request rate and ACR's active-session quota.

What they show: the run's end is recorded first and never fails for the clean-up; the clean-up is
parallel, bounded by the function's time, recorded as it goes; what a stop cannot finish in its time,
the session sweeper finishes. The figures (seconds, requests) are printed; `benchmarks/run_end_at_scale.py`
measures them, and the code before, over repeats (benchmarks README section 15).
"""

from __future__ import annotations

import json
import threading
import time

import pytest

from stepwise.aws.runstore import RunStore
from stepwise.layout import leftovers_key, run_summary_key
from tests.support.pipeline import BUCKET
from tests.support.run_end import aborted_event, acr_at, in_flight_run, invoke, long_run, stop_event

PACKAGES = 1_200  # examples/aws/gsm8k.json saves about 1,150 (a sampler package per step, save_every checkpoints)
IN_FLIGHT = 500  # acr_max_active_sessions' default
#: acr_tps_limit: 63 is the lowest that lets the Map run 500 rollouts at once (8 per unit); the drill runs at
#: the highest a config allows, to stay short in CI (the benchmark measures 63)
TPS = 125


def _exists(stack, arn: str) -> bool:
    return stack.sim.simulator._package(arn) is not None


def _no_leftovers(stack, run_id: str) -> bool:
    return not stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=leftovers_key(run_id)).get("KeyCount")


def test_retention_deletes_a_long_runs_1200_packages_within_the_stop_functions_limits(stack):
    """StopSession at a successful end with best_and_last: the 1,197 intermediate packages are deleted
    with one client, 8 at a time, DeleteModelPackage alone (no DescribeModelPackage, so no kms:Decrypt
    on an encrypted package), each recorded in state.json (checkpoints marked deleted), within StopSession's
    120 s and 512 MB; the best, the final weights and the final checkpoint stay (before: one SDK client
    per package, 0.6-1.8 s each, past the function's timeout at a few hundred: the run failed after it
    trained, and the deletions done were not recorded)."""
    run_id, arns, keep = long_run(stack, PACKAGES)
    before = stack.sim.counters
    out, seconds = invoke("StopSession", stop_event(run_id))
    after = stack.sim.counters
    deletes = after.get("DeleteModelPackage", 0) - before.get("DeleteModelPackage", 0)
    describes = after.get("DescribeModelPackage", 0) - before.get("DescribeModelPackage", 0)
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    gone = set(arns) - keep
    print(f"\nretention of {PACKAGES} packages in StopSession: {seconds:.1f} s, {deletes} DeleteModelPackage, "
          f"{describes} DescribeModelPackage, {len(state.deleted_packages)} recorded deleted")
    assert state.finished and state.session_stopped
    assert set(state.deleted_packages) == gone and deletes == len(gone) and describes == 0
    assert not any(_exists(stack, a) for a in gone) and all(_exists(stack, a) for a in keep)
    assert all(c.deleted == (c.model_package_arn in gone) for c in state.checkpoints)
    assert [c["deleted"] for c in out["checkpoints"]] == [c.deleted for c in state.checkpoints]
    assert out["best_model"]["model_package_arn"] == arns[PACKAGES // 4] and "model_packages_to_delete" not in out
    assert out["leftovers"]["left"] is None and _no_leftovers(stack, run_id)
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=run_summary_key(run_id))["Body"].read())
    assert summary["status"] == "FINISHED" and summary["model_packages_to_delete"] == len(gone)  # written before


def test_retention_cut_short_never_fails_the_run_and_the_sweeper_finishes_it(stack):
    """Deletions 0.25 s each and a StopSession given 16 s: it records the run's end (finished), deletes
    what it can in its time, returns (no timeout, so the run succeeds), and hands the rest over; the session
    sweeper finishes it, every package deleted once (a call abandoned at the deadline may be repeated, and
    answers "already gone")."""
    run_id, arns, keep = long_run(stack, 300)
    stack.sim.set_latency("DeleteModelPackage", 0.25)
    try:
        before = stack.sim.counters.get("DeleteModelPackage", 0)
        out, seconds = invoke("StopSession", stop_event(run_id), timeout_s=16)
        state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
        first = len(state.deleted_packages)
        assert state.finished and seconds < 16
        assert 0 < first < len(arns) - len(keep), first
        assert out["leftovers"]["left"]["retention"] is True and out["model_packages_to_delete"] == len(arns) - 3 - first
        held = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=leftovers_key(run_id))["Body"].read())
        assert held["held_until"] == 0.0 and held["retention"] is True
        swept, sweep_seconds = invoke("SweepSessions", {"grace_seconds": 0})
    finally:
        stack.sim.set_latency("DeleteModelPackage", 0.0)
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    gone = set(arns) - keep
    calls = stack.sim.counters.get("DeleteModelPackage", 0) - before
    print(f"\nretention cut short: StopSession {seconds:.1f} s deleted {first}, the sweeper {sweep_seconds:.1f} s the "
          f"other {len(gone) - first}; {calls} DeleteModelPackage for {len(gone)} packages")
    report = next(r for r in swept["leftovers"] if r["run_id"] == run_id)
    assert report["left"] is None and report["packages_deleted"] >= len(gone) - first
    assert set(state.deleted_packages) == gone and not any(_exists(stack, a) for a in gone)
    assert len(gone) <= calls <= len(gone) + 8  # at most the 8 in flight at the deadline repeated
    assert _no_leftovers(stack, run_id)


@pytest.fixture(scope="module")
def acr(stack):
    """The ACR emulator at the drill's rate (`TPS`) with ACR's active-session quota of 500, serving the slow
    agent."""
    with acr_at(stack, TPS, IN_FLIGHT) as emulator:
        yield emulator


def test_a_stop_with_500_rollouts_in_flight_records_the_end_first_and_stops_every_session(stack, acr, tmp_path):
    """An execution aborted with 500 rollouts in flight (a batch of 250 prompts x 2 on the slow agent, every
    runtime session busy): Cleanup stops the training session, records the run's end (state, summary: its
    Track ends the MLflow run KILLED), then ends the 500 rollouts in parallel at the run's ACR rate, within
    its 120 s and 512 MB; no runtime session is left. Before, the rollouts were ended one at a time (GETs
    and a PUT each) and the end written after all 500: 23 s here (once 124 s, past Cleanup's 120, at load
    42), about 0.2 s a rollout at S3's and ACR's own latencies, past 120 s, and then the end is never
    recorded. The drill watches for the run's summary and counts the sessions stopped by then."""
    from stepwise.aws import tracking
    from stepwise.config import RunConfig
    from stepwise.events import S3Notification
    from stepwise.handlers.track import track

    mlruns = f"file:{tmp_path / 'mlruns'}"
    run_id, cfg, sids, started_s = in_flight_run(stack, IN_FLIGHT, TPS, mlflow_tracking_uri=mlruns)
    assert len(set(sids)) == IN_FLIGHT and acr.session_counters()["sessions_active"] == IN_FLIGHT

    s3_before, acr_before = stack.moto.s3_requests.snapshot(), acr.session_counters()
    watching = threading.Event()
    stopped_at_end: list[int] = []  # runtime sessions already stopped when the run's summary first exists

    def watch_for_the_end() -> None:
        while not watching.is_set():
            if stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=run_summary_key(run_id)).get("KeyCount"):
                stopped_at_end.append(acr.session_counters()["sessions_stopped"] - acr_before["sessions_stopped"])
                return
            time.sleep(0.02)

    watcher = threading.Thread(target=watch_for_the_end, daemon=True)
    watcher.start()
    try:
        out, seconds = invoke("Cleanup", aborted_event(run_id))
    finally:
        watching.set()
        watcher.join(5)
    s3_after, counters = stack.moto.s3_requests.snapshot(), acr.session_counters()
    s3 = {k: s3_after.get(k, 0) - s3_before.get(k, 0) for k in s3_after if s3_after.get(k, 0) != s3_before.get(k, 0)}
    stops = counters["stop_calls"] - acr_before["stop_calls"]
    print(f"\nstop with {IN_FLIGHT} rollouts in flight (started in {started_s:.1f} s): Cleanup {seconds:.1f} s "
          f"(clean-up {out['leftovers']['seconds']:.1f} s), {stops} StopRuntimeSession, S3 {sum(s3.values())} requests "
          f"{s3}, runtime sessions left {counters['sessions_active']}; {stopped_at_end} stopped when the summary appeared")
    assert stopped_at_end and stopped_at_end[0] <= IN_FLIGHT // 10  # the end first (before: after all 500)
    assert out["stopped"] is True and out["leftovers"]["left"] is None
    assert out["leftovers"]["rollouts_ended"] == IN_FLIGHT == out["leftovers"]["runtime_sessions_stopped"]
    assert counters["sessions_active"] == 0 and counters["sessions_stopped"] - acr_before["sessions_stopped"] == IN_FLIGHT
    assert stops <= IN_FLIGHT * 1.05  # paced below the run's rate: a throttled call (retried) is rare
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    assert state.session_stopped and state.stop_reason == "execution ABORTED"
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=run_summary_key(run_id))["Body"].read())
    assert summary["status"] == "KILLED" and _no_leftovers(stack, run_id)
    for sid in sids[:20]:
        record = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=f"sessions/{sid}.json")["Body"].read())
        assert record["closed"] is True
    # The summary's notification runs Track (the stack's S3 notification; here its handler): the MLflow run ends.
    track(S3Notification.model_validate({"Records": [{"s3": {"bucket": {"name": BUCKET},
                                                            "object": {"key": run_summary_key(run_id)}}}]}))
    client = tracking._client(mlruns)
    assert client.get_run(tracking.mlflow_run_id(RunConfig.model_validate(cfg), run_id, client=client)).info.status == "KILLED"
