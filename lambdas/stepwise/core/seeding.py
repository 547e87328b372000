"""Sampler seeds: every sampling call of a run gets a seed derived from (seed, step, rollout, turn).

The runtime's ``SamplingParams.seed`` (botocore's ``sagemakertrainingsessionruntime`` model:
"the same seed with the same input produces deterministic outputs") makes a sample a function of
its inputs. Deriving the seed from *where* the sample sits in the run, not from when it was
drawn, makes a run reproducible although its rollouts run concurrently: thread and Lambda
scheduling decide the order in which samples are drawn, never which seed a sample gets.

Where a sample sits:
- ``seed``: the run config's ``seed`` (``RunConfig.seed``);
- the rollout: ``kind`` (train / eval), ``step``, ``generation_batch`` and the rollout's item
  index ``i`` in that batch (Distributed Map item order, fixed by PlanStep: prompt position x
  group member), all known to StartRollout, which stores `rollout_seed` in the session record;
- the turn: its index in the rollout (0 for the first LLM call), known to the gateway.

The run id is deliberately *not* an input: two runs with the same config and seed (whatever
their run ids, e.g. two ``make run``) sample the same tokens and so give the same per-step
rewards; to get an independent repeat, change ``seed``. A resumed or continued run keeps its seed
and so its seeds, and a step re-done after a rewind samples what it sampled the first time from
the same weights.

Seeds are 31-bit non-negative integers: the service model types ``seed`` as a 32-bit
``Integer``, and ``torch.Generator.manual_seed`` (the simulator) takes any of them.
"""

from __future__ import annotations

import hashlib

__all__ = ["SEED_BITS", "rollout_seed", "turn_seed"]

SEED_BITS = 31


def _derive(*parts: object) -> int:
    digest = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> (64 - SEED_BITS)


def rollout_seed(seed: int, *, kind: str, step: int, generation_batch: int, index: int) -> int:
    """The seed of one rollout, from the run's ``seed`` and the rollout's place in the run.

    Args:
        seed: ``RunConfig.seed`` (>= 0).
        kind: ``"train"`` or ``"eval"``.
        step: completed steps when the batch was planned (the batch's ``step``).
        generation_batch: DAPO generation batch within the step (0 for GRPO and evals).
        index: the rollout's item index ``i`` in its batch.

    Returns:
        An integer in ``[0, 2**31)``; the same inputs always give the same seed.
    """
    return _derive("stepwise-rollout", seed, kind, step, generation_batch, index)


def turn_seed(rollout: int, turn: int) -> int:
    """The sampler seed of turn ``turn`` (0-based) of a rollout whose `rollout_seed` is ``rollout``;
    in ``[0, 2**31)``."""
    return _derive("stepwise-turn", rollout, turn)
