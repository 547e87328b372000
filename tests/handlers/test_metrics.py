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
