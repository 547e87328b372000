"""The run's phases, pure: what state.json's write-ahead operations mean for the run.

Pure functions of `stepwise.records.RunState` (no boto3, no environment, no I/O).
"""

from __future__ import annotations

from stepwise.records import Checkpoint, RunState


def final_weights(state: RunState) -> Checkpoint | None:
    """The run's final weights, as a ``kind="weights"`` `Checkpoint` (a ``save_weights_for_sampler``
    model package: LoRA weights without optimizer state, the SDK's deployable kind), or ``None``
    when no step was trained (the sampler is still the base model).

    The ``save_weights_at_end`` checkpoint when one was saved; else the sampler's current model
    package, which SubmitTrain saves after every optimizer step (``reason="sampler"``, ``step`` =
    steps completed, ``policy_version`` = optimizer steps applied).
    """
    at_end = [c for c in state.checkpoints if c.kind == "weights" and c.reason == "weights_at_end"]
    if at_end:
        return max(at_end, key=lambda c: c.step)
    if not state.sampler_model_package_arn:
        return None
    return Checkpoint(step=state.step, kind="weights", model_package_arn=state.sampler_model_package_arn,
                      reason="sampler", epoch=state.epoch, policy_version=state.policy_version)
