"""Refuse before billing: what a run needs from its stack, checked before CreateTrainingSession.

Init (and ``stepwise validate --check-aws``) call `refusals` after the config itself validated.
It returns every problem at once, each as ``"field: message (got X)"`` naming the limit (the
config's style), in two passes:

1. pure checks of the config against the stack's scope (`StackScope`, from the environment the
   stack gives its functions, docs/internals.md): the run's ``region`` is the stack's; the agent
   runtime is one StartRollout is granted to invoke (the allow-list ``STEPWISE_AGENT_RUNTIME_ARNS``,
   or any runtime of the stack's region and account when it is empty); every S3 location the run
   reads or writes (datasets, ``tokenizer_path``, ``s3_output_path``) is in the stack's bucket or
   one of ``STEPWISE_DATA_BUCKETS`` (CDK context ``dataBuckets``);
2. lookups through the boundary modules, only for what passed 1: the runtime exists and is READY
   (`stepwise.aws.agentcore`), the buckets are reachable and the tokenizer prefix holds files
   (`stepwise.aws.s3_probe`), the base model is one the hub offers in the run's region and, when the hub
   marks it gated, the config accepts its license (``accept_eula``; `stepwise.aws.hub`), and its tokenizer can be
   loaded: a gated Hugging Face repository needs a token that has access (`TokenizerSource`); the model
   package the run resumes from or evaluates (``resume_from_model_package``, ``eval_model_package_arn``)
   exists and is ready (`stepwise.aws.sagemaker.model_package_problem`: one retention deleted is refused
   here, not in load_state after a session billed); the group judge's model is one the stack grants
   (``STEPWISE_JUDGE_MODEL_IDS``, CDK context ``judgeModelIds``) that Bedrock offers on demand in the run's
   region (`stepwise.aws.bedrock.model_problem`). Whether a dataset exists and parses is
   `stepwise.datasets.check_dataset`'s
   (Init runs it right after).

Nothing here creates, writes or bills anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from stepwise.config import ConfigError, RunConfig, parse_s3_uri
from stepwise.settings import (ENV_AGENT_RUNTIME_ARNS, ENV_BUCKET, ENV_DATA_BUCKETS, ENV_GATEWAY_CONCURRENCY,
                               ENV_JUDGE_MODEL_IDS, ENV_REGION)
from stepwise.stackinfo import region_of_arn as arn_region

CONTEXT_DATA_BUCKETS = "dataBuckets"
CONTEXT_AGENT_RUNTIME_ARNS = "agentRuntimeArns"
CONTEXT_JUDGE_MODEL_IDS = "judgeModelIds"


class RunRefused(ConfigError):
    """The run cannot work on this stack; ``errors`` lists each reason (``"field: message (got X)"``)."""

    def __init__(self, errors: list[str], source: str | None = None):
        super().__init__(errors, source)
        head = f"run refused before any training session{f' ({source})' if source else ''} ({len(self.errors)} problem(s)):"
        self.args = ("\n".join([head, *(f"  - {e}" for e in self.errors)]),)


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class StackScope:
    """What the stack grants its functions.

    Attributes:
        region: the stack's region (``AWS_REGION``).
        bucket: the run bucket (``STEPWISE_BUCKET``).
        data_buckets: other buckets the functions may read and write (``STEPWISE_DATA_BUCKETS``).
        agent_runtime_arns: the runtimes StartRollout may invoke (``STEPWISE_AGENT_RUNTIME_ARNS``);
            empty = any runtime of ``region`` (and ``account``, when known).
        account: the stack's account id ('' = not checked), e.g. from the execution ARN.
        judge_model_ids: the Bedrock models the group judge is granted (``STEPWISE_JUDGE_MODEL_IDS``); empty = none.
    """

    region: str
    bucket: str
    data_buckets: tuple[str, ...] = ()
    agent_runtime_arns: tuple[str, ...] = ()
    account: str = ""
    judge_model_ids: tuple[str, ...] = ()
    #: the gateway's reserved concurrency, when the stack sets one (``STEPWISE_GATEWAY_CONCURRENCY``; None = unknown)
    gateway_concurrency: int | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str], *, account: str = "") -> "StackScope":
        """The scope a function's environment ``env`` names (`stepwise.settings` names the variables)."""
        concurrency = env.get(ENV_GATEWAY_CONCURRENCY, "")
        return cls(region=env.get(ENV_REGION, "") or env.get("AWS_DEFAULT_REGION", ""), bucket=env.get(ENV_BUCKET, ""),
                   data_buckets=_split(env.get(ENV_DATA_BUCKETS, "")),
                   agent_runtime_arns=_split(env.get(ENV_AGENT_RUNTIME_ARNS, "")), account=account,
                   judge_model_ids=_split(env.get(ENV_JUDGE_MODEL_IDS, "")),
                   gateway_concurrency=int(concurrency) if concurrency.isdigit() and int(concurrency) > 0 else None)

    @property
    def buckets(self) -> tuple[str, ...]:
        """Every bucket the functions are granted: the run bucket first."""
        return tuple(dict.fromkeys(b for b in (self.bucket, *self.data_buckets) if b))

    def may_invoke(self, runtime_arn: str) -> bool:
        """Whether StartRollout's grant covers ``runtime_arn`` (IAM as the stack writes it)."""
        if self.agent_runtime_arns:
            return runtime_arn in self.agent_runtime_arns
        parts = runtime_arn.split(":")
        if len(parts) < 6:
            return False
        return parts[3] == self.region and (not self.account or parts[4] == self.account)


