"""Behaviour metrics: what the agents did in a step's rollouts, beside the reward.

Reward hacking in multi-turn RL usually shows here first: agents that call tools too often,
answer too early, ramble into ``max_new_tokens``, or emit markup the renderer cannot parse.

Two pure functions:

- `rollout_behaviour` summarises one rollout's captured gateway turns (the bodies the turn
  recorder writes, docs/internals.md "Captured turn"): turns, sampled tokens, turns truncated
  by ``max_new_tokens`` or the context (the sampler's ``finish_reason == "length"``: the
  gateway clamps ``max_new_tokens`` to what the context leaves, so both limits end that way),
  ill-formed turns (the renderer's ``ill_formed``: the response did not parse under the chat
  template's schema) and tool calls (``response_message.tool_calls``, the toolkit adapters'
  canonical form for both the OpenAI and the Anthropic protocol).
- `behaviour_metrics` turns the per-rollout summaries of a step into slash-namespaced metrics
  (STYLE.md): means per rollout, fractions per turn, rollout duration percentiles and the
  status counts (``ok``, ``error``, ``timeout``; docs/internals.md, rollout records).

The other per-step signals live beside what they describe: reward mean, std, min and max in
`stepwise.core.rewards.reward_metrics`, the fraction of zero-advantage groups in
`stepwise.core.advantages.advantage_metrics` (``advantages/zero_groups_fraction``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ROLLOUT_STATUSES", "rollout_behaviour", "behaviour_metrics"]

#: Rollout record status values (docs/internals.md, rollout records); each gets a ``rollouts/num_{status}`` count.
ROLLOUT_STATUSES = ("ok", "error", "timeout")


def rollout_behaviour(turns: Iterable[Any]) -> dict[str, int]:
    """Counts over one rollout's captured turns.

    Args:
        turns: captured turn bodies, each with ``turn`` (``output_ids``, ``finish_reason``,
            optional ``ill_formed``) and ``response_message`` (optional ``tool_calls``).
            Missing or ill-typed parts count as zero; a body that is not a mapping is not a turn.

    Returns:
        ``{"num_turns", "sampled_tokens", "truncated_turns", "ill_formed_turns", "tool_calls"}``
        (all ints >= 0; the keys FinishRollout stores in the rollout record).
    """
    out = {"num_turns": 0, "sampled_tokens": 0, "truncated_turns": 0, "ill_formed_turns": 0, "tool_calls": 0}
    for body in turns:
        if not isinstance(body, Mapping):
            continue
        turn = body.get("turn")
        turn = turn if isinstance(turn, Mapping) else {}
        message = body.get("response_message")
        message = message if isinstance(message, Mapping) else {}
        out["num_turns"] += 1
        out["sampled_tokens"] += _length(turn.get("output_ids"))
        out["truncated_turns"] += 1 if turn.get("finish_reason") == "length" else 0
        out["ill_formed_turns"] += 1 if turn.get("ill_formed") is True else 0
        out["tool_calls"] += _length(message.get("tool_calls"))
    return out


def _length(value: Any) -> int:
    return len(value) if isinstance(value, (list, tuple)) else 0


#: Larger than any real count or duration (in seconds: 30 million years); a value beyond it is not one.
_MAX_VALUE = 1e15


def _value(record: Mapping[str, Any], key: str) -> float | None:
    """``record[key]`` as a finite number in ``[0, _MAX_VALUE]``, else None (missing, ill-typed, NaN,
    negative, huge: a record of any shape never raises or poisons a mean)."""
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int) and not 0 <= value <= _MAX_VALUE:  # float() of a huge int overflows
        return None
    value = float(value)
    return value if math.isfinite(value) and 0.0 <= value <= _MAX_VALUE else None


def _num(record: Mapping[str, Any], key: str) -> float:
    value = _value(record, key)
    return 0.0 if value is None else value


def behaviour_metrics(rollouts_R: Sequence[Any]) -> dict[str, float]:
    """Per-step behaviour metrics over the step's rollouts (every generation batch of the step).

    Args:
        rollouts_R: one mapping per rollout, as FinishRollout writes the rollout record:
            ``status`` and the `rollout_behaviour` counts, plus ``duration_s`` (seconds from
            StartRollout to FinishRollout; absent = not counted in the percentiles). A count that
            is not a finite number >= 0 counts as 0 (a duration: not counted); an entry that is
            not a mapping is not a rollout.

    Returns:
        ``behaviour/turns_per_rollout``, ``behaviour/sampled_tokens_per_rollout``,
        ``behaviour/tool_calls_per_rollout`` (means over rollouts),
        ``behaviour/truncated_turns_fraction``, ``behaviour/ill_formed_turns_fraction`` (of all
        turns, at most 1; 0.0 when no turn ran), ``time/rollout_duration_p50`` and ``_p95`` (seconds), and
        ``rollouts/num_ok``, ``rollouts/num_error``, ``rollouts/num_timeout`` (counts). ``{}`` for no rollouts.
        Every value is a finite float >= 0.
    """
    rollouts_R = [r for r in rollouts_R if isinstance(r, Mapping)]
    n = len(rollouts_R)
    if n == 0:
        return {}
    turns_R = [_num(r, "num_turns") for r in rollouts_R]
    turns = sum(turns_R)

    def per_turn(key: str) -> float:  # a record cannot have more such turns than turns
        return sum(min(_num(r, key), t) for r, t in zip(rollouts_R, turns_R)) / turns if turns else 0.0

    durations = [d for d in (_value(r, "duration_s") for r in rollouts_R) if d is not None]
    out = {
        "behaviour/turns_per_rollout": turns / n,
        "behaviour/sampled_tokens_per_rollout": sum(_num(r, "sampled_tokens") for r in rollouts_R) / n,
        "behaviour/tool_calls_per_rollout": sum(_num(r, "tool_calls") for r in rollouts_R) / n,
        "behaviour/truncated_turns_fraction": per_turn("truncated_turns"),
        "behaviour/ill_formed_turns_fraction": per_turn("ill_formed_turns"),
        # numpy's default (linear interpolation between closest ranks)
        "time/rollout_duration_p50": float(np.percentile(durations, 50)) if durations else 0.0,
        "time/rollout_duration_p95": float(np.percentile(durations, 95)) if durations else 0.0,
    }
    for status in ROLLOUT_STATUSES:
        out[f"rollouts/num_{status}"] = float(sum(1 for r in rollouts_R if r.get("status") == status))
    return out
