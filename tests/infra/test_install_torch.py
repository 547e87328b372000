"""The local stack installs only what it runs: torch's CPU build, never the CUDA build's GPU libraries
(scripts/install_torch.py, which `make install-local` runs before the `local` extra)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: torch 2.13.0's Requires-Dist on the Python Package Index (its Linux x86_64 wheel is the CUDA build).
PYPI_TORCH = ['filelock', 'typing-extensions>=4.10.0', 'setuptools>=77.0.3', 'sympy>=1.13.3', 'networkx>=2.5.1', 'jinja2',
              'fsspec>=0.8.5', 'cuda-toolkit[cublas,cudart,cufft,cufile,cupti,curand,cusolver,cusparse,nvjitlink,nvrtc,nvtx]'
              '==13.0.3; platform_system == "Linux"', 'nvidia-cudnn-cu13==9.20.0.48; platform_system == "Linux"',
              'triton==3.7.1; platform_system == "Linux" and python_version < "3.15"', 'optree>=0.13.0; extra == "optree"']
CPU_TORCH = ['filelock', 'typing-extensions>=4.10.0', 'sympy>=1.13.3', 'networkx>=2.5.1', 'jinja2', 'fsspec>=0.8.5']


@pytest.fixture(scope="module")
def script():
    spec = importlib.util.spec_from_file_location("install_torch", ROOT / "scripts" / "install_torch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_cuda_build_is_recognised_by_its_gpu_requirements_on_linux(script, monkeypatch):
    import platform

    if platform.system() == "Linux":
        assert set(script.gpu_requirements(PYPI_TORCH)) == {"cuda-toolkit", "nvidia-cudnn-cu13", "triton"}
    assert script.gpu_requirements(CPU_TORCH) == []
    assert script.gpu_requirements(['optree>=0.13.0; extra == "optree"', 'nvidia-x; sys_platform == "nonesuch"']) == []


def test_make_installs_torch_through_the_script_before_the_local_extra():
    """Before, the Makefile ran `pip install torch==2.13.0`, which on a Linux x86_64 machine without a local CPU
    wheel takes the CUDA build and ~3 GB of nvidia wheels."""
    recipe = (ROOT / "Makefile").read_text().split("$(VENV)/.local-installed:", 1)[1].split("\n\n", 1)[0]
    lines = [line.strip() for line in recipe.splitlines()[1:] if line.strip()]
    assert lines[0] == "$(PY) scripts/install_torch.py" and lines[1].startswith('$(PIP) install -q -e ".[local]"')
    assert not re.search(r"pip install[^\n]*\btorch\b", recipe)


def test_this_environment_has_no_gpu_library():
    """The venv `make` built here: torch is the CPU build and no nvidia/cuda distribution is installed."""
    from importlib.metadata import distributions

    gpu = sorted(d.metadata["Name"] for d in distributions() if d.metadata["Name"].lower().startswith(("nvidia-", "cuda-")))
    assert gpu == []



def test_the_script_reads_requirements_in_a_fresh_venv_that_has_only_pip(tmp_path):
    """`make install-local` runs it in a new venv, where pip is all there is (the fresh-clone walk found it
    importing `packaging`, which only pip vendors there)."""
    import subprocess
    import sys

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import packaging"], capture_output=True).returncode != 0
    probe = ("import importlib.util, sys; spec = importlib.util.spec_from_file_location('t', sys.argv[1]); "
             "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m); "
             "print(m.gpu_requirements(['nvidia-x; python_version >= \"3\"', 'filelock']))")
    out = subprocess.run([python, "-c", probe, str(ROOT / "scripts" / "install_torch.py")], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "['nvidia-x']", out.stderr
