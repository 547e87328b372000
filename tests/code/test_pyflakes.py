"""The code as a tool we did not write reads it: Ruff's Pyflakes rules (``F``: undefined names, names used
before assignment, redefinitions of unused names, unused imports and variables, f-strings without fields)
find nothing in any Python file of the repository. Ruff is pinned in ``pyproject.toml``'s ``lint`` extra.

What it catches is what slips through the suite: a name defined only on another path, a closure reading
an ``except`` clause's name after the clause deleted it, an import a moved function left behind.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Every folder of the repository's own Python code (the venv, node_modules and run folders are not).
SOURCES = ("app.py", "lambdas", "local", "stepwise_cli", "infra", "benchmarks", "prepare_datasets", "state_machine",
           "scripts", "tests")


def ruff() -> str:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: `make install-dev` installs it (pyproject.toml, extra 'lint')")
    return found


def test_pyflakes_finds_nothing_in_the_repository():
    out = subprocess.run([ruff(), "check", "--no-cache", "--isolated", "--select", "F", "--output-format", "concise",
                          *[s for s in SOURCES if (ROOT / s).exists()]],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]


def test_the_check_fails_on_a_closure_reading_a_deleted_except_name(tmp_path):
    """The check can fail: the bug class it is here for (a name the ``except`` clause deletes, read by a nested
    function), in a file of its own."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    try:\n        pass\n    except ValueError as e:\n"
                   "        def g():\n            return e\n        return g\n    return undefined_name\n")
    out = subprocess.run([ruff(), "check", "--no-cache", "--isolated", "--select", "F", "--output-format", "concise",
                          str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "F821" in out.stdout and "undefined_name" in out.stdout, out.stdout
