"""What publishing one step costs the Track function at step 10, 100 and 1,000 of a run.

    .venv/bin/python -m benchmarks.report_cost [--steps 10 100 1000] [--reps 3]

A synthetic run folder of ``max(--steps)`` steps in moto's S3 (in this process): step 1 of
`tests.support.runs` (2 groups x 2 two-turn rollouts of a calculator agent with a tool call, the tiny
model's real tokenizer, TraceRecords from the real replay) copied under every step number (new sids, so
every step has its own records and captured turns), and the run "so far" published the way the Track
function leaves it: a sample table per step (the table Track made for step 1, copied) and, for the code
with a report index (`stepwise.views`), the index those steps give. Then Track publishes step N (its
summary's S3 notification through `stepwise.handlers.track.track`), ``--reps`` times on fresh copies
of that step: S3 requests by operation, wall and CPU seconds (CPU of this process, moto's S3 included),
bytes written, and the page's size.

Trackers off (no MLflow, no W&B): their cost per step does not depend on the step number.

``--tmp``: what a Track invocation writes under ``/tmp`` (Lambda's ephemeral storage, kept by a container
across invocations), with W&B on (offline: what it writes is what it would upload) and the run's
tokenizer loaded: the peak during each of the first invocations (sampled every 5 ms) and what is left
after, in a ``TMPDIR`` of its own.

It runs against whichever code is importable, so the same script measures the code before the report
index: ``PYTHONPATH=OTHER_CHECKOUT/lambdas:OTHER_CHECKOUT python -m benchmarks.report_cost`` from that
checkout (it needs only `stepwise.handlers.track.track` and `tests.support.runs`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

BUCKET = "stepwise-report-bench"
RUN = "bench-run"


def _has_index() -> bool:
    try:
        import stepwise.views.index  # noqa: F401
    except ImportError:
        return False
    return True


class Bucket:
    """Puts and gets of the benchmark's own setup (not counted)."""

    def __init__(self, s3) -> None:
        self.s3 = s3

    def get(self, key: str) -> bytes:
        return self.s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()

    def put(self, key: str, body: bytes) -> None:
        self.s3.put_object(Bucket=BUCKET, Key=key, Body=body)

    def keys(self, prefix: str) -> list[str]:
        out = []
        for page in self.s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
            out += [o["Key"] for o in page.get("Contents", [])]
        return out


def _template(b: Bucket) -> dict[str, bytes]:
    """Step 1's objects: its summary, rollout records and their captured turns (keys with ``/steps/1/``
    and the sids ``t1...``)."""
    from stepwise import layout

    out = {k: b.get(k) for k in b.keys(layout.summaries_prefix(RUN, "steps") + "1/")}
    for k in b.keys(layout.run_sessions_prefix(RUN)):
        if "/t1" in k:
            out[k] = b.get(k)
    return out


def _copy_step(b: Bucket, template: dict[str, bytes], step: int, tag: str = "") -> None:
    """Step 1's objects under ``step`` (sids ``t{step}x{tag}...``)."""
    new_sid = f"t{step}x{tag}"
    for key, body in template.items():
        text = body.decode().replace('"step": 1', f'"step": {step}').replace('"t1', f'"{new_sid}')
        new_key = key.replace("/steps/1/", f"/steps/{step}/").replace("/t1", f"/{new_sid}")
        b.put(new_key, text.encode())


def _publish(key: str) -> dict:
    from stepwise.events import S3Notification
    from stepwise.handlers import track

    event = {"Records": [{"s3": {"bucket": {"name": BUCKET}, "object": {"key": key}}}]}
    return track.track(S3Notification.model_validate(event))


def _mark_published(b: Bucket, table: dict, steps: range) -> None:
    """The run's steps ``steps`` as Track leaves them: a table each (step 1's, renumbered) and, with a
    report index, the index those steps give (`stepwise.views.index.add_step`, what Track writes)."""
    from stepwise import layout

    summaries = {}
    for step in steps:
        t = {**table, "step": step}
        b.put(layout.report_table_key(RUN, "train", step), json.dumps(t).encode())
        summaries[step] = json.loads(b.get(layout.summary_key(RUN, step)))
    if not _has_index():
        return
    from stepwise.records import ReportIndex
    from stepwise.views import index as ix
    from stepwise.views.page import curve_keys

    try:
        index = ReportIndex.model_validate_json(b.get(layout.report_index_key(RUN)))
    except Exception:
        index = ReportIndex()
    for step in steps:
        ix.add_step(index, "train", step, summaries[step], {**table, "step": step}, curve_keys=curve_keys("train"),
                    track=False)
    b.put(layout.report_index_key(RUN), index.model_dump_json().encode())


def _measure(s3, b: Bucket, template: dict[str, bytes], step: int, rep: int) -> dict:
    """Track publishing step ``step`` (a fresh copy of its objects, not yet published)."""
    from stepwise import layout

    for key in b.keys(layout.report_prefix(RUN)):
        if key.endswith((f"/steps/{step}.json", f"/steps/{step}.html")):
            s3.delete_object(Bucket=BUCKET, Key=key)
    if _has_index():  # a fresh copy: the index has not seen this step either
        from stepwise.records import ReportIndex

        try:
            index = ReportIndex.model_validate_json(b.get(layout.report_index_key(RUN)))
            index.published = [e for e in index.published if e != ["train", step]]
            b.put(layout.report_index_key(RUN), index.model_dump_json().encode())
        except Exception:
            pass
    for key in b.keys(layout.summaries_prefix(RUN, "steps") + f"{step}/"):
        s3.delete_object(Bucket=BUCKET, Key=key)
    _copy_step(b, template, step, tag=f"r{rep}")
    calls: Counter = Counter()
    written: Counter = Counter()

    def count(params, model, **_):
        calls[model.name] += 1
        if model.name == "PutObject":
            body = params.get("Body") or b""
            written[params["Key"]] += len(body) if isinstance(body, (bytes, str)) else len(body.getvalue())

    s3.meta.events.register("before-parameter-build.s3", count)
    t0, c0 = time.perf_counter(), time.process_time()
    try:
        _publish(layout.summary_key(RUN, step))
    finally:
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        s3.meta.events.unregister("before-parameter-build.s3", count)
    return {"wall": wall, "cpu": cpu, "requests": dict(calls), "page": written.get(layout.report_key(RUN), 0),
            "written": sum(written.values())}


