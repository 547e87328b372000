"""The columns of a rollout row, one list for every place a person reads rollouts.

`ROLLOUT_COLUMNS` is read by `stepwise rollouts` (a line per rollout), the report page's sample tables
(each rollout's summary line) and the W&B sample table (`stepwise.aws.wandb_tracking.TABLE_COLUMNS`),
so adding a column is one line here, e.g. a judge's score once the rollout record carries it::

    Column("judge_score", "judge", lambda v: v.record.judge_score, ".2f"),

A column's value is read from a `stepwise.views.steps.RolloutView`: its typed record (``v.record``:
every field of `stepwise.records.RolloutRecord`) and what the step made of it (``v.reward``, the
shaped reward; ``v.advantage``; ``v.selection``; ``v.cause``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Column", "ROLLOUT_COLUMNS", "cell", "cells", "header", "line", "row", "text"]


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
    """

    key: str
    header: str
    value: Callable[[Any], Any]
    fmt: str = ""
    width: int = 6
    left: bool = False


ROLLOUT_COLUMNS: tuple[Column, ...] = (
    Column("member", "member", lambda v: v.record.member),
    Column("sid", "sid", lambda v: v.record.sid, width=8, left=True),
    Column("reward", "reward", lambda v: v.reward, ".3f"),
    Column("advantage", "adv", lambda v: v.advantage, "+.3f", width=7),
    Column("status", "status", lambda v: str(v.record.status), width=7, left=True),
    Column("policy_version", "policy", lambda v: v.record.policy_version),
    Column("duration_s", "dur_s", lambda v: v.record.duration_s, ".1f", width=5),
    Column("num_turns", "turns", lambda v: v.record.num_turns, width=5),
    Column("tool_calls", "tools", lambda v: v.record.tool_calls, width=5),
    Column("sampled_tokens", "tokens", lambda v: v.record.sampled_tokens),
    Column("cause", "reason / cause", lambda v: v.cause or "", width=0, left=True),
)


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


def line(texts: Sequence[str], columns: Sequence[Column] = ROLLOUT_COLUMNS) -> str:
    """Texts laid out in the columns' widths, two spaces apart (a terminal line)."""
    parts = []
    for c, t in zip(columns, texts, strict=True):
        if c.width == 0:
            parts.append(t)
        else:
            parts.append(f"{t[:c.width] if c.left else t:<{c.width}}" if c.left else f"{t:>{c.width}}")
    return "  " + "  ".join(parts).rstrip()
