"""`stepwise validate --check-aws`: Init's refusals, run from the operator's machine against the deployed
stack (here: the stack's functions and state machine deployed on moto, the ACR emulator's control
plane, the simulator) — every problem at once, exit 2, nothing started."""

from __future__ import annotations

import json

import pytest
from tests.support.pipeline import BUCKET, REGION, FakeAgent, Stack

from stepwise_cli.main import main

OTHER_BUCKET = "stepwise-validate-elsewhere"


@pytest.fixture(scope="module")
def deployed():
    stack = Stack()
    agent = FakeAgent()
    arns, sm_arn = stack.deploy(agent, "validate-aws")
    stack.mp.setenv("STEPWISE_STATE_MACHINE_ARN", sm_arn)  # how `stepwise` finds the deployment
    stack.init_arn = arns["Init"]
    stack.s3.create_bucket(Bucket=OTHER_BUCKET)
    yield stack
    agent.stop()
    stack.stop()


def write(tmp_path, cfg) -> str:
    p = tmp_path / "run.json"
    p.write_text(json.dumps(cfg))
    return str(p)


def test_a_config_the_stack_can_run_passes_and_names_the_stack_region(deployed, tmp_path, capsys):
    cfg = deployed.config()
    del cfg["region"]  # '' = the stack's
    sessions = deployed.sim.counters.get("CreateTrainingSession", 0)
    assert main(["validate", write(tmp_path, cfg), "--check-aws", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["stack_region"] == REGION and summary["granted_buckets"] == BUCKET
    assert summary["dataset_rows"] > 0  # --check-aws reads the datasets as Init does
    assert deployed.sim.counters.get("CreateTrainingSession", 0) == sessions


def test_every_refusal_at_once_exit_2(deployed, tmp_path, capsys):
    cfg = deployed.config(region="eu-west-1",
                          agent_runtime_arn=f"arn:aws:bedrock-agentcore:{REGION}:123456789012:runtime/no_such_agent-x",
                          s3_output_path=f"s3://{OTHER_BUCKET}/out/", tokenizer_path=f"s3://{BUCKET}/nothing/",
                          eval_dataset_path=f"s3://{BUCKET}/data/no-such-eval.jsonl")
    assert main(["validate", write(tmp_path, cfg), "--check-aws"]) == 2
    err = capsys.readouterr().err
    assert "run refused before any training session" in err and "(5 problem(s))" in err
    for fragment in ("eval_dataset_path: ",  # the datasets' own problems come in the same list
                     f"region: the run's region 'eu-west-1' is not the stack's region '{REGION}'",
                     "agent_runtime_arn: no agent runtime 'no_such_agent-x'",
                     f"s3_output_path: bucket '{OTHER_BUCKET}' is outside the stack's grants",
                     "'dataBuckets'",
                     f"tokenizer_path: no files directly under s3://{BUCKET}/nothing/"):
        assert fragment in err


def test_the_grants_come_from_the_deployed_init_functions_environment(deployed, tmp_path, capsys):
    import boto3

    cfg = write(tmp_path, deployed.config(s3_output_path=f"s3://{OTHER_BUCKET}/out/"))
    assert main(["validate", cfg, "--check-aws"]) == 2
    assert f"s3_output_path: bucket '{OTHER_BUCKET}' is outside the stack's grants" in capsys.readouterr().err
    lam = boto3.client("lambda", region_name=REGION)
    env = lam.get_function_configuration(FunctionName=deployed.init_arn)["Environment"]["Variables"]
    lam.update_function_configuration(FunctionName=deployed.init_arn,
                                      Environment={"Variables": {**env, "STEPWISE_DATA_BUCKETS": OTHER_BUCKET}})
    try:
        assert main(["validate", cfg, "--check-aws", "--json"]) == 0
        assert OTHER_BUCKET in json.loads(capsys.readouterr().out)["summary"]["granted_buckets"]
    finally:
        lam.update_function_configuration(FunctionName=deployed.init_arn, Environment={"Variables": env})


def test_a_gated_base_model_without_accept_eula_is_refused_and_accepted_with_it(deployed, tmp_path, capsys):
    """The hub's GatedBucket is looked up from the operator's machine too (the simulator's gated model)."""
    from local.simulator.service import GATED_MODEL_NAME

    cfg = deployed.config(base_model_arn=GATED_MODEL_NAME)
    assert main(["validate", write(tmp_path, cfg), "--check-aws"]) == 2
    err = capsys.readouterr().err
    assert "(1 problem(s))" in err and "accept_eula: the base model" in err and "is gated" in err
    assert main(["validate", write(tmp_path, {**cfg, "accept_eula": True}), "--check-aws"]) == 0


def test_a_gated_tokenizer_without_a_token_init_will_have_is_refused_and_the_source_is_named(deployed, tmp_path, capsys):
    """The tokenizer's Hugging Face repository is gated (a loopback hub, tests/support/hf_hub.py): refused before any
    session while the stack has no secret with a token that has access (this shell's HF_TOKEN does not count: Init
    will not have it); with the stack's secret, the summary says the tokenizer comes from there."""
    import boto3

    from tests.support.hf_hub import FakeHub

    hub = FakeHub(public=set(), gated={"org/gated-tokenizer"}, tokens={"hf-good"})
    deployed.mp.setenv("HF_ENDPOINT", hub.url)
    deployed.mp.setenv("HF_TOKEN", "hf-good")  # the operator's token: not Init's
    lam = boto3.client("lambda", region_name=REGION)
    env = lam.get_function_configuration(FunctionName=deployed.init_arn)["Environment"]["Variables"]
    try:
        cfg = write(tmp_path, deployed.config(tokenizer_path="org/gated-tokenizer"))
        sessions = deployed.sim.counters.get("CreateTrainingSession", 0)
        assert main(["validate", cfg, "--check-aws"]) == 2
        err = capsys.readouterr().err
        assert "tokenizer_path: the tokenizer's Hugging Face repository 'org/gated-tokenizer' is gated" in err
        assert "huggingFaceTokenSecretArn" in err
        secret = boto3.client("secretsmanager", region_name=REGION).create_secret(
            Name="hf-token", SecretString='{"HF_TOKEN": "hf-good"}')["ARN"]
        lam.update_function_configuration(FunctionName=deployed.init_arn, Environment={
            "Variables": {**env, "STEPWISE_HF_TOKEN_SECRET_ARN": secret}})
        assert main(["validate", cfg, "--check-aws", "--json"]) == 0
        summary = json.loads(capsys.readouterr().out)["summary"]
        assert summary["tokenizer_source"] == (f"tokenizer_path org/gated-tokenizer (gated; token from the secret "
                                               f"{secret}); the token has access")
        assert deployed.sim.counters.get("CreateTrainingSession", 0) == sessions
    finally:
        lam.update_function_configuration(FunctionName=deployed.init_arn, Environment={"Variables": env})
        deployed.mp.delenv("HF_ENDPOINT")
        deployed.mp.delenv("HF_TOKEN")
        hub.stop()


def test_a_judge_model_is_refused_unless_the_deployed_stack_grants_it_and_bedrock_offers_it(deployed, tmp_path, capsys,
                                                                                            monkeypatch):
    import boto3

    from local.bedrock import BedrockEmulator

    with BedrockEmulator(region=REGION) as bedrock:
        for k, v in bedrock.env.items():
            monkeypatch.setenv(k, v)
        judged = write(tmp_path, deployed.config(judge={"model_id": "us.amazon.nova-micro-v1:0", "rubric": "the best"}))
        assert main(["validate", judged, "--check-aws"]) == 2
        assert "judge.model_id: the stack does not grant the judge" in capsys.readouterr().err
        lam = boto3.client("lambda", region_name=REGION)
        env = lam.get_function_configuration(FunctionName=deployed.init_arn)["Environment"]["Variables"]
        granted = "us.amazon.nova-micro-v1:0,us.amazon.titan-text-v1:0"
        lam.update_function_configuration(FunctionName=deployed.init_arn,
                                          Environment={"Variables": {**env, "STEPWISE_JUDGE_MODEL_IDS": granted}})
        try:
            assert main(["validate", judged, "--check-aws"]) == 0
            capsys.readouterr()
            absent = write(tmp_path, deployed.config(judge={"model_id": "us.amazon.titan-text-v1:0", "rubric": "the best"}))
            assert main(["validate", absent, "--check-aws"]) == 2
            assert "judge.model_id: Bedrock has no such model or inference profile" in capsys.readouterr().err
        finally:
            lam.update_function_configuration(FunctionName=deployed.init_arn, Environment={"Variables": env})
        assert bedrock.counters.lookups == 2 and bedrock.counters.converse == 0  # looked up, never invoked
