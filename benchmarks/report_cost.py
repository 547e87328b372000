"""What the run report costs per step, and that the training loop no longer pays for tracking.

    .venv/bin/python benchmarks/report_cost.py [--steps 20 100] [--reps 10]

1. **Track per step** (moto S3, in this process): a run of N steps written as the pipeline writes it
   (`tests.support.runs`: 2 groups x 2 rollouts of a two-turn calculator agent per step, real
   tokenizer, real replay), every step's table already published; then the Track function publishes
   step N-1's summary: seconds, S3 requests by operation and bytes written (the step's table, the page).
   The page's size grows with the steps (a table per step, bounded by `core.report.MAX_TEXT`); its
   requests are O(N) GETs (every summary and table, read 16 at a time).
2. **The loop's path**: ``handlers._common.write_summary`` (what Rebind calls once per step) with an
   MLflow file store configured, before this change (``tracking.summary_warning`` inline, then the S3
   PUT) and after (the PUT only; Track logs it beside the loop), median of ``--reps``.

Prints one table per part.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

BUCKET = "stepwise-report-bench"


def _run(s3, run_id: str, steps: int, mlflow_uri: str = "") -> None:
    from stepwise import layout
    from tests.support import runs

    runs.write_to_s3(s3, BUCKET, run_id, **({"mlflow_tracking_uri": mlflow_uri} if mlflow_uri else {}))
    # steps 2..N-1: copies of step 1's objects (summaries, records, turns), as a longer run leaves them
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=layout.summaries_prefix(run_id, "steps") + "1/")["Contents"]]
    turns = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=layout.run_sessions_prefix(run_id))["Contents"]]
    for step in range(2, steps):
        for key in keys:
            body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read().decode()
            new_key = key.replace("/steps/1/", f"/steps/{step}/")
            body = body.replace('"step": 1', f'"step": {step}').replace("t1", f"t{step}x")
            s3.put_object(Bucket=BUCKET, Key=new_key.replace("t1", f"t{step}x"), Body=body.encode())
        for key in turns:
            if "/t1" in key:
                s3.put_object(Bucket=BUCKET, Key=key.replace("/t1", f"/t{step}x"),
                              Body=s3.get_object(Bucket=BUCKET, Key=key)["Body"].read())


def track_cost(steps: int) -> dict:
    import boto3

    from stepwise import layout, settings
    from stepwise.events import S3Notification
    from stepwise.handlers import _common, track

    s3 = boto3.client("s3", region_name="us-east-1")
    run_id = f"bench-{steps}"
    _run(s3, run_id, steps)
    calls: Counter = Counter()
    written = Counter()

    def count(params, model, **_):
        calls[model.name] += 1
        if model.name == "PutObject":
            body = params.get("Body") or b""
            written[params["Key"]] += len(body) if isinstance(body, (bytes, str)) else len(body.getvalue())

    s3.meta.events.register("before-parameter-build.s3", count)
    with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
        def publish(step: int):
            event = {"Records": [{"s3": {"bucket": {"name": BUCKET}, "object": {"key": layout.summary_key(run_id, step)}}}]}
            return track.track(S3Notification.model_validate(event))

        for step in range(steps - 1):  # the run so far, published
            publish(step)
        calls.clear()
        written.clear()
        t0 = time.perf_counter()
        publish(steps - 1)
        seconds = time.perf_counter() - t0
    table = written[layout.report_table_key(run_id, "train", steps - 1)]
    page = written[layout.report_key(run_id)]
    return {"steps": steps, "seconds": seconds, "requests": dict(calls), "table_bytes": table, "page_bytes": page,
            "put_bytes": sum(written.values())}


def loop_path(reps: int) -> dict:
    import boto3

    from stepwise import layout, settings
    from stepwise.aws import tracking
    from stepwise.config import RunConfig
    from stepwise.handlers import _common

    s3 = boto3.client("s3", region_name="us-east-1")
    with tempfile.TemporaryDirectory() as tmp:
        run_id = "bench-loop"
        _run(s3, run_id, 2, mlflow_uri=f"file:{tmp}/mlruns")
        summary = json.loads(s3.get_object(Bucket=BUCKET, Key=layout.summary_key(run_id, 1))["Body"].read())
        summary.update({f"train/metric_{i}": float(i) for i in range(40)})  # a real summary has ~55 numbers
        with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
            cfg = RunConfig.model_validate(json.loads(s3.get_object(Bucket=BUCKET, Key=layout.config_key(run_id))["Body"].read()))

            def before(step: int) -> None:  # write_summary as it was: MLflow inline, then the PUT
                warning = tracking.summary_warning(cfg, run_id, step, summary)
                body = {**summary, tracking.WARNING_KEY: warning} if warning else summary
                _common.store().put_json(layout.summary_key(run_id, step), body)

            out = {}
            for name, fn in (("before (MLflow inline)", before),
                             ("after (S3 only)", lambda step: _common.write_summary(run_id, step, summary))):
                fn(100)  # warm: MLflow's run created, imports done
                times = []
                for rep in range(reps):
                    t0 = time.perf_counter()
                    fn(101 + rep)
                    times.append(time.perf_counter() - t0)
                out[name] = statistics.median(times)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[20, 100])
    parser.add_argument("--reps", type=int, default=10)
    args = parser.parse_args()
    import os

    from moto import mock_aws

    os.environ.update(STEPWISE_BUCKET=BUCKET, AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="x",
                      AWS_SECRET_ACCESS_KEY="x", POWERTOOLS_METRICS_NAMESPACE="Bench")
    with mock_aws():
        import boto3

        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        print("| steps so far | Track seconds (last step) | S3 GET | S3 LIST | S3 PUT | step table bytes | page bytes |")
        print("|---|---|---|---|---|---|---|")
        for n in args.steps:
            r = track_cost(n)
            q = r["requests"]
            print(f"| {n} | {r['seconds']:.2f} | {q.get('GetObject', 0)} | {q.get('ListObjectsV2', 0)} | "
                  f"{q.get('PutObject', 0)} | {r['table_bytes']:,} | {r['page_bytes']:,} |")
        print()
        print("| write_summary (the loop's path, once per step) | median seconds |")
        print("|---|---|")
        for name, seconds in loop_path(args.reps).items():
            print(f"| {name} | {seconds:.4f} |")


if __name__ == "__main__":
    main()
