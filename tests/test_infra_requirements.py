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


def _closure(requirements: list[str]) -> set[str]:
    """Installed distributions (normalized names) that ``pip install -r`` of ``requirements`` pulls in."""
    from importlib.metadata import PackageNotFoundError, requires

    seen: set[str] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        key = f"{name}[{','.join(sorted(req.extras))}]"
        if key in seen:
            continue
        seen.add(key)
        try:
            deps = requires(req.name) or []
        except PackageNotFoundError:
            continue
        for dep in deps:
            d = Requirement(dep)
            envs = [{"extra": e} for e in (req.extras or {""})]
            if d.marker is None or any(d.marker.evaluate(env) for env in envs):
                todo.append(d)
    return {k.split("[", 1)[0] for k in seen}


def test_every_third_party_module_the_lambda_code_imports_is_installed_by_the_image():
    """Imports anywhere under lambdas/stepwise/ (but the operator CLI) resolve to requirements.txt's closure."""
    import ast
    import sys
    from importlib.metadata import packages_distributions

    lines = (ROOT / "lambdas" / "requirements.txt").read_text().splitlines()
    installed = _closure([ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()])
    providers = packages_distributions()
    missing = {}
    for path in (ROOT / "lambdas" / "stepwise").rglob("*.py"):
        if "commands" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else [])
            for name in names:
                top = name.split(".", 1)[0]
                if top == "stepwise" or top in sys.stdlib_module_names:
                    continue
                dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(top, [])}
                if not dists & installed:
                    missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"imported by the Lambda code but not installed by lambdas/requirements.txt: {missing}"
