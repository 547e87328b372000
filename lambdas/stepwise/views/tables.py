"""A step's sample table: the JSON the report page, a step's own page and the W&B table are made from.

Pure: `sample_table(view, turns_of, decode, summary)` from a `stepwise.views.steps.StepView` (its groups
and marks, from the core function ComputeAdvantages trains with). The table holds the step's best,
worst and a mixed group (`stepwise.views.steps.sample_groups`), each member's row (the columns of
`stepwise.views.columns.ROLLOUT_COLUMNS`), conversation and token spans (trained spans only for a
trained group: an eval's or a filtered group's tokens were never trained), the step's failures by cause
and a few of its metrics. Texts are cut to `MAX_TEXT` characters and at most `MAX_GROUPS` groups are
kept, so a table's size is bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stepwise.views import columns as cols
from stepwise.views.rollout import conversation, failure_groups, token_spans
from stepwise.views.steps import StepView, sample_groups

__all__ = ["MAX_GROUPS", "MAX_TEXT", "clip", "sample_table"]

#: Characters of one message or token span kept in a sample table.
MAX_TEXT = 2000
#: Groups per step in a sample table (best, worst, mixed).
MAX_GROUPS = 3
#: The summary's figures a table's heading shows.
HEADING_KEYS = ("sampler/mean_reward", "eval/accuracy", "advantages/zero_groups_fraction", "policy_version", "decision")


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    text = "" if text is None else str(text)
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def _clipped(message: Mapping[str, Any]) -> dict[str, Any]:
    """A `conversation` message with its texts cut: content, tool call id / name / arguments, tool_call_id, name."""
    out = {**message, "content": clip(message.get("content"))}
    for key in ("tool_call_id", "name"):
        if key in out:
            out[key] = clip(out[key], 200)
    if message.get("tool_calls"):
        out["tool_calls"] = [{k: clip(v, 200 if k != "arguments" else MAX_TEXT) for k, v in call.items()}
                             for call in message["tool_calls"]]
    return out


def _json_value(v: Any) -> Any:
    return v if v is None or isinstance(v, (bool, int, float, str)) else str(v)


def sample_table(view: StepView, turns_of: Callable[[str], list[dict[str, Any]]],
                 decode: Callable[[list[int]], str] | None = None,
                 summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One step's sample table.

    Args:
        view: the step (`stepwise.views.steps.step_view`).
        turns_of: ``sid -> captured turns`` (called for the sampled groups' rollouts only).
        decode: ``token ids -> text`` (the run's tokenizer), None for counts only.
        summary: the step's summary (a few of its figures head the table).

    Returns:
        ``{"kind", "step", "decision", "note", "selection": {mark: groups}, "columns": [[key, header, fmt]],
        "groups": [{"label", "selection", "input_id", ..., "rollouts": [{"sid", "member", "selection",
        "trained", "row": {column: value}, "messages", "records"}]}], "failures", "metrics"}``: JSON.
    """
    columns = cols.ROLLOUT_COLUMNS
    out_groups = []
    for label, g in sample_groups(view.groups)[:MAX_GROUPS]:
        group_trained: bool | None = None if g.selection == "eval" else g.selection == "trained"
        members = []
        for r in g.rollouts:
            traces = [t for t in r.record.records if isinstance(t, Mapping)]
            turns = turns_of(r.sid) if r.sid else []
            messages = [_clipped(m) for m in conversation(turns, traces, trained=group_trained)]
            spans = [[{**s.to_json(), "trained": bool(s.trained and group_trained),
                       "text": None if s.text is None else clip(s.text)} for s in token_spans(t, decode)]
                     for t in traces]
            members.append({"sid": r.sid, "member": r.member, "selection": r.selection, "trained": r.trained,
                            "advantage": r.advantage, "turn_advantages": r.turn_advantages,
                            "row": {k: _json_value(v) for k, v in cols.row(r, columns).items()},
                            "messages": messages, "records": spans})
        out_groups.append({"label": label, **{k: v for k, v in g.to_json().items() if k != "rollouts"},
                           "rollouts": members})
    failures = failure_groups(r.record.model_dump(mode="json", exclude={"records", "turn_spans", "usage"})
                              for r in view.rollouts)
    return {"kind": view.kind, "step": view.step, "decision": view.decision, "note": view.note,
            "selection": view.counts(), "columns": [[c.key, c.header, c.fmt] for c in columns],
            "groups": out_groups, "failures": failures,
            "metrics": {k: v for k, v in (summary or {}).items() if k in HEADING_KEYS}}
