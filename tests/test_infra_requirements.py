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


def _imports(path: Path) -> list[str]:
    import ast

    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append(node.module)
            out.extend(f"{node.module}.{a.name}" for a in node.names)
    return out


def _module_file(name: str) -> Path | None:
    base = ROOT / "lambdas" / Path(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


def test_every_third_party_module_the_lambdas_can_import_is_installed_by_the_image():
    """Follow imports (module- and function-level) from every handler and the gateway entry point:
    each third-party module reached must come from requirements.txt's dependency closure."""
    import sys
    from importlib.metadata import packages_distributions

    from stepwise.functions import FUNCTIONS

    lines = (ROOT / "lambdas" / "requirements.txt").read_text().splitlines()
    installed = _closure([ln.split("#", 1)[0].strip() for ln in lines if ln.split("#", 1)[0].strip()])
    providers = packages_distributions()
    roots = {spec.handler.rsplit(".", 1)[0] for spec in FUNCTIONS} | {"stepwise.gateway", "stepwise.gateway.__main__"}
    todo, seen, missing = list(roots), set(), {}
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        for imported in _imports(path):
            top = imported.split(".", 1)[0]
            if top == "stepwise":
                parts = imported.split(".")
                todo.extend(".".join(parts[:i]) for i in range(2, len(parts) + 1))
                continue
            if top in sys.stdlib_module_names:
                continue
            dists = {re.sub(r"[-_.]+", "-", d).lower() for d in providers.get(top, [])}
            if not dists & installed:
                missing.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    assert len(seen) > len(roots), "the import walk found no modules"
    assert not missing, f"reachable from a Lambda entry point but not installed by lambdas/requirements.txt: {missing}"
