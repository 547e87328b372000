"""The Lambda images install exactly the project's runtime dependencies, locked for their platform.

``lambdas/requirements.lock`` is pyproject.toml's ``[project] dependencies`` resolved by
``scripts/lock_image.py`` for the images' CPython 3.13 / manylinux_2_34 x86_64; both Dockerfiles
install exactly it. These tests fail when the lock and pyproject drift, and name the script to run.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from infra.image_platform import (LOCK, PYTHON_VERSION, dependencies_digest, normalize, read_lock, recorded_digest,
                                  runtime_dependencies)

ROOT = Path(__file__).resolve().parents[2]
RELOCK = "the lock is stale: run `python scripts/lock_image.py` (under the dev venv) and commit lambdas/requirements.lock"
DOCKERFILES = ("Dockerfile", "Dockerfile.gateway")


def _lock() -> dict[str, tuple[str, list[str]]]:
    return read_lock(LOCK.read_text())


def test_lock_records_the_digest_of_pyprojects_dependency_list():
    assert recorded_digest(LOCK.read_text()) == dependencies_digest(runtime_dependencies()), RELOCK


def test_every_runtime_dependency_is_pinned_within_pyprojects_specifiers():
    pins = _lock()
    for dep in runtime_dependencies():
        req = Requirement(dep)
        name = normalize(req.name)
        assert name in pins, f"{req.name} (pyproject.toml) is missing from the lock; {RELOCK}"
        version, _ = pins[name]
        assert req.specifier.contains(version, prereleases=True), f"{name}=={version} is outside {dep!r}; {RELOCK}"


def test_lock_entries_are_pinned_and_hashed():
    pins = _lock()
    assert len(pins) > 50, "the lock lists the whole resolution, not only the direct dependencies"
    assert all(len(hashes) == 1 for _, hashes in pins.values())
    with pytest.raises(ValueError):
        read_lock("numpy>=1.26\n")
    with pytest.raises(ValueError):
        read_lock("numpy==2.0\n")


def test_a_changed_dependency_list_is_a_stale_lock():
    deps = runtime_dependencies()
    assert dependencies_digest([*deps[:-1], deps[-1] + ",<99"]) != recorded_digest(LOCK.read_text())


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_dockerfile_installs_exactly_the_lock_on_the_lambda_python_base(dockerfile):
    text = (ROOT / "lambdas" / dockerfile).read_text()
    (base,) = re.findall(r"^FROM (\S*aws-lambda-python:\S+)", text, re.M)
    assert base.endswith(f":{PYTHON_VERSION}"), f"{dockerfile}: base {base}, lock is for CPython {PYTHON_VERSION}"
    assert re.search(r"^COPY requirements\.lock \$\{LAMBDA_TASK_ROOT\}/requirements\.lock$", text, re.M)
    (install,) = re.findall(r"^RUN (pip install .*)$", text, re.M)
    assert install.split() == ["pip", "install", "--no-cache-dir", "--only-binary=:all:", "--require-hashes", "--no-deps",
                               "-r", "${LAMBDA_TASK_ROOT}/requirements.lock"]
    assert re.search(r"^COPY stepwise/ \$\{LAMBDA_TASK_ROOT\}/stepwise/", text, re.M)


def test_only_the_gateway_image_carries_the_web_adapter():
    handler = (ROOT / "lambdas" / "Dockerfile").read_text()
    gateway = (ROOT / "lambdas" / "Dockerfile.gateway").read_text()
    # the extension would wait for a web server in the handler image
    assert "/opt/extensions" not in handler and "aws-lambda-adapter" not in handler
    assert re.search(r"^COPY --from=\S+ /lambda-adapter /opt/extensions/lambda-adapter$", gateway, re.M)
    assert re.search(r'^ENTRYPOINT \["python3\.13", "-m", "stepwise\.gateway"\]$', gateway, re.M)


def _resolve(path: str):
    module, _, attr = path.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def test_every_function_spec_names_a_callable_its_image_runs():
    """Each handler function's CMD resolves; the gateway's spec names what its ENTRYPOINT runs."""
    from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION

    for spec in FUNCTIONS:
        assert callable(_resolve(spec.handler)), spec.name
    main = _resolve(GATEWAY_FUNCTION.handler)
    assert callable(main)
    # ENTRYPOINT `python -m stepwise.gateway` runs __main__, which must call exactly this function
    tree = ast.parse((ROOT / "lambdas" / "stepwise" / "gateway" / "__main__.py").read_text())
    imported = {f"stepwise.gateway.{n.module}.{a.name}" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                and n.level == 1 for a in n.names}
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert GATEWAY_FUNCTION.handler in imported and GATEWAY_FUNCTION.handler.rsplit(".", 1)[1] in called
    assert f"{main.__module__}.{main.__name__}" == GATEWAY_FUNCTION.handler


def _imports(path: Path) -> list[str]:
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
    each third-party module reached must come from a distribution the lock installs."""
    import sys
    from importlib.metadata import packages_distributions

    from stepwise.functions import FUNCTIONS, GATEWAY_FUNCTION

    installed = set(_lock())
    providers = packages_distributions()
    roots = {spec.handler.rsplit(".", 1)[0] for spec in (*FUNCTIONS, GATEWAY_FUNCTION)} | {"stepwise.gateway", "stepwise.gateway.__main__"}
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
    assert not missing, f"reachable from a Lambda entry point but not installed by lambdas/requirements.lock: {missing}"


