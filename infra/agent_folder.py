"""An agent folder: what a user hands Stepwise to train their own agent, read in one place (no CDK import).

An agent folder holds the agent's code and its own requirements, nothing of this repository:

- the **entrypoint** ``MODULE:ATTR`` (default ``agent:app``): ``MODULE`` a module of the folder
  (``agent.py``, or ``pkg/agent.py`` for ``pkg.agent``), ``ATTR`` its ``AgentCoreRLApp``;
- the **requirements** (default ``requirements.txt``): a pip requirements file, or a hashed lock (every line
  ``name==version --hash=sha256:...``, as ``pip-compile --generate-hashes`` or ``uv export`` write it). The agent
  side of ``agentcore-rl-toolkit`` (its ``AgentCoreRLApp``, which writes the rollout's result) must be there to
  serve the agent; when the file does not name the toolkit it is added with the version this repository's
  gateway speaks (`toolkit_requirement`, pyproject's ``agent`` extra), except to a hashed lock, which pip would
  then refuse (`AgentFolderError` says to add it).

The same folder is trained locally (``stepwise run-local CONFIG --agent FOLDER``: a virtual environment from its
requirements, `local.agent_env`), deployed as a training runtime (CDK context ``agentDir``, ``agentEntrypoint``,
``agentRequirements``, or ``stepwise agent deploy FOLDER``: `infra.agent_runtime`) and rehearsed without Docker
(``scripts/agent_image_rehearsal.py --folder FOLDER``). Its image is ``local/agents/Dockerfile`` built on the
staged copy `stage_context` makes (the folder without virtual environments, caches and run folders, plus that
Dockerfile).
"""

from __future__ import annotations

import hashlib
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: The agents' image recipe (linux/arm64, CPython 3.13): for the example agents and any agent folder.
DOCKERFILE = ROOT / "local" / "agents" / "Dockerfile"
#: Its name inside a staged agent folder (a user's own ``Dockerfile`` stays theirs, unused).
STAGED_DOCKERFILE = "Dockerfile.stepwise"
DEFAULT_ENTRYPOINT = "agent:app"
DEFAULT_REQUIREMENTS = "requirements.txt"
TOOLKIT = "agentcore-rl-toolkit"
#: What a staged copy leaves out: environments, caches, version control, run folders, CDK output.
IGNORED = (".venv", "venv", ".env", "env", "__pycache__", "*.pyc", ".git", ".hg", ".mypy_cache", ".pytest_cache",
           ".ruff_cache", "node_modules", "cdk.out", "runs-local", "runs", ".stepwise", STAGED_DOCKERFILE)
_ENTRYPOINT_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")
_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


class AgentFolderError(ValueError):
    """The agent folder cannot be used; the message names the folder, what is wrong and how to fix it."""


def toolkit_requirement() -> str:
    """The toolkit's agent side as this repository's gateway speaks it: pyproject's ``agent`` extra's
    ``agentcore-rl-toolkit[core]==0.2.*`` (the rollout contract of docs/agent-contract.md)."""
    from infra.image_platform import agent_dependencies, normalize

    for dep in agent_dependencies():
        name = _NAME_RE.match(dep)
        if name and normalize(name.group(1).split("[")[0]) == TOOLKIT:
            return dep
    raise AgentFolderError(f"pyproject.toml's agent extra names no {TOOLKIT}")


def requirement_names(text: str) -> set[str]:
    """The normalized distribution names a pip requirements file names (options, ``-r``/``-e`` lines and
    comments skipped; continuation lines joined)."""
    from infra.image_platform import normalize

    names = set()
    for line in re.sub(r"\\\n", " ", text).splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = _NAME_RE.match(line)
        if m:
            names.add(normalize(re.split(r"[\[<>=!~; @]", m.group(1))[0]))
    return names


def is_hashed(text: str) -> bool:
    """Whether pip would read the file in hash-checking mode (any ``--hash=``): then every requirement needs one."""
    return "--hash=" in text


