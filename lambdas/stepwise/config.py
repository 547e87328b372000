"""The run config: the JSON a Step Functions execution starts with.

`RunConfig` mirrors the reference loop's config
(`agentcore_rl_toolkit/backends/experimental/sagemaker/config.py`, same field names and
defaults) plus the DAPO fields of the toolkit's `train_dapo.py` proposal, the
SageMaker training-session options the SDK takes (`ServiceClient(kms_key_arn=, vpc_config=)`),
and the knobs the serverless design needs (continue-as-new, per-rollout budgets).

Reference fields dropped because they cannot apply serverless:
- ``gateway_port``: the gateway is a Lambda Function URL (locally, a port chosen at start).
- ``history_mode``: only ``"tree"`` is supported; the gateway is replayed from captured turns
  per rollout, and ``"linear"`` reuse of served ids needs the in-memory history of one process.
- ``rollout_log_path``: per-rollout records are written under ``runs/{run_id}/steps/``.

A config naming any of these (the reference's ``config.yaml.example`` does) loads: the key is
dropped with a warning that gives the reason (`drop_unsupported`). Any other unknown key is refused.
YAML is read with YAML 1.2's float syntax, so ``learning_rate: 1e-5`` (a string to PyYAML's YAML 1.1
resolver) is the number 1e-05. docs/migration.md maps every reference field to ours. Safe loading only (no
Python tags); a key given twice, a value referring to itself, an alias bomb, a file not in UTF-8 or a
number of thousands of digits is a `ConfigError`, and values are shown abbreviated in messages (`shown`).

Use `load_run_config(obj_or_path)` to get every problem at once as one `ConfigError`.
"""

from __future__ import annotations

import difflib
import json
import logging
import math
import re
import reprlib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from stepwise.core import service_limits as limits

__all__ = ["RunConfig", "VpcConfig", "EarlyStopping", "JudgeConfig", "JudgeInclude", "ConfigError", "load_run_config",
           "read_config_file", "inline_rubric", "config_format", "drop_unsupported",
           "DROPPED_FIELDS", "shown"]

log = logging.getLogger(__name__)

# Patterns follow botocore's service models (sagemaker CreateTrainingSession shapes) where
# one exists; they are checks of form only, not of existence. ASCII (re.A: ``\d`` would match any
# Unicode digit) and ending with ``\Z`` (``$`` also matches before a final newline, which a YAML
# block scalar leaves).
_PARTITION = r"arn:aws[a-z\-]*"
_REGION = r"[a-z]{2}(?:-[a-z]+)+-\d{1,2}"
ROLE_ARN_RE = re.compile(rf"^{_PARTITION}:iam::\d{{12}}:role/?[a-zA-Z_0-9+=,.@\-/]+\Z", re.A)
HUB_CONTENT_ARN_RE = re.compile(rf"^{_PARTITION}:sagemaker:{_REGION}:(?:\d{{12}}|aws):hub-content/[!-~]+\Z", re.A)
HUB_MODEL_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._\-]{0,62}\Z", re.A)
MODEL_PACKAGE_GROUP_ARN_RE = re.compile(rf"^{_PARTITION}:sagemaker:{_REGION}:\d{{12}}:model-package-group/[!-~]{{1,2048}}\Z", re.A)
MODEL_PACKAGE_ARN_RE = re.compile(rf"^{_PARTITION}:sagemaker:{_REGION}:\d{{12}}:model-package/[!-~]+\Z", re.A)
AGENT_RUNTIME_ARN_RE = re.compile(rf"^{_PARTITION}:bedrock-agentcore:{_REGION}:\d{{12}}:runtime/[A-Za-z0-9_\-]+\Z", re.A)
KMS_KEY_ARN_RE = re.compile(rf"^{_PARTITION}:kms:{_REGION}:\d{{12}}:(?:key|alias)/[a-zA-Z0-9:/_\-]+\Z", re.A)
REGION_RE = re.compile(rf"^{_REGION}\Z", re.A)
S3_URI_RE = re.compile(r"^s3://([a-z0-9][a-z0-9.\-]{1,61}[a-z0-9])(?:/(.*))?\Z", re.A | re.S)
VPC_ID_RE = re.compile(r"^[-0-9a-zA-Z]{1,32}\Z", re.A)
#: SageMaker managed MLflow: resource types the sagemaker-mlflow plugin routes (mlflow-app, mlflow-tracking-server).
MLFLOW_ARN_RE = re.compile(rf"^{_PARTITION}:sagemaker:{_REGION}:\d{{12}}:(?:mlflow-app|mlflow-tracking-server)/[A-Za-z0-9\-]+\Z", re.A)

#: A named eval set: its name is a segment of its metric keys (eval/NAME/accuracy) and of snapshot keys.
EVAL_SET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9_\-]{0,31}\Z", re.A)
#: Steps between save_state checkpoints when a config does not say (the reference's default, -1, saves only
#: at the end; docs/migration.md).
DEFAULT_SAVE_EVERY = 10

LOSSES = ("ppo", "importance_sampling", "cispo")
CLIPPED_LOSSES = ("ppo", "cispo")
#: The largest ``max_staleness`` a config may ask for (admission 'group'); the async systems this follows
#: train at 1 to 8 (docs/operating.md, deep asynchrony).
MAX_STALENESS = 16

# Reference fields that cannot apply serverless -> why (the warning when a config names one).
DROPPED_FIELDS: dict[str, str] = {
    "gateway_port": "the gateway is a Lambda Function URL; there is no port to choose",
    "history_mode": "only 'tree' is supported (turns are replayed per rollout, one record per trajectory-tree leaf)",
    "rollout_log_path": "rollout records are written to S3 under runs/{run_id}/steps/",
}


class ConfigError(ValueError):
    """A run config is invalid. ``errors`` lists each problem as ``"field: message (got X)"``."""

    def __init__(self, errors: list[str], source: str | None = None):
        self.errors = list(errors)
        self.source = source
        head = f"invalid run config{f' {source}' if source else ''} ({len(self.errors)} error(s)):"
        super().__init__("\n".join([head, *(f"  - {e}" for e in self.errors)]))


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """Split ``s3://bucket/key`` into ``(bucket, key)`` (key may be ``""``).

    Raises:
        ValueError: not an ``s3://`` URI with a valid bucket name.
    """
    try:
        return _check_s3(uri)
    except ValueError as e:
        raise ValueError(f"{e}, got {uri!r}") from None


S3_URI_HELP = "expected s3://bucket/key with a valid bucket name (3-63 of a-z 0-9 . -)"


def _check_s3(uri: str) -> tuple[str, str]:
    m = S3_URI_RE.match(uri)
    if not m:
        raise ValueError(S3_URI_HELP)
    bucket, key = m.group(1), m.group(2) or ""
    if ".." in bucket or _IP_ADDRESS_RE.match(bucket):  # S3's bucket naming rules
        raise ValueError(f"{S3_URI_HELP}; no two adjacent periods, not an IP address")
    if _CONTROL_RE.search(key):  # S3's XML listings cannot carry them; the datasets and tokenizer would not load
        raise ValueError("the key holds a control character (tab, newline, NUL, ...)")
    return bucket, key


_IP_ADDRESS_RE = re.compile(r"^\d{1,3}(?:\.\d{1,3}){3}\Z", re.A)
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _check_path(value: str, field: str, *, required: bool) -> str:
    """A dataset path: ``s3://bucket/key`` or a local path (local stack and `stepwise validate`)."""
    if not value:
        if required:
            raise ValueError("is required: an s3://bucket/key (or local path) of a Parquet or JSONL file")
        return value
    if value.startswith("s3://"):
        _bucket, key = _check_s3(value)
        if not key or key.endswith("/"):
            raise ValueError("must name a file (s3://bucket/key.parquet or .jsonl), not a bucket or prefix")
    return value


def _eval_set_names(data: dict[str, Any]) -> list[str]:
    """The eval sets a config validated so far names (``""`` = eval_dataset_path), for cross-field checks."""
    return ([""] if data.get("eval_dataset_path") else []) + list(data.get("eval_datasets") or {})


def _selection_metric_problem(metric: str, data: dict[str, Any]) -> str | None:
    """Why ``metric`` is not a key the run's eval summaries will hold (None when it is), from the fields
    validated so far: ``eval/METRIC`` or ``eval/NAME/METRIC`` of a configured set, METRIC one of accuracy,
    mean@n, pass@k and (k > 1) all_pass@k, all_fail@k, mixed@k."""
    from stepwise.core.evals import pass_ks

    if not metric.startswith("eval/"):
        return "must be an eval metric: eval/METRIC or eval/NAME/METRIC"
    parts = metric.split("/")[1:]
    sets = _eval_set_names(data)
    if len(parts) == 2 and not parts[0]:  # eval//METRIC: "" is the unnamed set's name, never in a key
        return "must be eval/METRIC (the unnamed eval set) or eval/NAME/METRIC, not an empty NAME"
    if len(parts) == 2 and parts[0] not in sets:
        return f"no eval set named {parts[0]!r} (eval_datasets: {sorted(s for s in sets if s) or 'none'})"
    if len(parts) == 1 and "" not in sets:
        return "the unnamed eval set (eval_dataset_path) is not set: name a set, eval/NAME/METRIC"
    if len(parts) not in (1, 2):
        return "must be eval/METRIC or eval/NAME/METRIC"
    n = data.get("eval_group_size") or 1
    try:
        ks = pass_ks(n, data.get("eval_pass_k"))
    except ValueError:
        ks = [1]
    allowed = ["accuracy", f"mean@{n}", *(f"pass@{k}" for k in ks),
               *(f"{f}@{k}" for k in ks if k > 1 for f in ("all_pass", "all_fail", "mixed"))]
    if parts[-1] not in allowed:
        return f"the eval reports {', '.join(allowed)}"
    return None


def _has_eval_set(data: dict[str, Any]) -> bool:
    """Whether the config names an eval set; True when either field failed its own check (said there)."""
    if "eval_dataset_path" not in data or "eval_datasets" not in data:
        return True
    return bool(_eval_set_names(data))


