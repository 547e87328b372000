"""The pure training core: reward extraction, GRPO advantages, DAPO group filtering and
overlong shaping, TraceRecord -> datum conversion, and replay of captured gateway turns.

No AWS, no network, no torch: every function here is importable and testable on its own.
Each module's docstrings cite the reference they follow (agentcore_rl_toolkit 0.2.0's
`backends/experimental/sagemaker/`, the DAPO paper arXiv:2503.14476, the toolkit's `train_dapo.py` proposal).
"""

from .advantages import compute_grpo_advantages
from .dapo import GenerationBatchDecision, decide_generation_batch, is_informative_group, overlong_penalty
from .datums import group_to_datums, trace_record_to_datum
from .rewards import extract_reward

__all__ = [
    "GenerationBatchDecision",
    "compute_grpo_advantages",
    "decide_generation_batch",
    "extract_reward",
    "group_to_datums",
    "is_informative_group",
    "overlong_penalty",
    "trace_record_to_datum",
]