def arn_account(arn: str) -> str:
    """The account field of an ARN ('' if it has none)."""
    parts = arn.split(":")
    return parts[4] if len(parts) > 4 and parts[0] == "arn" else ""


@dataclass(frozen=True)
class HubModel:
    """What the SageMaker Public Hub says of a base model (`stepwise.aws.hub`).

    Attributes:
        name: the hub content name (``openai-reasoning-gpt-oss-20b``).
        arn: its hub-content ARN (versioned).
        model_id: the id training sessions list it under (``openai/gpt-oss-20b``).
        version: the hub content version.
        display_name: the hub's display name.
        gated: the hub document's ``GatedBucket``: its license must be accepted (``accept_eula``).
        hf_model_id: the published tokenizer id (``HuggingfaceId``; '' when none).
    """

    name: str
    arn: str
    model_id: str
    version: str = ""
    display_name: str = ""
    gated: bool = False
    hf_model_id: str = ""


@dataclass(frozen=True)
class TokenizerSource:
    """Where the run's tokenizer will come from (`stepwise.aws.hub.tokenizer_source`), in the order Init tries:
    the config's ``tokenizer_path``; else the hub's published id for the base model, downloaded from the Hugging
    Face Hub, anonymously or, for a gated repository, with a token from ``HF_TOKEN`` and then the stack's secret
    (``STEPWISE_HF_TOKEN_SECRET_ARN``, CDK context ``huggingFaceTokenSecretArn``).

    Attributes:
        kind: ``tokenizer_path (s3)``, ``tokenizer_path``, ``local directory`` or ``Hugging Face``.
        where: the S3 prefix, folder or repository id.
        gated: the Hugging Face repository is gated (its files need an authorized token).
        token_from: where the token comes from ('' = none).
        problem: why it cannot be loaded ('' = it can, or it could not be checked: see ``note``).
        note: what was (or could not be) checked, in words.
    """

    kind: str
    where: str
    gated: bool = False
    token_from: str = ""
    problem: str = ""
    note: str = ""

    def describe(self) -> str:
        """One line for ``stepwise validate``."""
        out = f"{self.kind} {self.where}"
        if self.gated:
            out += f" (gated; token from {self.token_from})" if self.token_from else " (gated; no token)"
        return out + (f"; {self.note}" if self.note else "")


