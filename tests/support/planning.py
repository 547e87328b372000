"""Shared parts of the planner tests (``stepwise.core.planning``, ``stepwise.core.phases``): a valid
run config and a fresh run state, with no AWS behind them (the planner is pure)."""

from __future__ import annotations

from stepwise.config import RunConfig
from stepwise.records import RunState

#: The fields a RunConfig needs; every test sets what it exercises on top (``cfg(batch_size=...)``).
BASE = {
    "role_arn": "arn:aws:iam::123456789012:role/R",
    "base_model_arn": "stepwise-tiny",
    "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/agent",
    "dataset_path": "s3://bucket-name/data.jsonl",
    "model_package_group_arn": "arn:aws:sagemaker:us-east-1:123456789012:model-package-group/g",
}


def cfg(**kw) -> RunConfig:
    """:data:`BASE` with ``kw`` over it, validated."""
    return RunConfig(**(BASE | kw))


def state(**kw) -> RunState:
    """A run's state before its first step (``kw``: fields to set)."""
    return RunState(run_id="r", owner_execution_arn="arn:x", training_session_name="s", **kw)
