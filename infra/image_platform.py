"""The images' Python platforms, in one place: ``scripts/lock_image.py`` and the rehearsals
(``scripts/image_rehearsal.py``, ``scripts/agent_image_rehearsal.py``) resolve for them, and the
Dockerfiles' base images name them (tests/infra/test_requirements.py checks they agree). Needs no CDK.

- The Lambda images start ``FROM amazon/aws-lambda-python:3.13`` (Amazon Linux 2023, glibc 2.34, x86_64):
  ``LOCK``, ``GLIBC_MINOR``, ``ARCH``; their dependencies are pyproject's ``[project] dependencies``.
- The example agents' image (``local/agents/Dockerfile``, the training runtime the stack creates with
  ``deployMathAgent``) starts ``FROM python:3.13-slim-bookworm`` (Debian 12, glibc 2.36) for linux/arm64,
  the platform AgentCore Runtime runs: ``AGENT_LOCK``, ``AGENT_GLIBC_MINOR``, ``AGENT_ARCH``; its
  dependencies are pyproject's ``agent`` extra.
"""

from __future__ import annotations

import glob
import hashlib
import os
import re
import subprocess
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "lambdas" / "requirements.lock"

#: CPython of the Lambda base image (``amazon/aws-lambda-python:<PYTHON_VERSION>``).
PYTHON_VERSION = "3.13"
#: The interpreter of the base image by the one name CPython's install always creates
#: (``bin/python3.13``; ``make altinstall`` creates no ``python3``, nothing creates ``python``), on the
#: image's PATH (its Dockerfile: ``/var/lang/bin`` first).
INTERPRETER = f"python{PYTHON_VERSION}"
GATEWAY_DOCKERFILE = ROOT / "lambdas" / "Dockerfile.gateway"


def image_entrypoint(dockerfile: Path = GATEWAY_DOCKERFILE) -> list[str]:
    """The exec-form ``ENTRYPOINT [...]`` of ``dockerfile`` (its last one). Raises ValueError when it
    has none or a shell-form one (which would start a shell first)."""
    import json

    lines = [ln.strip() for ln in dockerfile.read_text().splitlines() if ln.strip().upper().startswith("ENTRYPOINT")]
    if not lines:
        raise ValueError(f"{dockerfile} has no ENTRYPOINT")
    body = lines[-1][len("ENTRYPOINT"):].strip()
    try:
        argv = json.loads(body)
    except ValueError:
        raise ValueError(f"{dockerfile}: ENTRYPOINT {body!r} is not the exec form [\"prog\", ...]") from None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise ValueError(f"{dockerfile}: ENTRYPOINT {body!r} is not a list of strings")
    return argv
ABI = "cp" + PYTHON_VERSION.replace(".", "")
#: Amazon Linux 2023's glibc: the newest manylinux tag the image's pip accepts.
GLIBC_MINOR = 34
ARCH = "x86_64"

#: The example agents' image: its lock, Debian 12's glibc and AgentCore Runtime's architecture.
AGENT_LOCK = ROOT / "local" / "agents" / "requirements.lock"
AGENT_GLIBC_MINOR = 36
AGENT_ARCH = "aarch64"
AGENT_EXTRA = "agent"


def manylinux_platforms(glibc_minor: int = GLIBC_MINOR, arch: str = ARCH) -> list[str]:
    """The manylinux platform tags a native pip on glibc ``2.<glibc_minor>`` accepts, in its order
    of preference (packaging's ``_manylinux.platform_tags``: newest first, each legacy alias right
    after the glibc it stands for). Passed to pip as ``--platform`` so a cross-resolution picks
    the same wheel file, hence the same hash, as the image's own pip. (pip also expands
    ``manylinux2014`` into ``manylinux2010`` and ``manylinux1`` right after it, so its order
    differs from a native pip's only between those two aliases and ``manylinux_2_5`` ..
    ``manylinux_2_16``; a release with files for both would make the image's ``--require-hashes``
    install fail loudly, never install another file.)"""
    aliases = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
    out = []
    for minor in range(glibc_minor, 4, -1):
        out.append(f"manylinux_2_{minor}_{arch}")
        if minor in aliases:
            out.append(f"{aliases[minor]}_{arch}")
    return out


