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
