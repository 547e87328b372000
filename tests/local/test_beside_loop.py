"""On the local stack, what a person reads is produced at a lower CPU priority than the loop: a function
beside the loop (`stepwise.functions.FunctionSpec.beside_loop`: Track) runs in a worker process of its own,
niced (`local.workers.BESIDE_LOOP_NICE`), while the loop's functions run at the loop's priority. Before,
Track shared the loop's two worker processes at the same priority (8.5 s an invocation idle, ~50 s under
load, beside the step's handlers)."""

from __future__ import annotations

import json
import os

from stepwise import functions


def _where(event, context):
    return {"pid": os.getpid(), "nice": os.getpriority(os.PRIO_PROCESS, 0)}


def test_track_is_the_function_beside_the_loop():
    assert [s.name for s in functions.FUNCTIONS if s.beside_loop] == ["Track"]


def test_a_function_beside_the_loop_runs_in_its_own_lower_priority_worker(monkeypatch):
    from local import engine
    from local.workers import BESIDE_LOOP_NICE, WorkerPool

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    d = engine.LambdaDispatcher(workers=WorkerPool(1))
    try:
        d.register("loop", handler_path="test_beside_loop._where", memory_mb=256, timeout_s=30, arn="arn:loop")
        d.register("page", handler_path="test_beside_loop._where", memory_mb=256, timeout_s=30, arn="arn:page",
                   beside_loop=True)
        loop = [json.loads(d.call("loop", {}, "RequestResponse")[0]) for _ in range(3)]
        page = [json.loads(d.call("page", {}, "Event")[0]) for _ in range(3)]
    finally:
        d.workers.stop()
        d.stop_limits()
    base = os.getpriority(os.PRIO_PROCESS, 0)
    assert {r["nice"] for r in loop} == {base}
    assert {r["nice"] for r in page} == {min(19, base + BESIDE_LOOP_NICE)}
    assert not {r["pid"] for r in loop} & {r["pid"] for r in page}
