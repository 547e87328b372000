"""The user pages stay true to the code: every state of the ASL is in the diagram, every operator
option is documented, every page link resolves."""

from __future__ import annotations

import argparse
import importlib
import re
from pathlib import Path

import pytest

from stepwise_cli.main import COMMANDS
from state_machine.definition import load_asl

DOCS = Path(__file__).resolve().parents[2] / "docs"
OPERATOR_COMMANDS = ("start", "watch", "stop", "resume", "runs", "cost", "probe-service")


def _mermaid_blocks(text: str) -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", text, flags=re.S)


def test_architecture_diagram_names_every_state_of_the_deployed_asl():
    blocks = _mermaid_blocks((DOCS / "architecture.md").read_text())
    assert len(blocks) == 2
    diagram = blocks[1]
    states = load_asl()["States"]
    names = set(states)
    for s in states.values():
        names |= set((s.get("ItemProcessor") or {}).get("States", {}))
        for branch in s.get("Branches", []):  # the overlapped step's Parallel (max_staleness 1)
            names |= set(branch["States"])
            for b in branch["States"].values():
                names |= set((b.get("ItemProcessor") or {}).get("States", {}))
    missing = sorted(n for n in names if f'"{n}' not in diagram)
    assert not missing, f"states missing from docs/architecture.md's state diagram: {missing}"


@pytest.mark.parametrize("command", OPERATOR_COMMANDS)
def test_operating_page_documents_every_option(command):
    text = (DOCS / "operating.md").read_text()
    assert f"stepwise {command}" in text
    module = importlib.import_module(COMMANDS[command][0])
    parser = argparse.ArgumentParser()
    module.configure(parser)
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"]
    missing = [o for o in options if f"`{o}" not in text and f"{o} " not in text]
    assert not missing, f"docs/operating.md does not mention {command} {missing}"


@pytest.mark.parametrize("command", ("eval", "compare", "screen"))
def test_evals_page_documents_every_option_of_the_model_selection_commands(command):
    text = (DOCS / "evals.md").read_text()
    assert f"stepwise {command}" in text
    module = importlib.import_module(COMMANDS[command][0])
    parser = argparse.ArgumentParser()
    module.configure(parser)
    stack = {"--stack", "--bucket", "--state-machine-arn", "--region"}  # documented once, in operating.md
    options = [o for a in parser._actions for o in a.option_strings if o.startswith("--") and o != "--help"
               and o not in stack and a.help != argparse.SUPPRESS]  # an old spelling: in operating.md's grammar
    missing = [o for o in options if f"`{o}" not in text and f"{o} " not in text]
    assert not missing, f"docs/evals.md does not mention {command} {missing}"


@pytest.mark.parametrize("page", ["operating.md", "architecture.md", "troubleshooting.md", "agent-contract.md",
                                  "config.md", "first-run.md", "deploy.md", "evals.md"])
def test_links_between_pages_resolve(page):
    text = (DOCS / page).read_text()
    for target in re.findall(r"\]\(([^)#:]+\.md)(?:#[^)]*)?\)", text):
        assert (DOCS / target).is_file(), f"{page} links to missing {target}"


def test_agent_contract_lists_every_rollout_field_the_pipeline_sends():
    from stepwise.handlers.rollout import rollout_payload

    body = rollout_payload({"prompt": "p"}, run_id="r", input_id="i", bucket="b", api_key="s.k", gateway_url="u",
                           model_id="m", sampling={"temperature": 1.0, "max_new_tokens": 8})
    text = (DOCS / "agent-contract.md").read_text()
    for key in body["_rollout"]:
        assert f"| `{key}` |" in text, key
    for key in body["_rollout"]["sampling_params"]:
        assert key in text


def test_first_run_is_the_first_page_the_readme_links_and_its_commands_exist():
    """README's docs table starts with first-run.md; every `stepwise` command first-run.md runs is a command, and
    every stack option it passes is one the stack reads."""
    from infra.settings import StackSettings

    readme = (DOCS.parent / "README.md").read_text()
    table = readme.split("| page | what |", 1)[1]
    assert table.split("\n")[2].startswith("| `docs/first-run.md`")
    text = (DOCS / "first-run.md").read_text()
    used = set(re.findall(r"^(?:\$ )?stepwise ([a-z-]+)", text, re.M)) | set(re.findall(r"`stepwise ([a-z-]+)", text))
    assert used and used <= set(COMMANDS), used - set(COMMANDS)
    asked: list[str] = []
    StackSettings.from_context(lambda key: asked.append(key))
    options = set(re.findall(r"-c ([A-Za-z]+)=", text))
    assert options and options <= set(asked), options - set(asked)
