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


def _foreign_session(stack, name: str, tags: list[dict]) -> None:
    """A session named ``name`` created by someone else (raw boto3, as another stack or a user would)."""
    from tests.support.simulator import control_client, session_request

    control_client(stack.sim).create_training_session(**session_request(stack.sim, name), **({"Tags": tags} if tags else {}))


@pytest.mark.parametrize("whose", ["another stack", "another run", "untagged"])
def test_a_session_of_the_runs_name_that_is_not_its_own_is_refused_before_anything_bills(stack, whose):
    """CreateTrainingSession answers ResourceInUse for a name anyone in the account holds. Init adopts
    it only when its tags name this bucket and this run; otherwise the run is refused before it claims
    anything, with the reason, and nothing of it (its catch-all included) touches that session
    (before: the session was adopted, trained on and stopped by the run's end)."""
    from stepwise.core.phases import session_name_for
    from stepwise.core.preflight import RunRefused
    from stepwise.core.sweeping import TAG_BUCKET, TAG_RUN_ID
    from stepwise.events import StopEvent
    from stepwise.handlers.session import stop

    run_id = new_run_id("foreign")
    name = session_name_for(run_id)
    tags = {"another stack": [{"Key": TAG_BUCKET, "Value": "another-stacks-bucket"}, {"Key": TAG_RUN_ID, "Value": run_id}],
            "another run": [{"Key": TAG_BUCKET, "Value": BUCKET}, {"Key": TAG_RUN_ID, "Value": "someone-else"}],
            "untagged": []}[whose]
    _foreign_session(stack, name, tags)
    before = session_creates(stack)
    with pytest.raises(RunRefused, match=f"training session: training session '{name}' already exists") as e:
        init_run(stack, run_id, stack.config())
    assert {"another stack": "another-stacks-bucket", "another run": "someone-else",
            "untagged": "do not name a Stepwise run"}[whose] in str(e.value)
    assert session_creates(stack) == before
    assert stack.s3.list_objects_v2(Bucket=BUCKET, Prefix=state_key(run_id)).get("KeyCount") == 0
    out = stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={},
                         error={"Error": "RunRefused", "Cause": str(e.value)}))
    assert out == {"stopped": False, "why": "no run state"} and name in stack.sim.running_sessions()
    from tests.support.simulator import control_client

    control_client(stack.sim).stop_training_session(TrainingSessionName=name)


def test_a_foreign_session_created_after_the_check_is_refused_recorded_and_left_alone(stack, monkeypatch):
    """The race: the name is taken between Init's check and its CreateTrainingSession. The ResourceInUse
    answer is checked too: the run is refused, its state records the session as refused, and neither its
    catch-all nor the sweeper stops that session."""
    from stepwise.core.phases import session_name_for
    from stepwise.core.preflight import RunRefused
    from stepwise.core.sweeping import REFUSED, TAG_BUCKET, TAG_RUN_ID
    from stepwise.aws.runstore import RunStore
    from stepwise.events import StopEvent, SweepEvent
    from stepwise.handlers import init
    from stepwise.handlers.session import stop
    from stepwise.handlers.sweeper import sweep

    run_id = new_run_id("race")
    name = session_name_for(run_id)
    tags = [{"Key": TAG_BUCKET, "Value": BUCKET}, {"Key": TAG_RUN_ID, "Value": "someone-else"}]
    original = init.refuse_foreign_session

    def check_then_lose_the_race(*args, **kwargs):
        original(*args, **kwargs)
        _foreign_session(stack, name, tags)

    monkeypatch.setattr(init, "refuse_foreign_session", check_then_lose_the_race)
    with pytest.raises(RunRefused, match="of this stack, not"):
        init_run(stack, run_id, stack.config())
    state, _ = RunStore(BUCKET, stack.s3).read_state(run_id)
    assert state.session_status == REFUSED and state.session_stopped and state.stop_reason.startswith("failed: RunRefused")
    stops = stack.sim.counters.get("StopTrainingSession", 0)
    out = stop(StopEvent(execution_arn=execution_arn(run_id), execution_name=run_id, input={},
                         error={"Error": "RunRefused", "Cause": "drill"}))
    assert out["stopped"] is True and stack.sim.counters.get("StopTrainingSession", 0) == stops
    report = sweep(SweepEvent(grace_seconds=0))
    assert name not in [x["session"] for x in report["stopped"]] and name in stack.sim.running_sessions()
    from tests.support.simulator import control_client

    control_client(stack.sim).stop_training_session(TrainingSessionName=name)


def test_a_resume_from_a_model_package_that_no_longer_exists_is_refused_before_any_session(stack):
    """``resume_from_model_package`` (and ``eval_model_package_arn``) naming a package that was deleted
    (retention best_and_last deletes intermediate ones) is refused by Init's checks, before any
    session (before: a session was created and the run failed in load_state). The lookup asks
    DescribeModelPackage for metadata only (no kms:Decrypt on an encrypted package's key)."""
    from stepwise.core.preflight import RunRefused
    from tests.support.simulator import control_client

    run_id = new_run_id("seed")
    init_run(stack, run_id, stack.config())
    from stepwise.aws.runstore import RunStore

    session = RunStore(BUCKET, stack.s3).read_state(run_id)[0].training_session_name
    kept, deleted = stack.sim.seed_model_packages(session, 2)
    sm = control_client(stack.sim)
    sm.delete_model_package(ModelPackageName=deleted)
    asked: list[dict] = []
    from stepwise.aws import sagemaker

    sagemaker.control_plane(stack.config()["region"]).meta.events.register(
        "provide-client-params.sagemaker.DescribeModelPackage", lambda params, **_: asked.append(dict(params)))
    before = session_creates(stack)
    for field in ("resume_from_model_package", "eval_model_package_arn"):
        extra = {"eval_only": True, "eval_dataset_path": stack.config()["dataset_path"]} if field.startswith("eval") else {}
        with pytest.raises(RunRefused, match=f"{field}: the model package does not exist"):
            init_run(stack, new_run_id("resume-deleted"), stack.config(**{field: deleted}, **extra))
    assert session_creates(stack) == before
    assert asked and all(p.get("IncludedData") == "MetadataOnly" for p in asked)
    init_run(stack, new_run_id("resume-kept"), stack.config(resume_from_model_package=kept))  # one that exists passes
    assert session_creates(stack) == before + 1
