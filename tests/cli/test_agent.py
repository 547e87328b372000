"""`stepwise agent`: deploy runs the CDK with the folder's context (its entrypoint and requirements, more -c after),
config fills a run config from the stack's outputs, and a folder that cannot be used is refused by name."""

from __future__ import annotations

import json
import shutil

import pytest

from stepwise_cli.commands import agent
from stepwise_cli.main import main

ROOT = agent.REPO_ROOT


@pytest.fixture
def folder(tmp_path):
    dest = tmp_path / "my-agent"
    shutil.copytree(ROOT / "examples" / "agents" / "langgraph", dest)
    return dest


def test_deploy_runs_cdk_with_the_folders_context_from_the_repository(folder, capsys):
    assert main(["agent", "deploy", str(folder), "--dry-run", "-c", "createSageMakerRole=true",
                 "-c", "huggingFaceTokenSecretArn=arn:aws:secretsmanager:us-west-2:1:secret:x-AbCdEf"]) == 0
    out = capsys.readouterr().out.strip()
    assert out == (f"(cd {ROOT} && cdk deploy -c agentDir={folder} -c agentEntrypoint=agent:app -c "
                   f"agentRequirements=requirements.txt -c createSageMakerRole=true -c "
                   f"huggingFaceTokenSecretArn=arn:aws:secretsmanager:us-west-2:1:secret:x-AbCdEf)")
    assert main(["agent", "deploy", str(folder), "--synth", "--dry-run", "--entrypoint", "agent:app"]) == 0
    assert " cdk synth -c agentDir=" in capsys.readouterr().out
    assert main(["agent", "deploy", str(folder / "missing"), "--dry-run"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["agent", "deploy", str(folder), "--entrypoint", "main:app", "--dry-run"]) == 2
    assert "has no main.py" in capsys.readouterr().err


def test_config_takes_the_stacks_runtime_and_role_and_names_a_missing_output():
    from infra import stack

    assert (agent.OUTPUT_AGENT_RUNTIME, agent.OUTPUT_MATH_AGENT_RUNTIME, agent.OUTPUT_SAGEMAKER_ROLE) == (
        stack.OUTPUT_AGENT_RUNTIME, stack.OUTPUT_MATH_AGENT_RUNTIME, stack.OUTPUT_SAGEMAKER_ROLE)
    raw = json.loads((ROOT / "examples" / "aws" / "gsm8k.json").read_text())
    outputs = {"AgentRuntimeArn": "arn:aws:bedrock-agentcore:us-west-2:1:runtime/Stepwise_my_agent-AbC",
               "SageMakerRoleArn": "arn:aws:iam::1:role/S"}
    filled, changed = agent.fill_config(raw, outputs)
    assert filled["agent_runtime_arn"] == outputs["AgentRuntimeArn"] and filled["role_arn"] == outputs["SageMakerRoleArn"]
    assert {k: v for k, v in filled.items() if k not in ("agent_runtime_arn", "role_arn")} == {
        k: v for k, v in raw.items() if k not in ("agent_runtime_arn", "role_arn")}
    assert len(changed) == 2
    with pytest.raises(LookupError, match="no MathAgentRuntimeArn output: deploy it with -c deployMathAgent=true"):
        agent.fill_config(raw, outputs, math_agent=True)
