"""`stepwise stop`: StopExecution, then confirm the training session stopped (stopping it when Cleanup did not).

Step Functions and S3 are moto; the training session lives in the SageMaker simulator, reached
by the SDK's control-plane client exactly as the Lambdas reach it.
"""

from __future__ import annotations

import json

import pytest
from tests.support.cli import BASE_CONFIG, run_state, wait_status

from stepwise_cli.main import main
from local.simulator import start_simulator
from stepwise.layout import config_key, state_key


@pytest.fixture(scope="module")
def sim():
    handle = start_simulator()
    yield handle
    handle.stop()


@pytest.fixture(autouse=True)
def sim_env(sim, monkeypatch):
    for key, value in sim.env.items():
        monkeypatch.setenv(key, value)


def _session(sim, run_id):
    """Create the run's session in the simulator, as Init does; returns (cfg, session name)."""
    from stepwise.aws import sagemaker
    from stepwise.config import load_run_config
    from stepwise.core.phases import session_name_for

    cfg = load_run_config({**BASE_CONFIG, "role_arn": sim.role_arn, "model_package_group_arn": sim.model_package_group_arn,
                           "s3_output_path": sim.s3_output_path, "dataset_path": "s3://bkt/x.jsonl"})
    name = session_name_for(run_id)
    sagemaker.create_session(cfg, name)
    return cfg, name


def _status(cfg, name):
    from stepwise_cli.commands.stop import session_status

    return session_status(cfg.region, name)


def _running_run(moto_dep, sim, run_id):
    cfg, name = _session(sim, run_id)
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name=run_id, input="{}")["executionArn"]
    moto_dep.put_json(config_key(run_id), cfg.model_dump(mode="json"))
    moto_dep.put_json(state_key(run_id), {**run_state(run_id, arn), "training_session_name": name})
    return cfg, name, arn


def test_stop_stops_execution_and_a_session_cleanup_left_running(moto_dep, sim, capsys):
    cfg, name, arn = _running_run(moto_dep, sim, "run-a")
    assert _status(cfg, name) in ("Creating", "Running")
    assert main(["stop", "run-a", "--wait", "0.5", *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    assert wait_status(moto_dep.sfn, arn, ("ABORTED",))["status"] == "ABORTED"
    assert f"stopped execution {arn}" in out
    assert "stopped it here" in out  # moto runs no EventBridge -> Cleanup: the command stopped the session
    assert _status(cfg, name) in ("Stopping", "Stopped")


def test_stop_leaves_an_already_stopped_session_alone(moto_dep, sim, capsys):
    from stepwise.aws import sagemaker

    cfg, name, arn = _running_run(moto_dep, sim, "run-b")
    sagemaker.stop_session(cfg, name)  # what the Cleanup Lambda does
    assert main(["stop", "run-b", "--wait", "5", *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    assert "stopped it here" not in out and f"training session {name}: Stop" in out
    assert wait_status(moto_dep.sfn, arn, ("ABORTED",))["status"] == "ABORTED"


def test_stop_of_an_ended_run_still_checks_the_session(moto_dep, sim, capsys):
    cfg, name, arn = _running_run(moto_dep, sim, "run-c")
    moto_dep.sfn.stop_execution(executionArn=arn)
    wait_status(moto_dep.sfn, arn, ("ABORTED",))
    assert main(["stop", "run-c", "--wait", "0", *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    assert "no running execution of run run-c (newest: ABORTED)" in out and "stopped it here" in out
    assert _status(cfg, name) in ("Stopping", "Stopped")


def test_stop_unknown_run_fails(moto_dep, capsys):
    assert main(["stop", "nope", *moto_dep.flags]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_stop_before_init_wrote_state(moto_dep, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="early",
                                       input=json.dumps({}))["executionArn"]
    assert main(["stop", "early", *moto_dep.flags]) == 0
    assert "no training session was created" in capsys.readouterr().out
    assert wait_status(moto_dep.sfn, arn, ("ABORTED",))["status"] == "ABORTED"
