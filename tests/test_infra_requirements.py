"""The Lambda images install exactly the project's runtime dependencies.

The image build context is ``lambdas/``, which cannot see ``pyproject.toml``, so the images
install ``lambdas/requirements.txt``; this test keeps the two lists equal.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent


def _normalized(lines: list[str]) -> set[str]:
    out = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            name = re.sub(r"[-_.]+", "-", req.name).lower()
            out.add(f"{name}[{','.join(sorted(req.extras))}]{req.specifier}{';' + str(req.marker) if req.marker else ''}")
    return out


def test_requirements_txt_equals_pyproject_runtime_dependencies():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = (ROOT / "lambdas" / "requirements.txt").read_text().splitlines()
    assert _normalized(requirements) == _normalized(pyproject)


def test_handler_dockerfile_installs_requirements_and_copies_the_package():
    text = (ROOT / "lambdas" / "Dockerfile").read_text()
    assert re.search(r"^FROM \S*aws-lambda-python:3\.11\b", text, re.M), "Lambda Python 3.11 base image"
    assert re.search(r"^RUN pip install .*-r \S*requirements\.txt", text, re.M)
    assert re.search(r"^COPY stepwise/ \$\{LAMBDA_TASK_ROOT\}/stepwise/", text, re.M)
    # the extension belongs to the gateway image only (it would wait for a web server here)
    assert "lambda-adapter" not in text.lower().replace("lambda web adapter", "")