def supported_tags(glibc_minor: int = GLIBC_MINOR, arch: str = ARCH) -> set:
    """Every wheel tag (``packaging.tags.Tag``) the image's pip accepts: CPython 3.13 with the
    cp313 ABI (and abi3/none), on ``manylinux_platforms()`` or any platform for pure wheels."""
    from packaging import tags

    version = tuple(int(x) for x in PYTHON_VERSION.split("."))
    platforms = manylinux_platforms(glibc_minor, arch)
    return set(tags.cpython_tags(version, abis=[ABI], platforms=platforms)) | set(
        tags.compatible_tags(version, interpreter=ABI, platforms=platforms))


def target_args(glibc_minor: int = GLIBC_MINOR, arch: str = ARCH) -> list[str]:
    """pip options that make it resolve for the image instead of the running interpreter."""
    args = ["--only-binary=:all:", "--python-version", PYTHON_VERSION, "--implementation", "cp", "--abi", ABI]
    for platform in manylinux_platforms(glibc_minor, arch):
        args += ["--platform", platform]
    return args


def runtime_dependencies() -> list[str]:
    """``pyproject.toml``'s ``[project] dependencies``, as written (the Lambdas' runtime)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def agent_dependencies() -> list[str]:
    """``pyproject.toml``'s ``agent`` extra, as written (the example agents' image)."""
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][AGENT_EXTRA]


def dependencies_digest(dependencies: list[str]) -> str:
    """sha256 (hex) of the dependency strings joined by newlines: the lock's header records it,
    so a changed dependency list is a stale lock even before any pin falls outside it."""
    return hashlib.sha256("\n".join(dependencies).encode()).hexdigest()


def target_python() -> str:
    """Path of pyenv's CPython ``PYTHON_VERSION`` interpreter (``$(pyenv root)/versions/3.13.*``).

    Raises SystemExit naming what to install when there is none.
    """
    root = os.environ.get("PYENV_ROOT")
    if not root:
        try:
            root = subprocess.run(["pyenv", "root"], capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            root = str(Path.home() / ".pyenv")
    found = sorted(glob.glob(f"{root}/versions/{PYTHON_VERSION}.*/bin/python{PYTHON_VERSION}"),
                   key=lambda p: [int(x) if x.isdigit() else 0 for x in Path(p).parents[1].name.split(".")])
    if not found:
        raise SystemExit(f"no CPython {PYTHON_VERSION} under {root}/versions (the Lambda image's Python): "
                         f"install one with `pyenv install {PYTHON_VERSION}`")
    return found[-1]


#: The lock header's line that records ``dependencies_digest`` of the list it was made from.
DIGEST_LINE = "# dependencies-sha256: "


def normalize(name: str) -> str:
    """PEP 503 normalized distribution name."""
    return re.sub(r"[-_.]+", "-", name).lower()


def recorded_digest(text: str) -> str | None:
    """The dependency digest in a lock's header (None if it has none)."""
    for line in text.splitlines():
        if line.startswith(DIGEST_LINE):
            return line[len(DIGEST_LINE):].strip()
    return None


def read_lock(text: str) -> dict[str, tuple[str, list[str]]]:
    """The pins of a lock: normalized name -> (version, sha256 hex digests).

    Raises ValueError for an entry that is not ``name==version`` with at least one sha256 hash.
    """
    out: dict[str, tuple[str, list[str]]] = {}
    joined = re.sub(r"\\\n\s*", " ", text)
    for line in joined.splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)((?:\s+--hash=sha256:[0-9a-f]{64})+)", line)
        if m is None:
            raise ValueError(f"not a pinned, hashed requirement: {line!r}")
        out[normalize(m.group(1))] = (m.group(2), re.findall(r"sha256:([0-9a-f]{64})", m.group(3)))
    return out
