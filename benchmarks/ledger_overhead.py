"""What the cost ledger adds to a step: S3 requests, bytes and CPU time.

The ledger makes no S3 request of its own per rollout: each measurement rides in a record the run
writes anyway (`stepwise.metering`). Per step it adds at most one GET of ``state.json`` (PlanStep,
when its container does not remember how far the execution's history was counted), and per run a
GET of the estimate, a DescribeTrainingSession and a GetExecutionHistory (StopSession), one more
DescribeTrainingSession (Init). What it does cost is CPU in every invocation and bytes in the
records it rides in. This script measures both, in this process:

- per invocation: `metering.begin` + `metering.end` (the entrypoint's), and one `metering.ride` +
  commit (each record written);
- per S3 request: the botocore ``before-send`` counter as botocore calls it (beside an in-process
  moto HEAD for scale);
- per record: the JSON bytes a `Usage` adds (a session record's, a captured turn's, a rollout
  record's), and the ledger's size in ``state.json`` after a 20-step run's worth of usage;
- per ``state.json`` write: `RunState` validation and serialisation with and without the ledger.

Then, with a run's counts (``--timing runs-local/RUN/timing.json``: invocations per function and S3
requests, and its steps), the CPU seconds per step: invocations x (begin/end + ride) + S3 requests x
the hook + state writes x the ledger's (de)serialisation.

Usage: ``python -m benchmarks.ledger_overhead [--timing runs-local/RUN/timing.json] [--steps 20]``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, load_average, write_result


def per_call(fn: Any, n: int) -> float:
    """Seconds per call of ``fn()`` over ``n`` calls (best of 3)."""
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


def measure(steps: int) -> dict[str, Any]:
    import boto3
    from moto import mock_aws

    from stepwise import metering
    from stepwise.core import ledger
    from stepwise.records import RunState, Usage

    def invocation() -> None:
        token = metering.begin("FinishRollout", 1024)
        metering.bind_run("r")
        metering.end(token)

    def ride() -> None:
        r = metering.ride("r")
        r.usage.model_dump()  # the record it rides in serialises it
        r.commit()

    metering.CARRY.clear()
    t_invocation = per_call(invocation, 20_000)
    metering.CARRY.clear()
    token = metering.begin("FinishRollout", 1024)
    metering.bind_run("r")
    t_ride = per_call(ride, 5_000)
    metering.end(token)
    metering.CARRY.clear()

    with mock_aws():
        plain = boto3.client("s3", region_name="us-east-1")
        plain.create_bucket(Bucket="ledger-overhead")
        plain.put_object(Bucket="ledger-overhead", Key="k", Body=b"x")
        t_plain = per_call(lambda: plain.head_object(Bucket="ledger-overhead", Key="k"), 300)
    # the counter itself, as botocore calls it once per HTTP attempt (a request's own time is noise beside it)
    token = metering.begin("PlanStep", 1024)
    t_hook = per_call(lambda: metering._before_send(event_name="before-send.s3.HeadObject"), 50_000)
    metering.end(token)

    one = Usage(lambda_gb_seconds={"Gateway": 20.0}, lambda_requests={"Gateway": 1}, s3_put_class=1, s3_get_class=2)
    rollout = Usage(lambda_gb_seconds={n: 1.0 for n in ("StartRollout", "OnRolloutResult", "FinishRollout", "Gateway")},
                    lambda_requests={n: 1 for n in ("StartRollout", "OnRolloutResult", "FinishRollout", "Gateway")},
                    state_transitions=2, s3_put_class=6, s3_get_class=5, acr_sessions=1, acr_session_seconds=7.0,
                    acr_vcpu_seconds=7.0, acr_gb_seconds=14.0)
    usage_bytes = {"turn or session record": len(json.dumps({"usage": one.model_dump()})),
                   "rollout record": len(json.dumps({"usage": rollout.model_dump()}))}

    from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION
    from tests.support.planning import cfg, state

    s = state(session_created_at=1.0)
    full = Usage(lambda_gb_seconds={f.name: 100.0 for f in (*FUNCTIONS, GATEWAY_FUNCTION)},
                 lambda_requests={f.name: 1000 for f in (*FUNCTIONS, GATEWAY_FUNCTION)})
    c = cfg(session_usd_per_hour=1.0, max_cost_usd=10.0)
    for step in range(steps):
        s.ledger.usage.add(full)
        ledger.close_step(s, c, 10.0 * (step + 1), step)
    from stepwise.core import stopping

    stopping.record_checks(s, c, 10.0 * steps)
    s.ledger.final = ledger.final_report(s, c, 10.0 * steps, None)
    bare = state(session_created_at=1.0)
    with_ledger = json.dumps(s.model_dump()).encode()
    without = json.dumps({k: v for k, v in bare.model_dump().items() if k != "ledger"}).encode()

    def roundtrip(body: bytes) -> Any:
        return lambda: RunState.model_validate(json.loads(body)).model_dump()

    t_state = per_call(roundtrip(with_ledger), 300) - per_call(roundtrip(json.dumps(bare.model_dump()).encode()), 300)
    return {"seconds_per_invocation": t_invocation, "seconds_per_ride": t_ride, "seconds_per_s3_request": t_hook,
            "s3_request_seconds_plain": t_plain, "usage_bytes": usage_bytes,
            "state_bytes": {"ledger": len(with_ledger) - len(without), "state_without_ledger": len(without)},
            "seconds_per_state_write_for_the_ledger": max(0.0, t_state)}


def per_step(m: dict[str, Any], timing: dict[str, Any], steps: int) -> dict[str, Any]:
    """The ledger's CPU seconds per step of a run, from its ``timing.json`` counts."""
    lambdas = timing.get("lambdas", {})
    invocations = sum(v["count"] for v in lambdas.values())
    rollouts = lambdas.get("FinishRollout", {}).get("count", 0)
    turns = timing.get("ledger_check", {}).get("lambda_seconds", {}).get("Gateway", {}).get("requests", rollouts)
    s3 = timing.get("s3_requests", {}).get("total", 0)
    state_writes = sum(n for k, n in timing.get("s3_requests", {}).get("by_kind", {}).items() if k == "PUT state")
    rides = invocations + turns  # every invocation writes at least one record it rides in, each turn one
    cpu = ((invocations + turns) * m["seconds_per_invocation"] + rides * m["seconds_per_ride"]
           + s3 * m["seconds_per_s3_request"] + state_writes * m["seconds_per_state_write_for_the_ledger"])
    return {"steps": steps, "invocations": invocations, "gateway_turns": turns, "s3_requests": s3,
            "state_writes": state_writes, "cpu_seconds_per_step": cpu / max(1, steps),
            "extra_s3_requests_per_step": "0 per rollout; at most 1 GET per step (a cold PlanStep container)"}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timing", type=Path, help="a run-local run's timing.json (its counts per step)")
    parser.add_argument("--steps", type=int, default=20, help="the run's steps (for the ledger's size)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    m = measure(args.steps)
    out: dict[str, Any] = {"measured": m, "load_average": load_average()}
    print(f"per invocation (begin + end): {m['seconds_per_invocation'] * 1e6:.1f} us; per ride: "
          f"{m['seconds_per_ride'] * 1e6:.1f} us; per S3 request (counter): {m['seconds_per_s3_request'] * 1e6:.1f} us "
          f"of {m['s3_request_seconds_plain'] * 1e3:.2f} ms")
    print(f"bytes: usage in a turn or session record {m['usage_bytes']['turn or session record']}, in a rollout record "
          f"{m['usage_bytes']['rollout record']}; the ledger in state.json after {args.steps} steps "
          f"{m['state_bytes']['ledger']} (state without it {m['state_bytes']['state_without_ledger']}); "
          f"(de)serialising it per state write {m['seconds_per_state_write_for_the_ledger'] * 1e3:.2f} ms")
    if args.timing:
        timing = json.loads(args.timing.read_text())
        steps = int(timing.get("steps") or args.steps)
        out["per_step"] = per_step(m, timing, steps)
        p = out["per_step"]
        print(f"run {args.timing}: {p['invocations']} invocations, {p['gateway_turns']} turns, {p['s3_requests']} S3 "
              f"requests, {p['state_writes']} state writes in {steps} steps -> {p['cpu_seconds_per_step'] * 1e3:.1f} ms "
              f"of CPU per step for the ledger; S3: {p['extra_s3_requests_per_step']}")
    write_result(args.out, "ledger_overhead", out)
    return out


if __name__ == "__main__":
    main()
