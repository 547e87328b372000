"""Reward extraction from an agent's rollout result (the JSON the toolkit writes to S3).

Sources:
- `agentcore_rl_toolkit/rollout_session/agentcore_s3_session.py`: ``status_error`` (a non-200
  ``status_code`` is a failed rollout; its ``rewards`` describe nothing) and ``extract_agent_reward``
  (``rewards`` is a scalar or a list whose last element is the reward; an empty list reports none).
- `agentcore_rl_toolkit/backends/experimental/sagemaker/rollout.py` ``_extract_reward``: the
  reference loop's ``float(result["reward"])``, and 0.0 whenever extraction fails.

The toolkit's session raises on a non-numeric ``rewards``; the reference loop scores every
failure 0.0 and keeps going. We keep the loop's behaviour (never raise, 0.0) but return the
reason, so FinishRollout can log it and the step summary can count it.

A rollout's outcome (FinishRollout's classification: ``ok`` / ``error`` / ``timeout``, ``late``, its reward
and per-turn rewards) is decided here too, in three pure steps around FinishRollout's reads: `task_end`
(how the rollout's task ended, and which result object to read), `rollout_outcome` (that and what reading
the object found: `ResultRead`), `per_turn_outcome` (the per-turn rewards against the turns captured).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Any, Literal, Mapping

from stepwise.core.liveness import RolloutTimeouts, task_error, timeout_cause

__all__ = ["MAX_RESULT_BYTES", "ResultRead", "RolloutOutcome", "TaskEnd", "agent_failure", "extract_reward",
           "extract_turn_rewards", "per_turn_outcome", "preview", "result_too_large", "reward_metrics",
           "rollout_outcome", "task_end"]

#: The largest agent result object FinishRollout reads (bytes): the toolkit's result holds the user's dict and
#: the dataset row (``payload``), so it is generous, yet parsed it stays far inside FinishRollout's memory
#: (1,024 MB; a JSON document takes several times its size as Python objects).
MAX_RESULT_BYTES = 16 * 2**20


def result_too_large(size: int, limit: int = MAX_RESULT_BYTES) -> dict[str, str]:
    """The failure of a rollout whose result object is ``size`` bytes, over ``limit``: ``{"error":
    "ResultTooLarge", "cause"}`` (the rollout is an ``error``, scored 0.0; the object is never read)."""
    return {"error": "ResultTooLarge",
            "cause": f"the agent's result object is {size:,} bytes, over the {limit:,} FinishRollout reads "
                     "(docs/agent-contract.md: return the rewards and what you need for debugging, not bulk data)"}


def preview(value: Any, limit: int = 80) -> str:
    """``str(value)`` cut to ``limit`` characters, for logs and causes; never raises (a value nested
    too deeply for ``str``, or an int too long to print, gets a placeholder)."""
    try:
        text = value if isinstance(value, str) else str(value)
    except (RecursionError, ValueError, MemoryError):
        text = f"<{type(value).__name__} too deep or too long to print>"
    return text[:limit]


def _status_code_failed(result: dict[str, Any]) -> bool:
    # Same rule as the toolkit's agentcore_s3_session.status_error: absent or == 200 is success.
    status_code = result.get("status_code")
    try:
        return not (status_code is None or status_code == 200)
    except RecursionError:  # == on a nested value never recurses today; keep "never raises" anyway
        return True


def agent_failure(result: Any) -> dict[str, str] | None:
    """The failure an agent's result reports about itself, or ``None`` when it reports success.

    ``@app.rollout_entrypoint`` saves a result whether the agent's function returned or raised; a
    raised exception (including the OpenAI/Anthropic client's error when every LLM call was
    refused) is saved with ``status_code`` 500 and ``str(exception)`` as ``stop_reason``
    (`agentcore_rl_toolkit/app.py` ``rollout_background_task``). Such a rollout *failed*: its
    ``rewards``, if any, describe nothing.

    Returns:
        ``{"error": "AgentError", "status_code": str, "cause": stop_reason}`` (strings, the cause cut
        to 1,000 characters) when ``result`` is a dict whose ``status_code`` is present and not 200
        (the toolkit's ``status_error`` rule); else ``None``. Never raises.
    """
    if not isinstance(result, dict) or not _status_code_failed(result):
        return None
    return {"error": "AgentError", "status_code": preview(result.get("status_code"), 40),
            "cause": preview(result.get("stop_reason", "unknown"), 1000)}


def _status_error(result: dict[str, Any]) -> str | None:
    # The toolkit's status_error wording, for the reward reason.
    failure = agent_failure(result)
    if failure is None:
        return None
    return f"agent returned status_code={failure['status_code']}: {failure['cause']}"


#: The largest reward magnitude kept: a group's squared deviations (GRPO's std, the step's reward_std)
#: stay finite for up to 10,000 rollouts ((2e150)^2 x 1e4 < 1.8e308). A larger finite reward made
#: the advantages NaN; it scores 0.0 with a reason, like a non-finite one.
MAX_ABS_REWARD = 1e150


def _as_float(value: Any, field: str) -> tuple[float | None, str | None]:
    try:
        reward = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: an int beyond float's range
        return None, f"non-numeric {field}: {preview(value)!r}"
    if not math.isfinite(reward):
        return None, f"non-finite {field}: {reward}"
    if abs(reward) > MAX_ABS_REWARD:
        return None, f"{field} beyond +-{MAX_ABS_REWARD:g}: {reward:g} (a group's mean and squares would overflow)"
    return reward, None


def extract_reward(result: dict[str, Any] | None) -> tuple[float, str | None]:
    """The rollout's scalar reward, and why it was zeroed (``None`` when it was not).

    Args:
        result: the agent's saved result dict, or ``None`` when there is none (ACR error,
            timeout, missing object).

    Returns:
        ``(reward, reason)``. ``reward`` is ``rewards`` (scalar, or the last element of a
        list), else ``reward``; it is 0.0 with a reason when the result is missing, not a
        dict, reports a non-200 ``status_code``, has neither key, an empty ``rewards`` list
        and no ``reward``, or a non-numeric / NaN / infinite / out-of-float-range value, or one beyond
        +-`MAX_ABS_REWARD` (finite, but a group's statistics would overflow).
        Never raises, whatever JSON value ``result`` is (property-tested with hypothesis).
    """
    if result is None:
        return 0.0, "no result (rollout failed or timed out)"
    if not isinstance(result, dict):
        return 0.0, f"result is not an object (got {type(result).__name__})"
    error = _status_error(result)
    if error is not None:
        return 0.0, error
    rewards = result.get("rewards")
    if isinstance(rewards, list) and not rewards:
        rewards = None  # an empty list reports no reward (toolkit extract_agent_reward)
        if "reward" not in result:
            return 0.0, "empty 'rewards' list"
    if rewards is not None:
        value = rewards[-1] if isinstance(rewards, list) else rewards
        reward, why = _as_float(value, "rewards")
    elif "reward" in result:
        reward, why = _as_float(result["reward"], "reward")
    else:
        return 0.0, "result has no 'rewards' or 'reward'"
    if reward is None:
        return 0.0, why
    return reward, None


_TURN_KEY_RE = re.compile(r"-?[0-9]+")


def _turn_index(key: Any, num_turns: int) -> int | None:
    """A mapping key as a turn index in ``[0, num_turns)`` (negative counts from the end), else None."""
    if isinstance(key, bool):
        return None
    if isinstance(key, str):  # ASCII decimal digits only: int() also reads "1_0", " 1 " and non-ASCII digits
        if _TURN_KEY_RE.fullmatch(key) is None or len(key) > 20:
            return None
        i: int | None = int(key)
    else:
        i = key if isinstance(key, int) else None
    if i is None or not -num_turns <= i < num_turns:
        return None
    return i % num_turns


def extract_turn_rewards(result: dict[str, Any] | None, num_turns: int) -> tuple[list[float], str | None]:
    """The rollout's per-turn rewards (``reward_granularity: per_turn``), aligned with its LLM turns.

    The contract (docs/agent-contract.md): ``rewards`` is either a list with one reward per LLM
    turn, in the order the gateway recorded the turns (the order the calls completed), or an object
    mapping turn indices to rewards (``{"0": 1.0, "-1": 0.5}``: keys 0-based, negative counts from
    the last turn, unnamed turns get 0.0). A single number (``rewards`` or ``reward``) is the last
    turn's reward. ``num_turns`` is how many LLM turns the gateway captured.

    Returns:
        ``(rewards_T, reason)``: ``num_turns`` floats, and ``None``; or, when the result does not give
        usable per-turn rewards, ``num_turns`` zeros and why (a zeroed rollout): every reason
        `extract_reward` gives, a list whose length is not ``num_turns``, a key that is not a turn
        index, two keys naming one turn, a non-numeric or non-finite value, a number with no turn to
        carry it, or rewards whose absolute sum passes +-`MAX_ABS_REWARD`. Never raises.
    """
    zeros = [0.0] * max(0, int(num_turns))
    rewards = result.get("rewards", result.get("reward")) if isinstance(result, dict) else None
    if not isinstance(rewards, (list, dict)) or _status_error(result) is not None:  # type: ignore[arg-type]
        scalar, why = extract_reward(result)
        if why is not None:
            return zeros, why
        rewards = scalar
    if isinstance(rewards, list):
        if len(rewards) != num_turns:
            return zeros, (f"per-turn rewards: the agent returned {len(rewards)} rewards for {num_turns} LLM turn(s) "
                           "(one per turn, or a {turn index: reward} object)")
        values = rewards
        out: list[float] = []
        for t, value in enumerate(values):
            reward, bad = _as_float(value, f"rewards[{t}]")
            if reward is None:
                return zeros, f"per-turn rewards: {bad}"
            out.append(reward)
    elif isinstance(rewards, dict):
        out = list(zeros)
        seen: dict[int, Any] = {}
        for key, value in rewards.items():
            t = _turn_index(key, num_turns)
            if t is None:
                return zeros, (f"per-turn rewards: key {preview(key, 40)!r} is not a turn index in "
                               f"[-{num_turns}, {num_turns}) ({num_turns} LLM turn(s))")
            if t in seen:
                return zeros, f"per-turn rewards: keys {preview(seen[t], 40)!r} and {preview(key, 40)!r} both name turn {t}"
            seen[t] = key
            reward, bad = _as_float(value, f"rewards[{preview(key, 40)!r}]")
            if reward is None:
                return zeros, f"per-turn rewards: {bad}"
            out[t] = reward
    else:  # one number: the last turn's reward
        if num_turns < 1:
            return zeros, "per-turn rewards: a reward but no captured LLM turn to carry it"
        out = [0.0] * (num_turns - 1) + [float(rewards)]
    if math.fsum(abs(r) for r in out) > MAX_ABS_REWARD:
        return zeros, (f"per-turn rewards: absolute sum beyond +-{MAX_ABS_REWARD:g} (a group's reward-to-go "
                       "statistics would overflow)")
    return out, None


def reward_metrics(rewards: list[float], zeroed_reasons: list[str | None] | None = None) -> dict[str, float]:
    """Slash-namespaced reward summary of a step's rollouts: ``sampler/mean_reward`` (the
    reference's name), ``sampler/reward_std`` (population), ``sampler/reward_min``,
    ``sampler/reward_max`` (0.0 without rollouts), ``sampler/num_rollouts`` and, given the reasons
    `extract_reward` returned, ``sampler/zeroed_rollouts`` (rewards forced to 0.0)."""
    n = len(rewards)
    mean = sum(rewards) / n if n else 0.0
    out = {
        "sampler/mean_reward": mean,
        "sampler/reward_std": math.sqrt(sum((r - mean) ** 2 for r in rewards) / n) if n else 0.0,
        "sampler/reward_min": float(min(rewards)) if n else 0.0,
        "sampler/reward_max": float(max(rewards)) if n else 0.0,
        "sampler/num_rollouts": float(n),
    }
    if zeroed_reasons is not None:
        out["sampler/zeroed_rollouts"] = float(sum(1 for r in zeroed_reasons if r is not None))
    return out


# ---------------------------------------------------------------------------- a rollout's outcome (FinishRollout)

#: A rollout record's ``status``: it returned a result (``ok``; its reward may still be zeroed, with a
#: reason), it failed (``error``: the agent's own failure, a bad result, the invoke), or it ran out of time.
RolloutStatus = Literal["ok", "error", "timeout"]
#: The reason of a per-turn rollout without a gateway session (no captured turn to carry a reward).
NO_SESSION_TURNS = "per-turn rewards: no gateway session, so no LLM turn"


@dataclass(frozen=True)
class TaskEnd:
    """How a rollout's Step Functions task ended, before its result object is read (`task_end`).

    Attributes:
        status: ``ok`` (resumed with a result, or neither result nor error), ``error`` or ``timeout``.
        error: ``{"error", "cause"}`` for ``error`` and ``timeout``, else None.
        late: the result was found by the re-check ("Wait for rollout result"), not its notification.
        read: which result object FinishRollout reads next: ``none``; ``result`` (the one the task's result
            names, or the rollout's own key); ``if_present`` (a timeout: the rollout's own key, read only when
            it exists, then scored as `found_late`: S3 notifications are at-least-once and may come late).
    """

    status: RolloutStatus
    error: dict[str, str] | None = None
    late: bool = False
    read: Literal["none", "result", "if_present"] = "none"

    def found_late(self) -> TaskEnd:
        """A timed-out rollout whose result object exists after all: scored (``ok``, ``late``), read next."""
        return TaskEnd("ok", None, True, "result")


def task_end(error: Mapping[str, Any] | None, result: Mapping[str, Any] | None, timeouts: RolloutTimeouts, *,
             silence_seconds: int | None = None, started: bool = True) -> TaskEnd:
    """How a rollout's task ended: ``error`` is the task's Catch output (``{"Error", "Cause"}``: a timeout's
    name as `stepwise.core.liveness.task_error` gives it, its cause `stepwise.core.liveness.timeout_cause`
    with ``silence_seconds``, another error's its ``Cause``, at most 1,000 characters), ``result`` the task's
    output (OnRolloutResult's, or the re-check's with ``rechecked``). ``started``: the rollout has a session
    (a sid): a timed-out one without one has no result to look for. Never raises."""
    if error is not None:
        err = task_error(str(error.get("Error", "error")))
        cause = timeout_cause(err, timeouts, silence_seconds=silence_seconds)
        status: RolloutStatus = "timeout" if cause is not None else "error"
        failure = {"error": err, "cause": cause or str(error.get("Cause", ""))[:1000]}
        return TaskEnd(status, failure, False, "if_present" if status == "timeout" and started else "none")
    if result is not None:
        return TaskEnd("ok", None, bool(result.get("rechecked")), "result")
    return TaskEnd("ok")


@dataclass(frozen=True)
class ResultRead:
    """What reading a rollout's result object (at most `MAX_RESULT_BYTES`) found: its parsed JSON ``value``,
    or that it is ``missing``, ``too_large`` (its size, bytes: never read), or ``malformed`` (why: not JSON,
    not UTF-8, nested too deep)."""

    value: Any = None
    missing: bool = False
    too_large: int | None = None
    malformed: str | None = None


@dataclass(frozen=True)
class RolloutOutcome:
    """A rollout's outcome as its record keeps it (`stepwise.records.RolloutRecord`).

    Attributes:
        status: see `RolloutStatus`.
        error: ``{"error", "cause"}`` (and ``result_key`` for a bad result object) when not ``ok``.
        late: scored from a result found after its task timed out, or by the re-check.
        result: the agent's result object when it is a JSON object and the rollout ``ok`` (else None).
        reward: the rollout's reward; 0.0 unless ``ok`` (`extract_reward`; per-turn: `per_turn_outcome`).
        reason: why the reward is zeroed (None: it is not, or per-turn and not yet read against the turns).
        turn_rewards: per-turn rewards, one per captured LLM turn (`per_turn_outcome`), else None.
    """

    status: RolloutStatus
    error: dict[str, Any] | None
    late: bool
    result: dict[str, Any] | None
    reward: float
    reason: str | None
    turn_rewards: list[float] | None = None


def rollout_outcome(end: TaskEnd, read: ResultRead | None, *, result_key: str | None = None,
                    per_turn: bool = False) -> RolloutOutcome:
    """The rollout's outcome from how its task ended (`task_end`, after `TaskEnd.found_late` where its result
    turned up) and what reading its result object found (``read``; None: none was read). A result that is
    missing, too large, malformed or not a JSON object, or that reports the agent's own failure
    (`agent_failure`), makes the rollout an ``error`` (``result_key`` named in the first four); the reward is
    `extract_reward`'s of an ``ok`` rollout's result, else 0.0 with ``"{status}: {error}: {cause}"`` as its
    reason. ``per_turn``: an ``ok`` rollout's reason waits for `per_turn_outcome`. Never raises."""
    status, error, result = end.status, end.error, None
    if read is not None:
        where = {"result_key": result_key}
        if read.missing:
            status, error = "error", {"error": "ResultMissing", "cause": "the result object was not found", **where}
        elif read.too_large is not None:  # never read: a result beyond the bound is the agent's fault, not an OOM
            status, error = "error", {**result_too_large(read.too_large), **where}
        elif read.malformed is not None:
            # the key stays out of the cause, so a run's failure counts rollouts by cause
            status, error = "error", {"error": "MalformedResult", "cause": preview(read.malformed, 1000), **where}
        elif not isinstance(read.value, dict):
            status, error = "error", {"error": "MalformedResult", **where,
                                      "cause": f"not a JSON object (got {type(read.value).__name__})"}
        elif (failure := agent_failure(read.value)) is not None:
            # the toolkit saved the agent's exception (status_code 500): a failed rollout, not a zero reward
            status, error, result = "error", failure, read.value
        else:
            result = read.value
    reward, reason = extract_reward(result if status == "ok" else None)
    if per_turn and status == "ok":
        reason = None  # read against the captured turns (per_turn_outcome)
    if status != "ok":
        reason = f"{status}: {error['error']}: {preview(error['cause'], 200)}" if error else status
    return RolloutOutcome(status, error, end.late, result if status == "ok" else None, reward, reason)


def per_turn_outcome(outcome: RolloutOutcome, num_turns: int | None) -> RolloutOutcome:
    """``reward_granularity: per_turn``: the outcome with one reward per LLM turn of the ``num_turns`` the
    gateway captured (`extract_turn_rewards`; None: the rollout had no gateway session, so no turn: an ``ok``
    one is zeroed with `NO_SESSION_TURNS`). An ``ok`` rollout's reward is their sum and its reason theirs;
    another keeps its 0.0 and reason (its turn rewards are zeros). Never raises."""
    if num_turns is None:
        return replace(outcome, reward=0.0, reason=NO_SESSION_TURNS) if outcome.status == "ok" else outcome
    turn_rewards, why = extract_turn_rewards(outcome.result if outcome.status == "ok" else None, num_turns)
    if outcome.status == "ok":
        return replace(outcome, reward=math.fsum(turn_rewards), reason=why, turn_rewards=turn_rewards)
    return replace(outcome, turn_rewards=turn_rewards)