class VpcConfig(BaseModel):
    """VPC for the training session (SDK `sagemaker.train.training_session.VpcConfig`).

    Limits from botocore's sagemaker `VpcConfig` shape: 1-16 subnets, 1-5 security groups.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    subnets: list[str] = Field(min_length=1, max_length=16)
    security_group_ids: list[str] = Field(min_length=1, max_length=5)

    @field_validator("subnets", "security_group_ids")
    @classmethod
    def _ids(cls, v: list[str]) -> list[str]:
        bad = [x for x in v if not VPC_ID_RE.match(x)]
        if bad:
            raise ValueError(f"ids must match [-0-9a-zA-Z]{{1,32}} (e.g. subnet-0abc, sg-0abc); bad: {bad}")
        return v


class EarlyStopping(BaseModel):
    """``early_stopping``: end the run when its eval has stopped improving (`stepwise.core.selection`).

    After ``patience`` evals in a row that do not beat the best value of ``metric`` so far by more
    than ``min_delta`` (``mode`` max: higher is better; min: lower), the run ends as the budget limits
    end it: final checkpoint, session stopped, SUCCEEDED, a stop reason naming the metric and its
    history. The same metric, mode and minimum change choose the run's best model package.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    metric: str = Field("eval/accuracy", description="an eval summary key: eval/METRIC (the unnamed eval set) or "
                        "eval/NAME/METRIC; METRIC is accuracy, mean@n, pass@k or all_pass@k / all_fail@k / mixed@k "
                        "(k > 1) of eval_group_size n and eval_pass_k")
    mode: Literal["max", "min"] = Field("max", description="max: higher is better; min: lower is better")
    patience: int = Field(3, ge=1, le=1000, description="evals without improvement before the run ends")
    min_delta: float = Field(0.0, ge=0.0, description="an eval improves only when it beats the best by more than this")


#: A Bedrock model the group judge may name: a foundation model id (``amazon.nova-micro-v1:0``), a system
#: inference profile id (``us.amazon.nova-micro-v1:0``, ``global.anthropic...``), or the ARN of a foundation model,
#: an inference profile or an application inference profile (botocore's ``bedrock-runtime`` Converse ``modelId``,
#: narrowed to what the judge can call on demand).
BEDROCK_MODEL_ID_RE = re.compile(r"^[a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63}){1,3}(?::[a-z0-9-]{1,63}){0,2}\Z", re.A)
BEDROCK_MODEL_ARN_RE = re.compile(
    rf"^{_PARTITION}:bedrock:({_REGION}):(\d{{12}})?:(foundation-model|inference-profile|application-inference-profile)/"
    r"[a-zA-Z0-9.:\-]{1,300}\Z", re.A)
#: What the judge can be asked to add to the agent's reward (`stepwise.core.judge.apply_judgements`).
JUDGE_COMBINATIONS = ("replace", "add", "gdpo")


class JudgeInclude(BaseModel):
    """``judge.include``: what of each rollout the judge reads, and how much (`stepwise.core.judge`).

    The judged text of a member is its conversation as the gateway captured it (each turn's new prompt
    messages and its reply, tool calls and tool results included), then the agent's result; the messages
    every member shares (the system prompt, the task) are shown once, before the members. Each message is
    cut to ``max_message_chars`` and each member's part to ``max_member_chars`` (the middle is cut, so the
    start and the final answer stay)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    system: bool = Field(True, description="show the agent's system prompt (shared by the group, shown once)")
    tool_calls: bool = Field(True, description="show the tool calls the agent's replies made")
    tool_results: bool = Field(True, description="show the tool results the agent got back")
    result_fields: list[str] | None = Field(
        None, description="fields of the agent's result object to show after its conversation; None = every field "
        "but 'rewards' (the judge does not see the agent's own reward), [] = none")
    max_message_chars: int = Field(2000, ge=50, le=100_000, description="each message is cut to this many characters")
    max_member_chars: int = Field(8000, ge=200, le=400_000,
                                  description="each member's part of the judged text is cut to this many characters")


class JudgeConfig(BaseModel):
    """``judge``: a group judge on Amazon Bedrock that scores each completed group's members relative to each
    other against a rubric (as OpenPipe ART's RULER does), for agents without an answer key (docs/judge.md).

    The judge is called through the Bedrock Runtime Converse API with a tool whose input schema is one score
    and a one-line reason per member; an answer with a score outside ``[score_min, score_max]``, a missing or
    repeated member, or no well-formed tool call is asked again, ``max_attempts`` answers in all, then the
    group gets ``fallback``. Throttling is waited out within the step (at ``requests_per_second`` and
    ``concurrency`` groups at once, up to ``max_wait_seconds``), never failing it. ``combine`` says what the
    estimator reads: the judge's score mapped to [0, 1] (``replace``), the agent's reward plus ``weight`` x
    that (``add``), or each of the two normalized within the group and summed, ``weight`` on the judge's (GDPO,
    arXiv:2601.05242: ``gdpo``).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False, validate_default=True)

    model_id: str = Field(description="the Bedrock model (or inference profile) that judges: a model id such as "
                          "amazon.nova-micro-v1:0, a cross-Region inference profile id such as us.amazon.nova-micro-v1:0, "
                          "or its ARN; the stack must grant it (CDK context judgeModelIds)")
    rubric: str = Field("", description="what a better rollout does, in the user's words (the judge's instructions); "
                        "required, unless rubric_file names a file to read it from")
    rubric_file: str = Field("", description="a text file holding the rubric, read when the config file is loaded "
                             "(stepwise validate, start, run-local; relative to the config file's folder) into rubric")
    score_min: float = Field(0.0, description="the lowest score the judge may give")
    score_max: float = Field(10.0, description="the highest score the judge may give (> score_min)")
    include: JudgeInclude = Field(default_factory=JudgeInclude, description="what of each rollout the judge reads")
    combine: Literal["replace", "add", "gdpo"] = Field(
        "replace", description="replace: the reward is the judge's score mapped to [0, 1]; add: the agent's reward "
        "plus weight x that; gdpo: the agent's reward and the judge's score each normalized within the group, "
        "summed with weight on the judge's (GDPO; with reinforce_pp_baseline it is the paper's recipe)")
    weight: float = Field(1.0, gt=0, le=1000, description="the judge's weight in add and gdpo")
    fallback: Literal["agent_reward", "no_signal"] = Field(
        "agent_reward", description="a group the judge gives no valid verdict: agent_reward = the agent's own "
        "rewards alone; no_signal = equal rewards, so the group trains nothing")
    max_attempts: int = Field(3, ge=1, le=10, description="answers asked of the judge per group before the fallback "
                              "(an invalid answer is asked again, with what was wrong)")
    concurrency: int = Field(4, ge=1, le=64, description="groups judged at once")
    requests_per_second: float = Field(2.0, gt=0, le=1000,
                                       description="Converse requests per second at most (throttled ones included)")
    max_output_tokens: int = Field(2048, ge=64, le=32_768, description="the judge's maxTokens per answer")
    temperature: float = Field(0.0, ge=0, le=1, description="the judge's sampling temperature")
    timeout_seconds: float = Field(120.0, ge=1, le=600, description="seconds one Converse request may take "
                                   "(read timeout); a slower answer is retried like throttling")
    max_wait_seconds: int = Field(1800, ge=0, le=86_400, description="seconds a generation batch's judging may wait "
                                  "out throttling; past them the groups still throttled get the fallback")
    usd_per_million_input_tokens: float | None = Field(
        None, ge=0, description="the judge model's price per million input tokens; None = the price table's "
        "(stepwise.core.prices)")
    usd_per_million_output_tokens: float | None = Field(
        None, ge=0, description="the judge model's price per million output tokens; None = the price table's")

    @field_validator("model_id")
    @classmethod
    def _model_id(cls, v: str) -> str:
        if not (BEDROCK_MODEL_ID_RE.match(v) or BEDROCK_MODEL_ARN_RE.match(v)):
            raise ValueError("must be a Bedrock model id (amazon.nova-micro-v1:0), an inference profile id "
                             "(us.amazon.nova-micro-v1:0) or an ARN of a foundation model, inference profile or "
                             "application inference profile")
        return v

    @field_validator("rubric")
    @classmethod
    def _rubric(cls, v: str) -> str:
        if len(v) > 50_000:
            raise ValueError(f"is {len(v):,} characters; a rubric is a page at most (50,000)")
        return v

    @field_validator("rubric_file")
    @classmethod
    def _rubric_file(cls, v: str, info: ValidationInfo) -> str:
        if not (info.data.get("rubric") or "").strip():
            if v:
                raise ValueError(f"{v!r} was not read into rubric: it is read when a config file is loaded "
                                 "(stepwise validate, start and run-local do); a config handed over as JSON must carry "
                                 "the rubric's text in rubric")
            raise ValueError("the judge needs a rubric: set rubric (what a better rollout does) or rubric_file")
        return v

    @field_validator("score_max")
    @classmethod
    def _range(cls, v: float, info: ValidationInfo) -> float:
        lo = info.data.get("score_min")
        if lo is not None and not v > lo:
            raise ValueError(f"must be above score_min ({lo:g})")
        return v

    @field_validator("usd_per_million_output_tokens")
    @classmethod
    def _prices(cls, v: float | None, info: ValidationInfo) -> float | None:
        if (v is None) != (info.data.get("usd_per_million_input_tokens") is None):
            raise ValueError("set both usd_per_million_input_tokens and usd_per_million_output_tokens, or neither")
        return v

    @property
    def usd_per_million(self) -> tuple[float, float] | None:
        """``(input, output)`` USD per million tokens: the config's, else the price table's, else None."""
        from stepwise.core.prices import bedrock_usd_per_million

        if self.usd_per_million_input_tokens is not None and self.usd_per_million_output_tokens is not None:
            return self.usd_per_million_input_tokens, self.usd_per_million_output_tokens
        return bedrock_usd_per_million(self.model_id)


