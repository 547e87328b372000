"""A run's end at scale: retention of a long run's model packages and a stop with hundreds of rollouts in
flight, each through the function's entrypoint under its Lambda limits (`local.engine.run_handler`), on
the SageMaker simulator, moto's S3 and the ACR emulator (the slow agent: every runtime session busy).

Rows (per repeat):
- ``retention``: StopSession at a successful end with ``keep_model_packages: best_and_last`` and
  ``--packages`` packages; ``--delete-latency`` seconds added to each DeleteModelPackage (the simulator
  answers in about a millisecond; a service call takes tens of milliseconds);
- ``retention, before``: the code before this change deleted each package through a new SDK
  ``ServiceClient`` (DescribeModelPackage, then DeleteModelPackage), one at a time: ``--before``
  packages timed that way, and the projection to ``--packages``;
- ``stop``: Cleanup of an execution aborted with ``--in-flight`` rollouts in flight at ``--tps``
  (``acr_tps_limit``; the emulator's rate limit is the same), its clean-up's seconds, the S3 requests
  and StopRuntimeSession calls, and the runtime sessions left;
- ``stop, before``: the code before ended the abandoned rollouts one at a time (the start marker's GET,
  the session record's GET and PUT, StopRuntimeSession, unpaced), before it wrote the run's end:
  ``--before-rollouts`` (default ``--in-flight``) rollouts timed that way.

``--only`` runs some rows (``retention,retention_local,retention_before,stop,stop_before``).

Usage: ``python -m benchmarks.run_end_at_scale [--packages 1200] [--in-flight 500] [--tps 63]
[--delete-latency 0.05] [--before 20] [--before-rollouts 500] [--repeats 1] [--only ROWS]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, load_average, write_result


def retention(stack: Any, packages: int, latency: float) -> dict[str, Any]:
    from stepwise.aws.runstore import RunStore
    from tests.support.pipeline import BUCKET
    from tests.support.run_end import invoke, long_run, stop_event

    run_id, arns, keep = long_run(stack, packages)
    stack.sim.set_latency("DeleteModelPackage", latency)
    try:
        before = stack.sim.counters
        out, seconds = invoke("StopSession", stop_event(run_id))
        after = stack.sim.counters
    finally:
        stack.sim.set_latency("DeleteModelPackage", 0.0)
    state = RunStore(BUCKET, stack.s3).read_state(run_id)[0]
    return {"packages": packages, "deleted": len(state.deleted_packages), "seconds": round(seconds, 2),
            "cleanup_seconds": (out.get("leftovers") or {}).get("seconds"),
            "left": (out.get("leftovers") or {}).get("left"),
            "DeleteModelPackage": after.get("DeleteModelPackage", 0) - before.get("DeleteModelPackage", 0),
            "DescribeModelPackage": after.get("DescribeModelPackage", 0) - before.get("DescribeModelPackage", 0)}


def retention_before(stack: Any, n: int, latency: float) -> dict[str, Any]:
    """The previous code's path: a new SDK ServiceClient per package (``ServiceClient.delete_model_package``)."""
    from stepwise.aws import sagemaker
    from stepwise.config import RunConfig
    from tests.support.run_end import long_run

    _, arns, keep = long_run(stack, n + 3)
    cfg = RunConfig.model_validate(stack.config())
    stack.sim.set_latency("DeleteModelPackage", latency)
    stack.sim.set_latency("DescribeModelPackage", latency)
    try:
        t0 = time.monotonic()
        for arn in [a for a in arns if a not in keep][:n]:
            sagemaker.service_client(cfg).delete_model_package(arn)
        seconds = time.monotonic() - t0
    finally:
        stack.sim.set_latency("DeleteModelPackage", 0.0)
        stack.sim.set_latency("DescribeModelPackage", 0.0)
    return {"packages": n, "seconds": round(seconds, 2), "per_package": round(seconds / n, 3)}


def stop(stack: Any, in_flight: int, tps: int) -> dict[str, Any]:
    from tests.support.run_end import aborted_event, acr_at, in_flight_run, invoke

    with acr_at(stack, tps, in_flight) as acr:
        run_id, _, sids, started = in_flight_run(stack, in_flight, tps)
        s3_before, acr_before = stack.moto.s3_requests.snapshot(), acr.session_counters()
        out, seconds = invoke("Cleanup", aborted_event(run_id))
        s3_after, counters = stack.moto.s3_requests.snapshot(), acr.session_counters()
    s3 = sum(s3_after.get(k, 0) - s3_before.get(k, 0) for k in s3_after)
    left = out.get("leftovers") or {}
    return {"in_flight": len(sids), "tps": tps, "start_seconds": round(started, 1), "seconds": round(seconds, 2),
            "cleanup_seconds": left.get("seconds"), "end_recorded_after": round(seconds - (left.get("seconds") or 0), 2),
            "rollouts_ended": left.get("rollouts_ended"), "s3_requests": s3,
            "StopRuntimeSession": counters["stop_calls"] - acr_before["stop_calls"],
            "sessions_left": counters["sessions_active"], "left": left.get("left")}


