"""The columns of a rollout row, one list for every place a person reads rollouts.

`ROLLOUT_COLUMNS` is read by `stepwise rollouts` (a line per rollout), the report page's sample tables
(each rollout's summary line) and the W&B sample table (`stepwise.aws.wandb_tracking.TABLE_COLUMNS`),
so adding a column is one line here, e.g. the group judge's score::

    Column("judge_score", "judge", lambda v: v.record.judge_score, ".2f", optional=True),

An ``optional`` column is left out where it has nothing to say (a judge's columns in a run without a
judge): the terminal shows it for a step in which some rollout has a value, the page in the line of a
rollout that has one. A ``below`` column (a sentence) is printed under its rollout's line in the terminal.

A column's value is read from a `stepwise.views.steps.RolloutView`: its typed record (``v.record``:
every field of `stepwise.records.RolloutRecord`) and what the step made of it (``v.reward``, the
shaped reward; ``v.advantage``; ``v.selection``; ``v.cause``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Column", "OPTIONAL_KEYS", "ROLLOUT_COLUMNS", "below", "cell", "cells", "empty", "header", "line", "row", "shown",
           "text"]


@dataclass(frozen=True)
class Column:
    """One column of a rollout row.

    Attributes:
        key: its name in a sample table's JSON row and the W&B table.
        header: its heading (terminal and page).
        value: reads it from a `stepwise.views.steps.RolloutView` (JSON: a number, a string or None).
        fmt: the format spec of a number (``.3f``, ``+.3f``); "" = ``str``.
        width: the terminal column's width (0 = the rest of the line: the last column).
        left: left-aligned (text) rather than right-aligned (numbers).
        optional: left out where it has no value (`shown`; the page's line of a rollout without one).
        below: the terminal prints it as ``header: value`` on a line of its own under the rollout's (`below`).
    """

    key: str
    header: str
    value: Callable[[Any], Any]
    fmt: str = ""
    width: int = 6
    left: bool = False
    optional: bool = False
    below: bool = False


ROLLOUT_COLUMNS: tuple[Column, ...] = (
    Column("member", "member", lambda v: v.record.member),
    Column("sid", "sid", lambda v: v.record.sid, width=8, left=True),
    Column("reward", "reward", lambda v: v.reward, ".3f"),
    # the group judge (`stepwise.core.judge`): its score and the agent's own reward beside the reward it made
    Column("judge_score", "judge", lambda v: v.record.judge_score, ".2f", optional=True),
    Column("agent_reward", "agent", lambda v: v.record.agent_reward, ".3f", optional=True),
    Column("advantage", "adv", lambda v: v.advantage, "+.3f", width=7),
    Column("status", "status", lambda v: str(v.record.status), width=7, left=True),
    Column("policy_version", "policy", lambda v: v.record.policy_version),
    # the group engine: versions between the trained rollout's first turn and its update (`RolloutView.staleness`)
    Column("staleness", "stale", lambda v: v.staleness, width=5, optional=True),
    Column("duration_s", "dur_s", lambda v: v.record.duration_s, ".1f", width=5),
    Column("num_turns", "turns", lambda v: v.record.num_turns, width=5),
    Column("tool_calls", "tools", lambda v: v.record.tool_calls, width=5),
    Column("sampled_tokens", "tokens", lambda v: v.record.sampled_tokens),
    Column("cause", "reason / cause", lambda v: v.cause or "", width=0, left=True, optional=True),
    Column("judge_reason", "judge's reason", lambda v: v.record.judge_reason, left=True, optional=True, below=True),
)

#: The keys of the optional columns (the page reads a table's columns as ``[key, header, fmt]``).
OPTIONAL_KEYS = frozenset(c.key for c in ROLLOUT_COLUMNS if c.optional)


def text(value: Any, fmt: str = "") -> str:
    """A cell's text: ``-`` for None or a non-finite number, the number formatted with ``fmt``."""
    if value is None:
        return "-"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if isinstance(value, float) and not math.isfinite(value):
            return "-"
        try:
            return format(value, fmt) if fmt else str(value)
        except (ValueError, TypeError):
            return str(value)
    return str(value)


def row(view: Any, columns: Sequence[Column] = ROLLOUT_COLUMNS) -> dict[str, Any]:
    """``{column key: value}`` of a rollout (JSON values)."""
    return {c.key: c.value(view) for c in columns}


def cell(column: Column, value: Any) -> str:
    return text(value, column.fmt)


def cells(values: dict[str, Any], columns: Sequence[Column] = ROLLOUT_COLUMNS) -> list[str]:
    """Each column's text of a `row`."""
    return [cell(c, values.get(c.key)) for c in columns]


def header(columns: Sequence[Column] = ROLLOUT_COLUMNS) -> list[str]:
    return [c.header for c in columns]


def empty(cell_text: str) -> bool:
    """A cell that says nothing (``-`` or '')."""
    return cell_text in ("", "-")


def shown(views: Sequence[Any], columns: Sequence[Column] = ROLLOUT_COLUMNS) -> list[Column]:
    """The columns a terminal shows for these rollouts (a step's): every column but an optional one none of
    them has a value for."""
    return [c for c in columns if not c.optional or any(not empty(cell(c, c.value(v))) for v in views)]


def line(texts: Sequence[str], columns: Sequence[Column] = ROLLOUT_COLUMNS) -> str:
    """Texts laid out in the columns' widths, two spaces apart (a terminal line; ``below`` columns left out)."""
    parts = []
    for c, t in zip(columns, texts, strict=True):
        if c.below:
            continue
        if c.width == 0:
            parts.append(t)
        else:
            parts.append(f"{t[:c.width] if c.left else t:<{c.width}}" if c.left else f"{t:>{c.width}}")
    return "  " + "  ".join(parts).rstrip()


#: Where a ``below`` column's line starts (under the reward, past the member and sid columns).
BELOW_INDENT = " " * 20


def below(texts: Sequence[str], columns: Sequence[Column] = ROLLOUT_COLUMNS) -> list[str]:
    """The terminal lines under a rollout's line: ``header: text`` of each ``below`` column with a value."""
    return [f"{BELOW_INDENT}{c.header}: {t}" for c, t in zip(columns, texts, strict=True) if c.below and not empty(t)]
