"""Your own agent, end to end: a Strands agent and a LangGraph agent (copies of ``examples/agents/*`` in a
temporary folder outside the repository) each train for two steps through ``stepwise start --local --agent FOLDER``,
served from an environment built from their own ``requirements.txt`` (never this repository's ``.venv``, which
holds neither framework), and each synthesizes as the stack's training runtime (cdk-nag and cfn-lint clean, the
documented role: tests/infra/test_agent_runtime.py checks the role itself).

The environments are cached under ``~/.cache/stepwise-agents`` (``STEPWISE_AGENT_ENV_CACHE``), keyed by the
requirements: a cold cache downloads and installs both frameworks (about a minute each here), a warm one reuses them.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.support.agent_folders import FRAMEWORKS, cfn_lint_errors, copy_example, synth_with_agent

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def project():
    """The user's project outside the repository: both agent folders, a toy dataset and a small config
    (2 steps of 2 prompts x 2 responses, no eval, no checkpoint but the final one)."""
    from prepare_datasets.prepare_toy import write_rows

    with tempfile.TemporaryDirectory(prefix="stepwise-frameworks-") as tmp:
        root = Path(tmp)
        for framework in FRAMEWORKS:
            copy_example(framework, root)
        write_rows(root / "train.jsonl", 8, 0)
        cfg = json.loads((ROOT / "examples" / "toy.json").read_text())
        cfg.update(dataset_path=str(root / "train.jsonl"), eval_dataset_path="", eval_every=0, eval_before_train=False,
                   batch_size=2, responses_per_prompt=2, max_prompts=4, save_every=-1)
        (root / "run.json").write_text(json.dumps(cfg))
        yield root


def _stepwise(cwd: Path, *args: str, timeout: float = 1500) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "stepwise_cli", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_this_repositorys_environment_holds_neither_framework():
    assert importlib.util.find_spec("strands") is None and importlib.util.find_spec("langgraph") is None


@pytest.mark.e2e
@pytest.mark.timeout(1800)  # cold: two framework installs (about a minute each) and two short runs
@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_a_framework_agent_trains_two_steps_from_its_own_environment_and_deploys_as_a_training_runtime(project, framework):
    folder = project / f"{framework}-agent"
    run = _stepwise(project, "start", "--local", "run.json", "--agent", folder.name, "--run-id", framework, "--no-progress",
                    "--mirror-s3", "--runs-dir", "runs")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = project / "runs" / framework
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "SUCCEEDED" and result["steps"] == 2 and result["session_status"] == "Stopped"
    results = [json.loads(p.read_text()) for p in (run_dir / "s3" / "rollout-results").rglob("*.json")]
    # every rollout answered by this framework's agent, through the gateway (its turns are the trained tokens)
    assert len(results) == 2 * 2 * 2 and {r["framework"] for r in results} == {framework}
    assert all(r["status_code"] == 200 for r in results)
    state = json.loads((run_dir / "state.json").read_text())
    assert state["policy_version"] == 2  # two optimizer steps
    log = (run_dir / "logs" / "agent-agent.log").read_text(errors="replace")
    assert "Traceback" not in log, log[-2000:]

    _, template, nag_errors = synth_with_agent(folder)
    assert nag_errors == [] and cfn_lint_errors(template) == []
    (runtime,) = [r for lid, r in template["Resources"].items() if r["Type"] == "AWS::BedrockAgentCore::Runtime"]
    assert runtime["Properties"]["AgentRuntimeName"] == f"Stepwise_{framework}_agent"


def test_a_framework_missing_from_the_requirements_is_refused_before_the_stack_starts_quoting_the_import(project):
    """The LangGraph folder's requirements (its environment is cached by the test above, or built here) with a
    Strands agent: run-local stops before starting anything, quoting Python's own ImportError."""
    folder = project / "forgot-strands"
    folder.mkdir()
    (folder / "requirements.txt").write_text((project / "langgraph-agent" / "requirements.txt").read_text())
    (folder / "agent.py").write_text((project / "strands-agent" / "agent.py").read_text())
    before = set((project / "runs").glob("*"))
    run = _stepwise(project, "start", "--local", "run.json", "--agent", folder.name, "--no-progress", "--runs-dir", "runs")
    assert run.returncode == 2, run.stderr[-2000:]
    assert "ModuleNotFoundError: No module named 'strands'" in run.stderr and "requirements" in run.stderr, run.stderr
    assert set((project / "runs").glob("*")) == before  # no run folder: nothing started