def run(steps: list[int], reps: int) -> list[dict]:
    import boto3

    from stepwise import layout, settings
    from stepwise.handlers import _common, track
    from tests.support import runs

    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    b = Bucket(s3)
    runs.write_to_s3(s3, BUCKET, RUN)
    state = json.loads(b.get(layout.state_key(RUN)))
    state.update(step=max(steps) + 1, policy_version=max(steps) + 1)
    b.put(layout.state_key(RUN), json.dumps(state).encode())
    template = _template(b)
    out = []
    with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
        if hasattr(track, "TRACKERS"):
            track.TRACKERS = ()
        _publish(layout.summary_key(RUN, 0))
        _publish(layout.summary_key(RUN, 1))  # its table is every synthetic step's
        table = json.loads(b.get(layout.report_table_key(RUN, "train", 1)))
        done = 2
        t_setup = time.perf_counter()
        for n in sorted(steps):
            for step in range(done, n):
                _copy_step(b, template, step)
            _mark_published(b, table, range(done, n))
            done = n
            rows = [_measure(s3, b, template, n, rep) for rep in range(reps)]
            q = Counter()
            for r in rows:
                q.update(r["requests"])
            out.append({"step": n, "wall": statistics.median(r["wall"] for r in rows),
                        "cpu": statistics.median(r["cpu"] for r in rows),
                        "requests": {k: v / reps for k, v in q.items()}, "page": rows[-1]["page"],
                        "written": rows[-1]["written"], "setup_s": time.perf_counter() - t_setup})
            print(f"  step {n}: {out[-1]['wall']:.2f} s ({len(rows)} reps)", file=sys.stderr, flush=True)
    return out


def _tree_bytes(root: str) -> int:
    total = 0
    for folder, _, files in os.walk(root):
        for f in files:
            try:
                total += os.lstat(os.path.join(folder, f)).st_size
            except OSError:
                pass
    return total


def tmp_use(invocations: int) -> list[dict]:
    """Peak and residual bytes under ``TMPDIR`` of each of the first Track invocations of a run with W&B."""
    import threading

    import boto3

    from stepwise import layout, settings
    from stepwise.handlers import _common
    from tests.support import runs

    root = os.environ["TMPDIR"]
    s3 = boto3.client("s3", region_name="us-east-1")
    s3.create_bucket(Bucket=BUCKET)
    runs.write_to_s3(s3, BUCKET, RUN, wandb_project="stepwise-bench")
    b = Bucket(s3)
    template = _template(b)
    out = []
    with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
        for step in range(invocations):
            if step >= 2:
                _copy_step(b, template, step)
            peak = [0]
            done = threading.Event()

            def poll() -> None:
                while not done.is_set():
                    peak[0] = max(peak[0], _tree_bytes(root))
                    time.sleep(0.005)

            before = _tree_bytes(root)
            poller = threading.Thread(target=poll, daemon=True)
            poller.start()
            _publish(layout.summary_key(RUN, step))
            done.set()
            poller.join()
            out.append({"invocation": step + 1, "before": before, "peak": peak[0], "after": _tree_bytes(root)})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tmp", type=int, metavar="N", help="measure /tmp over the first N invocations (W&B on)")
    args = parser.parse_args()
    if args.tmp:
        import tempfile

        os.environ["TMPDIR"] = tempfile.mkdtemp(prefix="stepwise-track-tmp-")
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again (W&B's folder is under it)
        os.environ.update(WANDB_MODE="offline", WANDB_SILENT="true")
        os.environ.pop("WANDB_DIR", None)
    os.environ.update(STEPWISE_BUCKET=BUCKET, AWS_DEFAULT_REGION="us-east-1", AWS_ACCESS_KEY_ID="x",
                      AWS_SECRET_ACCESS_KEY="x", POWERTOOLS_METRICS_NAMESPACE="Bench",
                      POWERTOOLS_METRICS_DISABLED="true", POWERTOOLS_LOG_LEVEL="ERROR")
    from moto import mock_aws

    if args.tmp:
        with mock_aws():
            rows = tmp_use(args.tmp)
        print("| Track invocation | /tmp bytes before | peak during | after |")
        print("|---|---|---|---|")
        for r in rows:
            print(f"| {r['invocation']} | {r['before']:,} | {r['peak']:,} | {r['after']:,} |")
        return
    with mock_aws():
        rows = run(args.steps, args.reps)
    print(f"code: {'report index (stepwise.views)' if _has_index() else 'before the report index'}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print("| publishing step | S3 GET | S3 LIST | S3 HEAD | S3 PUT | wall s | CPU s | page bytes | bytes written |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        q = r["requests"]
        print(f"| {r['step']:,} | {q.get('GetObject', 0):g} | {q.get('ListObjectsV2', 0):g} | {q.get('HeadObject', 0):g} | "
              f"{q.get('PutObject', 0):g} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['page']:,} | {r['written']:,} |")


if __name__ == "__main__":
    main()
