"""One rollout as a person reads it: its conversation, which of its tokens were trained, and why it
failed or scored zero.

Pure (no I/O). The inputs are what the pipeline stores, as plain mappings (a captured turn,
docs/internals.md "Captured turn"; a TraceRecord as `stepwise.core.replay.record_to_json` writes it),
so a body of any shape is shown rather than refused:

- `conversation(turns, records)`: the captured gateway turns as the messages the model saw, in order:
  system, user, assistant (with its tool calls), tool results, each assistant message marked with its
  turn, finish reason and whether it was trained (`trained_turns`; None for a rollout that was never
  trained: an eval's, a group DAPO filtered).
- `token_spans(record, decode)`: one TraceRecord as spans of the loss mask: the prompt (never
  trained), then alternating trained (loss mask 1) and masked (0) runs of the response region,
  decoded with the run's tokenizer when one is given. TraceRecord (toolkit
  ``rollout_gateway/trace.py``): ``token_ids`` is the whole sequence, ``loss_mask`` / ``logprobs``
  cover its last ``len(loss_mask)`` tokens (the first turn's prompt stripped).
- `failure_cause(rollout)` / `failure_groups(rollouts)`: why a rollout failed or scored zero, and
  failed rollouts counted by cause.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from stepwise.core.rewards import preview

__all__ = ["Span", "conversation", "failure_cause", "failure_groups", "message_text", "token_spans",
           "trained_turns"]


# ---------------------------------------------------------------------------- one rollout


def message_text(content: Any) -> str:
    """A message's ``content`` as text: a string as it is; OpenAI content parts and Anthropic
    blocks joined (``text`` parts as text, a ``tool_result`` block's content, ``tool_use`` as
    ``name(input)``, other parts as ``[type]``); None as ''."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Mapping):
        content = [content]
    if isinstance(content, (list, tuple)):
        parts = []
        for part in content:
            if isinstance(part, str):
                parts.append(part)
            elif isinstance(part, Mapping):
                kind = part.get("type")
                if isinstance(part.get("text"), str):
                    parts.append(part["text"])
                elif kind == "tool_result":
                    parts.append(message_text(part.get("content")))
                elif kind == "tool_use":
                    parts.append(f"{part.get('name')}({preview(part.get('input'), 2000)})")
                else:
                    parts.append(f"[{kind or 'part'}]")
        return "\n".join(parts)
    return preview(content, 10_000)


def _tool_calls(message: Mapping[str, Any]) -> list[dict[str, str]]:
    """``[{"id", "name", "arguments"}]`` of an assistant message (OpenAI ``tool_calls``)."""
    out = []
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, (list, tuple)) else []:  # what the agent sent: any JSON
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
        args = fn.get("arguments", fn.get("input", ""))
        out.append({"id": str(call.get("id", "")), "name": str(fn.get("name", "")),
                    "arguments": args if isinstance(args, str) else preview(args, 4000)})
    return out


def _message(m: Any) -> dict[str, Any]:
    m = m if isinstance(m, Mapping) else {"role": "?", "content": m}
    out: dict[str, Any] = {"role": str(m.get("role", "?")), "content": message_text(m.get("content"))}
    calls = _tool_calls(m)
    if calls:
        out["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if m.get(key):
            out[key] = str(m[key])
    return out


def _ids(values: Any) -> list[int]:
    """Token ids: the integers of a list (anything else in it is not a token id and is left out)."""
    if not isinstance(values, (list, tuple)):
        return []
    return [int(t) for t in values if isinstance(t, int) and not isinstance(t, bool)]


def _trained_runs(record: Mapping[str, Any]) -> list[list[int]]:
    """The token ids of each loss-mask-1 run of a TraceRecord's response region."""
    ids, mask = _ids(record.get("token_ids")), _ids(record.get("loss_mask"))
    start = len(ids) - len(mask)
    runs: list[list[int]] = []
    for k, m in enumerate(mask):
        if m:
            if not runs or mask[k - 1] == 0 or k == 0:
                runs.append([])
            if 0 <= start + k < len(ids):
                runs[-1].append(ids[start + k])
    return runs


def _contains(haystack: list[int], needle: list[int]) -> bool:
    if not needle or len(needle) > len(haystack):
        return False
    h, n = array("q", haystack).tobytes(), array("q", needle).tobytes()
    pos = h.find(n)
    while pos != -1:
        if pos % 8 == 0:
            return True
        pos = h.find(n, pos + 1)
    return False


def trained_turns(turns: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]]) -> list[bool]:
    """Per captured turn: whether its sampled tokens were trained, i.e. appear inside a loss-mask-1
    run of one of the rollout's TraceRecords (a turn re-emitted as context of a later branch, or cut
    by ``max_context_tokens``, was not)."""
    runs = [run for r in records if isinstance(r, Mapping) for run in _trained_runs(r)]
    out = []
    for t in turns:
        output = _ids((t.get("turn") or {}).get("output_ids")) if isinstance(t, Mapping) else []
        out.append(any(_contains(run, output) for run in runs))
    return out


