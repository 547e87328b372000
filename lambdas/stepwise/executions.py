"""A run's Step Functions executions: their names and the statuses they end in.

A run is identified by its run id. Its first execution is named after it; each continuation
(continue-as-new, and `stepwise resume` when it starts a new execution) is named
``{run_id[:70]}--{segment}``: execution names are 1-80 characters, so the run id is cut to 70
and a run id may not contain ``--``: `RUN_ID_RE`, which Init, ``stepwise start`` and ``run-local`` all
enforce (`run_id_problem`) before anything bills.

Statuses are DescribeExecution's ``status`` and the ``detail.status`` of EventBridge's
"Step Functions Execution Status Change" events (the Step Functions API reference, and
"Monitoring Step Functions with EventBridge" in its developer guide). The stack's cleanup rule,
the Cleanup handler, the operator CLI and the local stack all read them from here.

Pure and stdlib-only (not in `stepwise.core`, whose package imports numpy): `stepwise runs` and
`stepwise --help` import it.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from pathlib import PurePath
from typing import Any

__all__ = [
    "ABNORMAL_END_STATUSES",
    "CONTINUATION_RE",
    "EXECUTION_STATUS_CHANGE",
    "TERMINAL_STATUSES",
    "belongs_to",
    "RUN_ID_RE",
    "RUN_ID_RULE",
    "continuation_name",
    "default_run_id",
    "execution_arn_of",
    "group_execution_name",
    "run_id_of_execution",
    "run_id_problem",
    "run_id_stem",
]

#: Every status an execution ends in (all but RUNNING; PENDING_REDRIVE is a redrive's start).
TERMINAL_STATUSES = ("SUCCEEDED", "FAILED", "TIMED_OUT", "ABORTED")
#: The ends that skip the state machine's own stop path (a Catch runs on none of them), so the
#: stack's rule runs Cleanup to stop the training session.
ABNORMAL_END_STATUSES = ("ABORTED", "TIMED_OUT", "FAILED")
#: The EventBridge ``detail-type`` of an execution's status changes.
EXECUTION_STATUS_CHANGE = "Step Functions Execution Status Change"
#: The output key of an execution that handed its run over to the next one (continue-as-new; the
#: ASL's "Handed over to the next execution" state): such a SUCCEEDED is no run end.
HANDED_OVER_KEY = "handed_over_to"

#: A run id: it is the first execution's name (Step Functions: 1-80 characters; these are a subset of the
#: characters it allows), continuations append ``--{n}`` to its first 70 characters, and `belongs_to` /
#: `run_id_of_execution` tell a run's executions apart by that suffix, so a run id has at most 70
#: characters and no ``--``. ASCII only; matched whole (`run_id_problem` uses ``fullmatch``).
RUN_ID_RE = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9_]|-(?!-)){0,69}")
#: `RUN_ID_RE` in words, for the refusals.
RUN_ID_RULE = ("1-70 of the letters A-Z and a-z, digits, '_' and '-', starting with a letter or digit, without "
               "'--' (a run id is its first execution's name; continuations append --N)")


def run_id_problem(run_id: Any) -> str | None:
    """None when ``run_id`` is usable as a run id (`RUN_ID_RE`); else why not, naming the rule."""
    if isinstance(run_id, str) and RUN_ID_RE.fullmatch(run_id):
        return None
    return f"run id {run_id!r} is not usable as an execution name: use {RUN_ID_RULE}"


def run_id_stem(text: str) -> str:
    """``text`` reduced to what `RUN_ID_RE` allows, for the front of a default run id: ASCII letters, digits and
    ``_``, other characters as single ``-``, a letter or digit first, at most 48 characters (so
    ``STEM-YYYYMMDD-HHMMSS-NNNN`` fits in 70), ``run`` when nothing is left."""
    stem = "".join(c if c.isascii() and (c.isalnum() or c == "_") else "-" for c in text)
    return re.sub(r"-{2,}", "-", stem).lstrip("-_")[:48].rstrip("-") or "run"


def default_run_id(config_path: str | PurePath, now: datetime | None = None) -> str:
    """``{config stem}-{YYYYMMDD-HHMMSS}`` (UTC), the stem as `run_id_stem` makes it: always a usable run id."""
    now = now or datetime.now(timezone.utc)
    return f"{run_id_stem(PurePath(config_path).stem)}-{now.strftime('%Y%m%d-%H%M%S')}"


#: ``{prefix}--{segment}``: a continuation's execution name.
CONTINUATION_RE = re.compile(r"^(?P<prefix>.+)--(?P<segment>\d+)$")


def continuation_name(run_id: str, segment: int) -> str:
    """Execution name of segment ``segment`` (<= 80 chars, deterministic so a retry cannot start two)."""
    return f"{run_id[:70]}--{segment}"


def group_execution_name(run_id: str, group: int, attempt: int = 0) -> str:
    """The rollout-group execution of group ``group`` (attempt ``attempt``) of run ``run_id``:
    ``{run_id[:56]}-{8 hex of sha256(run_id)}-g{group}a{attempt}`` (<= 80 chars; deterministic, so a retried
    admission finds it started: ExecutionAlreadyExists)."""
    import hashlib

    return f"{run_id[:56]}-{hashlib.sha256(run_id.encode()).hexdigest()[:8]}-g{group}a{attempt}"


def execution_arn_of(state_machine_arn: str, name: str) -> str:
    """The ARN of the execution ``name`` of ``state_machine_arn`` (``arn:...:stateMachine:SM`` ->
    ``arn:...:execution:SM:NAME``), known before StartExecution returns it."""
    return f"{state_machine_arn.replace(':stateMachine:', ':execution:', 1)}:{name}"


def run_id_of_execution(name: str) -> str:
    """The run id an execution name belongs to (a continuation's ``--N`` suffix removed)."""
    m = CONTINUATION_RE.match(name)
    return m.group("prefix") if m else name


def belongs_to(name: str, run_id: str) -> bool:
    """Whether execution ``name`` is ``run_id`` itself or one of its continuations."""
    if name == run_id:
        return True
    m = CONTINUATION_RE.match(name)
    return bool(m) and m.group("prefix") == run_id[:70]


#: The execution input key of a continuation (continue-as-new, `stepwise resume`).
CONTINUATION_KEY = "continuation"


def resolve_run(execution_name: str, execution_input: Any) -> tuple[str, dict[str, Any] | None]:
    """``(run_id, continuation or None)`` of an execution.

    The first execution of a run is started with the RunConfig JSON and its name is the run id.
    A continuation (continue-as-new) is started with ``{"continuation": {"run_id": ...,
    "parent_execution_arn": ..., "segment": n}}``. ``execution_input`` may be the JSON text
    (EventBridge ``detail.input``) or the parsed object.
    """
    if isinstance(execution_input, str):
        try:
            execution_input = json.loads(execution_input)
        except ValueError:
            execution_input = None
    if isinstance(execution_input, dict) and isinstance(execution_input.get(CONTINUATION_KEY), dict):
        cont = execution_input[CONTINUATION_KEY]
        return str(cont["run_id"]), cont
    return execution_name, None
