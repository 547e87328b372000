"""docs/operating.md's permissions table has a row for every `stepwise` command (before: 5 rows for 15 commands)."""

from __future__ import annotations

import re
from pathlib import Path

from stepwise_cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]


def test_every_command_has_a_row_in_the_permissions_table():
    text = (ROOT / "docs" / "operating.md").read_text()
    table = text[text.index("## Permissions"):]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([a-z-]+)`", row.split("|")[1])}
    assert set(COMMANDS) - named == set()
