"""The limits one training step must stay within, each with its source (pure; no AWS call).

Service-side value ranges are read from botocore's service models (the JSON files botocore ships),
so they follow the service when botocore is upgraded: ``SamplingParams.maxTokens``,
``SamplingParams.temperature``, ``SampleConfig.numSamples``, ``AdamParamsConfig.learningRate`` and
the ``LossFnName`` enum of ``sagemakertrainingsessionruntime``, and ``LoraConfig.Rank`` / ``.Alpha``
of sagemaker's ``CreateTrainingSession``. The clip thresholds travel in
``lossFnConfig``, a free-form document in that model, so their ranges stay in `stepwise.config`.

Limits no model carries are documented quotas, kept here as constants with their page:
- Step Functions, "Map state processing modes": a Distributed Map runs up to 10,000 child
  workflow executions in parallel. One generation batch is one Map Run, so its rollouts
  (``batch_size * responses_per_prompt``) stay within that.
- PlanStep's Map concurrency: ``acr_tps_limit * CONCURRENCY_PER_TPS``, capped at
  ``MAX_MAP_CONCURRENCY`` (1,000: AgentCore Runtime's default quota of active session workloads
  per account in us-east-1 / us-west-2 is 1,000) and at the config's ``acr_max_active_sessions``
  (`ACR_ACTIVE_SESSIONS_DEFAULT`). An ``acr_tps_limit`` above
  ``MAX_MAP_CONCURRENCY / CONCURRENCY_PER_TPS`` changes nothing, so it is refused.
- AgentCore Runtime quota "Active session workloads per account" (AgentCore developer guide, "Quotas
  for Amazon Bedrock AgentCore", AgentCore Runtime, resource allocation limits): 1,000 in US East
  (N. Virginia) and US West (Oregon), 500 in the other regions, adjustable; each runtime session
  (``runtimeSessionId``) counts, idle ones too, until it is stopped or times out. Every rollout's
  session is stopped when it ends, so a run holds at most its rollouts in flight.
- Step Functions quota: 25,000 events in one execution's history. A step's generation batches
  run inside one execution (continue-as-new happens between steps), each adding
  ``EVENTS_PER_GENERATION_BATCH`` parent events (PlanStep task 5, choice 2, Distributed Map 6,
  choice 2, ComputeAdvantages task 5, choice 2), so ``max_num_gen_batches`` is bounded by
  ``MAX_GENERATION_BATCHES_PER_STEP``; a run with a group judge adds ``JUDGE_EVENTS_PER_GENERATION_BATCH``
  (the judge's task 5 and its choice 2; each wait for a throttled judge 2 + 5 more) and is bounded by
  ``MAX_JUDGED_GENERATION_BATCHES_PER_STEP``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

TRAINING_RUNTIME_SERVICE = "sagemakertrainingsessionruntime"

#: Map children started per unit of ``acr_tps_limit``: children start in a burst of
#: MaxConcurrency, then at the rate rollouts finish; ACR throttling beyond the limit is retried.
CONCURRENCY_PER_TPS = 8
#: PlanStep's cap on the Map's MaxConcurrency (AgentCore Runtime: 1,000 active sessions per account).
MAX_MAP_CONCURRENCY = 1000
#: Step Functions, "Map state processing modes": Distributed mode runs up to 10,000 parallel children.
DISTRIBUTED_MAP_MAX_CHILDREN = 10_000
#: Step Functions quota: maximum events in one execution's history.
EXECUTION_HISTORY_EVENTS = 25_000
#: Parent-history events of one generation batch (see the module doc).
EVENTS_PER_GENERATION_BATCH = 22
#: History events kept free in an execution for the rest of one step (train, rebind, save, eval).
HISTORY_RESERVE_EVENTS = 2_000
MAX_GENERATION_BATCHES_PER_STEP = (EXECUTION_HISTORY_EVENTS - HISTORY_RESERVE_EVENTS) // EVENTS_PER_GENERATION_BATCH
#: Parent-history events the group judge adds to a generation batch ("Judge groups" task, its choice).
JUDGE_EVENTS_PER_GENERATION_BATCH = 7
MAX_JUDGED_GENERATION_BATCHES_PER_STEP = ((EXECUTION_HISTORY_EVENTS - HISTORY_RESERVE_EVENTS)
                                          // (EVENTS_PER_GENERATION_BATCH + JUDGE_EVENTS_PER_GENERATION_BATCH))
#: AgentCore Runtime's default "Active session workloads per account" outside us-east-1 / us-west-2
#: (1,000 there): the default bound on a run's rollouts in flight (``acr_max_active_sessions``).
ACR_ACTIVE_SESSIONS_DEFAULT = 500
#: The most useful ``acr_tps_limit``: above it PlanStep's MaxConcurrency cap binds instead.
MAX_ACR_TPS_LIMIT = MAX_MAP_CONCURRENCY // CONCURRENCY_PER_TPS
#: AgentCore Runtime's default quota of InvokeAgentRuntime calls per second per endpoint (adjustable;
#: "Quotas for Amazon Bedrock AgentCore", invocation limits). A config may set more once the quota is raised.
ACR_DEFAULT_INVOCATIONS_PER_SECOND = 25


@dataclass(frozen=True)
class ModelRange:
    """A numeric member's ``min`` / ``max`` in a botocore service model (None = unbounded)."""

    lo: float | None
    hi: float | None
    source: str  # e.g. "sagemakertrainingsessionruntime SamplingParams.maxTokens"

    def describe(self) -> str:
        """``"512..131072 (the service's SamplingParams.maxTokens)"``."""
        lo = "" if self.lo is None else f"{self.lo:g}"
        hi = "" if self.hi is None else f"{self.hi:g}"
        return f"{lo}..{hi} ({self.source} in botocore's service model)"


