"""An agent folder as a training runtime (`infra.agent_folder`, `infra.agent_runtime`): ``-c agentDir=FOLDER``
synthesizes its arm64 image from a staged copy of the folder, its runtime and the execution role AgentCore Runtime
documents, clean for cdk-nag and cfn-lint both environment-agnostic and as ``cdk deploy`` synthesizes it."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from infra.agent_folder import AgentFolder, AgentFolderError, requirement_names, toolkit_requirement
from infra.agent_runtime import AGENT_RUNTIME_STATEMENTS, METRICS_NAMESPACE
from infra.settings import SettingsError, StackSettings
from tests.support.agent_folders import copy_example, cfn_lint_errors, runtime_role_statements, synth_with_agent
from tests.support.stack import RUNTIME


@pytest.fixture(scope="module")
def folder():
    with tempfile.TemporaryDirectory(prefix="stepwise-agent-folder-") as tmp:
        agent = copy_example("strands", Path(tmp))
        (agent / ".venv" / "lib").mkdir(parents=True)  # a local environment: never part of the image
        (agent / ".venv" / "lib" / "big.bin").write_bytes(b"x" * 1024)
        (agent / "helpers.py").write_text("X = 1\n")
        yield agent


@pytest.fixture(scope="module")
def synthesized_agent(folder):
    return {concrete: synth_with_agent(folder, concrete=concrete, extra={"agentRuntimeArns": RUNTIME})
            for concrete in (False, True)}


def _actions(statement: dict) -> set[str]:
    a = statement["Action"]
    return {a} if isinstance(a, str) else set(a)


@pytest.mark.parametrize("concrete", [False, True], ids=["agnostic", "concrete-account"])
def test_an_agent_folder_synthesizes_as_a_training_runtime_clean_for_cdk_nag_and_cfn_lint(synthesized_agent, concrete):
    _, template, nag_errors = synthesized_agent[concrete]
    # The agent's constructs (its role, runtime, image) are clean both ways; with a concrete account the rest of
    # the stack's suppressions are the deploy path's to make match (they spell <AWS::Region>:<AWS::AccountId>).
    mine = [e for e in nag_errors if e[0].startswith("/Stepwise/Agent")] if concrete else nag_errors
    assert mine == []
    assert cfn_lint_errors(template) == []
    from tests.infra.test_stack_validators import iam_findings

    assert iam_findings(template) == []
    assert "AgentRuntimeArn" in template["Outputs"] and "AgentRuntimeRoleArn" in template["Outputs"]


def test_the_runtime_role_is_the_documented_execution_role_and_no_more(synthesized_agent):
    """"IAM Permissions for AgentCore Runtime", execution role: every documented statement (but Bedrock model
    invocation: the agent's model is the gateway), scoped; plus the rollout results."""
    _, template, _ = synthesized_agent[True]
    trust, statements = runtime_role_statements(template)
    assert trust["Principal"] == {"Service": "bedrock-agentcore.amazonaws.com"} and trust["Action"] == "sts:AssumeRole"
    assert trust["Condition"]["StringEquals"] == {"aws:SourceAccount": "111122223333"}
    from tests.support.stack import resolve

    assert resolve(trust["Condition"]["ArnLike"]["aws:SourceArn"], template) == "arn:aws:bedrock-agentcore:us-west-2:111122223333:*"
    # CDK merges statements of equal resources (the '*' ones): compare action by action
    of_action = {a: st for st in statements for a in _actions(st)}
    assert set(of_action) == {a for actions in AGENT_RUNTIME_STATEMENTS.values() for a in actions}
    s = AGENT_RUNTIME_STATEMENTS

    def resources(key):
        (r,) = {json.dumps(of_action[a]["Resource"]) for a in s[key]}
        return r

    assert "container-assets" in resources("image")  # the CDK's asset repository, not every repository
    assert resources("image_token") == '"*"' and resources("traces") == '"*"'
    assert "log-group:/aws/bedrock-agentcore/runtimes/*" in resources("log_groups")
    assert "runtimes/*:log-stream:*" in resources("log_streams")
    assert of_action["cloudwatch:PutMetricData"]["Condition"] == {"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}}
    assert _actions(of_action["cloudwatch:PutMetricData"]) == {"cloudwatch:PutMetricData"}  # the condition is its own
    assert resources("describe_log_groups") == '"*"' 
    tokens = resources("workload_tokens")
    assert "workload-identity-directory/default" in tokens and "workload-identity/Stepwise_strands_agent-*" in tokens
    assert "rollout-results/*" in resources("results")
    assert not any(a.startswith("bedrock:") for st in statements for a in _actions(st))


def test_the_image_is_the_folders_staged_copy_for_linux_arm64_and_startrollout_may_invoke_it(synthesized_agent, folder):
    stack, template, _ = synthesized_agent[False]
    manifest_dir = Path(stack.node.root.synth().directory)
    manifest = json.loads((manifest_dir / f"{stack.artifact_id}.assets.json").read_text())
    (image,) = [i for i in manifest["dockerImages"].values()
                if i["source"].get("dockerBuildArgs", {}).get("ENTRYPOINT") == "agent:app"]
    source = image["source"]
    assert source["platform"] == "linux/arm64" and source["dockerFile"] == "Dockerfile.stepwise"
    assert source["dockerBuildArgs"] == {"REQUIREMENTS": "requirements.txt", "EXTRA_REQUIREMENTS": "", "APP_DIR": ".",
                                         "ENTRYPOINT": "agent:app"}
    staged = manifest_dir / source["directory"]
    assert {p.name for p in staged.iterdir()} == {"agent.py", "helpers.py", "requirements.txt", "Dockerfile.stepwise"}
    # the allow-list (agentRuntimeArns) takes the new runtime in, as the math agent's
    runtime = next(lid for lid, r in template["Resources"].items() if r["Type"] == "AWS::BedrockAgentCore::Runtime")
    invoke = [st for r in template["Resources"].values() if r["Type"] == "AWS::IAM::Policy"
              for st in r["Properties"]["PolicyDocument"]["Statement"] if "bedrock-agentcore:InvokeAgentRuntime" in _actions(st)]
    assert runtime in json.dumps(invoke)


def test_an_agent_folder_is_checked_before_any_synthesis(tmp_path):
    (tmp_path / "agent.py").write_text("app = None\n")
    with pytest.raises(AgentFolderError, match="has no requirements.txt"):
        AgentFolder.of(tmp_path)
    (tmp_path / "requirements.txt").write_text("strands-agents[openai]>=1.0  # the framework\n")
    agent = AgentFolder.of(tmp_path)
    assert agent.extra_requirements() == [toolkit_requirement()] and agent.entrypoint == "agent:app"
    with pytest.raises(AgentFolderError, match="no main.py"):
        AgentFolder.of(tmp_path, "main:app")
    with pytest.raises(AgentFolderError, match="not MODULE:ATTR"):
        AgentFolder.of(tmp_path, "agent:app:x")
    (tmp_path / "requirements.lock").write_text("strands-agents==1.0.0 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(AgentFolderError, match="hashed lock without agentcore-rl-toolkit"):
        AgentFolder.of(tmp_path, requirements="requirements.lock").extra_requirements()
    with pytest.raises(SettingsError, match="context agentDir: .* does not exist"):
        StackSettings.from_context({"agentDir": str(tmp_path / "missing")}.get)
    with pytest.raises(SettingsError, match="need agentDir"):
        StackSettings.from_context({"agentEntrypoint": "agent:app"}.get)
    s = StackSettings.from_context({"agentDir": str(tmp_path)}.get)
    assert (s.agent_entrypoint, s.agent_requirements) == ("agent:app", "requirements.txt")


def test_requirement_names_are_what_pip_installs():
    text = ("# a comment\n-r base.txt\n--index-url x\nAgentcore_RL.toolkit[core]==0.2.* ; python_version>'3'\n"
            "langchain-openai>=1.0\nstrands-agents[openai] \\\n  >=1.0\n-e ./local\n")
    assert requirement_names(text) == {"agentcore-rl-toolkit", "langchain-openai", "strands-agents"}