class RunConfig(BaseModel):
    """One training run. Field order matters: cross-field checks see only fields defined earlier.

    Defaults equal the reference `Config` (agentcore_rl_toolkit 0.2.0), except ``region`` ('' = the
    stack's region, where every grant is scoped; the reference says us-east-1) and ``save_every``
    (`DEFAULT_SAVE_EVERY`; the reference's -1 checkpoints only at the end). Required:
    ``role_arn``, ``base_model_arn``, ``agent_runtime_arn``, ``dataset_path``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, strict=True, allow_inf_nan=False)

    # --- SageMaker / model ---
    region: str = Field(
        "",
        description="AWS region of the training session (and its SageMaker calls); '' = the stack's region. "
        "Init refuses a region other than the stack's: every grant is scoped to it",
    )
    role_arn: str = Field(description="IAM role SageMaker assumes for the training session")
    base_model_arn: str = Field(
        description="hub-content ARN of the base model, or a hub model name/id from ServiceClient.list_base_models()"
    )
    # --- the base model's license ---
    accept_eula: bool = Field(
        False,
        description="accept the base model's end-user license agreement (EULA): sent as CreateTrainingSession's "
        "ModelConfig.AcceptEula. A gated model (the SageMaker Public Hub marks it GatedBucket; `stepwise models` "
        "lists which) is refused before any session without it. Read the model's license before setting it",
    )
    # --- the session: checkpoints, LoRA adapter, resume, encryption, network, tokenizer ---
    s3_output_path: str = Field("", description="s3:// prefix for checkpoints; '' = the SDK's default")
    model_package_group_arn: str = Field("", description="model package group for checkpoints; '' = the SDK's default")
    lora_rank: int = Field(32, ge=limits.LORA_RANK.lo, le=limits.LORA_RANK.hi,
                           description="LoRA rank of the trained adapter (range: CreateTrainingSession's LoraConfig.Rank)")
    lora_alpha: int = Field(64, ge=limits.LORA_ALPHA.lo, le=limits.LORA_ALPHA.hi or limits.MAX_INTEGER,
                            description="LoRA alpha (scaling) of the trained adapter (range: LoraConfig.Alpha, a 32-bit "
                            "integer)")
    resume_from_model_package: str = Field(
        "", description="model package ARN of a save_state checkpoint to resume from (weights + optimizer); '' = fresh"
    )
    kms_key_arn: str = Field("", description="KMS key for the session's S3 output; '' = none (SDK kms_key_arn)")
    vpc_config: VpcConfig | None = Field(None, description="run the session in these subnets / security groups")
    tokenizer_path: str = Field(
        "",
        description="where the gateway loads the tokenizer: an s3:// prefix holding tokenizer files, a model id, "
        "or a local directory (local stack); "
        "'' = the SDK's own resolution for the base model (SageMaker Hub lookup of its HuggingFace id, "
        "then AutoTokenizer.from_pretrained: the Init Lambda must reach the model hub; a gated repository needs a "
        "token with access, from HF_TOKEN or the stack's huggingFaceTokenSecretArn, checked before any session)",
    )

    # --- ACR / rollout ---
    agent_runtime_arn: str = Field(description="the AgentCore Runtime agent to train")
    max_rollout_time: float = Field(
        1800.0, gt=0, le=28800, description="seconds one rollout may take (task timeout); ACR sessions last at most 8 h"
    )
    acr_tps_limit: int = Field(
        5, ge=1, le=limits.MAX_ACR_TPS_LIMIT,
        description="InvokeAgentRuntime calls per second (and Map concurrency bound: "
        f"{limits.CONCURRENCY_PER_TPS} rollouts in flight per unit, at most {limits.MAX_MAP_CONCURRENCY}); "
        "ACR's default quota is 25 per endpoint",
    )
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="passed to the renderer's apply_chat_template, e.g. {'enable_thinking': false}"
    )
    max_turns_per_rollout: int = Field(64, ge=1, description="LLM calls one rollout may make (gateway enforces)")
    max_tokens_per_rollout: int = Field(
        262144, ge=1, description="tokens one rollout may sample across its turns (gateway enforces)"
    )
    # --- ACR sessions and rollout liveness ---
    acr_max_active_sessions: int = Field(
        limits.ACR_ACTIVE_SESSIONS_DEFAULT, ge=1, le=limits.DISTRIBUTED_MAP_MAX_CHILDREN,
        description="rollouts in flight at most (each holds one ACR runtime session until it ends): set it to your "
        "account's 'Active session workloads per account' quota for this region (Service Quotas; ACR's default is "
        f"{limits.ACR_ACTIVE_SESSIONS_DEFAULT}, 1000 in us-east-1 and us-west-2), less what other runs and agents of the "
        "account use; a higher value gets ServiceQuotaExceededException refusals, retried with backoff",
    )
    rollout_heartbeat_seconds: int = Field(
        300, ge=0, le=99999999,
        description="a rollout whose agent makes no LLM call for this long is stopped as a timeout ('no LLM call "
        "for N s'; the gateway heartbeats the rollout's task on every call and while one is in flight): a dead or "
        "hung agent frees its place after this, not after max_rollout_time. Raise it above the agent's longest "
        "tool call plus its start-up; 0 = off (only max_rollout_time); a value >= max_rollout_time is off too",
    )
    rollout_recheck_seconds: int = Field(
        60, ge=1, le=3600,
        description="a rollout whose task has heard nothing for this long (no LLM call, no result notification) "
        "checks whether its agent's result is already in S3, and ends with it if so: an S3 notification that comes "
        "late or never costs at most this, not rollout_heartbeat_seconds or max_rollout_time; each check is one state "
        "transition and one short OnRolloutResult call, only while the agent is silent",
    )

    # --- RL training ---
    algorithm: Literal["grpo", "dapo"] = Field(
        "grpo", description="grpo: train on every group; dapo: dynamic sampling keeps only groups whose rewards differ"
    )
    batch_size: int = Field(32, ge=1, description="prompts (groups) per optimizer step")
    # --- credit assignment: advantage estimator and reward granularity (stepwise.core.advantages) ---
    advantage_estimator: Literal["grpo", "dr_grpo", "rloo", "reinforce_pp_baseline", "per_turn_rloo"] = Field(
        "grpo",
        description="grpo: (r - group mean) / group std (the reference's); dr_grpo: r - group mean (Dr. GRPO, "
        "arXiv:2503.20783); rloo: r - mean of the other members (arXiv:2402.14740); reinforce_pp_baseline: r - "
        "group mean, whitened over the batch (REINFORCE++, arXiv:2501.03262); per_turn_rloo: each LLM turn gets "
        "its reward-to-go minus the other members' at that turn (needs reward_granularity per_turn). A group whose "
        "rewards are all equal gets zero advantages under every estimator",
    )
    reward_granularity: Literal["trajectory", "per_turn"] = Field(
        "trajectory",
        description="trajectory: the agent's reward is one number (a list's last element, as the reference); "
        "per_turn: the agent's 'rewards' is one reward per LLM turn (a list, or an object {turn index: reward}; "
        "docs/agent-contract.md), a rollout's reward is their sum, and a list of the wrong length zeroes the "
        "rollout with a reason",
    )
    responses_per_prompt: int = Field(
        4, ge=2, le=limits.NUM_SAMPLES.hi,
        description="group size; a group of 1 has zero advantage; at most the service's SampleConfig.numSamples; "
        f"batch_size x responses_per_prompt (one generation batch) at most {limits.DISTRIBUTED_MAP_MAX_CHILDREN} "
        "(the Distributed Map's parallel children)",
    )
    learning_rate: float = Field(
        1e-5, gt=0, le=limits.LEARNING_RATE.hi,
        description="Adam learning rate of optim_step (range: the service's AdamParamsConfig.learningRate)",
    )
    max_context_tokens: int = Field(32768, ge=1, description="prompt + completion tokens one LLM call may use")
    max_new_tokens: int = Field(
        2048, ge=limits.MAX_TOKENS.lo, le=limits.MAX_TOKENS.hi,
        description="tokens one LLM call may sample (default max_tokens; range: the service's SamplingParams.maxTokens)",
    )
    temperature: float = Field(
        1.0, ge=limits.TEMPERATURE.lo, le=limits.TEMPERATURE.hi,
        description="sampling temperature of training rollouts (range: the service's SamplingParams.temperature)",
    )
    epochs: int = Field(1, ge=1, description="passes over the (first max_prompts) training prompts")
    # --- checkpoint cadence: on by default (the reference's -1 saves only at the end, so a run resumed
    # after a failure or a stop restarted from step 0) ---
    save_every: int = Field(
        DEFAULT_SAVE_EVERY, ge=-1,
        description=f"save_state every N steps (N > 0), so a resumed run continues from the newest (at most N-1 "
        f"steps are redone); -1 or 0 = only at the end. Default {DEFAULT_SAVE_EVERY}; the reference's is -1, and a "
        "config that sets save_every keeps its value",
    )
    loss: Literal["ppo", "importance_sampling", "cispo"] = Field(
        "ppo", description="forward_backward loss function of the training session; from max_staleness 2 on, a "
        "config that names none gets cispo with clip_low_threshold 0 and clip_high_threshold 2 (truncated "
        "importance sampling), and importance_sampling is refused"
    )
    clip_low_threshold: float | None = Field(None, description="ratio clip low bound, 0..1 (ppo/cispo loss_fn_config)")
    clip_high_threshold: float | None = Field(
        None, description="ratio clip high bound, 1..10 (ppo/cispo loss_fn_config); DAPO's Clip-Higher"
    )
    max_num_gen_batches: int = Field(
        10, ge=1, le=limits.MAX_GENERATION_BATCHES_PER_STEP,
        description="DAPO: generation batches per step before giving up (checkpoint and stop); bounded so one "
        "step's batches fit in one execution's 25,000-event history",
    )
    admission: Literal["batch", "group"] = Field(
        "batch",
        description="how rollouts are admitted: 'batch' = a step rolls out its generation batch, then trains "
        "(max_staleness 0; 1 overlaps one step's training with the next step's rollouts); 'group' = the group "
        "engine: each prompt's group starts on its own as soon as capacity allows (sampling_steps_ahead, "
        "max_rollouts_in_flight), each step trains the oldest complete groups, and the trainer never waits "
        "for the slowest rollout of a batch (docs/operating.md, deep asynchrony). Needed for max_staleness >= 2",
    )
    max_staleness: int = Field(
        0, ge=0, le=MAX_STALENESS,
        description="policy versions a trained rollout may lag the policy it updates, counted from the version "
        "that sampled its first turn: 0 = strict on-policy (the reference loop: roll out, then train); with "
        "admission 'batch', 1 = the next step's rollouts run on the current sampler while this step trains and "
        "rebinds (one Parallel state). With admission 'group' a hard bound kept by pacing: the trainer waits "
        "rather than apply an update that would leave an unfinished group past it; nothing is ever discarded "
        "for staleness. From 2 on the loss defaults to cispo with clip_low_threshold 0 and clip_high_threshold "
        "2 (truncated importance sampling) and importance_sampling is refused",
    )
    sampling_steps_ahead: int | None = Field(
        None, ge=0,
        description="admission 'group': how many steps of groups may be admitted ahead of training (d: groups "
        "admitted and not yet trained stay under (d + 1) x batch_size); at most max_staleness. None = "
        "min(1, max_staleness)",
    )
    max_rollouts_in_flight: int | None = Field(
        None, ge=1, le=limits.DISTRIBUTED_MAP_MAX_CHILDREN,
        description="admission 'group': rollouts running at once at most (a group starts only when all its "
        "members fit). None = what the quotas allow: min(acr_max_active_sessions, acr_tps_limit x "
        f"{limits.CONCURRENCY_PER_TPS}, {limits.MAX_MAP_CONCURRENCY}). Refused above acr_max_active_sessions, "
        "above what acr_tps_limit can start within max_rollout_time, or below responses_per_prompt",
    )
    sampler_binding: Literal["per_rollout", "next_turn", "turn_gate"] = Field(
        "turn_gate",
        description="what a turn samples while the training session loads new weights (load_weights_for_sampling), "
        "which the service does not document: per_rollout = every turn of a rollout keeps its rollout's model "
        "package (the service must serve several at once); next_turn = a rollout moves to the new package at "
        "its next turn; turn_gate = the gateway holds new turns, the turns in flight finish, the load runs, "
        "then turns resume on the new package (safe whatever the service does). `stepwise probe-service` "
        "measures which are safe on an account and prints the line to put here. With max_staleness 1, "
        "per_rollout and next_turn let Rebind load while the next step's rollouts run; with admission 'group' "
        "from max_staleness 1 (and with max_staleness 2 and more) groups are in flight at every load and the "
        "gateway enforces the binding for each of them",
    )
    overlong_buffer_len: int = Field(0, ge=0, description="DAPO overlong shaping buffer L_cache in tokens; 0 = off")
    overlong_penalty_factor: float = Field(1.0, ge=0, description="DAPO overlong shaping scale")
    save_weights_at_end: bool = Field(False, description="also save sampler weights (save_weights) at the end")
    train_op_timeout: float = Field(600.0, gt=0, description="seconds to wait on each training operation")
    seed: int = Field(
        0, ge=0, le=limits.MAX_EXACT_INTEGER,
        description="seeds every sampling call (SamplingParams.seed) from (seed, step, rollout, turn), so two runs "
        "with the same config and seed give the same curve whatever their run ids; change it for an independent "
        "repeat. Data order is file order",
    )
    steps_per_execution: int = Field(
        20, ge=1, le=1000,
        description="continue as a new execution every N steps (or earlier, see history_event_budget); at most "
        "1,000 because a step writes at least ~25 history events, so no more than 1,000 steps fit in the "
        "25,000 events Step Functions allows one Standard execution",
    )
    history_event_budget: int = Field(
        20_000, ge=200, le=25_000,
        description="continue as a new execution before this execution's history would pass this many events: "
        "checked before each step, with room for twice the most events one step has used so far (long "
        "training or checkpoint waits poll, and every poll adds events); Step Functions fails a Standard "
        "execution at 25,000 events",
    )
    max_consecutive_empty_steps: int = Field(
        3, ge=1, le=1000,
        description="fail the run after N consecutive steps with no trainable datum (no rollout captured a turn "
                    "to train on), naming what the rollouts reported, instead of billing steps that train nothing",
    )

    # --- Cost ledger: what the ledger prices that AWS's price table cannot (stepwise.core.ledger) ---
    session_usd_per_hour: float | None = Field(
        None, gt=0, le=10_000,
        description="USD per hour of the training session (its instance's price); the ledger prices the session's "
        "seconds from its creation to its stop, waits included. None = the ledger counts session-hours only",
    )
    acr_vcpus: float = Field(
        1.0, ge=0, le=64,
        description="vCPUs the agent keeps busy per ACR session-second: AgentCore Runtime bills the CPU a session "
        "actively uses (not its waits on the LLM), so 1.0 is an upper bound for one busy core",
    )
    acr_memory_gb: float = Field(
        2.0, ge=0, le=256,
        description="GB of memory billed per ACR session-second (AgentCore Runtime bills a session's peak memory "
        "for its lifetime)",
    )

    # --- Budget limits (stepwise.core.stopping: checked before each step; the run ends gracefully) ---
    max_steps: int | None = Field(
        None, ge=1,
        description="end the run after this many steps (skipped steps count), gracefully: final eval if "
        "configured, final checkpoint, session stopped, SUCCEEDED with the limit as the stop reason; None = "
        "until the epochs are done",
    )
    max_cost_usd: float | None = Field(
        None, gt=0,
        description="end the run gracefully before a step that would take the cost ledger's total (session, agent "
        "and stack) past this many USD, projected from the costliest of the last steps; needs "
        "session_usd_per_hour. None = no limit",
    )
    max_session_hours: float | None = Field(
        None, gt=0,
        description="end the run gracefully before a step that would take the training sessions' hours (from "
        "creation, waits included, every session of the run) past this, projected from the last steps. None = "
        "no limit",
    )
    max_run_hours: float | None = Field(
        None, gt=0,
        description="end the run gracefully before a step that would end past this many wall-clock hours since "
        "the run started, projected from the last steps. None = no limit",
    )
    budget_warning_fraction: float = Field(
        0.8, gt=0, le=1,
        description="warn (log, SNS notification when the stack has a topic, stepwise watch) once a budget "
        "limit's projection reaches this fraction of it",
    )

    # --- The group judge (stepwise.core.judge, docs/judge.md): rewards for agents without an answer key ---
    judge: JudgeConfig | None = Field(
        None, description="a group judge on Bedrock that scores each group's members against a rubric "
        "(model_id, rubric, score range, what it reads, how its score combines with the agent's reward, "
        "concurrency, requests per second, fallback); None = the agent's own reward only. docs/judge.md")

    # --- Dataset ---
    dataset_path: str = Field(description="Parquet or JSONL with a 'payload' column/field")
    max_prompts: int = Field(0, ge=0, description="use only the first N prompts; 0 = all")

    # --- Evaluation ---
    eval_dataset_path: str = Field(
        "", description="Parquet or JSONL eval prompts, the unnamed eval set (its metrics are eval/accuracy, "
        "eval/pass@k, ...); '' = none")
    # --- Group evals and named eval sets (model selection) ---
    eval_datasets: dict[str, str] = Field(
        default_factory=dict,
        description="more eval sets, by name: {NAME: path} (Parquet or JSONL like eval_dataset_path); each is "
        "rolled out in the same eval (one Map run) and reported under its name (eval/NAME/accuracy, "
        "eval/NAME/pass@k, ...). NAME: 1-32 of a-z 0-9 _ -, starting with a letter or digit",
    )
    eval_every: int = Field(0, ge=0, description="eval every N steps; 0 = only at the end")
    eval_max_prompts: int = Field(200, ge=0, description="first N prompts of each eval set; 0 = all")
    eval_temperature: float = Field(
        0.0, ge=limits.TEMPERATURE.lo, le=limits.TEMPERATURE.hi,
        description="sampling temperature of eval rollouts (range: the service's SamplingParams.temperature)",
    )
    eval_before_train: bool | None = Field(
        None,
        description="a baseline eval at step 0, before the first optimizer step (verl's val_before_train); "
        "None = on when there is an eval set (eval_dataset_path or eval_datasets)",
    )
    eval_group_size: int = Field(
        1, ge=1, le=limits.NUM_SAMPLES.hi,
        description="rollouts per eval prompt, n: pass@k, mean@n and the group outcomes (all_pass@k, all_fail@k, "
        "mixed@k) are estimated from them (Chen et al. 2021's unbiased estimator); above 1 it needs "
        "eval_temperature > 0 (a greedy sampler answers n times the same)",
    )
    eval_pass_k: list[int] | None = Field(
        None,
        description="the k of eval/pass@k, eval/all_pass@k, eval/all_fail@k and eval/mixed@k, each 1..eval_group_size; "
        "None = 1 and eval_group_size",
    )
    eval_success_threshold: float = Field(
        1.0,
        description="an eval rollout succeeds (counts for pass@k) when its reward is at least this; eval/accuracy "
        "stays the mean reward",
    )
    # --- Eval-only runs (the same state machine: session, weights, eval sets, report; no training) ---
    eval_only: bool = Field(
        False,
        description="run the eval sets once and stop: create the session, load eval_model_package_arn's weights "
        "(or keep the base model), evaluate, stop the session; no training step and no checkpoint. "
        "`stepwise eval` and `stepwise screen` start such runs",
    )
    eval_model_package_arn: str = Field(
        "", description="eval_only: the model package whose weights are evaluated (a checkpoint or sampler weights "
        "of an earlier run); '' = the base model",
    )

    # --- Model selection: early stopping, the best model package, retention (stepwise.core.selection) ---
    early_stopping: EarlyStopping | None = Field(
        None,
        description="end the run when the eval stops improving: {metric, mode, patience, min_delta}; needs "
        "eval_every > 0. Its metric, mode and min_delta also choose the best model package (without it: "
        "the first eval set's accuracy, eval/accuracy or eval/NAME/accuracy, max, 0)",
    )
    keep_model_packages: Literal["all", "best_and_last"] = Field(
        "all",
        description="all: keep every model package the run saves; best_and_last: when the run ends successfully, "
        "delete the ones it created in between (each step's sampler weights, save_every checkpoints), keeping "
        "the best, the final weights and the final checkpoint; the run's output names what was deleted",
    )

    # --- Bookkeeping ---
    exp_id: str = Field(
        "", description="a label only: rollout results are written under rollout-results/{run_id}, whatever this says"
    )
    mlflow_tracking_uri: str = Field(
        "",
        description="MLflow tracking of params and per-step metrics: a SageMaker managed MLflow ARN "
        "(arn:aws:sagemaker:REGION:ACCOUNT:mlflow-app/ID or :mlflow-tracking-server/NAME), an http(s):// "
        "tracking server, or a local sqlite:/// or file: store; '' = off",
    )
    mlflow_experiment_name: str = Field(
        "stepwise", min_length=1, max_length=500, description="MLflow experiment the run is logged under"
    )
    # --- Weights & Biases (the reference's wandb_project / wandb_run_name, plus the entity) ---
    wandb_project: str = Field(
        "", max_length=128,
        description="W&B project every step's metrics, evals and sample table are logged to (one W&B run per "
        "run, resumed across executions; the API key comes from the secret the stack names, context "
        "wandbApiKeySecretArn); '' = off. W&B limits: 128 characters, none of / \\ # ? % :",
    )
    wandb_run_name: str = Field("", max_length=128, description="the W&B run's display name; '' = the run id")
    wandb_entity: str = Field("", max_length=128, description="W&B entity (team or user); '' = the API key's default")

    # ------------------------------------------------------------------ field checks

    @field_validator("*", mode="before")
    @classmethod
    def _exact_integers(cls, v: Any) -> Any:
        """Every field, before its own checks: no integer in it (nested ones included) beyond
        `limits.MAX_EXACT_INTEGER`, the one bound of every integer of a run config."""
        if _inexact_integer(v):
            raise ValueError(f"integers must be within +-{limits.MAX_EXACT_INTEGER:,} (2**53 - 1): Step Functions "
                             "carries numbers as doubles")
        return v

    @field_validator("region")
    @classmethod
    def _region(cls, v: str) -> str:
        if v and not REGION_RE.match(v):
            raise ValueError("must be an AWS region name such as 'us-east-1'")
        return v

    @field_validator("role_arn")
    @classmethod
    def _role(cls, v: str) -> str:
        if not ROLE_ARN_RE.match(v):
            raise ValueError("must be an IAM role ARN: arn:aws:iam::123456789012:role/NAME")
        return v

    @field_validator("base_model_arn")
    @classmethod
    def _base_model(cls, v: str) -> str:
        if v.startswith("arn:"):
            if not HUB_CONTENT_ARN_RE.match(v):
                raise ValueError(
                    "must be a hub-content ARN (arn:aws:sagemaker:REGION:aws:hub-content/SageMakerPublicHub/Model/NAME/"
                    "VERSION) or a hub model name"
                )
        elif not HUB_MODEL_NAME_RE.match(v):
            raise ValueError("must be a hub-content ARN or a hub model name (letters, digits, '.', '_', '-')")
        return v

    @field_validator("s3_output_path")
    @classmethod
    def _s3_output(cls, v: str) -> str:
        if v:
            _check_s3(v)
        return v

    @field_validator("model_package_group_arn")
    @classmethod
    def _mpg(cls, v: str) -> str:
        if v and not MODEL_PACKAGE_GROUP_ARN_RE.match(v):
            raise ValueError("must be '' or arn:aws:sagemaker:REGION:ACCOUNT:model-package-group/NAME")
        return v

    @field_validator("resume_from_model_package")
    @classmethod
    def _resume(cls, v: str) -> str:
        if v and not MODEL_PACKAGE_ARN_RE.match(v):
            raise ValueError("must be '' or arn:aws:sagemaker:REGION:ACCOUNT:model-package/NAME/VERSION")
        return v

    @field_validator("kms_key_arn")
    @classmethod
    def _kms(cls, v: str) -> str:
        if v and not KMS_KEY_ARN_RE.match(v):
            raise ValueError("must be '' or arn:aws:kms:REGION:ACCOUNT:key/ID (or :alias/NAME)")
        return v

    @field_validator("tokenizer_path")
    @classmethod
    def _tokenizer(cls, v: str) -> str:
        if v.startswith("s3://"):
            _check_s3(v)
        elif v and not re.match(r"^\S+\Z", v):
            raise ValueError(
                "must be '', an s3://bucket/prefix/ of tokenizer files, a model id like 'org/name', "
                "or a local directory (local stack only)"
            )
        return v

    @field_validator("chat_template_kwargs")
    @classmethod
    def _template_kwargs(cls, v: dict[str, Any]) -> dict[str, Any]:
        # It rides in the execution input and the gateway's session record, both JSON: a YAML date,
        # binary, set or NaN would load here and fail later (or send invalid JSON).
        stack: list[tuple[str, Any]] = list(v.items())
        while stack:
            where, x = stack.pop()
            if isinstance(x, dict):
                bad = [k for k in x if not isinstance(k, str)]
                if bad:
                    raise ValueError(f"{where}: keys must be strings (got {shown(bad[0])})")
                stack.extend((f"{where}.{k}", c) for k, c in x.items())
            elif isinstance(x, list):
                stack.extend((f"{where}[{i}]", c) for i, c in enumerate(x))
            elif isinstance(x, float) and not math.isfinite(x):
                raise ValueError(f"{where}: {x!r} is not a JSON number")
            elif not (x is None or isinstance(x, (str, int, float, bool))):
                raise ValueError(f"{where}: must be JSON data (string, number, boolean, null, list, mapping), "
                                 f"got a {type(x).__name__}")
        return v

    @field_validator("agent_runtime_arn")
    @classmethod
    def _agent(cls, v: str) -> str:
        if not AGENT_RUNTIME_ARN_RE.match(v):
            raise ValueError("must be arn:aws:bedrock-agentcore:REGION:ACCOUNT:runtime/AGENT_ID")
        return v

    @field_validator("max_new_tokens")
    @classmethod
    def _new_tokens(cls, v: int, info: ValidationInfo) -> int:
        ctx = info.data.get("max_context_tokens")
        if ctx is not None and v > ctx:
            raise ValueError(f"must be <= max_context_tokens ({ctx})")
        return v

    @field_validator("responses_per_prompt")
    @classmethod
    def _group_fits_map(cls, v: int, info: ValidationInfo) -> int:
        bs = info.data.get("batch_size")
        cap = limits.DISTRIBUTED_MAP_MAX_CHILDREN
        if bs is not None and bs * v > cap:
            raise ValueError(
                f"batch_size x responses_per_prompt = {bs} x {v} = {bs * v} rollouts in one generation batch, "
                f"more than the {cap} child executions a Distributed Map runs in parallel; lower either"
            )
        return v

    @field_validator("clip_low_threshold", "clip_high_threshold")
    @classmethod
    def _clip(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None:
            return v
        loss = info.data.get("loss")
        if loss is not None and loss not in CLIPPED_LOSSES:
            raise ValueError(f"applies only to loss 'ppo' or 'cispo', but loss is {loss!r}; remove it or change loss")
        lo, hi = (0.0, 1.0) if info.field_name == "clip_low_threshold" else (1.0, 10.0)
        if not (math.isfinite(v) and lo <= v <= hi):
            raise ValueError(f"must be between {lo:g} and {hi:g} (the service's accepted range)")
        return v

    @model_validator(mode="before")
    @classmethod
    def _deep_async_loss(cls, data: Any) -> Any:
        """From ``max_staleness`` 2 on, a config that names no ``loss`` gets truncated importance sampling
        (`stepwise.core.staleness.DEEP_ASYNC_LOSS`: cispo, clip thresholds 0 and 2; docs/operating.md)."""
        from stepwise.core.staleness import deep_async_defaults

        if isinstance(data, dict):
            return {**data, **deep_async_defaults(data)}
        return data

    @field_validator("max_staleness")
    @classmethod
    def _staleness(cls, v: int, info: ValidationInfo) -> int:
        from stepwise.core.staleness import MAX_SUPPORTED_STALENESS, deep_loss_problem

        if v > MAX_SUPPORTED_STALENESS and info.data.get("admission", "batch") == "batch":
            raise ValueError(
                f"max_staleness {v} needs admission 'group': with admission 'batch' one Parallel state overlaps a "
                f"step's training with the next step's rollouts, so a batch lags by at most "
                f"{MAX_SUPPORTED_STALENESS} policy version; use 0, {MAX_SUPPORTED_STALENESS}, or admission 'group'"
            )
        problem = deep_loss_problem(info.data.get("loss"), v)
        if problem:
            raise ValueError(problem)
        return v

    @field_validator("admission")
    @classmethod
    def _admission(cls, v: str, info: ValidationInfo) -> str:
        group, quota = info.data.get("responses_per_prompt"), info.data.get("acr_max_active_sessions")
        if v == "group" and group is not None and quota is not None and quota < group:
            raise ValueError(f"a group of responses_per_prompt ({group}) rollouts starts only when all of them fit "
                             f"under acr_max_active_sessions ({quota}): none could start")
        return v

    @field_validator("sampling_steps_ahead")
    @classmethod
    def _steps_ahead(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            return v
        if info.data.get("admission", "batch") != "group":
            raise ValueError("applies to admission 'group' only; remove it or set admission 'group'")
        k = info.data.get("max_staleness")
        if k is not None and v > k:
            raise ValueError(f"must be <= max_staleness ({k}): a group admitted {v} step(s) ahead would be "
                             f"trained more than {k} version(s) after it sampled")
        return v

    @field_validator("max_rollouts_in_flight")
    @classmethod
    def _in_flight(cls, v: int | None, info: ValidationInfo) -> int | None:
        if v is None:
            return v
        if info.data.get("admission", "batch") != "group":
            raise ValueError("applies to admission 'group' only (admission 'batch' bounds its Map by acr_tps_limit "
                             "and acr_max_active_sessions); remove it or set admission 'group'")
        group = info.data.get("responses_per_prompt")
        if group is not None and v < group:
            raise ValueError(f"must be >= responses_per_prompt ({group}): a group starts only when all its "
                             "members fit, so none could start")
        quota = info.data.get("acr_max_active_sessions")
        if quota is not None and v > quota:
            raise ValueError(f"must be <= acr_max_active_sessions ({quota}): each rollout in flight holds one ACR "
                             "runtime session, and ACR refuses sessions past the account's quota")
        tps, lifetime = info.data.get("acr_tps_limit"), info.data.get("max_rollout_time")
        if tps is not None and lifetime is not None and v > tps * lifetime:
            raise ValueError(f"must be <= acr_tps_limit x max_rollout_time ({tps} x {lifetime:g} = "
                             f"{tps * lifetime:g}): InvokeAgentRuntime at {tps}/s cannot start more rollouts "
                             "than that while the first of them still runs")
        return v

    @field_validator("reward_granularity")
    @classmethod
    def _granularity(cls, v: str, info: ValidationInfo) -> str:
        from stepwise.core.advantages import PER_TURN_ESTIMATORS

        estimator = info.data.get("advantage_estimator")
        if estimator in PER_TURN_ESTIMATORS and v != "per_turn":
            raise ValueError(f"advantage_estimator {estimator!r} gives each LLM turn its own advantage from per-turn "
                             "rewards: set reward_granularity 'per_turn' (and return one reward per turn), or choose "
                             "a trajectory estimator (grpo, dr_grpo, rloo, reinforce_pp_baseline)")
        return v

    @field_validator("overlong_buffer_len")
    @classmethod
    def _overlong(cls, v: int, info: ValidationInfo) -> int:
        cap = info.data.get("max_tokens_per_rollout")
        if v and cap is not None and v >= cap:
            raise ValueError(f"must be < max_tokens_per_rollout ({cap}), the L_max of overlong shaping")
        if v and info.data.get("algorithm", "dapo") != "dapo":
            raise ValueError("overlong shaping applies only to algorithm 'dapo'; set algorithm 'dapo' or use 0")
        return v

    @field_validator("max_cost_usd")
    @classmethod
    def _cost_needs_session_price(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is not None and info.data.get("session_usd_per_hour", 0) is None:
            raise ValueError("needs session_usd_per_hour: the training session is most of a run's cost, and the "
                             "ledger cannot price it without its hourly price")
        return v

    @field_validator("judge")
    @classmethod
    def _judge(cls, v: JudgeConfig | None, info: ValidationInfo) -> JudgeConfig | None:
        if v is None:
            return v
        from stepwise.core.advantages import PER_TURN_ESTIMATORS

        estimator = info.data.get("advantage_estimator")
        if estimator in PER_TURN_ESTIMATORS and v.combine != "add":
            raise ValueError(f"combine {v.combine!r} needs one reward per rollout, but advantage_estimator {estimator!r} "
                             "reads one per LLM turn: use combine 'add' (the judge's score joins the last turn's "
                             "reward) or a trajectory estimator")
        m = BEDROCK_MODEL_ARN_RE.match(v.model_id)
        region = info.data.get("region")
        if m and region and m.group(1) != region:
            raise ValueError(f"model_id names region {m.group(1)}, not the run's region {region}: the judge calls "
                             "Bedrock in the run's region (a cross-Region inference profile of that region reaches "
                             "others)")
        gens = info.data.get("max_num_gen_batches")
        if info.data.get("algorithm") == "dapo" and gens and gens > limits.MAX_JUDGED_GENERATION_BATCHES_PER_STEP:
            raise ValueError(f"with a judge a DAPO generation batch adds {limits.JUDGE_EVENTS_PER_GENERATION_BATCH} "
                             f"history events, so max_num_gen_batches may be at most "
                             f"{limits.MAX_JUDGED_GENERATION_BATCHES_PER_STEP} (got {gens})")
        if info.data.get("max_cost_usd") is not None and v.usd_per_million is None:
            raise ValueError(f"max_cost_usd needs the judge's price, and the price table does not know {v.model_id!r}: "
                             "set usd_per_million_input_tokens and usd_per_million_output_tokens")
        return v

    @field_validator("dataset_path")
    @classmethod
    def _dataset(cls, v: str) -> str:
        return _check_path(v, "dataset_path", required=True)

    @field_validator("max_prompts")
    @classmethod
    def _max_prompts(cls, v: int, info: ValidationInfo) -> int:
        bs = info.data.get("batch_size")
        if v and bs is not None and v < bs:
            raise ValueError(f"leaves fewer prompts than batch_size ({bs}), so no step could run; use 0 or >= {bs}")
        return v

    @field_validator("eval_dataset_path")
    @classmethod
    def _eval_dataset(cls, v: str) -> str:
        return _check_path(v, "eval_dataset_path", required=False)

    @field_validator("eval_datasets")
    @classmethod
    def _eval_datasets(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [name for name in v if not EVAL_SET_NAME_RE.match(name)]
        if bad:
            raise ValueError(f"eval set names must be 1-32 of a-z 0-9 _ -, starting with a letter or digit; bad: "
                             f"{shown(bad)}")
        for name, path in v.items():
            try:
                _check_path(path, f"eval_datasets.{name}", required=True)
            except ValueError as e:
                raise ValueError(f"{name}: {e}") from None
        return v

    @field_validator("eval_every")
    @classmethod
    def _eval_every(cls, v: int, info: ValidationInfo) -> int:
        if v and not _has_eval_set(info.data):
            raise ValueError("evaluates nothing: eval_dataset_path and eval_datasets are empty; set one or use "
                             "eval_every 0")
        return v

    @field_validator("eval_before_train")
    @classmethod
    def _eval_before_train(cls, v: bool | None, info: ValidationInfo) -> bool | None:
        if v and not _has_eval_set(info.data):
            raise ValueError("evaluates nothing: eval_dataset_path and eval_datasets are empty; set one or leave "
                             "eval_before_train unset")
        return v

    @field_validator("eval_group_size")
    @classmethod
    def _eval_group_size(cls, v: int, info: ValidationInfo) -> int:
        if v > 1 and info.data.get("eval_temperature") == 0:
            raise ValueError(f"{v} rollouts per prompt at eval_temperature 0 (greedy) give the same answer {v} "
                             "times: set eval_temperature > 0 (e.g. the training temperature) or use 1")
        prompts = info.data.get("eval_max_prompts")
        sets = len(_eval_set_names(info.data))
        cap = limits.DISTRIBUTED_MAP_MAX_CHILDREN
        if prompts and sets and prompts * v * sets > cap:
            raise ValueError(f"{sets} eval set(s) x eval_max_prompts {prompts} x {v} = {prompts * v * sets} eval "
                             f"rollouts in one Map run, more than {cap}; lower either")
        return v

    @field_validator("eval_pass_k")
    @classmethod
    def _eval_pass_k(cls, v: list[int] | None, info: ValidationInfo) -> list[int] | None:
        n = info.data.get("eval_group_size")
        if v is not None and n is not None:
            if not v:
                raise ValueError("must name at least one k (or be null for 1 and eval_group_size)")
            bad = [k for k in v if not 1 <= k <= n]
            if bad:
                raise ValueError(f"each k must be between 1 and eval_group_size ({n}); bad: {bad}")
        return v

    @field_validator("eval_success_threshold")
    @classmethod
    def _threshold(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("eval_only")
    @classmethod
    def _eval_only(cls, v: bool, info: ValidationInfo) -> bool:
        if v and not _has_eval_set(info.data):
            raise ValueError("an eval-only run needs an eval set: set eval_dataset_path or eval_datasets")
        if v and info.data.get("resume_from_model_package"):
            raise ValueError("an eval-only run does not train: name the weights to evaluate in "
                             "eval_model_package_arn, not resume_from_model_package")
        return v

    @field_validator("eval_model_package_arn")
    @classmethod
    def _eval_model_package(cls, v: str, info: ValidationInfo) -> str:
        if v and not MODEL_PACKAGE_ARN_RE.match(v):
            raise ValueError("must be '' or arn:aws:sagemaker:REGION:ACCOUNT:model-package/NAME/VERSION")
        if v and info.data.get("eval_only") is False:
            raise ValueError("applies to eval-only runs (eval_only true); to train on from a checkpoint use "
                             "resume_from_model_package")
        return v

    @field_validator("wandb_project", "wandb_entity")
    @classmethod
    def _wandb_name(cls, v: str) -> str:
        # W&B refuses project names with these (wandb/sdk/wandb_settings.py, Settings.validate_project)
        bad = sorted(set(v) & set("/\\#?%:"))
        if bad:
            raise ValueError(f"must not contain {' '.join(bad)} (W&B refuses / \\ # ? % : in names)")
        return v

    @field_validator("early_stopping")
    @classmethod
    def _early_stopping(cls, v: EarlyStopping | None, info: ValidationInfo) -> EarlyStopping | None:
        if v is None:
            return v
        if info.data.get("eval_only"):
            raise ValueError("an eval-only run does not train: remove early_stopping")
        if info.data.get("eval_every") == 0:
            raise ValueError("needs evals during training: set eval_every > 0 (evals every N steps)")
        problem = _selection_metric_problem(v.metric, info.data)
        if problem:
            raise ValueError(f"metric {v.metric!r}: {problem}")
        return v

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _mlflow(cls, v: str) -> str:
        if v and not (MLFLOW_ARN_RE.match(v) or re.match(r"^(https?://\S+|file:\S+|sqlite:///\S+)\Z", v)):
            raise ValueError(
                "must be '', a SageMaker MLflow ARN (arn:aws:sagemaker:REGION:ACCOUNT:mlflow-app/ID or "
                ":mlflow-tracking-server/NAME), an http(s):// URL, or a local sqlite:/// or file: store"
            )
        return v

    # ------------------------------------------------------------------ derived values

    @property
    def loss_fn_config(self) -> dict[str, float] | None:
        """``loss_fn_config`` for forward_backward (Clip-Higher), or None when no threshold is set."""
        cfg = {
            k: v
            for k, v in (("clip_low_threshold", self.clip_low_threshold), ("clip_high_threshold", self.clip_high_threshold))
            if v is not None
        }
        return cfg or None

    @property
    def saves_initial_sampler(self) -> bool:
        """Whether the run binds its sampler to the saved base weights before the first step
        (`stepwise.core.phases.plan_initial_sampler`): the group engine with ``max_staleness`` >= 1 admits
        groups while a step trains, and no rollout may sample the base model (``""``) then."""
        return self.admission == "group" and self.max_staleness >= 1 and not self.resume_from_model_package

    @property
    def steps_ahead(self) -> int:
        """The group engine's ``d`` (`sampling_steps_ahead`, default ``min(1, max_staleness)``)."""
        return min(1, self.max_staleness) if self.sampling_steps_ahead is None else self.sampling_steps_ahead

    @property
    def rollouts_in_flight_cap(self) -> int:
        """The group engine's cap on rollouts in flight: ``max_rollouts_in_flight``, else what the quotas
        allow (`stepwise.core.planning.map_concurrency` of an unbounded batch), at least one group."""
        if self.max_rollouts_in_flight is not None:
            return self.max_rollouts_in_flight
        bound = min(limits.MAX_MAP_CONCURRENCY, self.acr_max_active_sessions,
                    self.acr_tps_limit * limits.CONCURRENCY_PER_TPS)
        return max(bound, self.responses_per_prompt)

    @property
    def sampling_defaults(self) -> dict[str, Any]:
        """Training-rollout sampling defaults, as the reference builds them."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.temperature}

    @property
    def eval_sampling_defaults(self) -> dict[str, Any]:
        """Eval-rollout sampling defaults (reference ``run_eval``: temperature = eval_temperature)."""
        return {"max_new_tokens": self.max_new_tokens, "temperature": self.eval_temperature}

    def steps_per_epoch(self, dataset_rows: int) -> int:
        """Full batches per epoch: ``min(rows, max_prompts or rows) // batch_size`` (reference: a partial
        last batch is dropped)."""
        used = min(dataset_rows, self.max_prompts) if self.max_prompts > 0 else dataset_rows
        return used // self.batch_size

    def total_steps(self, dataset_rows: int) -> int:
        """Steps the run trains unless another limit ends it first: ``steps_per_epoch x epochs``, at most
        ``max_steps`` (DAPO: an upper bound, each extra generation batch consumes prompts too)."""
        total = self.steps_per_epoch(dataset_rows) * self.epochs
        return total if self.max_steps is None else min(total, self.max_steps)

    @property
    def eval_set_paths(self) -> dict[str, str]:
        """``{eval set name: dataset path}``: the unnamed set ``""`` (``eval_dataset_path``) when set,
        then ``eval_datasets`` in their order."""
        return ({"": self.eval_dataset_path} if self.eval_dataset_path else {}) | dict(self.eval_datasets)

    @property
    def has_evals(self) -> bool:
        """Whether the run has an eval set (``eval_dataset_path`` or ``eval_datasets``)."""
        return bool(self.eval_dataset_path or self.eval_datasets)

    @property
    def pass_ks(self) -> list[int]:
        """The k of the pass@k metrics (`stepwise.core.evals.pass_ks`)."""
        from stepwise.core.evals import pass_ks

        return pass_ks(self.eval_group_size, self.eval_pass_k)

    @property
    def baseline_eval(self) -> bool:
        """Whether step 0 starts with an eval of the untrained policy: ``eval_before_train``, or
        when unset, whether there is an eval set."""
        return self.has_evals if self.eval_before_train is None else self.eval_before_train

    def should_eval(self, step_done: int) -> bool:
        """Eval after ``step_done`` completed steps (reference: ``eval_every > 0 and step % eval_every == 0``)."""
        return self.eval_every > 0 and step_done % self.eval_every == 0

    def should_save(self, step: int) -> bool:
        """save_state before step ``step`` (0-based) (reference: ``save_every > 0 and step > 0 and step % save_every == 0``)."""
        return self.save_every > 0 and step > 0 and step % self.save_every == 0

    def final_eval_needed(self, steps_done: int, last_eval_step: int | None) -> bool:
        """Whether the end of training runs an eval: whenever there is an eval dataset, unless an
        eval already ran after the last step (docs/migration.md; fixes the reference's
        ``global_step % eval_every`` condition, which skips it when the last step was skipped)."""
        return self.has_evals and last_eval_step != steps_done

    def summary(self, dataset_rows: int | None = None) -> dict[str, Any]:
        """A one-screen summary for `stepwise validate`.

        Returns a flat dict: algorithm, loss, group shape, rollouts per step (per generation batch
        for DAPO, and the cap), and, when ``dataset_rows`` is given, prompts used, steps per epoch,
        total steps (at most ``max_steps``), executions (continue-as-new every ``steps_per_execution``) and
        eval points.
        """
        rollouts = self.batch_size * self.responses_per_prompt
        out: dict[str, Any] = {
            "algorithm": self.algorithm,
            "advantage_estimator": self.advantage_estimator,
            "reward_granularity": self.reward_granularity,
            "loss": self.loss,
            "base_model": self.base_model_arn,
            "agent_runtime_arn": self.agent_runtime_arn,
            "batch_size": self.batch_size,
            "responses_per_prompt": self.responses_per_prompt,
            "rollouts_per_step": rollouts,
        }
        if self.algorithm == "dapo":
            out["rollouts_per_generation_batch"] = rollouts
            out["max_rollouts_per_step"] = rollouts * self.max_num_gen_batches
        if self.loss_fn_config:
            out["loss_fn_config"] = self.loss_fn_config
        if dataset_rows is not None:
            spe = self.steps_per_epoch(dataset_rows)
            total = self.total_steps(dataset_rows)
            out.update(
                dataset_rows=dataset_rows,
                prompts_used=min(dataset_rows, self.max_prompts) if self.max_prompts > 0 else dataset_rows,
                steps_per_epoch=spe,
                epochs=self.epochs,
                total_steps=total,
                executions=max(1, -(-total // self.steps_per_execution)),
                evals=(total // self.eval_every if self.eval_every else 0) + (1 if self.has_evals else 0)
                - (1 if self.eval_every and total and total % self.eval_every == 0 else 0)
                + (1 if self.baseline_eval and total else 0),
            )
            if self.algorithm == "dapo":
                # each extra generation batch consumes batch_size more prompts
                out["steps_are_upper_bounds"] = True
        return out


# ---------------------------------------------------------------------- loading


class _ShortRepr(reprlib.Repr):
    def __init__(self) -> None:
        super().__init__()
        self.maxlevel, self.maxdict, self.maxlist, self.maxtuple, self.maxset = 3, 6, 6, 6, 6
        self.maxstring, self.maxother, self.maxlong = 120, 120, 60

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 1000:  # repr() refuses ints of more than 4300 digits; say how long instead
            return f"<{len(str(x)) if x.bit_length() < 14000 else int(x.bit_length() * 0.30103) + 1}-digit int>"
        return super().repr_int(x, level)


_SHORT_REPR = _ShortRepr()
#: The most characters `shown` gives of a value.
SHOWN_MAX_CHARS = 300


def _inexact_integer(value: Any) -> bool:
    """Whether ``value`` is, or holds (in lists, tuples, dicts' keys and values), an integer that is not a bool and
    lies beyond +-`limits.MAX_EXACT_INTEGER`. Each container is looked at once (a self-referring one ends)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if isinstance(v, int) and not isinstance(v, bool):
            if not -limits.MAX_EXACT_INTEGER <= v <= limits.MAX_EXACT_INTEGER:
                return True
        elif isinstance(v, (dict, list, tuple, set, frozenset)) and id(v) not in seen:
            seen.add(id(v))
            stack.extend([*v.keys(), *v.values()] if isinstance(v, dict) else v)
    return False


def shown(value: Any) -> str:
    """``repr(value)`` abbreviated for an error message: at most a few hundred characters, whatever
    the value (a YAML alias bomb, a self-referring list, an int of thousands of digits, six nested dicts of
    long keys: reprlib bounds each container's items, not the whole, so the whole is cut too)."""
    text = _SHORT_REPR.repr(value)
    return text if len(text) <= SHOWN_MAX_CHARS else text[:SHOWN_MAX_CHARS - 3] + "..."


def _format_error(err: dict[str, Any]) -> str:
    loc = ".".join(str(p) for p in err.get("loc", ())) or "(config)"
    kind = err.get("type", "")
    value = err.get("input")
    if kind == "extra_forbidden":
        field = str(err["loc"][-1])
        nested = {"vpc_config": VpcConfig, "early_stopping": EarlyStopping, "judge": JudgeConfig}
        model = (JudgeInclude if err["loc"][:2] == ("judge", "include") else nested.get(str(err["loc"][0]), VpcConfig))
        names = list(RunConfig.model_fields) if len(err["loc"]) == 1 else list(model.model_fields)
        close = difflib.get_close_matches(field, names, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"{loc}: unknown field (got {shown(value)}){hint}"
    if kind == "missing":
        desc = RunConfig.model_fields[loc].description if loc in RunConfig.model_fields else None
        return f"{loc}: required{f' ({desc})' if desc else ''}"
    msg = err.get("msg", "")
    msg = msg.removeprefix("Value error, ")
    source = LIMIT_SOURCES.get(loc) if kind in _RANGE_ERRORS else None
    if source is not None:
        msg = f"{msg}: {source}"
    return f"{loc}: {msg} (got {shown(value)})"


_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})

