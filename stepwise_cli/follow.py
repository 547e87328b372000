"""One run followed while it runs: its executions and its step and eval summaries.

`stepwise watch` (any deployment) and `stepwise run-local` (moto) follow a run the same way, with
`RunFollower`: the run's executions are its first one and its continuations
(`stepwise.executions.belongs_to`), the newest one is the run's status, and the run has ended when
the newest is terminal and did not hand over to a continuation. Its summaries are read by
`SummaryCache`. What each command shows of them is its own (`stepwise_cli.commands.watch.Watcher`
prints the table, `local.run.LocalFollower` writes the run folder and drives the progress bar).

Kept light (boto3 and the stdlib), like `stepwise_cli.commands._runs`.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from stepwise import layout
from stepwise.executions import TERMINAL_STATUSES
from stepwise_cli.commands._runs import Deployment, run_executions, run_state, step_folders

_MISSING = ("NoSuchKey", "404", "NotFound")


@dataclass
class SummaryCache:
    """Step and eval summaries of one run, re-read only when their ETag changes.

    ``steps`` / ``evals``: ``{step: summary}``; ``written``: ``{(kind, step): LastModified}``.
    ``probe_steps``: find new train steps by reading the next one (``steps/{last + 1}/``) instead
    of listing ``steps/`` (train steps are numbered 0, 1, 2, ... with no gap). For moto, whose
    ListObjectsV2 scans every key of the bucket whatever the prefix and delimiter, so a listing
    every half second cost more as the run wrote rollout records (`stepwise run-local`).
    """

    run_id: str
    probe_steps: bool = False
    steps: dict[int, dict[str, Any]] = field(default_factory=dict)
    evals: dict[int, dict[str, Any]] = field(default_factory=dict)
    written: dict[tuple[str, int], datetime] = field(default_factory=dict)
    _etags: dict[str, str] = field(default_factory=dict)

    def refresh(self, s3: Any, bucket: str, *, full: bool = False) -> list[tuple[str, int]]:
        """Read new or changed summaries; returns ``[(kind, step), ...]`` that changed, in step order.

        Lists step folders with a delimiter (never the rollout objects under them), reads each
        summary once, and re-reads only the newest two of each kind (train metrics are merged
        into a summary after its first write). With ``probe_steps``, train steps are probed
        unless ``full`` (at the end of a run, when nothing may be missed).
        """
        changed: list[tuple[str, int]] = []
        for kind, target in (("steps", self.steps), ("evals", self.evals)):
            probe = kind == "steps" and self.probe_steps and not full
            steps = sorted(target) if probe else step_folders(s3, bucket, layout.summaries_prefix(self.run_id, kind))
            recent = set(steps[-2:])
            for step in steps:
                if step in target and step not in recent:
                    continue
                if self._read(s3, bucket, kind, step, target):
                    changed.append((kind, step))
            while probe:
                step = max(target, default=-1) + 1
                probe = self._read(s3, bucket, kind, step, target) is not None
                if probe:
                    changed.append((kind, step))
        return sorted(changed, key=lambda c: (c[1], c[0]))

    def _read(self, s3: Any, bucket: str, kind: str, step: int, target: dict[int, dict[str, Any]]) -> bool | None:
        """Read one summary into ``target``: True when it is new or changed, False when unchanged,
        None when it does not exist (yet)."""
        key = layout.step_summary_key(self.run_id, kind, step)
        try:
            obj = s3.get_object(Bucket=bucket, Key=key)
        except Exception as e:  # not written yet
            if getattr(e, "response", {}).get("Error", {}).get("Code") in _MISSING:
                return None
            raise
        if self._etags.get(key) == obj["ETag"]:
            obj["Body"].close()
            return False
        target[step] = json.loads(obj["Body"].read())
        self._etags[key] = obj["ETag"]
        self.written[(kind, step)] = obj["LastModified"]
        return True


class RunFollower:
    """A run's executions and summaries as it runs; the commands that follow a run extend it.

    ``executions`` lists every execution ARN of the run seen so far, in start order (a run that
    continues as new has several); ``cache`` its summaries.
    """

    def __init__(self, dep: Deployment, run_id: str, *, probe_steps: bool = False) -> None:
        self.dep = dep
        self.run_id = run_id
        self.cache = SummaryCache(run_id, probe_steps=probe_steps)
        self.executions: list[str] = []

    def run_executions(self) -> list[dict[str, Any]]:
        """The run's executions (ListExecutions entries), oldest first."""
        runs = run_executions(self.dep, self.run_id)
        self.executions += [e["executionArn"] for e in runs if e["executionArn"] not in self.executions]
        return runs

    def newest_execution(self) -> dict[str, Any] | None:
        """The run's newest execution (ListExecutions entry), None before it has one."""
        runs = self.run_executions()
        return runs[-1] if runs else None

    def describe_newest(self) -> dict[str, Any] | None:
        """DescribeExecution of the run's newest execution, None before it has one."""
        newest = self.newest_execution()
        return None if newest is None else self.dep.sfn.describe_execution(executionArn=newest["executionArn"])

    def refresh(self, *, full: bool = False) -> list[tuple[str, int]]:
        """New or changed summaries (`SummaryCache.refresh`)."""
        return self.cache.refresh(self.dep.s3, self.dep.bucket, full=full)

    def ended(self, desc: dict[str, Any] | None) -> bool:
        """The run ended: ``desc`` (its newest execution) is terminal and did not hand over to a continuation."""
        if desc is None or desc["status"] not in TERMINAL_STATUSES:
            return False
        if desc["status"] == "SUCCEEDED":
            state = run_state(self.dep, self.run_id) or {}
            if not state.get("finished"):
                # a continue-as-new hand-over: the successor may not be listed yet
                time.sleep(0.5)
                newest = self.newest_execution()
                return (newest is not None and newest["executionArn"] == desc["executionArn"]
                        and newest["status"] in TERMINAL_STATUSES)
        return True
