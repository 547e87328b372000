"""The state machines' ASL: one file each, loaded by the CDK stack and by the local stack alike.

``training_loop.asl.json`` (the training loop: one execution per run segment) and
``rollout_group.asl.json`` (one execution per group of the group engine, ``admission: group``) are
JSONPath ASL (moto's engine has no JSONata) with ``${Name}`` placeholders for deployed resources:
``${<Name>FunctionArn}`` for every entry of ``stepwise.functions.FUNCTIONS`` the ASL uses,
``${BucketName}``, ``${RolloutGroupStateMachineArn}`` (the training loop starts groups of it), and the
service integrations (``${StatesLambdaInvoke}`` = ``arn:PARTITION:states:::lambda:invoke``). The stack
passes the file text to ``DefinitionBody.from_string`` with ``definition_substitutions``; the local stack
calls :func:`render_definition` with literal values. Both substitute the same placeholders in the same
text, so the deployed and the local definitions are the same document.

Every rollout runs the same child states (``rollout_child.json``: Pace start, Start rollout, its result's re-check
(Rollout silent, Wait for rollout result), Finish rollout, Record failed rollout, Rollout lost): the training loop's two Distributed Maps (the second under names of its own)
and the rollout group's inline Map carry generated copies of them. The group judge's loop (``judge_loop.json``:
Judge groups, Groups judged?, Wait for the judge) is generated the same way into the training loop (a generation
batch's groups, before "Compute advantages and filter groups") and the rollout group (its one group, before
"Record group complete"), each copy binding the fragment's ``<batch>``, ``<judged>`` and ``<failed>``.
``python -m state_machine.definition --write`` regenerates the copies after a fragment changed; `stale_copies`
is what a test checks.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ASL_PATH = Path(__file__).with_name("training_loop.asl.json")
GROUP_ASL_PATH = Path(__file__).with_name("rollout_group.asl.json")
CHILD_PATH = Path(__file__).with_name("rollout_child.json")
JUDGE_PATH = Path(__file__).with_name("judge_loop.json")
#: The placeholder of the rollout-group state machine's ARN in the training loop.
GROUP_STATE_MACHINE_PLACEHOLDER = "RolloutGroupStateMachineArn"

#: Where each copy of the rollout child states sits: (file, path of the Map state through the ASL,
#: the copy's state names for the fragment's).
NEXT_STEP_NAMES = {
    "Pace start": "Pace a rollout of the next step",
    "Start rollout": "Start a rollout of the next step",
    "Finish rollout": "Finish a rollout of the next step",
    "Record failed rollout": "Record a failed rollout of the next step",
    "Rollout lost": "A rollout of the next step lost",
    "Rollout silent": "A rollout of the next step silent",
    "Wait for rollout result": "Wait for a rollout result of the next step",
}
CHILD_COPIES: tuple[tuple[Path, tuple[str, ...], dict[str, str]], ...] = (
    (ASL_PATH, ("Roll out generation batch",), {}),
    (ASL_PATH, ("Train this step while rolling out the next", "1", "Roll out the next step's generation batch"),
     NEXT_STEP_NAMES),
    (GROUP_ASL_PATH, ("Roll out the group",), {}),
)

#: The group's names of the judge loop's states (the rollout group's copy).
GROUP_JUDGE_NAMES = {
    "Judge groups": "Judge the group",
    "Groups judged?": "Group judged?",
    "Wait for the judge": "Wait for the group's judge",
}
#: Where each copy of the judge loop sits: (file, the copy's state names for the fragment's, its bindings of the
#: fragment's tokens: ``<batch>`` the JSONPath of the batch judged, ``<judged>`` the state once every group has its
#: record, ``<failed>`` the state a failed judge goes to). A judge that fails for a group (retries spent) leaves it
#: unjudged: "Record group complete" records it, and the group falls back (`stepwise.core.judge.apply_judgements`).
JUDGE_COPIES: tuple[tuple[Path, dict[str, str], dict[str, str]], ...] = (
    (ASL_PATH, {}, {"<batch>": "$.plan.batch", "<judged>": "Compute advantages and filter groups",
                    "<failed>": "Stop training session after failure"}),
    (GROUP_ASL_PATH, GROUP_JUDGE_NAMES, {"<batch>": "$.batch", "<judged>": "Record group complete",
                                         "<failed>": "Record group complete"}),
)

#: ``${Name}`` as Step Functions' DefinitionSubstitutions spells a placeholder.
PLACEHOLDER_RE = re.compile(r"\$\{([A-Za-z0-9_]+)\}")


def load_definition() -> str:
    """The training loop's ASL text with its ``${...}`` placeholders (what the stack hands to Step Functions)."""
    return ASL_PATH.read_text()


def load_group_definition() -> str:
    """The rollout group's ASL text with its ``${...}`` placeholders."""
    return GROUP_ASL_PATH.read_text()