@dataclass(frozen=True)
class AgentFolder:
    """One agent folder (see the module doc).

    Attributes:
        folder: the folder, absolute.
        module: the entrypoint's module (``agent``, ``pkg.agent``).
        attr: the entrypoint's app attribute (``app``).
        requirements: the requirements file, absolute ('' when the folder has none: run-local then serves the
            agent with this repository's own Python, as before agent folders; deploying needs one).
    """

    folder: Path
    module: str
    attr: str = "app"
    requirements: Path | None = None

    @classmethod
    def of(cls, folder: str | Path, entrypoint: str | None = None, requirements: str | None = None, *,
           need_requirements: bool = True) -> "AgentFolder":
        """The agent folder ``folder`` with ``entrypoint`` (``MODULE:ATTR``, default ``agent:app``) and
        ``requirements`` (a file name in the folder, default ``requirements.txt``).

        Raises:
            AgentFolderError: the folder, its entrypoint module or (when ``need_requirements``, or when named)
                its requirements file do not exist, or the entrypoint is not ``MODULE:ATTR``.
        """
        path = Path(folder).expanduser().resolve()
        if not path.is_dir():
            raise AgentFolderError(f"agent folder {path} does not exist (or is not a folder)")
        entry = entrypoint or DEFAULT_ENTRYPOINT
        if ":" not in entry:
            entry += ":app"
        if not _ENTRYPOINT_RE.match(entry):
            raise AgentFolderError(f"agent entrypoint {entry!r} is not MODULE:ATTR (e.g. agent:app, pkg.agent:app)")
        module, attr = entry.split(":")
        agent = cls(path, module, attr)
        if agent.module_file is None:
            rel = module.replace(".", "/")
            raise AgentFolderError(f"agent folder {path} has no {rel}.py (nor {rel}/__init__.py) for the entrypoint "
                                   f"{entry}; name the module that defines the AgentCoreRLApp")
        req = path / (requirements or DEFAULT_REQUIREMENTS)
        if req.is_file():
            return cls(path, module, attr, req)
        if need_requirements or requirements:
            raise AgentFolderError(f"agent folder {path} has no {req.name}: list the agent's own dependencies there "
                                   f"(its framework, and {toolkit_requirement()}), one pip requirement a line")
        return agent

    @classmethod
    def of_file(cls, path: str | Path, attr: str = "app", *, need_requirements: bool = False) -> "AgentFolder":
        """The agent folder of an agent file ``.../FOLDER/agent.py``: its folder, entrypoint ``agent:ATTR``."""
        file = Path(path).expanduser().resolve()
        if not file.is_file() or file.suffix != ".py":
            raise AgentFolderError(f"agent file {file} does not exist (or is not a .py file)")
        return cls.of(file.parent, f"{file.stem}:{attr}", need_requirements=need_requirements)

    @property
    def entrypoint(self) -> str:
        """``MODULE:ATTR``."""
        return f"{self.module}:{self.attr}"

    @property
    def name(self) -> str:
        """A name for the agent: the folder's name."""
        return self.folder.name

    @property
    def module_file(self) -> Path | None:
        """The entrypoint module's file in the folder (None when it has none)."""
        rel = Path(*self.module.split("."))
        for candidate in (self.folder / rel.with_suffix(".py"), self.folder / rel / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def requirements_text(self) -> str:
        return self.requirements.read_text() if self.requirements else ""

    def extra_requirements(self) -> list[str]:
        """What is installed besides the requirements file: the toolkit's agent side when the file does not name
        it (`toolkit_requirement`).

        Raises:
            AgentFolderError: a hashed lock that does not name the toolkit (pip refuses an unhashed addition).
        """
        text = self.requirements_text()
        if TOOLKIT in requirement_names(text):
            return []
        if is_hashed(text):
            raise AgentFolderError(f"{self.requirements} is a hashed lock without {TOOLKIT}: lock "
                                   f"{toolkit_requirement()} with the agent's other dependencies")
        return [toolkit_requirement()]

    def digest(self) -> str:
        """sha256 (hex, 16 characters) of what the agent's environment is made from: the requirements file's bytes
        and `extra_requirements` (what keys a cached environment, `local.agent_env`)."""
        h = hashlib.sha256(self.requirements_text().encode())
        h.update("\n".join(self.extra_requirements()).encode())
        return h.hexdigest()[:16]

    def stage_context(self, dest: Path) -> Path:
        """Copy the folder (without `IGNORED`) and `DOCKERFILE` (as `STAGED_DOCKERFILE`) into ``dest`` (emptied
        first): the Docker build context of the agent's image. Returns ``dest``."""
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(self.folder, dest, ignore=shutil.ignore_patterns(*IGNORED), symlinks=False)
        shutil.copyfile(DOCKERFILE, dest / STAGED_DOCKERFILE)
        return dest

    def build_args(self) -> dict[str, str]:
        """``local/agents/Dockerfile``'s build arguments for this folder: the requirements file, what else to
        install, where the folder goes (``/app``) and the app the image serves."""
        return {"REQUIREMENTS": self.requirements.name if self.requirements else DEFAULT_REQUIREMENTS,
                "EXTRA_REQUIREMENTS": " ".join(self.extra_requirements()), "APP_DIR": ".",
                "ENTRYPOINT": self.entrypoint}
