"""README's reliability table names real tests: every `tests/folder/test_file.py::test_name` it cites exists
(a bare `test_file.py` is looked up in ``tests/`` itself, where no test file lives: it fails)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_drill_in_the_readme_names_an_existing_test():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Reliability", 1)[1].split("\n## ", 1)[0]
    cited = re.findall(r"`((?:\w+/)*test_\w+\.py)(?:::(test_\w+))?`", section)
    assert len(cited) >= 20, "the reliability table should cite the drills"
    missing = []
    for file, name in cited:
        path = ROOT / file if file.startswith("tests/") else ROOT / "tests" / file
        if not path.exists():
            missing.append(file)
        elif name and not re.search(rf"^(?:async )?def {name}\(", path.read_text(), re.M):
            missing.append(f"{file}::{name}")
    assert not missing, f"README cites tests that do not exist: {missing}"