#: Where a field's bounds come from, named in its range errors (see `stepwise.core.service_limits`).
LIMIT_SOURCES: dict[str, str] = {
    "lora_rank": f"the service's range is {limits.LORA_RANK.describe()}",
    "lora_alpha": f"the service's range is {limits.LORA_ALPHA.describe()}, a 32-bit integer",
    "max_new_tokens": f"the service's range is {limits.MAX_TOKENS.describe()}",
    "temperature": f"the service's range is {limits.TEMPERATURE.describe()}",
    "eval_temperature": f"the service's range is {limits.TEMPERATURE.describe()}",
    "learning_rate": f"the service's range is {limits.LEARNING_RATE.describe()}",
    "responses_per_prompt": f"the group size is bounded by {limits.NUM_SAMPLES.describe()}",
    "acr_tps_limit": f"above {limits.MAX_ACR_TPS_LIMIT} PlanStep's Map concurrency cap ({limits.MAX_MAP_CONCURRENCY} "
                     f"rollouts in flight, {limits.CONCURRENCY_PER_TPS} per unit) binds instead, so it would do nothing; "
                     "acr_max_active_sessions bounds the rollouts in flight too",
    "acr_max_active_sessions": "it bounds the rollouts in flight by ACR's active-session quota ('Active session "
                               f"workloads per account': {limits.ACR_ACTIVE_SESSIONS_DEFAULT} by default, 1000 in "
                               "us-east-1 and us-west-2) and a Distributed Map runs at most "
                               f"{limits.DISTRIBUTED_MAP_MAX_CHILDREN} children at once",
    "max_num_gen_batches": f"{limits.EVENTS_PER_GENERATION_BATCH} history events per generation batch must fit in one "
                           f"execution's {limits.EXECUTION_HISTORY_EVENTS}-event history",
}


