"""The group judge, pure: what the judge reads of a group, what it is asked, what a valid answer is, and
how its scores become the rewards the estimator reads.

An agent without an answer key (a support, research or operations agent) cannot score its own rollouts,
and it sees one rollout at a time; the pipeline sees the whole group. A judge model on Amazon Bedrock scores
the members of a completed group *relative to each other* against the user's rubric (OpenPipe ART's RULER,
``art/rewards/ruler.py``: relative scores need no labelled data, and GRPO only uses the differences within a
group, so the judge need not be calibrated across groups). The I/O lives in `stepwise.judging` (the run
store, the cache, the retries) and `stepwise.aws.bedrock` (the Converse call); this module is pure:

- `judged_group`: each member's conversation as the gateway captured it (`stepwise.views.rollout.conversation`)
  and the agent's result, rendered as text; the messages every judged member shares (system prompt, task) are
  shown once as the task, each member's own part after it; each message cut to ``include.max_message_chars``,
  each member's part to ``include.max_member_chars`` (the middle goes: the start and the final answer stay).
  Only completed rollouts (status ``ok``) are judged; the agent's reward, the toolkit's bookkeeping and the
  rollout's api key (``payload._rollout``) never reach the judge.
- `converse_request`: the Converse request: the rubric and the instructions as the system prompt, the task
  and the attempts as the user message, and one tool, `TOOL_NAME`, whose input schema is one score and a
  one-line reason per attempt (``toolChoice`` names it, so the answer is a tool call); `retry_messages` adds
  a rejected answer and what was wrong with it, for the next attempt.
- `parse_verdict`: the answer validated: a tool call (or, from a model that answers in text, one JSON
  object) holding every attempt exactly once, each score a finite number within ``[score_min, score_max]``;
  anything else raises `InvalidVerdict` naming what was wrong.
- `cache_key`: the hash of the judge's config and the judged text: the same group judged again (a retried
  step, a seeded re-run of it) reads the cached verdict instead of paying twice.
- `apply_judgements`: each group's record merged into its rollouts (``judge_score``, ``judge_reason``,
  ``agent_reward``) and ``reward`` set to what the config's ``combine`` says the estimator reads:
  ``replace`` the score mapped to [0, 1]; ``add`` the agent's reward plus ``weight`` x that (with per-turn
  rewards, on the last turn's); ``gdpo`` the agent's rewards and the judge's, each normalized within the
  group, summed with ``weight`` on the judge's (GDPO, arXiv:2601.05242, which then normalizes the sum over
  the batch: the ``reinforce_pp_baseline`` estimator does exactly that). A group without a verdict gets the
  ``fallback``: the agent's own rewards, or equal rewards (no signal).
- `judge_metrics`: the step summary's ``judge/*``: groups judged, cached and fallen back, the mean score,
  the judge's rank agreement with the agent's reward where both vary within a group, and the mean judged
  length beside the mean score with their rank correlation within groups (a judge that rewards length).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise.records import JudgeRecord, JudgeVerdict, RolloutRecord
from stepwise.views.rollout import conversation  # pure: the one reading of captured turns a person and the judge share

if TYPE_CHECKING:
    from stepwise.config import JudgeConfig, JudgeInclude, RunConfig

__all__ = [
    "TOOL_NAME",
    "PROMPT_VERSION",
    "RESERVED_RESULT_FIELDS",
    "InvalidVerdict",
    "JudgedGroup",
    "JudgedMember",
    "apply_judgements",
    "cache_key",
    "converse_request",
    "cut",
    "judge_metrics",
    "judged_group",
    "judged_reward",
    "parse_verdict",
    "retry_messages",
    "spearman",
]

#: The tool the judge answers through.
TOOL_NAME = "record_scores"
#: Changes whenever the prompt, the schema or the rendering changes: part of every cache key.
PROMPT_VERSION = 1
#: Keys of an agent's result the toolkit adds (``AgentCoreRLApp.save_result``), and the agent's reward: never
#: shown to the judge unless ``result_fields`` names them (``payload`` is then shown without ``_rollout``,
#: which holds the rollout's api key).
RESERVED_RESULT_FIELDS = ("rewards", "status_code", "stop_reason", "input_id", "s3_bucket", "result_key", "payload")
#: A one-line reason is cut to this many characters.
MAX_REASON_CHARS = 300
#: Within-group rank correlation of judged length and score at or above which ``judge/length_bias_alarm`` is 1,
#: over at least `LENGTH_ALARM_MIN_GROUPS` groups where both vary.
LENGTH_ALARM_CORRELATION = 0.5
LENGTH_ALARM_MIN_GROUPS = 4
EPS = 1e-8


class InvalidVerdict(ValueError):
    """The judge's answer is not a valid verdict; the message says what was wrong (it is shown to the judge
    when it is asked again, and recorded as the fallback's reason)."""