def test_platform_order_is_a_native_pips_on_amazon_linux_2023(monkeypatch):
    """The ``--platform`` list equals what pip's own packaging yields on glibc 2.34 x86_64, so the
    cross-resolution picks the wheel file (and hash) the image's pip picks."""
    from pip._vendor.packaging import _manylinux

    from infra.image_platform import GLIBC_MINOR, manylinux_platforms

    monkeypatch.setattr(_manylinux, "_get_glibc_version", lambda: (2, GLIBC_MINOR))
    monkeypatch.setattr(_manylinux, "_is_compatible", lambda arch, version: True)
    native = [p for p in _manylinux.platform_tags(["x86_64"]) if p.startswith("manylinux")]
    assert manylinux_platforms() == native


def test_every_locked_wheel_is_for_the_image_platform():
    from packaging.tags import Tag
    from packaging.utils import parse_wheel_filename

    from infra.image_platform import supported_tags

    ok = supported_tags()
    assert Tag("cp313", "cp313", "manylinux_2_28_x86_64") in ok
    assert Tag("cp313", "cp313", "manylinux_2_35_x86_64") not in ok  # newer glibc than AL2023's
    assert Tag("cp312", "cp312", "manylinux_2_28_x86_64") not in ok
    files = re.findall(r"^# (\S+\.whl)$", LOCK.read_text(), re.M)
    pins = _lock()
    assert len(files) == len(pins)
    for name in files:
        dist, version, _, tags = parse_wheel_filename(name)
        assert pins[normalize(dist)][0] == str(version), name
        assert set(tags) & ok, f"{name} does not install on CPython {PYTHON_VERSION} manylinux_2_34 x86_64"



# --- the example agents' image (local/agents/Dockerfile; the stack's deployMathAgent runtime) ----------------


def test_the_agent_lock_is_pyprojects_agent_extra_for_linux_arm64():
    from infra.image_platform import AGENT_ARCH, AGENT_GLIBC_MINOR, AGENT_LOCK, agent_dependencies, supported_tags
    from packaging.tags import Tag
    from packaging.utils import parse_wheel_filename

    relock = "the agent lock is stale: run `python scripts/lock_image.py --image agent` and commit local/agents/requirements.lock"
    text = AGENT_LOCK.read_text()
    assert recorded_digest(text) == dependencies_digest(agent_dependencies()), relock
    pins = read_lock(text)
    for dep in agent_dependencies():
        req = Requirement(dep)
        assert req.specifier.contains(pins[normalize(req.name)][0], prereleases=True), relock
    ok = supported_tags(AGENT_GLIBC_MINOR, AGENT_ARCH)
    assert Tag("cp313", "cp313", "manylinux_2_17_aarch64") in ok and Tag("cp313", "cp313", "manylinux_2_17_x86_64") not in ok
    files = re.findall(r"^# (\S+\.whl)$", text, re.M)
    assert len(files) == len(pins)
    for name in files:
        dist, version, _, tags = parse_wheel_filename(name)
        assert pins[normalize(dist)][0] == str(version), name
        assert set(tags) & ok, f"{name} does not install on CPython {PYTHON_VERSION} manylinux_2_{AGENT_GLIBC_MINOR} aarch64"


def test_the_agent_dockerfile_installs_exactly_the_lock_and_serves_the_agent_on_acrs_port():
    """By default (the example agents) the hashed lock, wheels only, and ``local.agents.math_agent:app``; an agent
    folder's build arguments (infra.agent_folder) name its own requirements and entrypoint."""
    text = (ROOT / "local" / "agents" / "Dockerfile").read_text()
    assert re.search(r"^ARG BASE_IMAGE=python:3\.13-slim-bookworm$", text, re.M)  # glibc 2.36 = AGENT_GLIBC_MINOR
    assert re.search(r"^FROM --platform=linux/arm64 \$\{BASE_IMAGE\}$", text, re.M)
    (install,) = re.findall(r"^RUN (set -f && pip install .*)$", text, re.M)
    assert install.split()[:9] == ["set", "-f", "&&", "pip", "install", "--no-cache-dir", "--only-binary=:all:", "-r",
                                   "/tmp/requirements.txt"]
    assert re.search(r"^ARG REQUIREMENTS=requirements\.lock$", text, re.M)  # hashed: pip checks every hash
    assert re.search(r'^CMD exec python -m uvicorn "\$\{STEPWISE_ENTRYPOINT\}" --host 0\.0\.0\.0 --port 8080$', text, re.M)
    assert re.search(r"^ARG ENTRYPOINT=local\.agents\.math_agent:app$", text, re.M)
    assert re.search(r"^ARG APP_DIR=local/agents$", text, re.M)