def stop_before(stack: Any, n: int, tps: int) -> dict[str, Any]:
    """The previous code's path for ``n`` abandoned rollouts: each one's start marker read, its gateway
    session closed (GET, PUT) and its runtime session stopped, one after another."""
    from stepwise.config import RunConfig
    from stepwise.handlers._rollout_sessions import end_rollout, started_without_record
    from stepwise.aws.runstore import RunStore
    from tests.support.pipeline import BUCKET
    from tests.support.run_end import acr_at, in_flight_run

    with acr_at(stack, tps, max(n, 2)) as acr:
        run_id, cfg, _, _ = in_flight_run(stack, n, max(tps, (n + 7) // 8))
        rs = RunStore(BUCKET, stack.s3)
        state = rs.read_state(run_id)[0]
        config = RunConfig.model_validate(cfg)
        t0 = time.monotonic()
        sids = started_without_record(rs, run_id, state.current_batch)
        for sid in sids:
            end_rollout(rs, config, sid)
        seconds = time.monotonic() - t0
        left = acr.session_counters()["sessions_active"]
    return {"rollouts": len(sids), "seconds": round(seconds, 2), "per_rollout": round(seconds / max(1, len(sids)), 4),
            "sessions_left": left}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--packages", type=int, default=1200)
    p.add_argument("--in-flight", type=int, default=500)
    p.add_argument("--tps", type=int, default=63)
    p.add_argument("--delete-latency", type=float, default=0.05)
    p.add_argument("--before", type=int, default=20)
    p.add_argument("--before-rollouts", type=int, default=None)
    p.add_argument("--only", default="retention,retention_local,retention_before,stop,stop_before")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    from tests.support.pipeline import Stack

    rows: dict[str, list[dict[str, Any]]] = {"retention": [], "retention_local": [], "retention_before": [],
                                             "stop": [], "stop_before": []}
    stack = Stack()
    try:
        only = set(args.only.split(","))
        for _ in range(args.repeats):
            if "retention" in only:
                rows["retention"].append(retention(stack, args.packages, args.delete_latency))
            if "retention_local" in only:
                rows["retention_local"].append(retention(stack, args.packages, 0.0))
            if args.before and "retention_before" in only:
                rows["retention_before"].append(retention_before(stack, args.before, args.delete_latency))
            if "stop_before" in only:
                rows["stop_before"].append(stop_before(stack, args.before_rollouts or args.in_flight, args.tps))
            if "stop" in only:
                rows["stop"].append(stop(stack, args.in_flight, args.tps))
            print(f"load {load_average()}", flush=True)
    finally:
        stack.stop()

    def med(name: str, key: str) -> float:
        return statistics.median(r[key] for r in rows[name]) if rows[name] else float("nan")

    print(f"\n{'what':<44} {'seconds':>9}  requests / figures")
    if rows["retention"]:
        r = rows["retention"][-1]
        print(f"{f'retention of {args.packages} packages, {args.delete_latency:g} s a delete':<44} "
              f"{med('retention', 'seconds'):>9.1f}  {r['DeleteModelPackage']} DeleteModelPackage, "
              f"{r['DescribeModelPackage']} Describe, {r['deleted']} recorded, left {r['left']}")
    if rows["retention_local"]:
        r = rows["retention_local"][-1]
        print(f"{f'retention of {args.packages} packages, simulator latency':<44} {med('retention_local', 'seconds'):>9.1f}"
              f"  {r['DeleteModelPackage']} DeleteModelPackage, {r['deleted']} recorded")
    if rows["retention_before"]:
        per = med("retention_before", "per_package")
        print(f"{'retention before, per package (SDK client each)':<44} {per:>9.3f}"
              f"  projected for {args.packages}: {per * args.packages:.0f} s (StopSession has 120)")
    if rows["stop"]:
        r = rows["stop"][-1]
        print(f"{f'stop with {args.in_flight} in flight at {args.tps}/s (Cleanup)':<44} {med('stop', 'seconds'):>9.1f}"
              f"  end recorded after {med('stop', 'end_recorded_after'):.2f} s; {r['StopRuntimeSession']} "
              f"StopRuntimeSession, {r['s3_requests']} S3 requests, sessions left {r['sessions_left']}")
    if rows["stop_before"]:
        r = rows["stop_before"][-1]
        what = f"stop before: {r['rollouts']} one at a time, unpaced"
        print(f"{what:<44} {med('stop_before', 'seconds'):>9.1f}"
              f"  {med('stop_before', 'per_rollout'):.4f} s a rollout, all before the end was written")
    path = write_result(args.out, "run_end_at_scale", {"args": vars(args) | {"out": str(args.out)}, "rows": rows,
                                                       "load_average": load_average()})
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    # The in-process simulator's torch threads can abort the interpreter's teardown (SIGABRT, as
    # tests/conftest.py notes): the figures are written by then, so leave with main's status at once.
    status = main()
    sys.stdout.flush()
    os._exit(status)