def license_errors(cfg: RunConfig, model: HubModel) -> list[str]:
    """A gated base model needs ``accept_eula``: CreateTrainingSession's ``ModelConfig.AcceptEula`` (botocore's
    ``sagemaker`` model: "for gated models"), refused here before any session rather than by the service."""
    if model.gated and not cfg.accept_eula:
        return [f"accept_eula: the base model {model.model_id or model.name!r} is gated (the SageMaker Public Hub marks "
                f"it GatedBucket): read its license (end-user license agreement) and set accept_eula: true to accept "
                f"it; CreateTrainingSession sends it as ModelConfig.AcceptEula (got false)"]
    return []


@dataclass(frozen=True)
class S3Location:
    """One S3 location the run uses. ``kind``: ``dataset`` (read by `stepwise.datasets`), ``prefix``
    (must hold files directly under it) or ``output`` (written later: only its bucket must be reachable)."""

    field: str
    uri: str
    kind: str

    @property
    def bucket(self) -> str:
        return parse_s3_uri(self.uri)[0]

    @property
    def key(self) -> str:
        return parse_s3_uri(self.uri)[1]


def s3_locations(cfg: RunConfig) -> list[S3Location]:
    """Every ``s3://`` location in ``cfg`` the run reads or writes (local paths are not S3's)."""
    out = []
    for name, kind in (("dataset_path", "dataset"), ("eval_dataset_path", "dataset"), ("tokenizer_path", "prefix"),
                       ("s3_output_path", "output")):
        uri = getattr(cfg, name)
        if uri.startswith("s3://"):
            out.append(S3Location(name, uri, kind))
    for set_name, uri in getattr(cfg, "eval_datasets", {}).items():
        if uri.startswith("s3://"):
            out.append(S3Location(f"eval_datasets.{set_name}", uri, "dataset"))
    return out


# ------------------------------------------------------------------------------ pure checks


def region_errors(cfg: RunConfig, scope: StackScope) -> list[str]:
    """The run's region must be the stack's: every grant and the gateway's sampler are scoped to it."""
    if not cfg.region and not scope.region:
        return [f"region: '' means the stack's region, but {ENV_REGION} is not set; set 'region' (got '')"]
    if cfg.region and scope.region and cfg.region != scope.region:
        return [f"region: the run's region {cfg.region!r} is not the stack's region {scope.region!r}; every grant "
                f"(training session, S3, ACR) is scoped to {scope.region}: remove 'region' (it defaults to the "
                f"stack's) or deploy a stack in {cfg.region} (got {cfg.region!r})"]
    return []


def runtime_scope_errors(cfg: RunConfig, scope: StackScope) -> list[str]:
    """The agent runtime must be one StartRollout may invoke."""
    arn = cfg.agent_runtime_arn
    if scope.may_invoke(arn):
        return []
    if scope.agent_runtime_arns:
        why = (f"it is not in the stack's allow-list {ENV_AGENT_RUNTIME_ARNS} ({', '.join(scope.agent_runtime_arns)}); "
               f"add it to the CDK context value '{CONTEXT_AGENT_RUNTIME_ARNS}' and redeploy")
    elif arn_region(arn) != scope.region:
        why = (f"it is in {arn_region(arn)}, outside the stack's region {scope.region}, and the stack allows no other "
               f"runtimes; add it to the CDK context value '{CONTEXT_AGENT_RUNTIME_ARNS}' and redeploy")
    else:
        why = (f"it is in account {arn_account(arn)}, not the stack's account {scope.account}; add it to the CDK "
               f"context value '{CONTEXT_AGENT_RUNTIME_ARNS}' and redeploy")
    return [f"agent_runtime_arn: StartRollout is not granted InvokeAgentRuntime on this runtime: {why} (got {arn!r})"]