#: YAML 1.2's float syntax (PyYAML resolves YAML 1.1, whose floats need a dot: ``1e-5`` would be
#: the string "1e-5"); the documented PyYAML recipe, added to a SafeLoader subclass only.
_YAML12_FLOAT = re.compile(r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
    |\.[0-9][0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


def _yaml_loader() -> Any:
    # PyYAML (6.0.4 here) comes with our runtime dependencies: sagemaker-train requires PyYAML>=6,<7
    # (transformers too); the toolkit's reference loop imports it for its YAML config.
    import yaml

    class Loader(yaml.SafeLoader):
        def construct_mapping(self, node: Any, deep: bool = False) -> Any:
            # PyYAML keeps the last of a key given twice; refuse it (a merge key's entries, ``<<``,
            # may be overridden: that is what merging means).
            if isinstance(node, yaml.MappingNode):
                seen: dict[Any, Any] = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node)
                    try:
                        first = seen.setdefault(key, key_node.start_mark)
                    except TypeError:  # unhashable: SafeConstructor says so below
                        continue
                    if first is not key_node.start_mark:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"{key!r} is given twice (first at line {first.line + 1})", key_node.start_mark)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver("tag:yaml.org,2002:float", _YAML12_FLOAT, list("-+0123456789."))
    return Loader


