"""Rollouts as a person reads them: a step's groups, each rollout's reward, advantage and status,
one rollout's conversation and which of its tokens were trained.

Pure (no I/O): the inputs are the records the pipeline already stores, as plain mappings, so a
record of any shape is shown rather than refused (`stepwise.records.RolloutRecord` for the fields):

- `group_views(rollouts, ...)`: rollout records -> groups (the responses to one prompt, in item
  order, as ComputeAdvantages groups them) with each member's reward, why it was zeroed, its
  advantage, status and cause, policy version, duration, turns, tool calls and sampled tokens.
  Advantages come from the estimator ComputeAdvantages applies (the run's ``advantage_estimator``
  through `stepwise.core.advantages.compute_advantages`, over the whole step at once since some
  estimators normalize over the batch, on the rewards DAPO's overlong shaping already applied when
  the caller passes ``rewards_of``); eval batches have none.
- `pick_groups(groups, which, n)`: the best, worst or most informative groups (highest reward
  spread: the groups whose advantages are not all zero, the ones a step learns from);
  `sample_groups` the best, worst and a mixed one, for a report.
- `conversation(turns)`: the captured gateway turns (docs/internals.md "Captured turn") as the
  messages the model saw, in order: system, user, assistant (with its tool calls), tool results,
  each assistant message marked with its turn, finish reason and whether it was trained.
- `token_spans(record, decode)`: one TraceRecord (`stepwise.core.replay.record_to_json`) as
  spans of the loss mask: the prompt (never trained), then alternating trained (loss mask 1) and
  masked (0) runs of the response region, decoded with the run's tokenizer when one is given.
  TraceRecord (toolkit ``rollout_gateway/trace.py``): ``token_ids`` is the whole sequence,
  ``loss_mask`` / ``logprobs`` cover its last ``len(loss_mask)`` tokens (the first turn's prompt
  stripped).
- `failure_cause(rollout)` / `failure_groups(rollouts)`: why a rollout failed or scored zero,
  and the run's failed rollouts counted by cause.
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

from stepwise.core.advantages import PER_TURN_ESTIMATORS, carries_no_signal, compute_advantages
from stepwise.core.rewards import preview

__all__ = [
    "GroupView", "RolloutView", "Span", "conversation", "failure_cause", "failure_groups", "group_views",
    "message_text", "pick_groups", "sample_groups", "token_spans", "trained_turns", "PICKS",
]

#: How `pick_groups` orders groups: best mean reward first, worst first, most informative (largest
#: reward spread) first, or prompt order.
PICKS = ("best", "worst", "informative", "all")
Pick = Literal["best", "worst", "informative", "all"]


@dataclass
class RolloutView:
    """One rollout as a row: what it scored, why, what it did and what it was trained with.

    ``advantage`` is None for eval rollouts (never trained); with a per-turn estimator it is the first
    turn's (the whole rollout's return against the group's baseline) and ``turn_advantages`` holds
    one per LLM turn; ``cause`` names the error of a failed
    rollout (``error: cause``) or the reason its reward was zeroed; ``duration_s`` is None when it
    never started; ``reward`` is the agent's reward (0.0 on any failure)."""

    sid: str | None
    i: int
    member: int
    input_id: str
    row: int
    generation_batch: int
    reward: float
    reward_reason: str | None
    advantage: float | None
    status: str
    cause: str | None
    policy_version: int | None
    duration_s: float | None
    num_turns: int
    tool_calls: int
    sampled_tokens: int
    truncated_turns: int
    ill_formed_turns: int
    turn_advantages: list[float] | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class GroupView:
    """One prompt's rollouts (``responses_per_prompt`` members, in member order) with the rewards
    the estimator saw (``rewards_G``, shaped returns) and its ``advantages_G`` (empty for evals; with a
    per-turn estimator one list per member), and ``signal_G``, what the no-signal test reads (``rewards_G``,
    or the per-turn rewards under a per-turn estimator)."""

    input_id: str
    generation_batch: int
    rollouts: list[RolloutView] = field(default_factory=list)
    rewards_G: list[float] = field(default_factory=list)
    advantages_G: list = field(default_factory=list)
    signal_G: list = field(default_factory=list)

    @property
    def mean_reward(self) -> float:
        return math.fsum(self.rewards_G) / len(self.rewards_G) if self.rewards_G else 0.0

    @property
    def reward_std(self) -> float:
        """Population std of ``rewards_G`` (GRPO's denominator)."""
        if not self.rewards_G:
            return 0.0
        import numpy as np

        with np.errstate(all="ignore"):  # rewards near float's range spread to inf, never raise
            return float(np.asarray(self.rewards_G, dtype=np.float64).std())

    @property
    def informative(self) -> bool:
        """The group carries a learning signal (`stepwise.core.advantages.carries_no_signal`, the test
        the estimators, ``advantages/zero_groups_fraction`` and DAPO's filter share)."""
        return not carries_no_signal(self.signal_G or self.rewards_G)

    def to_json(self) -> dict[str, Any]:
        return {"input_id": self.input_id, "generation_batch": self.generation_batch,
                "mean_reward": self.mean_reward, "reward_std": self.reward_std, "informative": self.informative,
                "rewards_G": list(self.rewards_G), "advantages_G": list(self.advantages_G),
                "rollouts": [r.to_json() for r in self.rollouts]}