def bucket_scope_errors(locations: list[S3Location], scope: StackScope) -> list[str]:
    """Every location must be in a bucket the stack grants its functions."""
    granted = scope.buckets
    errors = []
    for loc in locations:
        if loc.bucket not in granted:
            errors.append(
                f"{loc.field}: bucket {loc.bucket!r} is outside the stack's grants (the run bucket {scope.bucket!r} "
                f"and {ENV_DATA_BUCKETS}: {', '.join(scope.data_buckets) or 'none'}); add it to the CDK context value "
                f"'{CONTEXT_DATA_BUCKETS}' and redeploy, or copy the data into s3://{scope.bucket}/ (got {loc.uri!r})")
    return errors


def _model_key(model_id: str, region: str, account: str) -> tuple[str, str]:
    """``(kind, id)`` a Bedrock model id or ARN stands for in ``region`` (``model`` or ``profile``; another
    region's or account's ARN keeps its whole text, so it matches only itself)."""
    from stepwise.core.prices import BEDROCK_PROFILE_PREFIXES

    if model_id.startswith("arn:"):
        parts = model_id.split(":", 5)
        kind, _, name = parts[5].partition("/") if len(parts) == 6 else ("", "", "")
        if parts[3:4] != [region] or (parts[4] and account and parts[4] != account):
            return "arn", model_id
        return {"foundation-model": "model", "inference-profile": "profile"}.get(kind, kind), name
    return ("profile" if model_id.startswith(BEDROCK_PROFILE_PREFIXES) else "model"), model_id


def judge_scope_errors(cfg: RunConfig, scope: StackScope) -> list[str]:
    """The judge's model must be one the stack grants the judge (its id, or its ARN in the stack's region)."""
    judge = getattr(cfg, "judge", None)
    if judge is None:
        return []
    region = cfg.region or scope.region
    want = _model_key(judge.model_id, region, scope.account)
    if any(_model_key(m, region, scope.account) == want for m in scope.judge_model_ids):
        return []
    granted = (f"it grants {', '.join(scope.judge_model_ids)}" if scope.judge_model_ids
               else "it grants no Bedrock model (the context value is empty)")
    return [f"judge.model_id: the stack does not grant the judge bedrock:InvokeModel on this model: {granted}; add it "
            f"to the CDK context value '{CONTEXT_JUDGE_MODEL_IDS}' and redeploy (got {judge.model_id!r})"]


# ------------------------------------------------------------------------------ orchestration


@dataclass
class Probes:
    """The lookups `refusals` makes; each returns '' when fine, else the problem (no field, no value).

    The real ones are `stepwise.aws.s3_probe.probes` (S3 and the AgentCore control plane).
    """

    bucket: Callable[[Any, str], str]
    prefix: Callable[[Any, str, str], str]
    runtime: Callable[[str], str]
    s3: Any = None
    calls: list[str] = field(default_factory=list)
    #: (region, base_model_arn) -> the hub's `HubModel`, or the problem in words; None = not looked up.
    base_model: Callable[[str, str], HubModel | str] | None = None
    #: (config, the base model's `HubModel`) -> where the tokenizer comes from; None = not looked up.
    tokenizer: Callable[[RunConfig, HubModel], TokenizerSource] | None = None
    #: what `refusals` found the tokenizer's source to be (for ``stepwise validate``'s summary).
    found: dict[str, Any] = field(default_factory=dict)
    #: (region, model package ARN) -> '' when it exists and is ready, else the problem; None = not looked up.
    model_package: Callable[[str, str], str] | None = None
    #: (region, judge model id) -> '' or what stops the judge from calling it; None = not looked up.
    judge_model: Callable[[str, str], str] | None = None


