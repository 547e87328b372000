"""Write ``lambdas/requirements.lock``: the Lambda images' exact, hashed set of wheels (and, with
``--image agent``, ``local/agents/requirements.lock``: the example agents' image).

    python scripts/lock_image.py                 # re-resolve pyproject's [project] dependencies
    python scripts/lock_image.py --check         # exit 1 if the lock's digest is stale
    python scripts/lock_image.py --image agent   # pyproject's `agent` extra for linux/arm64 (glibc 2.36)

pip is the resolver: ``pip install --dry-run --report`` under pyenv's CPython 3.13 (so
environment markers are evaluated for the image's Python), for the image's platform
(``infra/image_platform.py``: manylinux up to glibc 2.34, x86_64, wheels only). Every package
of the resolution is pinned with the sha256 of the one wheel pip chose; the header records
the digest of the dependency list it was made from (tests/infra/test_requirements.py fails when
pyproject.toml and the lock drift). The Dockerfiles install exactly this file with
``--require-hashes --no-deps --only-binary=:all:``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.image_platform import (  # noqa: E402
    ABI, AGENT_ARCH, AGENT_GLIBC_MINOR, AGENT_LOCK, ARCH, DIGEST_LINE, GLIBC_MINOR, LOCK, PYTHON_VERSION, ROOT,
    agent_dependencies, dependencies_digest, normalize, read_lock, recorded_digest, runtime_dependencies, target_args,
    target_python)

#: image -> (lock, dependencies, glibc minor, arch, what the image is, how to re-lock).
IMAGES = {
    "lambda": (LOCK, runtime_dependencies, GLIBC_MINOR, ARCH, "the Lambda images' runtime",
               "(amazon/aws-lambda-python:3.13, Amazon Linux 2023).", "pyproject.toml's [project] dependencies",
               "`python scripts/lock_image.py`"),
    "agent": (AGENT_LOCK, agent_dependencies, AGENT_GLIBC_MINOR, AGENT_ARCH, "the example agents' image",
              "(python:3.13-slim-bookworm for linux/arm64, AgentCore Runtime's platform).",
              "pyproject.toml's `agent` extra", "`python scripts/lock_image.py --image agent`"),
}


def resolve(dependencies: list[str], python: str, glibc_minor: int = GLIBC_MINOR, arch: str = ARCH) -> list[dict]:
    """pip's installation report (``install`` entries) for ``dependencies`` on the image platform."""
    with tempfile.TemporaryDirectory() as tmp:
        reqs = Path(tmp, "dependencies.txt")
        reqs.write_text("\n".join(dependencies) + "\n")
        report = Path(tmp, "report.json")
        cmd = [python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", str(report),
               *target_args(glibc_minor, arch), "--target", str(Path(tmp, "target")), "-r", str(reqs)]
        subprocess.run(cmd, check=True)
        return json.loads(report.read_text())["install"]


def render(dependencies: list[str], installs: list[dict], image: str = "lambda") -> str:
    _, _, glibc_minor, arch, what, base, source, command = IMAGES[image]
    lines = [
        f"# {what[0].upper()}{what[1:]}: every wheel, pinned and hashed. GENERATED, do not edit:",
        f"# run {command} after changing {source}.",
        f"# Target: CPython {PYTHON_VERSION} ({ABI}), manylinux_2_{glibc_minor}_{arch} and older, wheels only",
        f"# {base}",
        f"{DIGEST_LINE}{dependencies_digest(dependencies)}",
        "# made from:",
        *(f"#   {d}" for d in dependencies),
        "",
    ]
    for entry in sorted(installs, key=lambda e: normalize(e["metadata"]["name"])):
        name, version = normalize(entry["metadata"]["name"]), entry["metadata"]["version"]
        info = entry["download_info"]
        url = info["url"]
        sha256 = info.get("archive_info", {}).get("hashes", {}).get("sha256")
        if not url.endswith(".whl") or not sha256:
            raise SystemExit(f"{name} {version}: pip chose {url} without a wheel sha256; the image must not build from source")
        lines.append(f"# {url.rsplit('/', 1)[-1]}")
        lines.append(f"{name}=={version} \\")
        lines.append(f"    --hash=sha256:{sha256}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="only check the lock's digest against pyproject.toml")
    parser.add_argument("--image", choices=sorted(IMAGES), default="lambda",
                        help="which image's lock: the Lambda images (default) or the example agents'")
    args = parser.parse_args(argv)
    lock, deps_of, glibc_minor, arch, _, _, _, command = IMAGES[args.image]
    dependencies = deps_of()
    if args.check:
        stale = not lock.exists() or recorded_digest(lock.read_text()) != dependencies_digest(dependencies)
        print(f"{lock.relative_to(ROOT)}: {f'stale, run {command}' if stale else 'up to date'}")
        return 1 if stale else 0
    installs = resolve(dependencies, target_python(), glibc_minor, arch)
    text = render(dependencies, installs, args.image)
    read_lock(text)  # every entry parses as pinned and hashed
    lock.write_text(text)
    print(f"wrote {lock.relative_to(ROOT)}: {len(installs)} wheels for CPython {PYTHON_VERSION} manylinux_2_{glibc_minor}_{arch}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