def config_format(path: str | Path, text: str) -> Literal["json", "yaml"]:
    """How a config file is read: by its extension when it says (``.json``; ``.yaml`` / ``.yml``), else by
    its content: JSON when its first non-blank character opens a JSON object or array, YAML otherwise.
    So the reference's own template ``config.yaml.example`` reads as the YAML it is."""
    suffix = Path(path).suffix.lower()
    if suffix == ".json":
        return "json"
    if suffix in (".yaml", ".yml"):
        return "yaml"
    return "json" if text.lstrip("\ufeff \t\r\n")[:1] in ("{", "[") else "yaml"


def read_config_file(path: str | Path) -> Any:
    """The parsed content of a JSON or YAML config file, before validation (`config_format` says which).

    YAML floats follow YAML 1.2 (``1e-5`` is a number). Raises ConfigError naming the file when it
    cannot be read or parsed.
    """
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError([f"(file): cannot read {path}: {e.strerror or e}"], str(path)) from e
    except UnicodeDecodeError as e:
        raise ConfigError([f"(file): not UTF-8 text (byte {e.object[e.start]:#x} at offset {e.start}); "
                           "save the file as UTF-8"], str(path)) from None
    is_yaml = config_format(path, text) == "yaml"
    try:
        raw = _parse_config_text(path, text, is_yaml)
    except ConfigError as e:
        raise ConfigError(e.errors, str(path)) from None
    return inline_rubric(raw, path.parent)


