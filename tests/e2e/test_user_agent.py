"""`stepwise start --local --agent`: a user's own AgentCoreRLApp, kept in a folder outside this repository with a
helper module of its own, trains through the whole local stack (moto's state machine, the handlers, the
gateway, the simulator), served by the ACR emulator in place of the config's runtime."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

AGENT = '''"""A toy agent outside the Stepwise repository: one LLM call through the gateway, scored by its own helper."""
from agentcore_rl_toolkit import AgentCoreRLApp
from openai import OpenAI

from scoring import score  # this agent's own module, beside it

app = AgentCoreRLApp()


@app.rollout_entrypoint
def invoke_agent(payload):
    ro = payload["_rollout"]
    client = OpenAI(base_url=ro["base_url"].rstrip("/") + "/v1", api_key=ro["api_key"], max_retries=2)
    reply = client.chat.completions.create(
        model=ro["model_id"], temperature=ro["sampling_params"]["temperature"],
        max_tokens=ro["sampling_params"]["max_tokens"],
        messages=[{"role": "system", "content": "Reply with one digit."},
                  {"role": "user", "content": payload["prompt"]}],
    ).choices[0].message.content
    return {"rewards": score(payload, reply), "answer": reply, "agent": "my_agent"}
'''
SCORING = '''def score(payload, answer):
    return 1.0 if (answer or "").replace("<|im_end|>", "").strip() == str(payload["answer"]) else 0.0
'''


@pytest.fixture
def outside():
    """A folder of the system's temporary directory, outside the repository (not pytest's numbered tmp_path,
    which another pytest process on the same machine may clean up while a long run still uses it)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="stepwise-user-agent-") as folder:
        yield Path(folder)


def _project(tmp_path: Path) -> Path:
    """The user's project: the agent, its helper, a toy dataset and a config, none of them in the repository."""
    from prepare_datasets.prepare_toy import write_rows

    project = tmp_path / "my_project"
    project.mkdir()
    assert ROOT not in project.resolve().parents
    (project / "agent.py").write_text(AGENT)
    (project / "scoring.py").write_text(SCORING)
    write_rows(project / "train.jsonl", 16, 0)
    cfg = json.loads((ROOT / "examples" / "toy.json").read_text())
    cfg.update(dataset_path=str(project / "train.jsonl"), eval_dataset_path="", eval_every=0, batch_size=2,
               responses_per_prompt=2, max_prompts=4, save_every=-1, steps_per_execution=20)
    (project / "run.json").write_text(json.dumps(cfg))
    return project


def _stepwise(project: Path, *args: str, timeout: float = 1100) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    return subprocess.run([sys.executable, "-m", "stepwise_cli", *args], cwd=project, env=env, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.e2e
@pytest.mark.timeout(1200)  # a subprocess run: about 60 s on an idle 2-core machine, minutes on a loaded one
def test_run_local_trains_a_users_own_agent_from_a_folder_outside_the_repository(outside):
    project = _project(outside)
    run = _stepwise(project, "start", "--local", "run.json", "--agent", "agent.py", "--run-id", "mine", "--no-progress",
                    "--mirror-s3", "--runs-dir", "runs")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    run_dir = project / "runs" / "mine"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["status"] == "SUCCEEDED" and result["steps"] == 2 and result["session_status"] == "Stopped"
    results = [json.loads(p.read_text()) for p in (run_dir / "s3" / "rollout-results").rglob("*.json")]
    assert len(results) == 2 * 2 * 2 and all(r["agent"] == "my_agent" for r in results)  # this agent, every rollout
    state = json.loads((run_dir / "state.json").read_text())
    assert state["policy_version"] == 2 and state["checkpoints"][-1]["reason"] == "final"  # two optimizer steps
    assert (run_dir / "logs" / "agent-agent.log").exists()
    sent = json.loads((run_dir / "run_config.json").read_text())
    assert sent["agent_runtime_arn"].endswith(":runtime/user_agent-local")


def test_the_agent_is_a_module_of_the_current_directory_or_a_file_and_a_broken_one_is_named(outside):
    """``--agent agent:app`` imports from the directory run-local starts in (as ``python -m`` does); a file that
    does not exist, or an app that does not import, is refused before anything starts."""
    project = _project(outside)
    probe = ("import sys; sys.path.insert(0, ''); from local.agents.serve import load_app; "
             "print(type(load_app(sys.argv[1])).__name__)")
    for spec in ("agent:app", "agent", str(project / "agent.py"), "./agent.py:app"):
        out = subprocess.run([sys.executable, "-c", probe, spec], cwd=project, capture_output=True, text=True)
        assert out.stdout.strip() == "AgentCoreRLApp", (spec, out.stderr[-2000:])
    from local.run import user_agent_spec

    assert user_agent_spec("agent.py", project) == f"{project / 'agent.py'}:app"
    assert user_agent_spec("pkg.mod:my_app", project) == "pkg.mod:my_app"
    with pytest.raises(FileNotFoundError, match="no file"):
        user_agent_spec("missing.py", project)
    (project / "broken.py").write_text("import not_a_module_anywhere\n")
    run = _stepwise(project, "start", "--local", "run.json", "--agent", "broken.py", "--no-progress", "--runs-dir", "runs")
    # refused before the stack starts (local.agent_env's import check), quoting Python's own error
    assert run.returncode == 2 and "broken:app does not import" in run.stderr, run.stderr[-2000:]
    assert "No module named 'not_a_module_anywhere'" in run.stderr and "requirements.txt" in run.stderr
