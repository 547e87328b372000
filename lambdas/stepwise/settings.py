"""The Lambda environment, read in one place (docs/internals.md, "Environment variables every Lambda reads").

`Settings.from_env` reads every variable the handlers use; `current` returns the settings of
the process's environment now (one ``os.environ`` read per variable, then a cached `Settings`),
so the local engine and the tests, which run one handler after another under different
environments in one process, always get the settings of the environment they set. Defaults and
bounds are the ones the stack and the local stack document.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from dataclasses import dataclass

ENV_BUCKET = "STEPWISE_BUCKET"
ENV_GATEWAY_URL = "STEPWISE_GATEWAY_URL"
ENV_DATA_BUCKETS = "STEPWISE_DATA_BUCKETS"
ENV_AGENT_RUNTIME_ARNS = "STEPWISE_AGENT_RUNTIME_ARNS"
#: The Bedrock models (ids, inference profile ids or ARNs) the stack grants the group judge (CDK context
#: ``judgeModelIds``); '' = none: a run with a judge is refused before billing.
ENV_JUDGE_MODEL_IDS = "STEPWISE_JUDGE_MODEL_IDS"
ENV_POLL_SECONDS = "STEPWISE_POLL_SECONDS"
ENV_INLINE_WAIT_SECONDS = "STEPWISE_INLINE_WAIT_SECONDS"
ENV_SESSION_START_TIMEOUT = "STEPWISE_SESSION_START_TIMEOUT"
ENV_TURN_GRACE_SECONDS = "STEPWISE_TURN_GRACE_SECONDS"
ENV_SWEEP_GRACE_SECONDS = "STEPWISE_SWEEP_GRACE_SECONDS"
ENV_DEFAULT_S3_OUTPUT_PATH = "STEPWISE_DEFAULT_S3_OUTPUT_PATH"
ENV_NOTIFICATION_TOPIC_ARN = "STEPWISE_NOTIFICATION_TOPIC_ARN"
#: The Secrets Manager secret (ARN) holding the W&B API key (CDK context ``wandbApiKeySecretArn``; Track only).
ENV_WANDB_API_KEY_SECRET = "STEPWISE_WANDB_API_KEY_SECRET_ARN"
#: The Secrets Manager secret of a Hugging Face token for gated tokenizers (CDK context huggingFaceTokenSecretArn;
#: Init reads it, `stepwise.aws.hub.token_sources`).
ENV_HF_TOKEN_SECRET = "STEPWISE_HF_TOKEN_SECRET_ARN"
#: Set by the stack when the gateway has a reserved concurrency (``-c gatewayReservedConcurrency=N``): the LLM
#: calls that can run at once, so the rollouts a run may keep in flight (`stepwise.core.preflight`).
ENV_GATEWAY_CONCURRENCY = "STEPWISE_GATEWAY_CONCURRENCY"
ENV_REGION = "AWS_REGION"
ENV_SERVICE = "POWERTOOLS_SERVICE_NAME"
ENV_METRICS_NAMESPACE = "POWERTOOLS_METRICS_NAMESPACE"

#: Endpoint overrides (set only by the local stack): a client is made per endpoint, so a handler run
#: after another under a new moto server never talks to the old one.
ENDPOINT_VARIABLES = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL_SFN",
                      "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE", "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL",
                      "AWS_ENDPOINT_URL_BEDROCK_RUNTIME", "AWS_ENDPOINT_URL_BEDROCK")

_NAMES = (ENV_BUCKET, ENV_GATEWAY_URL, ENV_DATA_BUCKETS, ENV_AGENT_RUNTIME_ARNS, ENV_JUDGE_MODEL_IDS, ENV_POLL_SECONDS,
          ENV_INLINE_WAIT_SECONDS, ENV_SESSION_START_TIMEOUT, ENV_TURN_GRACE_SECONDS, ENV_SWEEP_GRACE_SECONDS,
          ENV_DEFAULT_S3_OUTPUT_PATH, ENV_NOTIFICATION_TOPIC_ARN, ENV_WANDB_API_KEY_SECRET, ENV_HF_TOKEN_SECRET, ENV_REGION,
          "AWS_DEFAULT_REGION", ENV_GATEWAY_CONCURRENCY, *ENDPOINT_VARIABLES)


def _split(value: str) -> tuple[str, ...]:
    return tuple(v.strip() for v in value.split(",") if v.strip())


@dataclass(frozen=True)
class Settings:
    """What a handler function's environment says.

    Attributes:
        bucket: the run bucket (``STEPWISE_BUCKET``; '' = unset, `require_bucket` raises).
        gateway_url: the agents' LLM base URL (``STEPWISE_GATEWAY_URL``).
        data_buckets: more buckets the functions may read and write (``STEPWISE_DATA_BUCKETS``).
        agent_runtime_arns: the ACR runtimes StartRollout may invoke (``STEPWISE_AGENT_RUNTIME_ARNS``;
            empty = any runtime of the stack's region).
        judge_model_ids: the Bedrock models the group judge is granted (``STEPWISE_JUDGE_MODEL_IDS``;
            empty = none).
        poll_seconds: Wait-state seconds between polls (``STEPWISE_POLL_SECONDS``, integer >= 1, default 10).
        inline_wait_seconds: how long a submit/poll handler polls before handing the wait to a Wait
            state (``STEPWISE_INLINE_WAIT_SECONDS``, >= 0, default 30; at most the invocation's time
            left less 15 s). The session is idle from an operation's end until someone polls it: a
            handler polling inline sees the end at once (every 0.25 s), a Wait state of
            ``poll_seconds`` does not. With 5 s here and 10 s of Wait, a training operation's end was
            seen on average a third of a poll late, and an 8 s operation 10 s late every time
            (benchmarks/README.md, section 21); a Lambda second costs about 1/200 of a session second.
        session_start_timeout: seconds the session may take to reach Running
            (``STEPWISE_SESSION_START_TIMEOUT``, default 1800).
        turn_grace_seconds: FinishRollout's wait between closing a session and listing its turns
            (``STEPWISE_TURN_GRACE_SECONDS``, >= 0, default 1).
        sweep_grace_seconds: how old a run's last change must be before the session sweeper stops its
            session (``STEPWISE_SWEEP_GRACE_SECONDS``, >= 0, default 300: `stepwise.core.sweeping`).
        default_s3_output_path: the sessions' default output path (``STEPWISE_DEFAULT_S3_OUTPUT_PATH``).
        notification_topic_arn: the SNS topic the session sweeper and budget warnings report to
            (``STEPWISE_NOTIFICATION_TOPIC_ARN``, the stack's ``notificationTopicArn``; '' = none).
        wandb_api_key_secret: the Secrets Manager secret ARN of the W&B API key
            (``STEPWISE_WANDB_API_KEY_SECRET_ARN``; '' = none: W&B logs only where ``WANDB_API_KEY`` or
            ``WANDB_MODE=offline`` is set, e.g. the local stack).
        region: ``AWS_REGION`` (else ``AWS_DEFAULT_REGION``).
        endpoints: the ``AWS_ENDPOINT_URL*`` overrides, as ``((name, url), ...)``.
    """

    bucket: str = ""
    gateway_url: str = ""
    data_buckets: tuple[str, ...] = ()
    agent_runtime_arns: tuple[str, ...] = ()
    judge_model_ids: tuple[str, ...] = ()
    poll_seconds: int = 10
    inline_wait_seconds: float = 30.0
    session_start_timeout: float = 1800.0
    turn_grace_seconds: float = 1.0
    sweep_grace_seconds: float = 300.0
    default_s3_output_path: str = ""
    notification_topic_arn: str = ""
    wandb_api_key_secret: str = ""
    region: str = ""
    gateway_concurrency: int | None = None
    endpoints: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Settings":
        """The settings ``env`` holds. Raises ValueError naming a variable that is not a number."""
        def number(name: str, default: str, kind: type) -> float:
            raw = env.get(name) or default
            try:
                return kind(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None

        return cls(
            bucket=env.get(ENV_BUCKET, ""),
            gateway_url=env.get(ENV_GATEWAY_URL, ""),
            data_buckets=_split(env.get(ENV_DATA_BUCKETS, "")),
            agent_runtime_arns=_split(env.get(ENV_AGENT_RUNTIME_ARNS, "")),
            judge_model_ids=_split(env.get(ENV_JUDGE_MODEL_IDS, "")),
            poll_seconds=max(1, int(number(ENV_POLL_SECONDS, "10", int))),
            inline_wait_seconds=max(0.0, number(ENV_INLINE_WAIT_SECONDS, "30", float)),
            session_start_timeout=number(ENV_SESSION_START_TIMEOUT, "1800", float),
            turn_grace_seconds=max(0.0, number(ENV_TURN_GRACE_SECONDS, "1", float)),
            sweep_grace_seconds=max(0.0, number(ENV_SWEEP_GRACE_SECONDS, "300", float)),
            default_s3_output_path=env.get(ENV_DEFAULT_S3_OUTPUT_PATH, ""),
            notification_topic_arn=env.get(ENV_NOTIFICATION_TOPIC_ARN, ""),
            wandb_api_key_secret=env.get(ENV_WANDB_API_KEY_SECRET, ""),
            region=env.get(ENV_REGION, "") or env.get("AWS_DEFAULT_REGION", ""),
            gateway_concurrency=int(number(ENV_GATEWAY_CONCURRENCY, "0", int)) or None,
            endpoints=tuple((n, env[n]) for n in ENDPOINT_VARIABLES if env.get(n)),
        )

    def endpoint(self, name: str) -> str:
        """The ``AWS_ENDPOINT_URL_{name}`` override ('' = none)."""
        return dict(self.endpoints).get(f"AWS_ENDPOINT_URL_{name}", "")

    def require_bucket(self) -> str:
        """The run bucket. Raises KeyError naming the variable when unset."""
        if not self.bucket:
            raise KeyError(f"{ENV_BUCKET} is not set: the Lambda environment must name the run bucket")
        return self.bucket


def current() -> Settings:
    """The settings of this process's environment now (cached per distinct environment)."""
    return _settings(tuple(os.environ.get(name, "") for name in _NAMES))


@functools.lru_cache(maxsize=16)
def _settings(values: tuple[str, ...]) -> Settings:
    return Settings.from_env({k: v for k, v in zip(_NAMES, values) if v})