def _parse_config_text(path: Path, text: str, is_yaml: bool) -> Any:
    try:
        if is_yaml:
            import yaml

            try:
                return yaml.load(text, Loader=_yaml_loader())  # noqa: S506 - a SafeLoader subclass
            except yaml.YAMLError as e:
                raise ConfigError([f"(file): not valid YAML: {e}"], str(path)) from e
            except (AttributeError, TypeError) as e:  # PyYAML's constructors on some explicit tags (!!timestamp x)
                raise ConfigError([f"(file): not valid YAML: a tagged value cannot be constructed ({e})"],
                                  str(path)) from None
        try:
            return json.loads(text, object_pairs_hook=_json_object)
        except json.JSONDecodeError as e:
            raise ConfigError([f"(file): not valid JSON at line {e.lineno} column {e.colno}: {e.msg}"], str(path)) from e
    except RecursionError:
        raise ConfigError([f"(file): values nested too deeply to read (a config needs {_MAX_DEPTH} levels at most)"],
                          str(path)) from None
    except ValueError as e:  # Python's int() refuses numbers of more than sys.get_int_max_str_digits() digits
        if isinstance(e, ConfigError):  # a JSON key given twice (_json_object): name the file
            raise ConfigError(e.errors, str(path)) from None
        raise ConfigError([f"(file): not a usable {'YAML' if is_yaml else 'JSON'} value: {e}"], str(path)) from None