def child_states(names: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The rollout child states (``rollout_child.json``'s ``States``), renamed by ``names`` (fragment name ->
    copy's name; state keys and ``Next`` targets)."""
    return _renamed(json.loads(CHILD_PATH.read_text())["States"], dict(names or {}))


def judge_states(names: Mapping[str, str] | None = None, bindings: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The judge loop's states (``judge_loop.json``'s ``States``), renamed by ``names`` (as `child_states`) and
    every string value equal to a token of ``bindings`` (``<batch>``, ``<judged>``, ``<failed>``) replaced.

    Raises:
        KeyError: a token of the fragment has no binding (named).
    """
    names, bindings = dict(names or {}), dict(bindings or {})

    def bind(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {k: bind(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [bind(x) for x in obj]
        if isinstance(obj, str) and obj.startswith("<") and obj.endswith(">"):
            if obj not in bindings:
                raise KeyError(f"judge_loop.json's {obj} has no binding; given {sorted(bindings)}")
            return bindings[obj]
        return obj

    return _renamed(bind(json.loads(JUDGE_PATH.read_text())["States"]), names)


#: The fields whose value names a state (renamed with the states).
TARGETS = ("Next", "Default")


def _renamed(states: dict[str, Any], names: Mapping[str, str]) -> dict[str, Any]:
    def rename(obj: Any) -> Any:
        if isinstance(obj, dict):
            return {names.get(k, k): (names.get(v, v) if k in TARGETS else rename(v)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [rename(x) for x in obj]
        return obj

    return rename(states)


def _map_state(asl: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    state: Any = asl
    for part in path:
        state = state["Branches"][int(part)] if part.isdigit() else state["States"][part]
    return state


def with_child_copies(path: Path) -> str:
    """The text of ``path`` with every rollout child copy and judge loop copy it holds regenerated from the
    fragments (a judge state the file lacks is added at the end of its top-level ``States``)."""
    asl = json.loads(path.read_text())
    for file, where, names in CHILD_COPIES:
        if file == path:
            proc = _map_state(asl, where)["ItemProcessor"]
            proc["States"] = child_states(names)
            start = json.loads(CHILD_PATH.read_text())["StartAt"]
            proc["StartAt"] = names.get(start, start)
    for file, names, bindings in JUDGE_COPIES:
        if file == path:
            asl["States"].update(judge_states(names, bindings))
    return json.dumps(asl, indent=2) + "\n"


def _copied_files() -> list[Path]:
    return list(dict.fromkeys([*(f for f, _, _ in CHILD_COPIES), *(f for f, _, _ in JUDGE_COPIES)]))


def stale_copies() -> list[str]:
    """The ASL files whose rollout child or judge loop copies differ from ``rollout_child.json`` and
    ``judge_loop.json`` ([] = in sync)."""
    return [p.name for p in _copied_files() if with_child_copies(p) != p.read_text()]


def placeholders(text: str | None = None) -> set[str]:
    """The placeholder names the ASL uses (``{"InitFunctionArn", ..., "BucketName", "Partition"}``)."""
    return set(PLACEHOLDER_RE.findall(load_definition() if text is None else text))


def render_definition(substitutions: Mapping[str, str], text: str | None = None) -> str:
    """Substitute every ``${Name}`` with ``substitutions[Name]`` and return valid ASL JSON text.

    Values are inserted verbatim (they sit inside JSON strings: ARNs and the bucket name), as
    Step Functions' DefinitionSubstitutions does.

    Raises:
        KeyError: a placeholder has no value (names every missing one).
        ValueError: a value would break the JSON string it is inserted into.
    """
    text = load_definition() if text is None else text
    missing = sorted(placeholders(text) - set(substitutions))
    if missing:
        raise KeyError(f"no value for ASL placeholder(s) {missing}; given {sorted(substitutions)}")
    bad = [k for k, v in substitutions.items() if not isinstance(v, str) or '"' in v or "\\" in v]
    if bad:
        raise ValueError(f"substitution values must be plain strings without quotes or backslashes: {bad}")
    rendered = PLACEHOLDER_RE.sub(lambda m: substitutions[m.group(1)], text)
    json.loads(rendered)  # still valid JSON
    return rendered


def load_asl() -> dict[str, Any]:
    """The training loop's ASL as a dict (placeholders left in place)."""
    return json.loads(load_definition())


def load_group_asl() -> dict[str, Any]:
    """The rollout group's ASL as a dict (placeholders left in place)."""
    return json.loads(load_group_definition())


def main(argv: list[str] | None = None) -> int:
    """``python -m state_machine.definition [--write]``: check (or regenerate) the rollout child and judge loop copies."""
    import argparse

    parser = argparse.ArgumentParser(description="check or regenerate the rollout child states' and the judge loop's copies")
    parser.add_argument("--write", action="store_true", help="rewrite the ASL files from rollout_child.json and judge_loop.json")
    args = parser.parse_args(argv)
    stale = stale_copies()
    if args.write:
        for path in _copied_files():
            path.write_text(with_child_copies(path))
        print(f"regenerated: {', '.join(stale) or 'nothing (in sync)'}")
        return 0
    if stale:
        print(f"out of date with rollout_child.json or judge_loop.json: {', '.join(stale)}; run: python -m state_machine.definition --write")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
