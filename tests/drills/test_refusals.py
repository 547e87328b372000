"""Refuse before billing: Init against moto S3, the SageMaker simulator and the ACR emulator's control
plane refuses every input it can know is doomed, naming field, value and limit, before any
CreateTrainingSession reaches the simulator and before the run id is claimed."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, example, given, settings
from tests.drills.test_run_ids import names
from tests.support.pipeline import AGENT_ARN, BUCKET, REGION, Stack, execution_arn, init_run, new_run_id, session_creates

from stepwise.config import ConfigError
from stepwise.core.preflight import RunRefused
from stepwise.layout import config_key, state_key
from stepwise.aws.runstore import RunStore

WEST_ARN = "arn:aws:bedrock-agentcore:us-west-2:123456789012:runtime/toy_agent-west"
OTHER_BUCKET = "stepwise-refusal-data"


@pytest.fixture(scope="module")
def stack():
    from prepare_datasets import prepare_toy

    s = Stack()
    s.s3.create_bucket(Bucket=OTHER_BUCKET)  # exists, readable here, but not granted to the stack
    body = "".join(json.dumps({"payload": p}) + "\n" for p in prepare_toy.all_payloads())
    s.s3.put_object(Bucket=OTHER_BUCKET, Key="toy.jsonl", Body=body.encode())
    yield s
    s.stop()


def refused(stack: Stack, exc: type[Exception] = RunRefused, **overrides) -> Exception:
    """Init with ``overrides``: the exception it raises; asserts no session and no claimed run."""
    run_id = new_run_id("refuse")
    before = session_creates(stack)
    with pytest.raises(exc) as e:
        init_run(stack, run_id, stack.config(**overrides))
    assert session_creates(stack) == before, "a training session was created"
    assert not RunStore(BUCKET, stack.s3).exists(state_key(run_id))  # nothing claimed
    return e.value


def accepted(stack: Stack, **overrides) -> dict:
    run_id = new_run_id("accept")
    before = session_creates(stack)
    init_run(stack, run_id, stack.config(**overrides))
    assert session_creates(stack) == before + 1
    return json.loads(stack.s3.get_object(Bucket=BUCKET, Key=config_key(run_id))["Body"].read())


# ------------------------------------------------------------------------------ region


def test_region_defaults_to_the_stacks_and_another_region_is_refused_naming_both(stack):
    cfg = accepted(stack, region="")
    assert cfg["region"] == REGION  # config.json holds the resolved region every handler uses
    e = refused(stack, region="eu-west-1")
    assert e.errors == [e.errors[0]] and e.errors[0].startswith("region:")
    assert "'eu-west-1'" in e.errors[0] and f"'{REGION}'" in e.errors[0]


# ------------------------------------------------------------------------------ base model and its license


def test_a_gated_base_model_is_refused_without_accept_eula_and_starts_with_it(stack):
    """The simulator's hub publishes the tiny model twice, once gated (GatedBucket, as the SageMaker Public Hub
    marks models whose license must be accepted). Without accept_eula Init refuses it before any session,
    naming the field; with it, CreateTrainingSession carries ModelConfig.AcceptEula (the SDK's builder never
    sends it) and the simulator, which refuses a gated model without it, creates the session."""
    from local.simulator.service import GATED_MODEL_NAME

    e = refused(stack, base_model_arn=GATED_MODEL_NAME)
    assert len(e.errors) == 1 and e.errors[0].startswith("accept_eula:"), e.errors
    assert "gated" in e.errors[0] and "GatedBucket" in e.errors[0] and "(got false)" in e.errors[0]
    run_id = new_run_id("gated")
    init_run(stack, run_id, stack.config(base_model_arn=GATED_MODEL_NAME, accept_eula=True))
    state = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=state_key(run_id))["Body"].read())
    request = stack.sim.simulator._sessions[state["training_session_name"]].request
    assert request["ModelConfig"]["AcceptEula"] is True and GATED_MODEL_NAME in request["ModelConfig"]["BaseModelArn"]
    # a model the hub does not offer is refused too, with the SDK's list of those it does
    e = refused(stack, base_model_arn="no-such-model")
    assert e.errors[0].startswith("base_model_arn: the SageMaker Public Hub in") and "Supported models: " in e.errors[0]


# ------------------------------------------------------------------------------ agent runtime


def test_a_runtime_in_another_region_is_refused_unless_the_stack_allows_it(stack):
    stack.acr.host(WEST_ARN)  # it exists, in us-west-2
    e = refused(stack, agent_runtime_arn=WEST_ARN)
    assert len(e.errors) == 1 and e.errors[0].startswith("agent_runtime_arn:")
    assert "us-west-2" in e.errors[0] and REGION in e.errors[0] and "agentRuntimeArns" in e.errors[0]
    assert WEST_ARN in e.errors[0]
    stack.mp.setenv("STEPWISE_AGENT_RUNTIME_ARNS", WEST_ARN)
    try:
        accepted(stack, agent_runtime_arn=WEST_ARN)  # allowed and found by GetAgentRuntime in us-west-2
        e = refused(stack)  # the allow-list is the whole grant: the stack-region runtime is outside it
        assert "not in the stack's allow-list" in e.errors[0] and AGENT_ARN in e.errors[0]
    finally:
        stack.mp.delenv("STEPWISE_AGENT_RUNTIME_ARNS")


def test_a_runtime_that_does_not_exist_is_refused(stack):
    arn = f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/no_such_agent-x"
    calls = stack.acr.counters.get_runtime_calls
    e = refused(stack, agent_runtime_arn=arn)
    assert stack.acr.counters.get_runtime_calls == calls + 1
    assert len(e.errors) == 1 and "agent_runtime_arn: no agent runtime 'no_such_agent-x'" in e.errors[0]
    assert "ResourceNotFoundException" in e.errors[0] and arn in e.errors[0]


def test_a_runtime_that_is_not_ready_is_refused(stack):
    arn = f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/toy_agent-creating"
    stack.acr.host(arn, status="CREATING")
    e = refused(stack, agent_runtime_arn=arn)
    assert len(e.errors) == 1 and "status is CREATING, not READY" in e.errors[0]


def test_a_runtime_of_another_account_is_refused(stack):
    arn = f"arn:aws:bedrock-agentcore:{REGION}:999999999999:runtime/toy_agent-abc"
    e = refused(stack, agent_runtime_arn=arn)
    assert "account 999999999999" in e.errors[0] and "123456789012" in e.errors[0]


# ------------------------------------------------------------------------------ S3 locations


def test_a_bucket_outside_the_stacks_grants_is_refused_naming_dataBuckets(stack):
    uri = f"s3://{OTHER_BUCKET}/toy.jsonl"
    e = refused(stack, dataset_path=uri)
    assert len(e.errors) == 1 and e.errors[0].startswith("dataset_path:")
    assert f"'{OTHER_BUCKET}'" in e.errors[0] and "'dataBuckets'" in e.errors[0] and uri in e.errors[0]
    stack.mp.setenv("STEPWISE_DATA_BUCKETS", f"some-other-bucket, {OTHER_BUCKET}")
    try:
        accepted(stack, dataset_path=uri)
    finally:
        stack.mp.delenv("STEPWISE_DATA_BUCKETS")


def test_a_granted_bucket_that_does_not_exist_and_an_empty_tokenizer_prefix_are_refused(stack):
    stack.mp.setenv("STEPWISE_DATA_BUCKETS", "stepwise-never-created")
    try:
        e = refused(stack, s3_output_path="s3://stepwise-never-created/out/",
                    tokenizer_path=f"s3://{BUCKET}/no-tokenizer-here/")
    finally:
        stack.mp.delenv("STEPWISE_DATA_BUCKETS")
    by_field = {err.split(":", 1)[0]: err for err in e.errors}
    assert set(by_field) == {"s3_output_path", "tokenizer_path"}
    assert "bucket 'stepwise-never-created' does not exist" in by_field["s3_output_path"]
    assert f"no files directly under s3://{BUCKET}/no-tokenizer-here/" in by_field["tokenizer_path"]


def test_every_refusal_is_reported_at_once(stack):
    e = refused(stack, region="eu-west-1", agent_runtime_arn=WEST_ARN,
                eval_dataset_path=f"s3://{OTHER_BUCKET}/toy.jsonl", s3_output_path=f"s3://{OTHER_BUCKET}/out/")
    assert [err.split(":", 1)[0] for err in e.errors] == [
        "region", "agent_runtime_arn", "eval_dataset_path", "s3_output_path"]
    assert "run refused before any training session (4 problem(s))" in str(e)


# ------------------------------------------------------------------------------ service limits


@pytest.mark.parametrize("overrides, field, limit", [
    ({"max_new_tokens": 8}, "max_new_tokens", "512"),
    ({"max_new_tokens": 200_000, "max_context_tokens": 300_000}, "max_new_tokens", "131072"),
    ({"temperature": 2.5}, "temperature", "2"),
    ({"eval_temperature": 3.0}, "eval_temperature", "2"),
    ({"responses_per_prompt": 1001}, "responses_per_prompt", "1000"),
    ({"learning_rate": 0.05}, "learning_rate", "0.01"),
    ({"batch_size": 2000, "responses_per_prompt": 8}, "responses_per_prompt", "10000"),
    ({"acr_tps_limit": 200}, "acr_tps_limit", "125"),
    ({"acr_max_active_sessions": 0}, "acr_max_active_sessions", "Active session workloads per account"),
    ({"acr_max_active_sessions": 20_000}, "acr_max_active_sessions", "10000"),
    ({"max_num_gen_batches": 2000, "algorithm": "dapo"}, "max_num_gen_batches", "1045"),
])
def test_values_the_services_or_one_step_cannot_hold_are_refused(stack, overrides, field, limit):
    e = refused(stack, ConfigError, **overrides)
    [err] = [x for x in e.errors if x.startswith(f"{field}:")]
    assert limit in err and repr(overrides[field]) in err


# ------------------------------------------------------------------------------ run ids (tests/drills/test_run_ids.py)


class _PastTheCheck(Exception):
    """Raised by the stand-in for the local stack: run-local got past its run-id check."""


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(names)
@example("a--1")
@example("r" * 71)
@example("ok_run-1")
def test_init_start_and_run_local_refuse_the_same_names_before_anything_bills(stack, monkeypatch, name):
    """Init (a first execution named ``name``, with a config that is invalid anyway, so a usable name fails on
    the config instead), ``stepwise start``'s check and ``run-local`` (an empty ``--run-id`` is none: both
    then use `default_run_id`) (whose local stack is replaced by one
    that raises: got that far = accepted) give the rule's verdict; a refusal names the rule and Init's leaves
    no training session and no claimed run."""
    import tempfile
    from pathlib import Path

    import local.run
    from stepwise.events import InitEvent
    from stepwise.handlers.init import initialize
    from stepwise.executions import RUN_ID_RULE
    from stepwise_cli.commands._runs import CommandError, validate_run_id
    from tests.drills.test_run_ids import ROOT, usable

    refused_by_rule = not usable(name)
    before = session_creates(stack)
    with pytest.raises(ConfigError) as init:
        initialize(InitEvent(input={}, execution_arn=execution_arn("x") + name, execution_name=name))
    assert isinstance(init.value, RunRefused) == refused_by_rule, init.value
    assert (RUN_ID_RULE in str(init.value)) == refused_by_rule
    assert session_creates(stack) == before
    if refused_by_rule:
        assert not RunStore(BUCKET, stack.s3).exists(state_key(name))

    if name == "":  # no --run-id: both commands name the run `default_run_id(config)`, a usable id
        return
    if refused_by_rule:
        with pytest.raises(CommandError, match="is not usable as an execution name"):
            validate_run_id(name)
    else:
        assert validate_run_id(name) == name

    monkeypatch.setattr(local.run, "LocalStack", lambda **_: (_ for _ in ()).throw(_PastTheCheck()))
    with tempfile.TemporaryDirectory() as out:
        with pytest.raises(RunRefused if refused_by_rule else _PastTheCheck) as run_local:
            local.run.run_local(ROOT / "examples" / "toy.json", run_id=name, out_root=Path(out), progress=False)
        if refused_by_rule:
            assert RUN_ID_RULE in str(run_local.value)
            assert list(Path(out).iterdir()) == []  # no run folder, nothing started