def concurrency_errors(cfg: RunConfig, scope: StackScope) -> list[str]:
    """The group engine (``admission: group``) keeps up to ``max_rollouts_in_flight`` rollouts running, each
    calling its LLM through the gateway: more than the gateway's reserved concurrency (when the stack sets
    one) would be throttled (``TooManyRequestsException``) instead of sampled."""
    limit = scope.gateway_concurrency
    if cfg.admission != "group" or not limit or cfg.rollouts_in_flight_cap <= limit:
        return []
    field = "max_rollouts_in_flight" if cfg.max_rollouts_in_flight is not None else "max_rollouts_in_flight (its default)"
    return [f"{field}: {cfg.rollouts_in_flight_cap} rollouts in flight, but the gateway's reserved concurrency is "
            f"{limit} (-c gatewayReservedConcurrency): their LLM calls would be throttled; set max_rollouts_in_flight "
            f"<= {limit} or raise the reservation"]


def refusals(cfg: RunConfig, scope: StackScope, probes: Probes) -> list[str]:
    """Every reason this run cannot work on this stack (empty = go ahead); see the module doc."""
    locations = s3_locations(cfg)
    runtime_errors = runtime_scope_errors(cfg, scope)
    judge_errors = judge_scope_errors(cfg, scope)
    errors = (region_errors(cfg, scope) + runtime_errors + bucket_scope_errors(locations, scope) + judge_errors
              + concurrency_errors(cfg, scope))
    if not runtime_errors:
        problem = probes.runtime(cfg.agent_runtime_arn)
        if problem:
            errors.append(f"agent_runtime_arn: {problem} (got {cfg.agent_runtime_arn!r})")
    if probes.base_model is not None and not region_errors(cfg, scope):
        found = probes.base_model(cfg.region or scope.region, cfg.base_model_arn)
        if isinstance(found, str):
            errors.append(f"base_model_arn: {found} (got {cfg.base_model_arn!r})")
        else:
            errors.extend(license_errors(cfg, found))
            if probes.tokenizer is not None and not cfg.tokenizer_path.startswith("s3://"):
                source = probes.tokenizer(cfg, found)
                probes.found["tokenizer"] = source
                if source.problem:
                    errors.append(f"tokenizer_path: {source.problem} (got {cfg.tokenizer_path!r})")
    if probes.model_package is not None and not region_errors(cfg, scope):
        for name in ("resume_from_model_package", "eval_model_package_arn"):
            arn = getattr(cfg, name, "") or ""
            if arn:
                problem = probes.model_package(cfg.region or scope.region, arn)
                if problem:
                    errors.append(f"{name}: {problem} (got {arn!r})")
    judge = getattr(cfg, "judge", None)
    if judge is not None and not judge_errors and probes.judge_model is not None and not region_errors(cfg, scope):
        problem = probes.judge_model(cfg.region or scope.region, judge.model_id)
        if problem:
            errors.append(f"judge.model_id: {problem} (got {judge.model_id!r})")
    granted = set(scope.buckets)
    bucket_problems: dict[str, str] = {}
    for loc in locations:
        if loc.bucket not in granted:
            continue
        if loc.bucket not in bucket_problems:
            bucket_problems[loc.bucket] = probes.bucket(probes.s3, loc.bucket)
        problem = bucket_problems[loc.bucket]
        if not problem and loc.kind == "prefix":
            problem = probes.prefix(probes.s3, loc.bucket, loc.key)
        if problem:
            errors.append(f"{loc.field}: {problem} (got {loc.uri!r})")
    return errors


def resolve_region(cfg: RunConfig, scope: StackScope) -> RunConfig:
    """``cfg`` with ``region`` = the stack's when the config leaves it '' (what Init stores)."""
    if cfg.region or not scope.region:
        return cfg
    return cfg.model_copy(update={"region": scope.region})


def refuse_before_billing(cfg: RunConfig, scope: StackScope, probes: Probes) -> RunConfig:
    """`refusals`, raised as one `RunRefused`; returns ``cfg`` with its region resolved.

    Raises:
        RunRefused: listing every problem found.
    """
    errors = refusals(cfg, scope, probes)
    if errors:
        raise RunRefused(errors)
    return resolve_region(cfg, scope)
