"""Handlers' EMF records: the names, units and dimensions the stack's dashboard searches for."""

from __future__ import annotations

import json


def test_emit_writes_one_emf_record_with_service_and_run_dimensions(capsys):
    from stepwise.handlers._common import emit

    emit({"sampler/mean_reward": 0.5, "time/rollout": 2.0, "sampler/num_datums": 4, "bad": float("nan")}, run_id="r1")
    record = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    meta = record["_aws"]["CloudWatchMetrics"][0]
    assert meta["Namespace"] and sorted(meta["Dimensions"][0]) == ["run_id", "service"]
    assert {m["Name"]: m["Unit"] for m in meta["Metrics"]} == {
        "sampler/mean_reward": "None", "time/rollout": "Seconds", "sampler/num_datums": "Count"}
    assert record["run_id"] == "r1" and record["sampler/mean_reward"] == [0.5]


def test_concurrent_emits_in_one_process_each_write_their_own_record(capsys):
    """The local stack runs several handlers in one process's threads (Lambda never does): one
    invocation's flush must not empty another's metrics (Powertools raises SchemaValidationError
    'Must contain at least one metric' for the emptied one) nor mix runs' metrics in one record."""
    import threading

    from stepwise.handlers._common import emit

    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def worker(n: int) -> None:
        start.wait()
        try:
            for i in range(150):
                emit({f"test/m{n}": float(i), "test/shared": float(n)}, run_id=f"run-{n}")
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines() if '"_aws"' in line]
    assert len(records) == 8 * 150
    for record in records:
        n = int(record["run_id"].removeprefix("run-"))
        names = {m["Name"] for m in record["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
        assert names == {f"test/m{n}", "test/shared"} and record["test/shared"] == [float(n)], record


def test_concurrent_invocations_in_one_process_log_with_their_own_keys():
    """Every log line names the invocation that wrote it (function name, request id, run id, sid digest),
    even with 8 invocations of different functions logging at once on one process's threads, as the local
    stack runs them: the keys are context-local (`invocation_log_keys`, `bind`), not the logger's
    process-wide ones, which the last invocation to bind overwrote for all (seen in lambdas.log). A key
    never outlives its invocation."""
    import threading
    from types import SimpleNamespace

    from pydantic import BaseModel

    from stepwise.handlers._common import bind, entrypoint, logger

    class Event(BaseModel):
        n: int

    start = threading.Barrier(8)

    def work(event: Event) -> dict:
        bind(run_id=f"run-{event.n}", sid=f"sid-{event.n}")
        start.wait()
        for i in range(40):
            logger.info(f"line of {event.n}", extra={"i": i})
        return {}

    errors: list[BaseException] = []

    def invoke(n: int) -> None:
        handler = entrypoint(Event, work)
        context = SimpleNamespace(function_name=f"fn-{n}", memory_limit_in_mb=128, aws_request_id=f"req-{n}",
                                  invoked_function_arn=f"arn:aws:lambda:us-east-1:123456789012:function:fn-{n}")
        try:
            handler({"n": n}, context)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    import io

    logger.thread_safe_clear_keys()  # what an earlier test's bind() outside any invocation left on this thread
    out = io.StringIO()
    handler = logger.registered_handler
    stream, handler.stream = handler.stream, out  # not setStream: it flushes a stream an earlier test closed
    level = logger.log_level  # the level this process's logger was made with (POWERTOOLS_LOG_LEVEL at import)
    logger.setLevel("INFO")
    try:
        threads = [threading.Thread(target=invoke, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        logger.info("after every invocation")
    finally:
        handler.stream = stream
        logger.setLevel(level)
    assert not errors, errors[:3]
    lines = [json.loads(line) for line in out.getvalue().splitlines() if '"line of' in line]
    assert len(lines) == 8 * 40
    wrong = [line for line in lines
             if {line.get("function_name"), line.get("function_request_id"), line.get("run_id")}
             != {f"fn-{line['message'][8:]}", f"req-{line['message'][8:]}", f"run-{line['message'][8:]}"}
             or "sid-" in json.dumps(line)]
    assert wrong == [], wrong[:3]
    after = json.loads(out.getvalue().strip().splitlines()[-1])
    assert "function_name" not in after and "run_id" not in after and "sid" not in after
