"""An agent folder's own Python environment for the local stack, as AgentCore Runtime gives the agent its own image.

``stepwise run-local CONFIG --agent FOLDER`` serves the user's agent from a virtual environment built from the
folder's own requirements (`infra.agent_folder.AgentFolder`: its ``requirements.txt`` or lock, plus the
toolkit's agent side when it does not name it), never from this repository's ``.venv``: the agent's framework
(Strands, LangGraph, ...) stays out of the project's environment, and a dependency the folder forgot fails here
as it would in the image. `prepare`:

1. **builds** the environment once per requirements (``python -m venv --without-pip``, then this interpreter's
   pip installs into it with ``--python``), cached under ``~/.cache/stepwise-agents/env-{digest}``
   (``$STEPWISE_AGENT_ENV_CACHE``), keyed by `AgentFolder.digest` (the requirements' bytes, what is added to
   them) and the Python version; a file lock lets concurrent runs share one build; a build cut short is redone;
2. **gives it the serving shim**: ``local/agents/serve.py``, ``local/no_aws.py`` and ``local/_proc.py`` (what
   serves an app as an ACR container does, keeps it off AWS and ends it with the local stack; stdlib and botocore only) copied into ``{env}/stepwise-serve/`` on every prepare, first on the
   agent process's ``PYTHONPATH`` and nothing else of this repository;
3. **imports the agent** in it before anything starts (``python -m local.agents.serve MODULE:ATTR --check``, from
   the folder): a missing framework is `AgentEnvironmentError` quoting the import error, not a run whose every
   rollout fails with it hidden in a log file.

A folder without a requirements file is served with this repository's Python (as before agent folders), after
the same import check, whose error then says to add one.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from infra.agent_folder import AgentFolder
from local import REPO_ROOT

#: Where environments are cached (one folder per digest), unless ``$STEPWISE_AGENT_ENV_CACHE`` says otherwise.
DEFAULT_CACHE = Path.home() / ".cache" / "stepwise-agents"
#: At most this many environments are kept; the least recently used beyond it are removed after a build.
KEEP = 8
#: The shim's files, relative to the repository and to ``{env}/stepwise-serve/``.
SHIM_FILES = ("local/no_aws.py", "local/_proc.py", "local/agents/serve.py")
#: Seconds one environment build may take (pip resolving and downloading a framework's dependency tree).
BUILD_TIMEOUT_S = 1200.0
#: Seconds the import check may take (a framework's import time on a busy machine).
CHECK_TIMEOUT_S = 180.0


class AgentEnvironmentError(RuntimeError):
    """The agent's environment cannot be built, or the agent does not import in it; the message says which
    and quotes the tool's own last lines (pip's error, the ImportError)."""


def cache_root() -> Path:
    return Path(os.environ.get("STEPWISE_AGENT_ENV_CACHE") or DEFAULT_CACHE)


@dataclass(frozen=True)
class AgentLaunch:
    """How the ACR emulator starts the agent's process (`local.acr.AgentProcess`): ``python -m
    local.agents.serve SPEC`` with this interpreter, in ``cwd``, with ``env`` over the stack's environment.

    Attributes:
        spec: ``MODULE:ATTR``, imported from ``cwd``.
        python: the interpreter (the agent environment's, or this one's).
        cwd: the agent folder.
        env: ``PYTHONPATH`` (the serving shim) when the agent has its own environment.
        venv: the environment's folder (None: this repository's Python).
        built_s: seconds spent building the environment now (0 when it came from the cache).
    """

    spec: str
    python: str
    cwd: str
    env: dict[str, str] = field(default_factory=dict)
    venv: str | None = None
    built_s: float = 0.0

    def __str__(self) -> str:
        where = f"its environment {self.venv}" if self.venv else "this repository's Python"
        return f"{self.spec} in {self.cwd} ({where})"


def _tail(text: str, lines: int = 15) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@contextlib.contextmanager
def _locked(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def environment_key(agent: AgentFolder) -> str:
    """The cache key of ``agent``'s environment: its requirements' digest and this Python's ``major.minor``."""
    return hashlib.sha256(f"{agent.digest()} py{sys.version_info[0]}.{sys.version_info[1]}".encode()).hexdigest()[:16]


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def build_environment(agent: AgentFolder, *, log=None) -> tuple[Path, float]:
    """The agent's cached virtual environment, built when missing: ``(folder, seconds spent building now)``.

    Raises:
        AgentEnvironmentError: ``python -m venv`` or pip failed (pip's last lines quoted).
    """
    root = cache_root()
    key = environment_key(agent)
    venv = root / f"env-{key}"
    done = venv / ".complete"
    with _locked(root / f"env-{key}.lock"):
        if done.exists():
            done.touch()  # most recently used
            return venv, 0.0
        t0 = time.monotonic()
        if log:
            log(f"building the agent's environment from {agent.requirements} (cached in {venv}) ...")
        shutil.rmtree(venv, ignore_errors=True)
        run = subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)],  # noqa: SLF001
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise AgentEnvironmentError(f"python -m venv {venv} failed:\n{_tail(run.stderr)}")
        cmd = [sys.executable, "-m", "pip", "--python", str(venv_python(venv)), "install", "--quiet",
               "--disable-pip-version-check", "-r", str(agent.requirements), *agent.extra_requirements()]
        try:
            run = subprocess.run(cmd, capture_output=True, text=True, cwd=agent.folder, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise AgentEnvironmentError(f"installing {agent.requirements} took more than {BUILD_TIMEOUT_S:.0f} s") from None
        if run.returncode != 0:
            shutil.rmtree(venv, ignore_errors=True)
            raise AgentEnvironmentError(f"the agent's requirements {agent.requirements} do not install "
                                        f"(pip install -r):\n{_tail(run.stderr or run.stdout)}")
        done.write_text(f"{agent.requirements}\n")
        built = time.monotonic() - t0
    _prune(root, keep=venv)
    return venv, built


def _prune(root: Path, keep: Path) -> None:
    """Remove the least recently used environments beyond `KEEP` (never ``keep``)."""
    envs = sorted((p for p in root.glob("env-*") if p.is_dir() and (p / ".complete").exists()),
                  key=lambda p: (p / ".complete").stat().st_mtime, reverse=True)
    for old in envs[KEEP:]:
        if old != keep:
            with contextlib.suppress(OSError), _locked(root / f"{old.name}.lock"):
                shutil.rmtree(old, ignore_errors=True)


def write_shim(venv: Path) -> Path:
    """Copy `SHIM_FILES` into ``{venv}/stepwise-serve/`` (the package ``local`` with only them); returns it."""
    shim = venv / "stepwise-serve"
    for rel in SHIM_FILES:
        dest = shim / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / rel, dest)
    (shim / "local" / "__init__.py").write_text("")
    return shim


