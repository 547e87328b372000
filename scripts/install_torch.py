"""Install the CPU build of torch into the running interpreter's environment (`make install-local` runs it).

    .venv/bin/python scripts/install_torch.py

The local stack runs torch on the CPU only (the simulator's tiny model). On Linux x86_64 the torch wheel
pip picks from the Python Package Index is the CUDA build, which pulls about 3 GB of GPU libraries
(``cuda-toolkit``, ``nvidia-*``, ``triton``) nobody here uses; the CPU builds are published on PyTorch's
own index, which uv knows by name (``uv pip install --torch-backend=cpu``, uv >= 0.7.14), so this script
writes no index address of its own:

1. ask pip which torch wheel it would install (``pip install --dry-run --report``, nothing downloaded but
   the wheel's metadata): when that build needs no GPU library on this platform (a ``+cpu`` wheel found
   locally, macOS, Windows), install it with pip;
2. otherwise install uv from the package index and let it install the CPU build (``--torch-backend=cpu``).

Either way ``pip install -e .[local]`` afterwards finds torch satisfied and installs nothing of CUDA.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

#: The torch the local stack is tested with (CPU; pyproject's `local` extra accepts >= 2.6).
TORCH = "torch==2.13.0"
#: uv's --torch-backend left preview in 0.7.14.
UV = "uv>=0.7.14,<1"
#: Distributions that mean "a GPU build" when torch requires them on this platform.
GPU_PREFIXES = ("nvidia-", "cuda-", "triton")


def gpu_requirements(requires_dist: list[str]) -> list[str]:
    """The GPU libraries among a torch wheel's ``Requires-Dist`` that apply on this interpreter and platform
    (markers evaluated here, extras not requested)."""
    try:
        from packaging.requirements import Requirement
    except ImportError:  # a fresh venv has only pip, which vendors packaging
        from pip._vendor.packaging.requirements import Requirement

    out = []
    for line in requires_dist:
        req = Requirement(line)
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if req.name.lower().startswith(GPU_PREFIXES):
            out.append(req.name)
    return out


def pip_choice(python: str = sys.executable, spec: str = TORCH) -> dict[str, Any]:
    """The torch pip would install (its ``--report`` entry: ``metadata`` and ``download_info``)."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp, "report.json")
        subprocess.run([python, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--no-deps",
                        "--report", str(report), spec], check=True)
        (entry,) = [e for e in json.loads(report.read_text())["install"] if e["metadata"]["name"].lower() == "torch"]
        return entry


def main(argv: list[str] | None = None) -> int:
    python = sys.executable
    choice = pip_choice(python)
    version = choice["metadata"]["version"]
    gpu = gpu_requirements(choice["metadata"].get("requires_dist") or [])
    if not gpu:
        print(f"install_torch: pip's torch {version} is a CPU build here; installing it with pip", flush=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", TORCH], check=True)
        return 0
    print(f"install_torch: pip's torch {version} would pull GPU libraries ({', '.join(sorted(gpu)[:4])}, ...); "
          f"installing the CPU build with uv --torch-backend=cpu", flush=True)
    subprocess.run([python, "-m", "pip", "install", "--quiet", UV], check=True)
    subprocess.run([python, "-m", "uv", "pip", "install", "--python", python, "--torch-backend=cpu", TORCH], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