def _int(value: Any, default: int = 0) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _float(value: Any, default: float | None = 0.0) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return default


def failure_cause(rollout: Mapping[str, Any], limit: int = 300) -> str | None:
    """Why a rollout failed or scored zero: ``"ERROR: cause"`` of a failed one (status ``error`` or
    ``timeout``), else its ``reward_reason``, else None (cut to ``limit`` characters)."""
    err = rollout.get("error")
    if isinstance(err, Mapping) and err:
        return preview(f"{err.get('error')}: {preview(err.get('cause'), limit)}", limit)
    reason = rollout.get("reward_reason")
    return preview(reason, limit) if reason else None


def _view(r: Mapping[str, Any], advantage: Any) -> RolloutView:
    turn_advantages = [float(a) for a in advantage] if isinstance(advantage, (list, tuple)) else None
    if turn_advantages is not None:
        advantage = turn_advantages[0] if turn_advantages else 0.0
    return RolloutView(
        sid=r.get("sid") if isinstance(r.get("sid"), str) else None,
        i=_int(r.get("i")), member=_int(r.get("member")), input_id=str(r.get("input_id", "")),
        row=_int(r.get("row")), generation_batch=_int(r.get("generation_batch")),
        reward=_float(r.get("reward")) or 0.0, reward_reason=r.get("reward_reason") or None,
        advantage=advantage, status=str(r.get("status", "")), cause=failure_cause(r),
        policy_version=r.get("policy_version") if isinstance(r.get("policy_version"), int) else None,
        duration_s=_float(r.get("duration_s"), None),
        num_turns=_int(r.get("num_turns")), tool_calls=_int(r.get("tool_calls")),
        sampled_tokens=_int(r.get("sampled_tokens")), truncated_turns=_int(r.get("truncated_turns")),
        ill_formed_turns=_int(r.get("ill_formed_turns")), turn_advantages=turn_advantages,
    )


