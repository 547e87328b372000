"""The image rehearsal's own checks (scripts/image_rehearsal.py): a downloaded file counts only as
the lock's wheel for the image platform. The rehearsal itself runs in CI (`make image-rehearsal`)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "image_rehearsal.py"


@pytest.fixture(scope="module")
def rehearsal():
    spec = importlib.util.spec_from_file_location("image_rehearsal", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _wheels(tmp_path: Path, files: dict[str, bytes]) -> Path:
    for name, body in files.items():
        (tmp_path / name).write_bytes(body)
    return tmp_path


def _pins(**bodies: bytes) -> dict[str, tuple[str, list[str]]]:
    return {name: ("1.0", [hashlib.sha256(body).hexdigest()]) for name, body in bodies.items()}


def test_the_pinned_wheel_for_the_image_platform_passes(rehearsal, tmp_path):
    wheels = _wheels(tmp_path, {"foo-1.0-cp313-cp313-manylinux_2_28_x86_64.whl": b"foo",
                                "bar-1.0-py3-none-any.whl": b"bar",
                                "foo-0.9-cp313-cp313-manylinux_2_28_x86_64.whl": b"old lock"})
    found = rehearsal.check_wheels(_pins(foo=b"foo", bar=b"bar"), wheels)
    assert sorted(p.name for p in found) == ["bar-1.0-py3-none-any.whl", "foo-1.0-cp313-cp313-manylinux_2_28_x86_64.whl"]


@pytest.mark.parametrize("name, why", [
    ("foo-1.0-cp313-cp313-manylinux_2_35_x86_64.whl", "no tag"),  # needs a newer glibc than AL2023's
    ("foo-1.0-cp312-cp312-manylinux_2_28_x86_64.whl", "no tag"),  # another CPython
    ("foo-1.0-cp313-cp313-manylinux_2_28_aarch64.whl", "no tag"),  # another architecture
    ("foo-1.0.tar.gz", "not a wheel"),
])
def test_a_file_the_image_cannot_install_fails(rehearsal, tmp_path, name, why):
    wheels = _wheels(tmp_path, {name: b"foo"})
    with pytest.raises(rehearsal.RehearsalFailed, match=why):
        rehearsal.check_wheels(_pins(foo=b"foo"), wheels)


def test_a_wheel_with_another_hash_is_not_the_locked_one(rehearsal, tmp_path):
    wheels = _wheels(tmp_path, {"foo-1.0-cp313-cp313-manylinux_2_28_x86_64.whl": b"tampered"})
    with pytest.raises(rehearsal.RehearsalFailed, match=r"sha256 for \['foo==1.0'\]"):
        rehearsal.check_wheels(_pins(foo=b"foo"), wheels)


def test_the_agent_rehearsal_runs_only_the_locks_versions_and_pure_wheels_of_the_locks_bytes(tmp_path):
    """scripts/agent_image_rehearsal.py runs x86_64 twins of the arm64 lock: a pure wheel must be the lock's very
    file (its sha256), a binary one only the same version; a missing version fails."""
    spec = importlib.util.spec_from_file_location("agent_image_rehearsal", SCRIPT.with_name("agent_image_rehearsal.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pins = {"pure": ("1.0", [hashlib.sha256(b"pure").hexdigest()]), "fast": ("2.0", [hashlib.sha256(b"arm64").hexdigest()])}
    wheels = _wheels(tmp_path, {"pure-1.0-py3-none-any.whl": b"pure",
                                "fast-2.0-cp313-cp313-manylinux_2_17_x86_64.whl": b"x86_64 build",
                                "fast-1.9-cp313-cp313-manylinux_2_17_x86_64.whl": b"older"})
    files, identical, binary = module.twins(pins, wheels)
    assert sorted(p.name for p in files) == ["fast-2.0-cp313-cp313-manylinux_2_17_x86_64.whl", "pure-1.0-py3-none-any.whl"]
    assert (identical, binary) == (1, ["fast==2.0"])
    (wheels / "pure-1.0-py3-none-any.whl").write_bytes(b"another file")
    with pytest.raises(module.RehearsalFailed, match="not the lock's"):
        module.twins(pins, wheels)
    (wheels / "pure-1.0-py3-none-any.whl").unlink()
    with pytest.raises(module.RehearsalFailed, match="pure"):
        module.twins(pins, wheels)


def test_the_gateway_image_starts_the_interpreter_its_base_image_is_known_to_have(rehearsal, tmp_path):
    """The gateway image's ENTRYPOINT names the base image's CPython by the name its install always
    creates (``python3.13``, first on the image's PATH in /var/lang/bin), not a bare ``python`` no
    install creates; the rehearsal starts the gateway by that name, looked up among those names only."""
    import re
    import sys

    from infra.image_platform import GATEWAY_DOCKERFILE, INTERPRETER, PYTHON_VERSION, image_entrypoint

    entry = image_entrypoint()
    (base,) = re.findall(r"^FROM (amazon/aws-lambda-python:\S+)$", GATEWAY_DOCKERFILE.read_text(), re.M)
    assert base == f"amazon/aws-lambda-python:{PYTHON_VERSION}" and INTERPRETER == f"python{PYTHON_VERSION}"
    assert entry == [INTERPRETER, "-m", "stepwise.gateway"]
    found = rehearsal.entrypoint_interpreter(entry, sys.executable, tmp_path)
    assert Path(found).name == INTERPRETER and Path(found).resolve() == Path(sys.executable).resolve()
    for bad in (["python", "-m", "stepwise.gateway"], ["python3", "-m", "stepwise.gateway"], [INTERPRETER, "app.py"]):
        with pytest.raises(rehearsal.RehearsalFailed):
            rehearsal.entrypoint_interpreter(bad, sys.executable, tmp_path)
