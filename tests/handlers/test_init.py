"""Init: bad input never starts a billed session; a good run is claimed, configured and cached once."""

from __future__ import annotations

import json

import pytest
from tests.support.pipeline import BUCKET, execution_arn, init_run, new_run_id, session_creates, wait_ready

from stepwise.config import ConfigError
from stepwise.datasets import DatasetError
from stepwise.aws.runstore import RunOwnedElsewhere
from stepwise.layout import config_key, state_key, tokenizer_prefix


def test_init_refuses_a_bad_config_before_creating_a_session(stack):
    before = session_creates(stack)
    with pytest.raises(ConfigError) as e:
        init_run(stack, new_run_id(), stack.config(batch_size=0, loss="dpo"))
    assert "batch_size" in str(e.value) and "loss" in str(e.value)
    assert session_creates(stack) == before


def test_init_refuses_a_dataset_smaller_than_a_batch_before_creating_a_session(stack):
    before = session_creates(stack)
    small = stack.put_dataset("data/small.jsonl", [{"prompt": "What digit comes after 1?", "answer": "2"}] * 3)
    with pytest.raises(DatasetError, match="3 rows, need at least 4"):
        init_run(stack, new_run_id(), stack.config(dataset_path=small, batch_size=4))
    no_payload = "data/no_payload.jsonl"
    stack.s3.put_object(Bucket=BUCKET, Key=no_payload, Body=b'{"prompt": "x"}\n' * 8)
    with pytest.raises(DatasetError):
        init_run(stack, new_run_id(), stack.config(dataset_path=f"s3://{BUCKET}/{no_payload}"))
    assert session_creates(stack) == before


def test_init_claims_the_run_caches_the_tokenizer_and_a_retry_adopts_the_same_session(stack):
    run_id = new_run_id()
    out = init_run(stack, run_id, stack.config())
    assert out["run"] == {"run_id": run_id, "execution_arn": execution_arn(run_id)}
    state = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=state_key(run_id))["Body"].read())
    # Already Running (the simulator starts fast): no Wait state needed; else PollSession waits.
    assert out["session"]["ready"] == (state["session_status"] == "Running")
    assert state["owner_execution_arn"] == execution_arn(run_id)
    assert state["dataset_rows"] == 10 and state["step"] == 0 and state["last_sequence_number"] == 0
    config = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=config_key(run_id))["Body"].read())
    assert config["batch_size"] == 2 and config["dataset_path"].startswith("s3://")
    files = {o["Key"].rsplit("/", 1)[1] for o in stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=tokenizer_prefix(run_id))["Contents"]}
    assert {"tokenizer.json", "tokenizer_config.json"} <= files

    sessions_before = set(stack.sim.running_sessions())
    init_run(stack, run_id, stack.config())  # the Lambda retried: same session, not a second one
    assert set(stack.sim.running_sessions()) == sessions_before
    assert wait_ready(run_id)["ready"] is True


def test_a_second_execution_of_an_existing_run_is_refused_without_a_session(stack):
    run_id = new_run_id()
    init_run(stack, run_id, stack.config())
    before = session_creates(stack)
    from stepwise.events import InitEvent
    from stepwise.handlers.init import initialize

    with pytest.raises(RunOwnedElsewhere, match="already exists"):
        initialize(InitEvent(input=stack.config(), execution_arn=execution_arn(run_id) + "-other", execution_name=run_id))
    assert session_creates(stack) == before


def test_a_slow_session_start_is_left_to_the_poll_loop(stack):
    stack.sim.set_session_start("ok", seconds=4.0)
    try:
        run_id = new_run_id()
        out = init_run(stack, run_id, stack.config())
        assert out["session"]["ready"] is False and out["session"]["wait_seconds"] == 1
        assert wait_ready(run_id)["ready"] is True
    finally:
        stack.sim.set_session_start("ok", seconds=0.0)
