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
  status counts (``ok``, ``error``, ``timeout``; CONTRACTS.md item 3).

The other per-step signals live beside what they describe: reward mean, std, min and max in
`stepwise.core.rewards.reward_metrics`, the fraction of zero-advantage groups in
`stepwise.core.advantages.advantage_metrics` (``advantages/zero_groups_fraction``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["ROLLOUT_STATUSES", "rollout_behaviour", "behaviour_metrics"]

#: Rollout record status values (CONTRACTS.md item 3); each gets a ``rollouts/num_{status}`` count.
ROLLOUT_STATUSES = ("ok", "error", "timeout")


def rollout_behaviour(turns: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Counts over one rollout's captured turns.

    Args:
        turns: captured turn bodies, each with ``turn`` (``output_ids``, ``finish_reason``,
            optional ``ill_formed``) and ``response_message`` (optional ``tool_calls``).
            Missing parts count as zero.

    Returns:
        ``{"num_turns", "sampled_tokens", "truncated_turns", "ill_formed_turns", "tool_calls"}``
        (all ints; the keys FinishRollout stores in the rollout record).
    """
    out = {"num_turns": 0, "sampled_tokens": 0, "truncated_turns": 0, "ill_formed_turns": 0, "tool_calls": 0}
    for body in turns:
        turn = body.get("turn") or {}
        message = body.get("response_message") or {}
        out["num_turns"] += 1
        out["sampled_tokens"] += len(turn.get("output_ids") or [])
        out["truncated_turns"] += 1 if turn.get("finish_reason") == "length" else 0
        out["ill_formed_turns"] += 1 if turn.get("ill_formed") else 0
        out["tool_calls"] += len(message.get("tool_calls") or []) if isinstance(message, Mapping) else 0
    return out


def _num(record: Mapping[str, Any], key: str) -> float:
    value = record.get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def behaviour_metrics(rollouts_R: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Per-step behaviour metrics over the step's rollouts (every generation batch of the step).

    Args:
        rollouts_R: one mapping per rollout, as FinishRollout writes the rollout record:
            ``status`` and the `rollout_behaviour` counts, plus ``duration_s`` (seconds from
            StartRollout to FinishRollout; absent = not counted in the percentiles).

    Returns:
        ``behaviour/turns_per_rollout``, ``behaviour/sampled_tokens_per_rollout``,
        ``behaviour/tool_calls_per_rollout`` (means over rollouts),
        ``behaviour/truncated_turns_fraction``, ``behaviour/ill_formed_turns_fraction`` (of all
        turns; 0.0 when no turn ran), ``time/rollout_duration_p50`` and ``_p95`` (seconds), and ``rollouts/num_ok``,
        ``rollouts/num_error``, ``rollouts/num_timeout`` (counts). ``{}`` for no rollouts.
    """
    n = len(rollouts_R)
    if n == 0:
        return {}
    turns = sum(_num(r, "num_turns") for r in rollouts_R)
    durations = [float(r["duration_s"]) for r in rollouts_R if isinstance(r.get("duration_s"), (int, float))]
    out = {
        "behaviour/turns_per_rollout": turns / n,
        "behaviour/sampled_tokens_per_rollout": sum(_num(r, "sampled_tokens") for r in rollouts_R) / n,
        "behaviour/tool_calls_per_rollout": sum(_num(r, "tool_calls") for r in rollouts_R) / n,
        "behaviour/truncated_turns_fraction": sum(_num(r, "truncated_turns") for r in rollouts_R) / turns if turns else 0.0,
        "behaviour/ill_formed_turns_fraction": sum(_num(r, "ill_formed_turns") for r in rollouts_R) / turns if turns else 0.0,
        # numpy's default (linear interpolation between closest ranks)
        "time/rollout_duration_p50": float(np.percentile(durations, 50)) if durations else 0.0,
        "time/rollout_duration_p95": float(np.percentile(durations, 95)) if durations else 0.0,
    }
    for status in ROLLOUT_STATUSES:
        out[f"rollouts/num_{status}"] = float(sum(1 for r in rollouts_R if r.get("status") == status))
    return out
