"""What rendering the report page beside the loop costs the loop's handlers on the local stack.

    .venv/bin/python -m benchmarks.beside_loop [--calls 30] [--renders 2]

The local stack's worker processes (`local.workers.WorkerPool`, as run-local starts them: 2 for the loop)
run a loop handler, ``compute_step`` of a 64-rollout GRPO step (`stepwise.core.steps`, what
ComputeAdvantages runs), ``--calls`` times one after another, while ``--renders`` threads keep a
Track-like handler busy: the report page of a 1,000-step index with its sample tables
(`stepwise.views.page.render_page`, matplotlib's curves). Three ways:

- ``alone``: no page rendered (the loop handler's own time);
- ``shared``: the page rendered in the loop's workers, at the loop's priority (Track before:
  ``STEPWISE_LOCAL_BESIDE_LOOP_NICE=0``);
- ``beside``: the page rendered in a worker process of its own at niceness +10 (Track now).

Prints the loop handler's seconds (median, p90) and the pages rendered meanwhile. Seconds depend on the
machine's load (printed with them); the three ways run back to back.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

_STEP: Any = None
_PAGE: Any = None


def loop_work(event: dict, context: Any) -> dict:
    """The loop's handler: compute_step of a 64-rollout GRPO step (8 prompts x 8, two-turn records)."""
    global _STEP
    from stepwise.core.steps import compute_step
    from tests.support.planning import cfg

    if _STEP is None:
        from stepwise.records import RolloutRecord

        records = []
        for i in range(64):
            trace = {"token_ids": [1000 + i, *range(2, 300)], "loss_mask": [1] * 150 + [0] * 50 + [1] * 97,
                     "logprobs": [-0.5] * 297}
            records.append(RolloutRecord(sid=f"s{i}", i=i, input_id=f"p{i // 8}", row=i // 8, member=i % 8, step=3,
                                         reward=float(i % 3 == 0), status="ok", policy_version=3, records=[trace] * 3))
        _STEP = ([records], cfg(batch_size=8, responses_per_prompt=8))
    t0 = time.perf_counter()
    compute_step(_STEP[0], _STEP[1], policy_version=3)
    return {"seconds": time.perf_counter() - t0}


def page_work(event: dict, context: Any) -> dict:
    """Track's CPU: the page of a 1,000-step run (curves from its index, 5 inline tables)."""
    global _PAGE
    from stepwise.records import ReportIndex
    from stepwise.views import index as ix
    from stepwise.views.page import PageInputs, curve_keys, render_page

    if _PAGE is None:
        index = ReportIndex()
        for s in range(1000):
            summary = {k: (s % 7) / 7 for k in curve_keys("train")} | {"sampler/num_rollouts": 64}
            ix.add_step(index, "train", s, summary, None, curve_keys=curve_keys("train"), track=False)
        _PAGE = PageInputs(run_id="bench", index=index)
    render_page(_PAGE)
    return {}


def measure(way: str, calls: int, renders: int) -> dict:
    from local import engine
    from local.workers import WorkerPool

    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "lambdas"), os.environ.get("PYTHONPATH", "")])
    pool = WorkerPool(2, nice=10 if way == "beside" else 0)
    d = engine.LambdaDispatcher(workers=pool)
    stop = threading.Event()
    rendered = [0]
    try:
        d.register("loop", handler_path="benchmarks.beside_loop.loop_work", memory_mb=3008, timeout_s=300, arn="arn:loop")
        d.register("page", handler_path="benchmarks.beside_loop.page_work", memory_mb=3008, timeout_s=300, arn="arn:page",
                   beside_loop=True)
        d.call("loop", {}, "RequestResponse")  # warm both workers' imports
        d.call("loop", {}, "RequestResponse")

        def render() -> None:
            while not stop.is_set():
                d.call("page", {}, "Event")
                rendered[0] += 1

        threads = [threading.Thread(target=render, daemon=True) for _ in range(renders if way != "alone" else 0)]
        for t in threads:
            t.start()
        time.sleep(3.0 if threads else 0.0)  # the renders are under way
        seconds = []
        import json

        for _ in range(calls):
            payload, _err = d.call("loop", {}, "RequestResponse")
            seconds.append(json.loads(payload)["seconds"])
        stop.set()
        for t in threads:
            t.join(120)
    finally:
        pool.stop()
        d.stop_limits()
    seconds.sort()
    return {"way": way, "median": statistics.median(seconds), "p90": seconds[int(0.9 * (len(seconds) - 1))],
            "rendered": rendered[0], "load": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=30)
    parser.add_argument("--renders", type=int, default=2)
    args = parser.parse_args()
    rows = [measure(way, args.calls, args.renders) for way in ("alone", "shared", "beside", "alone")]
    print(f"{os.cpu_count()} cores; loop handler: compute_step of a 64-rollout step, {args.calls} calls; "
          f"{args.renders} threads rendering a 1,000-step page meanwhile")
    print("| page rendered | loop handler s (median) | p90 | pages rendered meanwhile | load average |")
    print("|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['way']} | {r['median']:.3f} | {r['p90']:.3f} | {r['rendered']} | {r['load']:.1f} |")


if __name__ == "__main__":
    main()