def group_views(rollouts: Iterable[Mapping[str, Any]], *, train: bool = True,
                rewards_of: Callable[[Mapping[str, Any]], float] | None = None,
                estimator: str = "grpo",
                turn_rewards_of: Callable[[Mapping[str, Any]], list[float]] | None = None) -> list[GroupView]:
    """Rollout records -> groups, as ComputeAdvantages forms them: one group per (generation
    batch, ``input_id``), groups in item order, members in member order.

    Args:
        rollouts: rollout records (``RolloutRecord`` fields; ``records`` is not read).
        train: a training batch (advantages computed) or an eval batch (``advantage`` None).
        rewards_of: the reward the estimator sees (default: the record's ``reward``; DAPO's
            overlong shaping adds its penalty here).
        estimator: the run's ``advantage_estimator`` (`stepwise.core.advantages.ESTIMATORS`); its
            advantages are computed over all the groups at once, as ComputeAdvantages does.
        turn_rewards_of: a member's per-turn rewards, for a per-turn estimator (the run reads
            ``reward_granularity: per_turn``); None = the estimator sees ``rewards_G``.

    Returns:
        The groups; a group's ``rewards_G`` and ``advantages_G`` align with its ``rollouts``.

    Raises:
        ValueError: an unknown estimator, or a per-turn estimator without ``turn_rewards_of``.
    """
    ordered = sorted(rollouts, key=lambda r: (_int(r.get("generation_batch")), _int(r.get("i")), _int(r.get("member"))))
    groups: dict[tuple[int, str], list[Mapping[str, Any]]] = {}
    for r in ordered:
        groups.setdefault((_int(r.get("generation_batch")), str(r.get("input_id", ""))), []).append(r)
    per_turn = estimator in PER_TURN_ESTIMATORS
    if per_turn and turn_rewards_of is None:
        raise ValueError(f"estimator {estimator!r} reads per-turn rewards: pass turn_rewards_of")
    keyed = []
    for key, members in groups.items():
        members.sort(key=lambda r: (_int(r.get("member")), _int(r.get("i"))))
        rewards_G = [float(rewards_of(r)) if rewards_of else (_float(r.get("reward")) or 0.0) for r in members]
        signal_G = [list(turn_rewards_of(r)) for r in members] if per_turn and turn_rewards_of else rewards_G
        keyed.append((key, members, rewards_G, signal_G))
    advantages_P = compute_advantages(estimator, [k[3] for k in keyed]) if train and keyed else [[] for _ in keyed]
    out: list[GroupView] = []
    for ((gen, input_id), members, rewards_G, signal_G), advantages_G in zip(keyed, advantages_P, strict=True):
        advantages_G = list(advantages_G) if train else []
        views = [_view(r, advantages_G[k] if train else None) for k, r in enumerate(members)]
        out.append(GroupView(input_id, gen, views, rewards_G, advantages_G, signal_G))
    return out


def pick_groups(groups: Sequence[GroupView], which: Pick = "all", n: int | None = None) -> list[GroupView]:
    """``n`` groups (all when None) ordered by ``which`` (`PICKS`): ``best`` highest mean reward,
    ``worst`` lowest, ``informative`` largest reward spread (the groups a step learns from), ``all``
    in prompt order. Ties keep prompt order. Raises ValueError for another ``which``."""
    if which not in PICKS:
        raise ValueError(f"which must be one of {PICKS}, got {which!r}")
    order = list(range(len(groups)))
    if which == "best":
        order.sort(key=lambda k: -groups[k].mean_reward)
    elif which == "worst":
        order.sort(key=lambda k: groups[k].mean_reward)
    elif which == "informative":
        order.sort(key=lambda k: -groups[k].reward_std)
    picked = [groups[k] for k in order]
    return picked if n is None else picked[:max(0, n)]


def sample_groups(groups: Sequence[GroupView]) -> list[tuple[str, GroupView]]:
    """A report's sample of a step: ``[("best", g), ("worst", g), ("mixed", g)]``, distinct groups
    (fewer when the step has fewer); ``mixed`` is the remaining group with the largest reward spread."""
    out: list[tuple[str, GroupView]] = []
    used: set[int] = set()
    for label, which in (("best", "best"), ("worst", "worst"), ("mixed", "informative")):
        for g in pick_groups(groups, which):  # type: ignore[arg-type]
            if id(g) not in used:
                used.add(id(g))
                out.append((label, g))
                break
    return out


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


def conversation(turns: Sequence[Mapping[str, Any]], records: Sequence[Mapping[str, Any]] = ()) -> list[dict[str, Any]]:
    """The captured turns (in key order) as the messages the model saw, each once.

    A turn's ``prompt_messages`` that extend what the previous turn showed add only the new
    messages (the tool results, the next user message); a prompt that rewrites the history (a
    sub-agent, a trimmed context) is shown whole after a ``{"role": "branch"}`` marker. Each turn's
    reply follows as an ``assistant`` message with ``turn`` (1-based), ``finish_reason``,
    ``output_tokens``, ``ill_formed`` and ``trained`` (`trained_turns` of ``records``; None without
    records).

    Returns:
        ``[{"role", "content", "tool_calls"?, "tool_call_id"?, "name"?, "turn"?, ...}]``.
    """
    trained = trained_turns(turns, records) if records else [None] * len(turns)
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
                      "trained": trained[k]})
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
