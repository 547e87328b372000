"""Where a command reads a run from: the deployed stack's bucket, or a local run folder.

``RUN`` names either a run id (the deployed stack, found as every operator command finds it:
`stepwise_cli.commands._runs.deployment`) or a local run folder ``runs-local/RUN_ID``, whose ``s3/``
is the copy of the run's objects `stepwise run-local` keeps when its stack stops. Both are read
through the same store interface (`stepwise.views.store.Store`), so a command shows a local run and a
deployed one the same way.
"""

from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stepwise import layout
from stepwise_cli.commands._runs import CommandError, Deployment, deployment, validate_run_id

#: The folder of a local run that holds its copy of the bucket (`local.report.mirror_run_objects`).
MIRROR = "s3"


class DirStore:
    """A folder laid out as the bucket (``{root}/{key}``), read like `stepwise.aws.runstore.RunStore`."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.bucket = str(self.root)

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents and path != self.root.resolve():
            raise KeyError(key)
        return path

    def get_bytes(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            raise KeyError(key) from None

    def get_json(self, key: str) -> Any:
        return json.loads(self.get_bytes(key))

    def get_json_or(self, key: str, default: Any = None) -> Any:
        try:
            return self.get_json(key)
        except (KeyError, ValueError):
            return default

    def list_keys(self, prefix: str) -> list[str]:
        """Every key under ``prefix``, sorted (S3's listing order)."""
        head = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        base = self.root / head
        if not base.is_dir():
            return []
        keys = (p.relative_to(self.root).as_posix() for p in base.rglob("*") if p.is_file())
        return sorted(k for k in keys if k.startswith(prefix))

    def put_bytes(self, key: str, body: bytes, *, content_type: str | None = None) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(body)


@dataclass
class RunSource:
    """A run to read: its id, a store holding its objects, and where that is (for messages);
    ``deployment`` is None for a local run folder, ``folder`` None for a deployed run."""

    run_id: str
    store: Any
    where: str
    deployment: Deployment | None = None
    folder: Path | None = None


def local_run_folder(target: str) -> Path | None:
    """``target`` as a local run folder (one holding ``s3/runs/RUN_ID/``), else None."""
    path = Path(target)
    return path if (path / MIRROR / layout.RUNS_PREFIX).is_dir() else None


def open_run(target: str, args: argparse.Namespace) -> RunSource:
    """The run ``target`` names: a local run folder, else a run id on the deployed stack.

    Raises:
        CommandError: a folder without the run's objects, or a run the bucket does not hold.
    """
    if not target.strip():
        raise CommandError("name a run: a run id on the deployed stack or a local run folder (runs-local/RUN_ID)")
    folder = local_run_folder(target)
    if folder is None and not Path(target).exists() and ("/" in target or os.sep in target):
        raise CommandError(f"no folder {target}: a local run folder is runs-local/RUN_ID (a run id holds no '/')")
    if folder is None and Path(target).is_dir():
        raise CommandError(f"{target} is a folder but not a local run folder: it has no {MIRROR}/runs/ "
                           "(a run made by `stepwise run-local` keeps its objects there)")
    if folder is not None:
        runs = sorted(p.name for p in (folder / MIRROR / layout.RUNS_PREFIX).iterdir() if p.is_dir())
        run_id = folder.name if folder.name in runs else (runs[0] if len(runs) == 1 else "")
        if not run_id:
            raise CommandError(f"{folder}/{MIRROR}/runs/ holds {len(runs)} runs ({', '.join(runs) or 'none'}); "
                               "expected the folder's own run")
        return RunSource(run_id, DirStore(folder / MIRROR), str(folder), folder=folder)
    from stepwise.aws.runstore import RunStore

    run_id = validate_run_id(target)
    dep = deployment(args)
    store = RunStore(dep.bucket, dep.s3)
    from stepwise.views.store import Unreadable, read_json

    try:
        config = read_json(store, layout.config_key(run_id))
    except Unreadable as e:  # a damaged config.json: one line naming it
        raise CommandError(str(e)) from None
    if config is None:
        raise CommandError(f"run {run_id!r} not found: s3://{dep.bucket}/{layout.config_key(run_id)} does not exist")
    return RunSource(run_id, store, f"s3://{dep.bucket}/{layout.run_prefix(run_id)}", deployment=dep)