def conversation(turns: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]] = (), *,
                 trained: bool | None = True) -> list[dict[str, Any]]:
    """The captured turns (in key order) as the messages the model saw, each once.

    A turn's ``prompt_messages`` that extend what the previous turn showed add only the new
    messages (the tool results, the next user message); a prompt that rewrites the history (a
    sub-agent, a trimmed context) is shown whole after a ``{"role": "branch"}`` marker. Each turn's
    reply follows as an ``assistant`` message with ``turn`` (1-based), ``finish_reason``,
    ``output_tokens``, ``ill_formed`` and ``trained``.

    Args:
        turns: the rollout's captured turns, in key order.
        records: its TraceRecords (JSON).
        trained: whether the rollout's group was trained (`stepwise.views.steps.GroupView.selection`):
            True: each turn's ``trained`` is `trained_turns` of ``records`` (None without records);
            False (a group DAPO filtered or cut, a step that trained nothing): False for every turn;
            None (an eval rollout: never trained): None for every turn.

    Returns:
        ``[{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?, "turn"?, ...}]``.
    """
    if trained is None or (trained and not records):
        marks: list[bool | None] = [None] * len(turns)
    elif trained:
        marks = list(trained_turns(turns, records))
    else:
        marks = [False] * len(turns)
    shown: list[Any] = []
    out: list[dict[str, Any]] = []
    for k, body in enumerate(turns):
        if not isinstance(body, Mapping):
            continue
        prompt = body.get("prompt_messages") if isinstance(body.get("prompt_messages"), list) else []
        common = 0
        while common < min(len(shown), len(prompt)) and shown[common] == prompt[common]:
            common += 1
        if shown and common < len(shown):
            out.append({"role": "branch", "content": f"turn {k + 1} starts from a different history "
                                                     f"({common} of {len(shown)} earlier messages kept)"})
        out.extend(_message(m) for m in prompt[common:])
        turn = body.get("turn") if isinstance(body.get("turn"), Mapping) else {}
        response = body.get("response_message")
        reply = _message(response) if isinstance(response, Mapping) else {"role": "assistant", "content": ""}
        reply.update({"role": "assistant", "turn": k + 1, "finish_reason": str(turn.get("finish_reason", "")),
                      "output_tokens": len(_ids(turn.get("output_ids"))), "ill_formed": bool(turn.get("ill_formed")),
                      "trained": marks[k]})
        out.append(reply)
        shown = [*prompt, response] if isinstance(response, Mapping) else list(prompt)
    return out


@dataclass
class Span:
    """A run of tokens of one TraceRecord: ``region`` ``prompt`` (the first turn's prompt, never
    trained) or ``response``; ``trained`` = loss mask 1; ``text`` decoded (None without a tokenizer)."""

    region: Literal["prompt", "response"]
    trained: bool
    token_ids: list[int]
    text: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"region": self.region, "trained": self.trained, "tokens": len(self.token_ids), "text": self.text}


def token_spans(record: Mapping[str, Any], decode: Callable[[list[int]], str] | None = None) -> list[Span]:
    """A TraceRecord as loss-mask spans: the prompt, then maximal runs of equal mask in the response
    region (``len(loss_mask)`` last tokens of ``token_ids``), each decoded by ``decode`` when given.
    The spans' token ids concatenate to ``token_ids``."""
    ids, mask = _ids(record.get("token_ids")), _ids(record.get("loss_mask"))
    start = max(0, len(ids) - len(mask))
    spans: list[Span] = []
    if start:
        spans.append(Span("prompt", False, ids[:start]))
    for k, tok in enumerate(ids[start:]):
        trained = bool(mask[k]) if k < len(mask) else False
        if not spans or spans[-1].region != "response" or spans[-1].trained != trained:
            spans.append(Span("response", trained, []))
        spans[-1].token_ids.append(tok)
    if decode is not None:
        for s in spans:
            s.text = decode(s.token_ids)
    return spans


# ---------------------------------------------------------------------------- failures


def failure_cause(rollout: Mapping[str, Any], limit: int = 300) -> str | None:
    """Why a rollout failed or scored zero: ``"ERROR: cause"`` of a failed one (status ``error`` or
    ``timeout``), else its ``reward_reason``, else None (cut to ``limit`` characters)."""
    err = rollout.get("error")
    if isinstance(err, Mapping) and err:
        return preview(f"{err.get('error')}: {preview(err.get('cause'), limit)}", limit)
    reason = rollout.get("reward_reason")
    return preview(reason, limit) if reason else None


def failure_groups(rollouts: Iterable[Mapping[str, Any]], *, examples: int = 3) -> list[dict[str, Any]]:
    """Failed rollouts (status other than ``ok``) and zeroed ones (a ``reward_reason``) counted by
    cause, most common first: ``[{"cause", "status", "count", "examples": [{"step", "kind", "sid",
    "input_id"}]}]`` (``examples`` of each at most)."""
    found: dict[tuple[str, str], dict[str, Any]] = {}
    for r in rollouts:
        status = str(r.get("status", ""))
        cause = failure_cause(r)
        if status == "ok" and not cause:
            continue
        entry = found.setdefault((status, cause or status), {"cause": cause or status, "status": status,
                                                             "count": 0, "examples": []})
        entry["count"] += 1
        if len(entry["examples"]) < examples:
            entry["examples"].append({"step": r.get("step"), "kind": r.get("kind"), "sid": r.get("sid"),
                                      "input_id": r.get("input_id")})
    return sorted(found.values(), key=lambda e: (-e["count"], e["status"], e["cause"]))