# ---------------------------------------------------------------------------- what the judge reads


@dataclass(frozen=True)
class JudgedMember:
    """One member of a group as the judge's input is built from it: its member index and sid, its status,
    the agent's reward, its captured turns (`stepwise.records.CapturedTurn` bodies, key order) and the agent's
    result object (None when there is none)."""

    member: int
    sid: str | None
    status: str
    agent_reward: float
    turns: Sequence[Mapping[str, Any]] = ()
    result: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class JudgedGroup:
    """What the judge is shown of a group: ``context`` (the messages every judged member shares, once),
    ``parts`` (each judged member's own part, cut), ``judged`` (the positions in the group of the judged
    members, in the order shown: attempt k is ``judged[k - 1]``) and ``chars`` (each part's length)."""

    context: str
    parts: list[str] = field(default_factory=list)
    judged: list[int] = field(default_factory=list)
    chars: list[int] = field(default_factory=list)


def cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters long: its start and its end kept, the middle replaced by a
    marker saying how much went (the final answer of a long transcript is at its end)."""
    if len(text) <= limit:
        return text
    marker = f"\n[... {len(text) - limit} characters cut ...]\n"
    keep = max(0, limit - len(marker))
    head = keep // 2
    return text[:head] + marker + text[len(text) - (keep - head):]


def _render(message: Mapping[str, Any], include: JudgeInclude) -> str | None:
    """One message of `stepwise.views.rollout.conversation` as text, or None when ``include`` leaves it out."""
    role = str(message.get("role", "?"))
    content = str(message.get("content") or "")
    limit = include.max_message_chars
    if role == "system":
        return f"[system]\n{cut(content, limit)}" if include.system else None
    if role == "branch":
        return f"[{content}]"
    if role == "tool":
        if not include.tool_results:
            return None
        name = message.get("name") or message.get("tool_call_id") or ""
        return f"[tool result{f' {name}' if name else ''}]\n{cut(content, limit)}"
    lines = [f"[{role}]", cut(content, limit)] if content else [f"[{role}]"]
    if role == "assistant" and include.tool_calls:
        for call in message.get("tool_calls") or []:
            lines.append(cut(f"-> calls {call.get('name')}({call.get('arguments')})", limit))
    if role == "assistant" and message.get("finish_reason") == "length":
        lines.append("(cut off: the reply reached its token limit)")
    return "\n".join(lines) if len(lines) > 1 or role != "assistant" else f"[{role}] (no reply)"


def _result_text(result: Mapping[str, Any] | None, include: JudgeInclude) -> str | None:
    if not isinstance(result, Mapping):
        return None
    names = include.result_fields
    keys = [k for k in result if k not in RESERVED_RESULT_FIELDS] if names is None else [k for k in names if k in result]
    if not keys:
        return None
    shown: dict[str, Any] = {}
    for k in keys:
        value = result[k]
        if k == "payload" and isinstance(value, Mapping):
            value = {pk: pv for pk, pv in value.items() if pk != "_rollout"}
        shown[k] = value
    try:
        text = json.dumps(shown, ensure_ascii=False, sort_keys=True, default=str)
    except (TypeError, ValueError):
        text = str(shown)
    return f"[the agent's result]\n{cut(text, include.max_message_chars)}"


def _key(message: Mapping[str, Any]) -> str:
    return json.dumps({k: message.get(k) for k in ("role", "content", "tool_calls", "tool_call_id", "name")},
                      sort_keys=True, default=str)


def judged_group(members: Sequence[JudgedMember], include: JudgeInclude) -> JudgedGroup:
    """The judge's view of a group (`JudgedGroup`): the completed members (status ``ok``), their shared
    leading messages once as the task, each one's own messages and result after it. The messages a member
    shares with the others are those of its prompt before its first reply; a member whose conversation
    differs earlier (another system prompt) shows it in its own part."""
    judged = [i for i, m in enumerate(members) if m.status == "ok"]
    convs = [conversation(list(members[i].turns)) for i in judged]
    shared: list[Mapping[str, Any]] = []
    if convs:
        first = convs[0]
        n = 0
        while (n < len(first) and first[n].get("role") not in ("assistant", "branch")
               and all(len(c) > n and _key(c[n]) == _key(first[n]) for c in convs[1:])):
            n += 1
        shared = first[:n]
    context = "\n\n".join(t for t in (_render(m, include) for m in shared) if t) or "(the agent's prompt was not captured)"
    parts, chars = [], []
    for i, conv in zip(judged, convs, strict=True):
        texts = [t for t in (_render(m, include) for m in conv[len(shared):]) if t]
        if not conv:
            texts.append("(no LLM call was captured)")
        result = _result_text(members[i].result, include)
        if result:
            texts.append(result)
        part = cut("\n\n".join(texts), include.max_member_chars)
        parts.append(part)
        chars.append(len(part))
    return JudgedGroup(context=context, parts=parts, judged=judged, chars=chars)


# ---------------------------------------------------------------------------- what the judge is asked


def _system_prompt(judge: JudgeConfig, n: int) -> str:
    lo, hi = f"{judge.score_min:g}", f"{judge.score_max:g}"
    return (
        f"You are judging {n} attempt(s) by an AI agent at the same task. Score every attempt from {lo} (worst) "
        f"to {hi} (best) against the rubric below, comparing the attempts with each other: a better attempt gets a "
        f"higher score, equally good attempts get equal scores, and use the range to separate them. Judge what the "
        f"agent did and answered, not how long it is. Give each attempt a one-line reason.\n\n"
        f"<rubric>\n{judge.rubric.strip()}\n</rubric>\n\n"
        f"Answer by calling the tool {TOOL_NAME} once, with exactly one entry for each attempt 1 to {n}.")


def _schema(judge: JudgeConfig, n: int) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"scores": {
            "type": "array", "minItems": n, "maxItems": n,
            "items": {"type": "object", "required": ["attempt", "score", "reason"], "properties": {
                "attempt": {"type": "integer", "minimum": 1, "maximum": n, "description": "the attempt's number"},
                "score": {"type": "number", "minimum": judge.score_min, "maximum": judge.score_max},
                "reason": {"type": "string", "description": "one line: why this score"},
            }},
        }},
        "required": ["scores"],
    }


def _user_text(group: JudgedGroup) -> str:
    attempts = "\n\n".join(f"<attempt {k}>\n{part}\n</attempt {k}>" for k, part in enumerate(group.parts, 1))
    return f"<task>\n{group.context}\n</task>\n\n{attempts}"


def converse_request(judge: JudgeConfig, group: JudgedGroup) -> dict[str, Any]:
    """The Converse request (boto3 ``bedrock-runtime`` ``converse`` keyword arguments) that asks the judge to
    score ``group``: ``modelId``, ``system``, ``messages``, ``inferenceConfig`` and a ``toolConfig`` whose one
    tool (`TOOL_NAME`) the ``toolChoice`` requires (botocore's ``bedrock-runtime`` 2023-09-30 model)."""
    n = len(group.parts)
    return {
        "modelId": judge.model_id,
        "system": [{"text": _system_prompt(judge, n)}],
        "messages": [{"role": "user", "content": [{"text": _user_text(group)}]}],
        "inferenceConfig": {"maxTokens": judge.max_output_tokens, "temperature": judge.temperature},
        "toolConfig": {
            "tools": [{"toolSpec": {"name": TOOL_NAME, "description": f"Record the score and reason of each of the "
                                    f"{n} attempts.", "inputSchema": {"json": _schema(judge, n)}}}],
            "toolChoice": {"tool": {"name": TOOL_NAME}},
        },
    }


def retry_messages(request: Mapping[str, Any], answer: Mapping[str, Any] | None, problem: str) -> list[dict[str, Any]]:
    """The messages of the next attempt after a rejected answer: the request's messages, the judge's answer
    (``output.message`` of the Converse response) and a user turn saying what was wrong (a ``toolResult``
    with status ``error`` for a tool call, as Converse requires after one; else text). Without a usable
    answer message, the request's messages unchanged."""
    messages = [dict(m) for m in request.get("messages", [])]
    message = ((answer or {}).get("output") or {}).get("message") if isinstance(answer, Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list) or not content or messages[-1:] and messages[-1].get("role") != "user":
        return messages
    feedback = (f"That answer was not valid: {problem}. Call {TOOL_NAME} again with exactly one entry for each "
                f"attempt, every score within the range.")
    uses = [b["toolUse"] for b in content if isinstance(b, Mapping) and isinstance(b.get("toolUse"), Mapping)
            and b["toolUse"].get("toolUseId")]
    reply: list[dict[str, Any]]
    if uses:
        reply = [{"toolResult": {"toolUseId": u["toolUseId"], "status": "error", "content": [{"text": feedback}]}}
                 for u in uses]
    else:
        reply = [{"text": feedback}]
    return [*messages, {"role": "assistant", "content": content}, {"role": "user", "content": reply}]


def cache_key(judge: JudgeConfig, group: JudgedGroup) -> str:
    """The hex SHA-256 of everything that decides the judge's answer: the prompt's version, the model, the
    rubric, the range, the sampling and what of each rollout is read, and the judged text itself."""
    payload = {"v": PROMPT_VERSION, "model": judge.model_id, "rubric": judge.rubric, "range": [judge.score_min,
               judge.score_max], "temperature": judge.temperature, "max_tokens": judge.max_output_tokens,
               "include": judge.include.model_dump(), "context": group.context, "parts": group.parts}
    return hashlib.sha256(json.dumps(payload, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


# ---------------------------------------------------------------------------- what a valid answer is


_JSON_OBJECT = re.compile(r"\{.*\}", re.S)


def _answer_input(response: Mapping[str, Any]) -> Any:
    message = (response.get("output") or {}).get("message") if isinstance(response.get("output"), Mapping) else None
    content = message.get("content") if isinstance(message, Mapping) else None
    if not isinstance(content, list):
        raise InvalidVerdict("the answer holds no message")
    for block in content:
        use = block.get("toolUse") if isinstance(block, Mapping) else None
        if isinstance(use, Mapping) and use.get("name") == TOOL_NAME:
            value = use.get("input")
            if isinstance(value, str):  # some models put the arguments' JSON text there
                try:
                    return json.loads(value)
                except ValueError as e:
                    raise InvalidVerdict(f"the {TOOL_NAME} call's input is not valid JSON ({e})") from None
            return value
    text = "\n".join(str(b.get("text")) for b in content if isinstance(b, Mapping) and isinstance(b.get("text"), str))
    m = _JSON_OBJECT.search(text)
    if not m:
        stop = response.get("stopReason")
        raise InvalidVerdict(f"no {TOOL_NAME} call and no JSON object in the answer"
                             + (f" (it stopped: {stop})" if stop and stop not in ("end_turn", "tool_use") else ""))
    try:
        return json.loads(m.group(0))
    except ValueError as e:
        raise InvalidVerdict(f"the answer's JSON is malformed ({e})") from None


def parse_verdict(response: Mapping[str, Any], n: int, judge: JudgeConfig) -> JudgeVerdict:
    """A Converse response -> the verdict on ``n`` attempts (scores and one-line reasons in attempt order).

    Raises:
        InvalidVerdict: no ``record_scores`` call or JSON object, malformed JSON, an attempt missing, given
            twice or not among 1..n, a score that is not a finite number or is outside the config's range.
    """
    value = _answer_input(response)
    entries = value.get("scores") if isinstance(value, Mapping) else None
    if not isinstance(entries, list):
        raise InvalidVerdict("the answer has no 'scores' list")
    scores: dict[int, float] = {}
    reasons: dict[int, str] = {}
    lo, hi = judge.score_min, judge.score_max
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise InvalidVerdict(f"a scores entry is not an object (got {str(entry)[:60]!r})")
        k = entry.get("attempt")
        if isinstance(k, float) and k.is_integer():
            k = int(k)
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= n:
            shown = k if isinstance(k, int) and not isinstance(k, bool) else repr(str(k)[:20])
            raise InvalidVerdict(f"attempt {shown} does not exist (the attempts are 1 to {n})")
        if k in scores:
            raise InvalidVerdict(f"attempt {k} is scored twice")
        s = entry.get("score")
        if isinstance(s, str):
            try:
                s = float(s)
            except ValueError:
                pass
        if not isinstance(s, (int, float)) or isinstance(s, bool) or not math.isfinite(s):
            raise InvalidVerdict(f"attempt {k}'s score is not a number (got {str(s)[:30]!r})")
        if not lo <= s <= hi:
            raise InvalidVerdict(f"attempt {k}'s score {s:g} is outside the range {lo:g} to {hi:g}")
        scores[k] = float(s)
        reason = " ".join(str(entry.get("reason") or "").split())
        reasons[k] = reason[:MAX_REASON_CHARS] or "(no reason given)"
    missing = [k for k in range(1, n + 1) if k not in scores]
    if missing:
        raise InvalidVerdict(f"attempt(s) {', '.join(map(str, missing))} missing")
    return JudgeVerdict(model_id=judge.model_id, scores=[scores[k] for k in range(1, n + 1)],
                        reasons=[reasons[k] for k in range(1, n + 1)])


# ---------------------------------------------------------------------------- scores -> rewards


def judged_reward(score: float | None, judge: JudgeConfig) -> float:
    """The judge's score mapped to [0, 1] (``score_min`` -> 0, ``score_max`` -> 1); None (not scored) -> 0."""
    if score is None:
        return 0.0
    return (float(score) - judge.score_min) / (judge.score_max - judge.score_min)


def _normalized(values_G: Sequence[float]) -> list[float]:
    """``(x - mean) / (std + eps)`` within a group; zeros when the values are all equal (no signal)."""
    from stepwise.core.advantages import carries_no_signal

    if carries_no_signal(list(values_G)):
        return [0.0] * len(values_G)
    mean = math.fsum(values_G) / len(values_G)
    std = math.sqrt(math.fsum((x - mean) ** 2 for x in values_G) / len(values_G))
    return [(x - mean) / (std + EPS) for x in values_G]


def _position(record: JudgeRecord, rollout: RolloutRecord) -> int | None:
    if rollout.sid is not None and rollout.sid in record.sids_G:
        return record.sids_G.index(rollout.sid)
    return None


def apply_judgements(rollouts: Sequence[RolloutRecord], records: Mapping[str, JudgeRecord],
                     cfg: RunConfig) -> list[RolloutRecord]:
    """The rollouts of one generation batch with their groups' judge records merged in (see the module doc):
    copies with ``agent_reward`` (the agent's reward), ``judge_score`` / ``judge_reason`` and ``reward`` (and,
    with per-turn rewards under ``add``, the last of ``turn_rewards``) set as ``cfg.judge.combine`` and
    ``cfg.judge.fallback`` say. ``records`` maps input ids to records; a group without one falls back with
    that reason. Without ``cfg.judge`` the rollouts are returned unchanged.
    """
    judge = cfg.judge
    if judge is None:
        return list(rollouts)
    groups: dict[str, list[RolloutRecord]] = {}
    for r in rollouts:
        groups.setdefault(r.input_id, []).append(r)
    out: dict[int, RolloutRecord] = {}
    for input_id, members in groups.items():
        record = records.get(input_id)
        agent_G = [float(r.reward) for r in members]
        positions = [_position(record, r) if record is not None else None for r in members]
        verdict = record is not None and record.source in ("judge", "cache")
        if not verdict:
            why = ("no judge record for this group (the judge did not run for it)" if record is None
                   else record.fallback_reason or f"not judged ({record.source})")
            for r, a in zip(members, agent_G, strict=True):
                reward = a if judge.fallback == "agent_reward" else 0.0
                update: dict[str, Any] = {"agent_reward": a, "judge_score": None, "reward": reward,
                                          "judge_reason": f"fallback ({judge.fallback}): {why}"}
                if judge.fallback == "no_signal" and r.turn_rewards is not None:
                    update["turn_rewards"] = [0.0] * len(r.turn_rewards)
                out[id(r)] = r.model_copy(update=update)
            continue
        assert record is not None
        scores_G = [record.scores_G[p] if p is not None and p < len(record.scores_G) else None for p in positions]
        reasons_G = [record.reasons_G[p] if p is not None and p < len(record.reasons_G) else
                     "not judged: the rollout did not complete" for p in positions]
        judged_G = [judged_reward(s, judge) for s in scores_G]
        if judge.combine == "replace":
            reward_G = judged_G
        elif judge.combine == "add":
            reward_G = [a + judge.weight * j for a, j in zip(agent_G, judged_G, strict=True)]
        else:  # gdpo
            za, zj = _normalized(agent_G), _normalized(judged_G)
            reward_G = [x + judge.weight * y for x, y in zip(za, zj, strict=True)]
        for r, a, s, why, reward, j in zip(members, agent_G, scores_G, reasons_G, reward_G, judged_G, strict=True):
            update = {"agent_reward": a, "judge_score": s, "judge_reason": why, "reward": reward}
            if judge.combine == "add" and r.turn_rewards:
                update["turn_rewards"] = [*r.turn_rewards[:-1], r.turn_rewards[-1] + judge.weight * j]
            out[id(r)] = r.model_copy(update=update)
    return [out[id(r)] for r in rollouts]


# ---------------------------------------------------------------------------- metrics


def spearman(x: Sequence[float], y: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long sequences (ties get their average rank:
    ``scipy.stats.spearmanr``), or None when either is constant or shorter than 2 (undefined)."""
    if len(x) != len(y) or len(x) < 2 or len(set(x)) < 2 or len(set(y)) < 2:
        return None
    from scipy.stats import spearmanr

    rho = float(spearmanr(list(x), list(y)).statistic)
    return rho if math.isfinite(rho) else None


def _mean(values: Iterable[float]) -> float | None:
    v = list(values)
    return math.fsum(v) / len(v) if v else None


def judge_metrics(rollouts: Sequence[RolloutRecord], records: Iterable[JudgeRecord]) -> dict[str, float]:
    """The step summary's ``judge/*`` keys, from the step's merged rollouts (`apply_judgements`) and its
    groups' records:

    - ``judge/groups``, ``judge/judged_groups`` (a verdict, fresh or cached), ``judge/cached_groups``,
      ``judge/fallback_groups`` (no valid verdict: the fallback scored them), ``judge/skipped_groups``;
    - ``judge/mean_score`` (the judge's scores, in its range), ``judge/mean_agent_reward``;
    - ``judge/agreement_spearman``: the judge's rank agreement with the agent's reward, Spearman's rho within
      each group where both vary, averaged over those ``judge/agreement_groups`` (absent when none);
    - ``judge/mean_judged_chars`` beside ``judge/mean_score``, and ``judge/length_spearman``, the rank
      correlation of judged length and score within groups (averaged; absent when none varies);
      ``judge/length_bias_alarm`` is 1 when it is at least `LENGTH_ALARM_CORRELATION` over at least
      `LENGTH_ALARM_MIN_GROUPS` groups (a judge that prefers longer answers);
    - ``judge/requests``, ``judge/input_tokens``, ``judge/output_tokens``, ``judge/invalid_answers``
      (answers asked again), ``judge/throttled`` (throttled requests waited out), ``judge/seconds`` (summed).
    """
    recs = list(records)
    out: dict[str, float] = {"judge/groups": float(len(recs))}
    for source, key in (("judge", "judged_groups"), ("cache", "cached_groups"), ("fallback", "fallback_groups"),
                        ("skipped", "skipped_groups")):
        out[f"judge/{key}"] = float(sum(1 for r in recs if r.source == source))
    out["judge/judged_groups"] += out["judge/cached_groups"]
    scored = [r for r in rollouts if r.judge_score is not None]
    if (m := _mean(float(r.judge_score) for r in scored if r.judge_score is not None)) is not None:
        out["judge/mean_score"] = m
    if (m := _mean(float(r.agent_reward) for r in rollouts if r.agent_reward is not None)) is not None:
        out["judge/mean_agent_reward"] = m
    by_group: dict[str, list[RolloutRecord]] = {}
    for r in scored:
        by_group.setdefault(r.input_id, []).append(r)
    agreement = [rho for g in by_group.values()
                 if (rho := spearman([float(r.agent_reward or 0.0) for r in g], [float(r.judge_score or 0.0) for r in g]))
                 is not None]
    if agreement:
        out["judge/agreement_spearman"] = math.fsum(agreement) / len(agreement)
    out["judge/agreement_groups"] = float(len(agreement))
    lengths = [rho for rec in recs if rec.source in ("judge", "cache")
               for pairs in [[(c, s) for c, s, j in zip(rec.judged_chars_G, rec.scores_G, rec.judged_G, strict=False)
                              if j and s is not None]]
               if (rho := spearman([float(c) for c, _ in pairs], [float(s) for _, s in pairs])) is not None]
    chars = [c for rec in recs for c, j in zip(rec.judged_chars_G, rec.judged_G, strict=False) if j]
    if chars:
        out["judge/mean_judged_chars"] = math.fsum(chars) / len(chars)
    if lengths:
        out["judge/length_spearman"] = math.fsum(lengths) / len(lengths)
    out["judge/length_bias_alarm"] = float(len(lengths) >= LENGTH_ALARM_MIN_GROUPS
                                           and out.get("judge/length_spearman", 0.0) >= LENGTH_ALARM_CORRELATION)
    usage = [r.usage for r in recs if r.usage is not None]
    out["judge/requests"] = float(sum(u.judge_requests for u in usage))
    out["judge/input_tokens"] = float(sum(u.judge_input_tokens for u in usage))
    out["judge/output_tokens"] = float(sum(u.judge_output_tokens for u in usage))
    out["judge/invalid_answers"] = float(sum(max(0, r.attempts - 1) for r in recs if r.source == "judge")
                                         + sum(r.attempts for r in recs if r.source == "fallback"))
    out["judge/throttled"] = float(sum(r.throttled for r in recs))
    out["judge/seconds"] = float(math.fsum(r.seconds for r in recs))
    return out
