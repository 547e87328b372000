"""Overlapped steps (``max_staleness`` >= 1): which policy versions a batch may mix, and what the overlap costs.

With ``max_staleness`` 0 (the reference loop, `train_grpo.py`) a step rolls out on policy version
``v`` and trains on it, so its datums are exactly on-policy. With 1, the rollouts of step ``n+1``
sample on version ``v`` while step ``n`` trains and rebinds to ``v+1`` (one Parallel state,
docs/operating.md, overlapped steps); step ``n+1`` then updates version ``v+1`` with datums sampled on ``v``. The
datums carry the sampling logprobs (`stepwise.core.datums`: the reference's ``logprobs`` loss
input), so the ``importance_sampling``, ``ppo`` and ``cispo`` losses weight each token by
``exp(logprob_now - logprob_sampled)`` and correct for the lag; one version of lag is the
"one-step off-policy" of verl / AReaL / PipelineRL.

Everything here is pure (no I/O): the planner asks `roll_out_ahead_blocker`, ComputeAdvantages
calls `check_staleness` and reports `staleness_metrics`, Rebind reports `session_time_metrics`.

Staleness of a rollout = ``trained_version - sampled_version``: how many optimizer steps the
policy that receives the update has moved since the rollout sampled. Units: policy versions
(``RunState.policy_version``, one per optimizer step applied).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: The largest ``max_staleness`` the batch engine (``admission: batch``) implements: one Parallel state
#: overlaps one training step with the next step's rollouts, so nothing can lag by two versions. The group
#: engine (``admission: group``, `stepwise.core.groups`) takes any bound.
MAX_SUPPORTED_STALENESS = 1

#: From this ``max_staleness`` on, the loss defaults to `DEEP_ASYNC_LOSS` and ``importance_sampling`` is refused.
DEEP_STALENESS = 2
#: The loss a config that names none gets from ``max_staleness`` `DEEP_STALENESS` on: ``(loss,
#: clip_low_threshold, clip_high_threshold)``. With one optimizer step per batch the proximal policy of
#: AReaL's decoupled PPO objective (Fu et al. 2025, "AReaL: A Large-Scale Asynchronous Reinforcement
#: Learning System for Language Reasoning", arXiv:2505.24298, eq. 5) is the policy being updated, so
#: its clipped ratio is 1 where the gradient is taken and the objective's gradient is the behaviour
#: importance weight ``pi_theta / pi_behaviour`` times ``A * grad log pi_theta``; the weight is truncated
#: (AReaL and verl cap it). The service's cispo computes exactly ``sg(clip(r, lo, hi)) * A * log pi``
#: (`local/simulator/losses.py`), so lo 0 and hi 2 is truncated importance sampling with the cap at 2
#: (tests/simulator/test_losses.py checks the gradients agree).
DEEP_ASYNC_LOSS = ("cispo", 0.0, 2.0)


def deep_async_defaults(config: dict) -> dict:
    """The fields a raw config (a mapping, before validation) gets filled in from ``max_staleness``
    `DEEP_STALENESS` on when it names no ``loss``: `DEEP_ASYNC_LOSS` (the thresholds only where unset).
    ``{}`` otherwise, and for a config whose ``max_staleness`` is not an integer (validation says why)."""
    k = config.get("max_staleness")
    if isinstance(k, bool) or not isinstance(k, int) or k < DEEP_STALENESS or "loss" in config:
        return {}
    loss, lo, hi = DEEP_ASYNC_LOSS
    out: dict = {"loss": loss}
    if config.get("clip_low_threshold") is None:
        out["clip_low_threshold"] = lo
    if config.get("clip_high_threshold") is None:
        out["clip_high_threshold"] = hi
    return out


def deep_loss_problem(loss: str | None, max_staleness: int) -> str | None:
    """Why ``loss`` cannot train rollouts up to ``max_staleness`` versions old, or None.

    Untruncated importance sampling weights a token by ``pi_theta / pi_behaviour`` without a bound:
    beyond a lag of one or two versions a few tokens whose probability moved far get weights of
    hundreds, and the async systems' ablations (AReaL's "naive PPO" at staleness 4: 23.3 on AIME24
    against 42.2 with the decoupled objective) show training collapse without a correction.
    """
    if loss == "importance_sampling" and max_staleness >= DEEP_STALENESS:
        lo_hi = f"{DEEP_ASYNC_LOSS[1]:g} and {DEEP_ASYNC_LOSS[2]:g}"
        return (f"loss 'importance_sampling' is not bounded, and from max_staleness {DEEP_STALENESS} on rollouts "
                f"sampled several versions ago get unbounded weights (training collapses in the async systems' "
                f"ablations): use loss 'cispo' with clip_low_threshold/clip_high_threshold {lo_hi} (truncated "
                f"importance sampling, the default when no loss is named), or 'ppo'")
    return None


class StalenessExceeded(RuntimeError):
    """A batch about to be trained holds rollouts older than ``max_staleness`` versions (or sampled
    on a version newer than the policy they would update): training on it would break the run's
    off-policy bound. Raised by ComputeAdvantages before any datum is written."""


def staleness_R(sampled_versions_R: Sequence[int | None], trained_version: int) -> list[int]:
    """Per rollout, ``trained_version - sampled_version`` (policy versions; 0 = on-policy).

    Args:
        sampled_versions_R: the policy version each rollout sampled with (its rollout record's
            ``policy_version``); None = a record written before rollouts recorded it, which only
            the on-policy loop produced, so it counts as ``trained_version``.
        trained_version: the policy version the batch's update is applied to (``state.policy_version``
            when ComputeAdvantages runs).
    """
    return [trained_version - (trained_version if v is None else int(v)) for v in sampled_versions_R]


def check_staleness(sampled_versions_R: Sequence[int | None], trained_version: int, max_staleness: int,
                    *, where: str = "the batch") -> None:
    """The assertion ComputeAdvantages makes before it writes datums: every rollout sampled on a
    version in ``[trained_version - max_staleness, trained_version]``.

    Raises:
        StalenessExceeded: naming how many rollouts are too old or from the future, and the versions.
    """
    lags = staleness_R(sampled_versions_R, trained_version)
    too_old = [lag for lag in lags if lag > max_staleness]
    future = [lag for lag in lags if lag < 0]
    if too_old or future:
        versions = sorted({trained_version - lag for lag in lags})
        parts = []
        if too_old:
            parts.append(f"{len(too_old)} rollout(s) {max(too_old)} version(s) old (max_staleness {max_staleness})")
        if future:
            parts.append(f"{len(future)} rollout(s) sampled on a version newer than the policy they would update")
        raise StalenessExceeded(f"{where} would update policy version {trained_version} with "
                                f"{' and '.join(parts)}; sampled versions {versions}")


def sampled_version(rollout: Any) -> int | None:
    """The version a rollout's staleness is counted from: its first turn's (`RolloutRecord.first_turn_version`),
    else the version its session was opened on (``policy_version``: a rollout without a turn, or a record
    written before turns' versions were recorded; the same version under per-rollout packages)."""
    first = getattr(rollout, "first_turn_version", None)
    return first if first is not None else getattr(rollout, "policy_version", None)


def staleness_histogram(sampled_versions_R: Sequence[int | None], trained_version: int, max_staleness: int
                        ) -> dict[str, float]:
    """How many trained rollouts lag by each staleness: ``staleness/hist/{j}`` for j in 0..``max_staleness``
    (every key present), and ``staleness/past_k``: those beyond ``max_staleness`` (the group engine keeps it
    at 0 by pacing; a non-zero figure is a bug to report, never a reason to discard)."""
    lags = staleness_R(sampled_versions_R, trained_version)
    out = {f"staleness/hist/{j}": float(sum(1 for lag in lags if lag == j)) for j in range(max_staleness + 1)}
    out["staleness/past_k"] = float(sum(1 for lag in lags if lag > max_staleness or lag < 0))
    return out


def staleness_metrics(sampled_versions_R: Sequence[int | None], trained_version: int) -> dict[str, float]:
    """``staleness/max``, ``staleness/mean`` (policy versions) and ``staleness/stale_fraction`` (rollouts
    sampled on an older version) of the rollouts a step trains on; ``{}`` when there are none."""
    lags = staleness_R(sampled_versions_R, trained_version)
    if not lags:
        return {}
    return {"staleness/max": float(max(lags)), "staleness/mean": sum(lags) / len(lags),
            "staleness/stale_fraction": sum(1 for lag in lags if lag > 0) / len(lags)}


def roll_out_ahead_blocker(*, max_staleness: int, finishing: bool, save_due: bool, segment_ends: bool,
                           stop_due: str | None = None, base_sampler: bool = False) -> str | None:
    """Why the next step's first generation batch may NOT be rolled out while this step trains, or None.

    Args:
        max_staleness: the run's bound (0 = never overlap).
        finishing: no next training step (epochs done, data exhausted, a stop reason set).
        save_due: a ``save_every`` checkpoint comes before the next step: the checkpoint records the
            dataset cursor a resume rewinds to, which must not include a batch rolled out ahead.
        segment_ends: the execution continues as a new one before the next step
            (``steps_per_execution``): the next execution starts that step on its own.
        stop_due: the stop reason a stopping rule gives for the next step (`stepwise.core.stopping.ahead_reason`):
            the run ends before it, so its batch would be rolled out for nothing.
        base_sampler: the sampler is still the base model (``sampler_model_package_arn`` ``""``). For
            the service a sample without ``modelPackageArn`` runs against "the session's latest
            checkpoint" (botocore's ``SampleConfig``), which becomes the weights this step saves while
            the rollouts run: they would sample a version newer than the one they record.

    Evals due before the next step do not block: the eval runs after the rebind, on the new policy,
    and the batch rolled out ahead waits for it in ``state.json``.
    """
    if max_staleness < 1:
        return "max_staleness 0"
    if finishing:
        return "no next training step"
    if save_due:
        return "a save_every checkpoint comes first"
    if segment_ends:
        return "the execution continues as a new one first"
    if stop_due is not None:
        return f"the run stops before the next step ({stop_due})"
    if base_sampler:
        return "the sampler is the base model (for the service: the session's latest checkpoint, which this step replaces)"
    return None


def session_time_metrics(*, train_started_at: float, rebound_at: float, previous_end: float | None) -> dict[str, float]:
    """How long the training session was busy and idle during one step, in seconds.

    Busy = from the step's first training operation submitted to its sampler rebound (forward_backward,
    optim_step, save_weights, load_weights_for_sampling and the polls between them: the session's
    billed work as the state machine sees it). Idle = the rest of the step's wall time, from the
    previous step's rebind (``previous_end``; None = the step's start is unknown, so no idle figure):
    rollouts, advantages and orchestration, all billed too. Overlapped steps shrink the idle part.

    Returns ``{"time/session_busy", "time/session_idle", "time/step_wall", "session/busy_fraction"}``
    (idle, wall and the busy fraction only when ``previous_end`` is given; idle is never negative). The
    busy fraction, busy over wall, is the figure a user pays for: the session bills for wall time.
    """
    busy = max(0.0, rebound_at - train_started_at)
    out = {"time/session_busy": busy}
    if previous_end is not None:
        wall = max(busy, rebound_at - previous_end)
        out.update({"time/session_idle": wall - busy, "time/step_wall": wall,
                    "session/busy_fraction": busy / wall if wall > 0 else 1.0})
    return out


#: The ratio bounds a loss clips at when its config names none: Tinker's documented defaults for ppo and
#: cispo (0.8, 1.2), which the simulator implements (`local/simulator/losses.py`); the clip fraction of
#: importance_sampling (no clip) is reported against them too.
DEFAULT_CLIP = (0.8, 1.2)


def loss_clip_bounds(cfg: Any) -> tuple[float, float]:
    """``(lo, hi)``: the config's ``clip_low_threshold`` / ``clip_high_threshold``, else `DEFAULT_CLIP`."""
    lo, hi = cfg.clip_low_threshold, cfg.clip_high_threshold
    return (DEFAULT_CLIP[0] if lo is None else float(lo), DEFAULT_CLIP[1] if hi is None else float(hi))


def loss_outputs_by_staleness(datums_D: Sequence[Any], outputs_D: Sequence[Any], staleness_D: Sequence[int],
                              clip: tuple[float, float]) -> dict[str, list[float]]:
    """The service's per-datum loss outputs of one forward_backward chunk, summed by staleness bucket:
    ``{"j": [kl_sum, clipped_tokens, tokens]}`` over the datums of staleness j, counting the tokens whose
    weight is not zero. ``kl`` is the k1 estimator of KL(sampler || policy) per token, ``log q - log p``
    (the sampler's logprob from the datum's ``lossFnInputs.logprobs``, the policy's from the output's
    ``logprobs``, as the simulator's ``actor/ppo_kl``); a token is clipped when ``exp(log p - log q)`` is
    outside ``clip`` = (lo, hi). Datums or outputs of an unexpected shape are left out.

    Args:
        datums_D: the chunk's datums as sent (``lossFnInputs``: ``logprobs``, ``weights`` as TensorData).
        outputs_D: the result's ``lossFnOutputs`` (``per_datum``: one ``{"logprobs": TensorData}`` each).
        staleness_D: each datum's staleness (`stepwise.core.steps.StepOutcome.datum_staleness`'s slice).
        clip: the loss's ratio bounds.
    """
    import math

    def values(t: Any) -> list[float]:
        data = t.get("data") if isinstance(t, dict) else t
        return [float(x) for x in data] if isinstance(data, list) else []

    out: dict[str, list[float]] = {}
    lo, hi = clip
    for datum, output, lag in zip(datums_D, outputs_D, staleness_D):
        inputs = (datum or {}).get("lossFnInputs") or {} if isinstance(datum, dict) else {}
        logq, weights = values(inputs.get("logprobs")), values(inputs.get("weights"))
        logp = values((output or {}).get("logprobs")) if isinstance(output, dict) else []
        if not logq or len(logq) != len(logp) or len(weights) != len(logp):
            continue
        acc = out.setdefault(str(int(lag)), [0.0, 0.0, 0.0])
        for p_, q_, w in zip(logp, logq, weights):
            if w == 0:
                continue
            ratio = math.exp(max(-50.0, min(50.0, p_ - q_)))
            acc[0] += q_ - p_
            acc[1] += 1.0 if (ratio < lo or ratio > hi) else 0.0
            acc[2] += 1.0
    return out


def staleness_loss_metrics(parts: Sequence[dict[str, list[float]]]) -> dict[str, float]:
    """``train/kl_staleness_{j}`` and ``train/clipfrac_staleness_{j}`` per staleness bucket j, from the chunks'
    `loss_outputs_by_staleness` sums: the early warning of an off-policy collapse is the KL of the old
    buckets growing step after step."""
    total: dict[str, list[float]] = {}
    for part in parts:
        for lag, (kl, clipped, n) in part.items():
            acc = total.setdefault(lag, [0.0, 0.0, 0.0])
            acc[0] += kl
            acc[1] += clipped
            acc[2] += n
    out: dict[str, float] = {}
    for lag, (kl, clipped, n) in sorted(total.items(), key=lambda kv: int(kv[0])):
        if n:
            out[f"train/kl_staleness_{lag}"] = kl / n
            out[f"train/clipfrac_staleness_{lag}"] = clipped / n
    return out
