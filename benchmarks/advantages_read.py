"""ComputeAdvantages' read of a step's rollout records: one GET at a time against GETs in parallel.

Writes ``--rollouts`` rollout records (the toy task's size, or ``--record-kb`` of captured tokens each) to
moto's S3 (server mode, on loopback), then times `stepwise.handlers.advantages.load_rollouts` as it was
(one GET after another) and as it is (`stepwise.aws.runstore.RunStore.get_json_many`, at the client's
connection pool: 10 on Lambda, ``STEPWISE_MAX_POOL_CONNECTIONS``), each with ``--latency-ms`` added to every
S3 request (a botocore ``before-send`` hook that sleeps: loopback answers in about a millisecond, S3 from a
Lambda in tens of them). Also the peak of Python memory while reading (tracemalloc) and the GETs the
invocation's meter counted (the cost ledger's S3 requests).

Usage: ``python -m benchmarks.advantages_read [--rollouts 1024] [--latency-ms 0,20,40] [--pools 10,32]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import tracemalloc
from typing import Any

from benchmarks._common import DEFAULT_OUT, load_average, write_result

RUN_ID = "bench-read"


def record(i: int, sid: str, tokens: int) -> dict[str, Any]:
    """A rollout record with ``tokens`` captured token ids in one trajectory (the toy task's are ~20)."""
    return {"sid": sid, "i": i, "input_id": f"s0g0p{i // 8}", "row": i // 8, "member": i % 8, "kind": "train",
            "step": 0, "generation_batch": 0, "reward": float(i % 2), "status": "ok", "num_turns": 1,
            "records": [{"token_ids": list(range(tokens)), "logprobs": [-0.5] * tokens,
                         "loss_mask": [1] * tokens, "reward": float(i % 2)}],
            "usage": {"lambda_requests": {"FinishRollout": 1}}}


def latency_hook(seconds: float) -> Any:
    def sleep(**_: Any) -> None:
        time.sleep(seconds)
    return sleep


def sequential(rs: Any, keys: list[str]) -> list[Any]:
    """The read before: one GET after another."""
    from stepwise.records import RolloutRecord

    return [RolloutRecord.model_validate(rs.get_json(k)) for k in keys]


def measure(read: Any, rs: Any, keys: list[str], repeats: int) -> dict[str, Any]:
    from stepwise import metering

    seconds, peaks, gets = [], [], 0
    for _ in range(repeats):
        token = metering.begin("ComputeAdvantages", 2048)
        tracemalloc.start()
        t0 = time.perf_counter()
        out = read(rs, keys)
        seconds.append(time.perf_counter() - t0)
        peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
        tracemalloc.stop()
        meter = metering.current()
        gets = meter.s3_get if meter is not None else 0
        metering.end(token)
        assert len(out) == len(keys)
    return {"seconds": statistics.median(seconds), "peak_mb": max(peaks), "gets_counted": gets}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1024)
    parser.add_argument("--record-kb", type=float, default=0.0, help="captured tokens per record, in KB of JSON "
                        "(0: the toy task's ~20 tokens)")
    parser.add_argument("--latency-ms", default="0,20,40")
    parser.add_argument("--pools", default="10,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=str, default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)

    import boto3
    from botocore.config import Config

    from local.engine import MotoServer
    from stepwise.aws.runstore import RunStore
    from stepwise.layout import rollout_key, rollouts_prefix

    tokens = 20 if not args.record_kb else max(1, int(args.record_kb * 1024 / 12))  # ~12 bytes a token in 3 lists
    rows = []
    with MotoServer() as moto:
        setup = moto.client("s3")
        bucket = "stepwise-bench-read"
        setup.create_bucket(Bucket=bucket)
        size = 0
        for i in range(args.rollouts):
            body = json.dumps(record(i, f"sid-{i:05d}", tokens)).encode()
            size += len(body)
            setup.put_object(Bucket=bucket, Key=rollout_key(RUN_ID, 0, 0, f"sid-{i:05d}"), Body=body)
        keys = sorted(o["Key"] for p in setup.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=rollouts_prefix(RUN_ID, 0, 0)) for o in p.get("Contents", []))
        for latency in (float(x) for x in args.latency_ms.split(",")):
            for pool in (int(x) for x in args.pools.split(",")):
                s3 = boto3.client("s3", endpoint_url=moto.endpoint, region_name="us-east-1",
                                  config=Config(max_pool_connections=pool))
                if latency:
                    s3.meta.events.register("before-send.s3", latency_hook(latency / 1000))
                rs = RunStore(bucket, s3)
                row = {"rollouts": args.rollouts, "record_bytes": size // args.rollouts, "latency_ms": latency,
                       "pool": pool}
                if pool == int(args.pools.split(",")[0]):
                    row["before"] = measure(sequential, rs, keys, 1 if latency else args.repeats)
                from stepwise.records import RolloutRecord

                row["after"] = measure(lambda r, k: r.get_json_many(k, RolloutRecord.model_validate), rs, keys,
                                       args.repeats)
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(f"{'rollouts':>8} {'KB/rec':>6} {'lat ms':>6} {'pool':>4} {'before s':>9} {'after s':>8} {'x':>6} "
          f"{'peak MB before/after':>21} {'GETs counted':>12}  load {load_average()}")
    for r in rows:
        b, a = r.get("before"), r["after"]
        print(f"{r['rollouts']:>8} {r['record_bytes'] / 1024:>6.1f} {r['latency_ms']:>6.0f} {r['pool']:>4} "
              f"{b['seconds'] if b else float('nan'):>9.3f} {a['seconds']:>8.3f} "
              f"{(b['seconds'] / a['seconds']) if b else float('nan'):>6.1f} "
              f"{(b['peak_mb'] if b else float('nan')):>10.1f}/{a['peak_mb']:<10.1f} {a['gets_counted']:>12}")
    from pathlib import Path

    print(f"written: {write_result(Path(args.out), 'advantages_read', {'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