def inline_rubric(raw: Any, config_dir: str | Path) -> Any:
    """``raw`` (a loaded config) with ``judge.rubric`` read from ``judge.rubric_file`` when the config names a
    file and no rubric text (relative paths resolve against ``config_dir``, the config file's folder); the file's
    name stays in ``rubric_file``. An execution's input so always carries the rubric's text, never a path only
    the operator's machine has. Anything else is returned as it is.

    Raises:
        ConfigError: the file cannot be read as UTF-8 text.
    """
    judge = raw.get("judge") if isinstance(raw, dict) else None
    if not isinstance(judge, dict) or not isinstance(judge.get("rubric_file"), str) or not judge["rubric_file"]:
        return raw
    if isinstance(judge.get("rubric"), str) and judge["rubric"].strip():
        return raw
    path = Path(judge["rubric_file"])
    path = path if path.is_absolute() else Path(config_dir) / path
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as e:
        raise ConfigError([f"judge.rubric_file: cannot read {path}: {e.strerror or e}"]) from e
    except UnicodeDecodeError:
        raise ConfigError([f"judge.rubric_file: {path} is not UTF-8 text"]) from None
    return {**raw, "judge": {**judge, "rubric": text}}


def _json_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object, refusing a key given twice (json keeps the last one silently)."""
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ConfigError([f"{k}: is given twice in one JSON object (the first would be ignored)"])
        out[k] = v
    return out


#: Bounds on a loaded config's shape: its fields are scalars, short lists and one small mapping
#: (chat_template_kwargs); beyond these it is a YAML alias bomb or a mistake, refused before validation.
_MAX_VALUES = 10_000
_MAX_DEPTH = 32


def _shape_errors(raw: Any) -> list[str]:
    """``field: message`` for a value that refers to itself, is nested deeper than `_MAX_DEPTH`, or makes the
    config hold more than `_MAX_VALUES` values (counting each alias's expansion); [] when none."""
    count = 0
    stack: list[tuple[Any, str, int, tuple[int, ...]]] = [(v, str(k), 1, ()) for k, v in raw.items()]
    while stack:
        value, field, depth, parents = stack.pop()
        count += 1
        if count > _MAX_VALUES:
            return [f"(config): holds more than {_MAX_VALUES:,} values (YAML aliases expanding?); a run config is small"]
        if not isinstance(value, (dict, list, tuple, set, frozenset)):
            continue
        if id(value) in parents:
            return [f"{field}: refers to itself (a YAML alias inside its own anchor)"]
        if depth > _MAX_DEPTH:
            return [f"{field}: nested more than {_MAX_DEPTH} levels deep"]
        children = value.values() if isinstance(value, dict) else value
        stack.extend((c, field, depth + 1, (*parents, id(value))) for c in children)
    return []


def drop_unsupported(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``(raw without the reference fields that cannot apply serverless, one warning per dropped key)``.

    Each warning reads ``"FIELD: ignored, REASON (got VALUE)"`` (`DROPPED_FIELDS`). A config that sets
    DAPO's ``max_num_gen_batches`` but no ``algorithm`` (the reference selects DAPO by running
    ``train_dapo.py``) also gets a warning that it trains GRPO unless ``algorithm: dapo`` is set.
    """
    out = {k: v for k, v in raw.items() if k not in DROPPED_FIELDS}
    warnings = [f"{k}: ignored, {DROPPED_FIELDS[k]} (got {shown(v)})" for k, v in raw.items() if k in DROPPED_FIELDS]
    if "max_num_gen_batches" in raw and "algorithm" not in raw:
        warnings.append("max_num_gen_batches: applies to algorithm 'dapo' only, and algorithm defaults to 'grpo' "
                        "(the reference picks DAPO by running train_dapo.py); set algorithm: dapo to use it")
    return out, warnings


def load_run_config(obj_or_path: RunConfig | dict[str, Any] | str | Path, *,
                    warnings: list[str] | None = None) -> RunConfig:
    """Validate a run config from a dict, a `RunConfig`, or a JSON/YAML file path.

    Reference fields that cannot apply serverless are dropped (`drop_unsupported`); their
    warnings are appended to ``warnings`` when a list is given, else logged.

    Raises:
        ConfigError: listing every problem found (not just the first), each as
            ``"field: message (got X)"``.
    """
    if isinstance(obj_or_path, RunConfig):
        return obj_or_path
    source: str | None = None
    raw: Any = obj_or_path
    if isinstance(obj_or_path, (str, Path)):
        source = str(obj_or_path)
        raw = read_config_file(obj_or_path)
    if not isinstance(raw, dict):
        raise ConfigError([f"(config): must be a JSON object of fields (got {type(raw).__name__})"], source)
    shape = _shape_errors(raw)
    if shape:
        raise ConfigError(shape, source)
    raw, dropped = drop_unsupported(raw)
    if warnings is not None:
        warnings.extend(dropped)
    else:
        for w in dropped:
            log.warning("run config%s: %s", f" {source}" if source else "", w)
    try:
        return RunConfig.model_validate(raw)
    except ValidationError as e:
        raise ConfigError([_format_error(err) for err in e.errors(include_url=False)], source) from None