def check_import(launch: AgentLaunch) -> None:
    """Import the agent's app in its process's environment, as the ACR emulator will start it.

    Raises:
        AgentEnvironmentError: it does not import (the import error quoted, and what to do).
    """
    # as the local stack starts it: moto's dummy credentials (an app that builds its S3 client at import time
    # must not look for real ones, let alone ask the instance metadata service)
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           **os.environ, "AWS_EC2_METADATA_DISABLED": "true", **launch.env}
    if not os.environ.get("AWS_ACCESS_KEY_ID"):
        env.pop("AWS_SESSION_TOKEN", None)
        env.pop("AWS_PROFILE", None)
    try:
        run = subprocess.run([launch.python, "-m", "local.agents.serve", launch.spec, "--check"], cwd=launch.cwd,
                             env=env, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise AgentEnvironmentError(f"importing the agent {launch} took more than {CHECK_TIMEOUT_S:.0f} s") from None
    if run.returncode == 0:
        return
    hint = ("add what it imports to the folder's requirements (and its cached environment is rebuilt)" if launch.venv
            else "put a requirements.txt beside it listing what it imports (its framework, agentcore-rl-toolkit[core]): "
                 "run-local then serves it from an environment of its own")
    raise AgentEnvironmentError(f"the agent {launch.spec} does not import in {launch.venv or sys.executable}:\n"
                                f"{_tail(run.stderr or run.stdout, 8)}\n{hint}")


def prepare(agent: AgentFolder, *, log=None) -> AgentLaunch:
    """The agent's launch, its environment built (or taken from the cache) and its import checked (module doc).

    Raises:
        AgentEnvironmentError: as `build_environment` and `check_import`.
    """
    if agent.requirements is None:
        launch = AgentLaunch(agent.entrypoint, sys.executable, str(agent.folder))
    else:
        venv, built = build_environment(agent, log=log)
        shim = write_shim(venv)
        launch = AgentLaunch(agent.entrypoint, str(venv_python(venv)), str(agent.folder),
                             env={"PYTHONPATH": str(shim)}, venv=str(venv), built_s=built)
    check_import(launch)
    return launch