@functools.lru_cache(maxsize=4)
def _service_model(service: str):
    import botocore.session

    return botocore.session.get_session().get_service_model(service)


def model_range(shape: str, member: str, *, service: str = TRAINING_RUNTIME_SERVICE) -> ModelRange:
    """``min`` / ``max`` of ``shape.member`` in ``service``'s botocore model.

    Raises:
        KeyError: the shape has no such member (the model changed: the caller's limit moved).
    """
    target = _service_model(service).shape_for(shape).members[member]
    md = target.metadata
    return ModelRange(md.get("min"), md.get("max"), f"{service} {shape}.{member}")


def model_enum(shape: str, *, service: str = TRAINING_RUNTIME_SERVICE) -> tuple[str, ...]:
    """The ``enum`` values of a string shape in ``service``'s botocore model."""
    return tuple(_service_model(service).shape_for(shape).metadata.get("enum", ()))


MAX_TOKENS = model_range("SamplingParams", "maxTokens")
TEMPERATURE = model_range("SamplingParams", "temperature")
NUM_SAMPLES = model_range("SampleConfig", "numSamples")
LEARNING_RATE = model_range("AdamParamsConfig", "learningRate")
LOSS_FUNCTIONS = model_enum("LossFnName")
#: CreateTrainingSession's LoraConfig (the sagemaker model): the adapter's rank and alpha.
LORA_RANK = model_range("LoraConfig", "Rank", service="sagemaker")
LORA_ALPHA = model_range("LoraConfig", "Alpha", service="sagemaker")
#: The largest value of a botocore ``integer`` shape (32-bit; ``long`` is 64-bit).
MAX_INTEGER = 2**31 - 1
#: The largest integer a run config may hold anywhere. The config is a Step Functions execution's input and
#: travels in its state data, whose JSON numbers are IEEE 754 doubles: integers are exact only within
#: +-(2**53 - 1) (RFC 8259, section 6); 2**53 + 1 would arrive as 2**53, 10**30 as 1e30.
MAX_EXACT_INTEGER = 2**53 - 1
