"""The training service's loss functions, per datum, on the tiny model.

The service's ``lossFnName`` enum (botocore ``sagemakertrainingsessionruntime``: LossFnName)
is ``cross_entropy | importance_sampling | ppo | cispo``; the SDK (``types.LossFunction``,
``_utils._LOSS_FN_INPUT_KEYS``) requires ``target_tokens`` and ``weights`` for all of them and
``logprobs`` (the sampler's logprobs) and ``advantages`` for the policy losses, one value per
input token. ``lossFnConfig`` carries ``clip_low_threshold`` / ``clip_high_threshold``
(``training_client.forward_backward`` docstring: ``{"clip_low_threshold": 0.2,
"clip_high_threshold": 5.0}`` for CISPO/PPO clipping), bounds on the probability ratio.

The API and its input names are those of Tinker's built-in losses (Thinking Machines,
"Loss functions", tinker-docs ``losses``), whose definitions we follow, with the per-token
``weights`` applied to every loss (the SDK requires them for every loss):

* cross_entropy:        ``L = -sum_t w_t * logp_t``
* importance_sampling:  ``L = -sum_t w_t * r_t * A_t``, ``r_t = exp(logp_t - logq_t)``
* ppo:                  ``L = -sum_t w_t * min(r_t A_t, clip(r_t, lo, hi) A_t)``
  (Schulman et al. 2017; ``lo``/``hi`` default 0.8 / 1.2)
* cispo:                ``L = -sum_t w_t * sg(clip(r_t, lo, hi)) * A_t * logp_t``
  (MiniMax-M1, 2025; the clipped ratio is a stop-gradient weight; default 0.8 / 1.2)

``logp`` is the trained policy's logprob of the target token, ``logq`` the sampler's.
Losses are **sums** over tokens (and over datums and forward_backward calls until the
optimizer step), as in Tinker: normalisation is the caller's, through ``weights`` /
``advantages``. So a batch split into chunks accumulates exactly the gradient of the whole.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LOSS_FNS = ("cross_entropy", "importance_sampling", "ppo", "cispo")
REQUIRED_INPUTS = {
    "cross_entropy": ("target_tokens", "weights"),
    "importance_sampling": ("target_tokens", "weights", "logprobs", "advantages"),
    "ppo": ("target_tokens", "weights", "logprobs", "advantages"),
    "cispo": ("target_tokens", "weights", "logprobs", "advantages"),
}
DEFAULT_CLIP_LOW = 0.8
DEFAULT_CLIP_HIGH = 1.2


@dataclass
class DatumLoss:
    """One datum's loss (a scalar with graph) and diagnostics.

    ``clipped_T`` marks tokens whose ratio was clipped (ppo/cispo), ``ratio_T`` is ``r_t``
    (ones for cross_entropy).
    """

    loss: torch.Tensor
    logprobs_T: torch.Tensor
    ratio_T: torch.Tensor
    clipped_T: torch.Tensor


def clip_bounds(loss_fn: str, config: dict | None) -> tuple[float, float]:
    """``(lo, hi)`` ratio bounds from ``lossFnConfig``.

    Raises:
        ValueError: a threshold is not a number, or ``lo > hi``, or an unknown key is given.
    """
    config = dict(config or {})
    unknown = set(config) - {"clip_low_threshold", "clip_high_threshold"}
    if unknown:
        raise ValueError(
            f"lossFnConfig has unknown key(s) {sorted(unknown)}; accepted: clip_low_threshold, clip_high_threshold"
        )
    lo = config.get("clip_low_threshold", DEFAULT_CLIP_LOW)
    hi = config.get("clip_high_threshold", DEFAULT_CLIP_HIGH)
    for name, value in (("clip_low_threshold", lo), ("clip_high_threshold", hi)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"lossFnConfig.{name} must be a number, got {value!r}")
    if lo > hi:
        raise ValueError(f"lossFnConfig.clip_low_threshold ({lo}) is greater than clip_high_threshold ({hi})")
    return float(lo), float(hi)


def datum_loss(
    loss_fn: str,
    logprobs_T: torch.Tensor,
    weights_T: torch.Tensor,
    sampler_logprobs_T: torch.Tensor | None,
    advantages_T: torch.Tensor | None,
    clip: tuple[float, float],
) -> DatumLoss:
    """The loss of one datum; see the module docstring for the formulas.

    Args:
        loss_fn: one of ``LOSS_FNS``.
        logprobs_T: policy logprobs of the target tokens, with graph, [T].
        weights_T: per-token weights, [T].
        sampler_logprobs_T: sampler logprobs ``logq`` [T] (policy losses).
        advantages_T: per-token advantages [T] (policy losses).
        clip: ``(lo, hi)`` ratio bounds (ppo, cispo).
    """
    if loss_fn == "cross_entropy":
        ones = torch.ones_like(logprobs_T)
        return DatumLoss(-(weights_T * logprobs_T).sum(), logprobs_T, ones, torch.zeros_like(ones, dtype=torch.bool))
    assert sampler_logprobs_T is not None and advantages_T is not None
    ratio = torch.exp(logprobs_T - sampler_logprobs_T)
    lo, hi = clip
    clipped_ratio = ratio.clamp(lo, hi)
    clipped = (ratio < lo) | (ratio > hi)
    if loss_fn == "importance_sampling":
        per_token = ratio * advantages_T
    elif loss_fn == "ppo":
        per_token = torch.minimum(ratio * advantages_T, clipped_ratio * advantages_T)
    elif loss_fn == "cispo":
        per_token = clipped_ratio.detach() * advantages_T * logprobs_T
    else:
        raise ValueError(f"unknown loss function {loss_fn!r}; accepted: {', '.join(LOSS_FNS)}")
    return DatumLoss(-(weights_T * per_token).sum(), logprobs_T, ratio.detach(), clipped)
