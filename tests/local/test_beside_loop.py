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


def _slow(event, context):
    import time

    time.sleep(float(event.get("seconds", 0)))
    return {"pid": os.getpid()}


def test_a_run_s_end_stops_the_functions_beside_the_loop_instead_of_waiting_for_them(monkeypatch, caplog):
    """run-local's end (no tracker configured) does not wait for Track: it stops its process, so an invocation in
    flight is cut short quietly and none ends later (the ledger and the invocations compared at the end hold still);
    the loop's workers go on. Before, the end drained Track for up to 60 s."""
    import time

    from local import engine
    from local.workers import WorkerPool

    monkeypatch.setenv("PYTHONPATH", os.path.dirname(__file__) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    d = engine.LambdaDispatcher(workers=WorkerPool(1))
    try:
        d.register("loop", handler_path="test_beside_loop._slow", memory_mb=256, timeout_s=60, arn="arn:loop")
        d.register("page", handler_path="test_beside_loop._slow", memory_mb=256, timeout_s=60, arn="arn:page",
                   beside_loop=True)
        d.workers.wait()
        d.invoke_from_moto("page", json.dumps({"seconds": 30}), {}, {})  # an S3 notification: asynchronous
        time.sleep(1.0)
        t0 = time.monotonic()
        assert d.abandon_beside_loop() is True
        d.drain(timeout=60)
        assert time.monotonic() - t0 < 15
        assert json.loads(d.call("loop", {"seconds": 0}, "RequestResponse")[0])["pid"]  # the loop's worker answers
    finally:
        d.workers.stop()
        d.stop_limits()
    assert [i.function_name for i in d.invocations] == ["loop"]  # the cut-short one is not counted
    assert not [r for r in caplog.records if r.levelname == "WARNING" and "dropped" in r.getMessage()]


def test_without_a_process_of_their_own_the_functions_beside_the_loop_are_waited_for():
    from local import engine

    assert engine.LambdaDispatcher().abandon_beside_loop() is False


def test_the_end_waits_for_asynchronous_invocations_while_they_end_and_not_for_one_that_hangs(monkeypatch):
    """`LambdaDispatcher.drain(timeout, while_progressing=cap)`: the timeout counts from the last invocation that
    ended, up to the cap. A run with a tracker waits so for Track's queue (invocations of ~10 s idle, about a minute
    each under load): with a fixed 60 s, the last of three queued pages was left on a loaded CI machine
    (tests/e2e/test_inspect_run.py counted 23 Track invocations of 24). One that hangs costs the timeout."""
    import time

    from local import engine

    monkeypatch.syspath_prepend(os.path.dirname(__file__))  # the dispatcher runs the handler in this process

    def run(seconds: list[float], **drain) -> tuple[float, int]:
        d = engine.LambdaDispatcher()
        try:
            d.register("page", handler_path="test_beside_loop._slow", memory_mb=256, timeout_s=60, arn="arn:page")
            for s in seconds:
                d.invoke_from_moto("page", json.dumps({"seconds": s}), {}, {})
            t0 = time.monotonic()
            d.drain(**drain)
            return time.monotonic() - t0, sum(t.is_alive() for t in d._async_threads)
        finally:
            d.stop_limits()

    waited, left = run([1.0, 2.0, 3.0], timeout=1.6)  # a fixed bound leaves the slower ones
    assert waited < 2.5 and left == 2
    waited, left = run([1.0, 2.0, 3.0], timeout=1.6, while_progressing=30)  # each one ended gives 1.6 s more
    assert left == 0 and waited < 10
    waited, left = run([1.0, 20.0], timeout=1.6, while_progressing=30)  # one that hangs: the timeout after the last
    assert left == 1 and 2.0 < waited < 6
