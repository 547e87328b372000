"""Deploy-time settings of the stack, read from CDK context (``cdk.json`` or ``-c key=value``).

Kept free of CDK imports so it can be tested and documented on its own. Every setting is
optional: ``cdk synth`` works with none, and the stack falls back to the broadest grant
that still names this account and region (each such fallback carries a cdk-nag
suppression that says to set the value).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# ASCII (re.A: '\d' matches any Unicode digit) and '\Z' ('$' also matches before a final newline).
RUNTIME_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:bedrock-agentcore:[a-z0-9\-]+:\d{12}:runtime/[A-Za-z0-9_\-]+\Z", re.A)
ROLE_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:iam::\d{12}:role/[A-Za-z0-9_+=,.@\-/]+\Z", re.A)
TOPIC_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:sns:[a-z0-9\-]+:\d{12}:[A-Za-z0-9_\-]+\Z", re.A)
#: A key ARN (not an alias: IAM authorizes KMS requests against the key, CreateTrainingSession takes a key ARN).
KMS_KEY_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:kms:[a-z0-9\-]+:\d{12}:key/(mrk-)?[a-f0-9\-]+\Z", re.A)
#: SageMaker managed MLflow: a tracking server (the resource type ``sagemaker-mlflow:*`` actions name) or an
#: MLflow app (``sagemaker:CallMlflowAppApi`` on ``mlflow-app/ID``).
MLFLOW_SERVER_ARN_RE = re.compile(
    r"^arn:aws[a-z\-]*:sagemaker:[a-z0-9\-]+:\d{12}:(?:mlflow-tracking-server|mlflow-app)/[A-Za-z0-9\-]+\Z", re.A)
#: A Secrets Manager secret's full ARN (name plus the 6-character suffix Secrets Manager appends).
SECRET_ARN_RE = re.compile(r"^arn:aws[a-z\-]*:secretsmanager:[a-z0-9\-]+:\d{12}:secret:[A-Za-z0-9/_+=.@\-]+-[A-Za-z0-9]{6}\Z", re.A)
#: A Bedrock model the group judge may call (`stepwise.config.JudgeConfig.model_id`'s forms).
JUDGE_MODEL_RE = re.compile(
    r"^[a-z0-9-]{1,63}(?:\.[a-z0-9-]{1,63}){1,3}(?::[a-z0-9-]{1,63}){0,2}\Z"
    r"|^arn:aws[a-z\-]*:bedrock:[a-z0-9\-]+:(?:\d{12})?:(?:foundation-model|inference-profile|application-inference-profile)/"
    r"[a-zA-Z0-9.:\-]{1,300}\Z", re.A)
#: S3 bucket naming rules (general purpose buckets): 3-63 of lowercase letters, digits, dots, hyphens.
BUCKET_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]\Z", re.A)
#: Lambda's reserved concurrency cannot exceed the account's concurrency quota (1,000 by default).
MAX_RESERVED_CONCURRENCY = 100_000
#: ``sessionStartTimeoutSeconds``: a minute to a day (sessions usually start in minutes; capacity may take longer).
SESSION_START_TIMEOUT_RANGE = (60, 86_400)
#: ``pollSeconds``: 1 s to an hour between polls (each poll is a Wait state plus a Lambda invocation).
POLL_SECONDS_RANGE = (1, 3600)


class SettingsError(ValueError):
    """A context value is malformed; the message names the key, the value and what is accepted."""


@dataclass(frozen=True)
class StackSettings:
    """What a deployment may configure.

    Attributes:
        agent_runtime_arns: ACR runtime ARNs StartRollout may invoke (context
            ``agentRuntimeArns``: comma-separated or a JSON list). Empty = every runtime of
            this account and region.
        sagemaker_role_arns: IAM roles Init may pass to SageMaker as the training session's
            role (context ``sagemakerRoleArns``). Empty = any role of this account, still
            only to ``sagemaker.amazonaws.com``. Listed roles also get read/write on the
            bucket's ``sagemaker-output/`` prefix (the default session output path).
        agent_role_arns: execution roles of the ACR agents (context ``agentRoleArns``); the
            bucket policy lets them write their results under ``rollout-results/``.
            Empty = the agent roles need that permission in their own policy.
        notification_topic_arn: SNS topic told when a run succeeds, fails, times out or is
            stopped, and when an alarm fires (context ``notificationTopicArn``). '' = none.
        bulk_retention_days: days before bulky per-step objects (tagged
            ``stepwise-class=bulk``) and agent result objects expire (``bulkRetentionDays``).
        stall_minutes: the stalled-run alarm fires when pipeline Lambdas ran but no training
            step completed for this long (``stallMinutes``).
        rollout_failure_rate: the rollout-failure alarm's threshold, a fraction in (0, 1]
            (``rolloutFailureRateAlarm``).
        log_retention_days: CloudWatch Logs retention of every log group (``logRetentionDays``).
        destroy_on_delete: delete the bucket and its objects with the stack
            (``destroyOnDelete``; default false: the bucket is retained).
        data_buckets: S3 buckets besides the stack's own that runs read datasets and tokenizers
            from and write ``s3_output_path`` to (context ``dataBuckets``: bucket names,
            comma-separated or a JSON list). The functions get read/write on them and
            ``STEPWISE_DATA_BUCKETS``. Empty = only the stack's bucket.
        kms_key_arn: the customer managed KMS key runs name as ``kms_key_arn`` (context
            ``kmsKeyArn``); Init gets the KMS permissions CreateTrainingSession needs on it,
            only through SageMaker (``kms:ViaService``). '' = runs use no customer managed key.
        mlflow_tracking_server_arns: SageMaker managed MLflow tracking servers and MLflow apps runs
            log to (context ``mlflowTrackingServerArns``); the functions that log get the
            ``sagemaker-mlflow`` actions MLflow's client calls on a tracking server, and
            ``sagemaker:CallMlflowAppApi`` on an app. Empty = no grant (tracking to a managed
            server or app then fails, visibly, in each step summary).
        sweep_minutes: minutes between two runs of the session sweeper (context ``sweepMinutes``,
            1-60, default 5): it stops training sessions of this stack whose executions ended without
            stopping them (EventBridge's execution events, which run Cleanup, are best-effort).
        wandb_api_key_secret_arn: the Secrets Manager secret holding the W&B API key (context
            ``wandbApiKeySecretArn``, the secret's full ARN; its value the key, or JSON with one
            string field). The Track function gets ``secretsmanager:GetSecretValue`` on it and
            ``STEPWISE_WANDB_API_KEY_SECRET_ARN``. '' = none (runs naming ``wandb_project`` then get
            a W&B warning in each step's report table, never a failed step).
        gateway_reserved_concurrency: reserved concurrency of the gateway function (context
            ``gatewayReservedConcurrency``), so rollouts cannot starve the account's other
            functions (and the handlers cannot starve the gateway). None = unreserved.
        session_start_timeout_seconds: seconds a training session may take to reach Running before
            the run fails with ``SessionStartTimeout`` (context ``sessionStartTimeoutSeconds``, 60..86400;
            the functions' ``STEPWISE_SESSION_START_TIMEOUT``). None = the functions' default, 1800.
        poll_seconds: Wait-state seconds between polls of the session and its operations (context
            ``pollSeconds``, 1..3600; ``STEPWISE_POLL_SECONDS``). None = the functions' default, 10.
        create_sagemaker_role: create the training sessions' execution role (context
            ``createSageMakerRole``; ``infra.session_role``); its ARN is the ``SageMakerRoleArn`` output
            and the only role Init may pass besides ``sagemakerRoleArns``. Off by default.
        deploy_math_agent: build the example math agent's image for linux/arm64 and create its
            training runtime, role and grants (context ``deployMathAgent``; ``infra.agent_runtime``);
            its ARN is the ``MathAgentRuntimeArn`` output. Off by default.
        hugging_face_token_secret_arn: the Secrets Manager secret (full ARN) holding a Hugging Face token for a gated
            tokenizer (context ``huggingFaceTokenSecretArn``): Init gets ``secretsmanager:GetSecretValue`` on it and
            ``STEPWISE_HF_TOKEN_SECRET_ARN``, tried after ``HF_TOKEN`` (`stepwise.aws.hub`). '' = none.
        agent_dir: a user's agent folder to build for linux/arm64 and deploy as a training runtime, with its
            role and grants (context ``agentDir``; `infra.agent_folder`, ``infra.agent_runtime``); its ARN is the
            ``AgentRuntimeArn`` output. '' = none.
        agent_entrypoint: the folder's ``MODULE:ATTR`` (context ``agentEntrypoint``, default ``agent:app``).
        agent_requirements: the folder's requirements file (context ``agentRequirements``, default
            ``requirements.txt``).
        judge_model_ids: the Bedrock models a run's group judge may call (context ``judgeModelIds``: model ids,
            cross-Region inference profile ids or ARNs, comma-separated or a JSON list; ``infra.judge``). The
            JudgeGroups function gets ``bedrock:InvokeModel`` on exactly these, Init the lookups, every function
            ``STEPWISE_JUDGE_MODEL_IDS``. Empty = no Bedrock grant (a run with a judge is refused before billing).
    """

    agent_runtime_arns: tuple[str, ...] = ()
    sagemaker_role_arns: tuple[str, ...] = ()
    agent_role_arns: tuple[str, ...] = ()
    notification_topic_arn: str = ""
    bulk_retention_days: int = 30
    stall_minutes: int = 60
    rollout_failure_rate: float = 0.5
    log_retention_days: int = 30
    destroy_on_delete: bool = False
    data_buckets: tuple[str, ...] = ()
    kms_key_arn: str = ""
    mlflow_tracking_server_arns: tuple[str, ...] = ()
    sweep_minutes: int = 5
    wandb_api_key_secret_arn: str = ""
    gateway_reserved_concurrency: int | None = None
    # --- what a first run needs (off by default: each adds resources to the account) and the loop's timing ---
    session_start_timeout_seconds: int | None = None
    poll_seconds: int | None = None
    create_sagemaker_role: bool = False
    deploy_math_agent: bool = False
    hugging_face_token_secret_arn: str = ""
    agent_dir: str = ""
    agent_entrypoint: str = ""
    agent_requirements: str = ""
    judge_model_ids: tuple[str, ...] = ()

    @classmethod
    def from_context(cls, get: Callable[[str], Any]) -> "StackSettings":
        """Read settings with ``get(key)`` (``node.try_get_context``); missing keys keep defaults.

        Raises:
            SettingsError: a value has the wrong shape (named, with what is accepted).
        """
        d = cls()
        return cls(
            agent_runtime_arns=_arns(get("agentRuntimeArns"), "agentRuntimeArns", RUNTIME_ARN_RE,
                                     "arn:aws:bedrock-agentcore:REGION:ACCOUNT:runtime/AGENT_ID"),
            sagemaker_role_arns=_arns(get("sagemakerRoleArns"), "sagemakerRoleArns", ROLE_ARN_RE,
                                      "arn:aws:iam::ACCOUNT:role/NAME"),
            agent_role_arns=_arns(get("agentRoleArns"), "agentRoleArns", ROLE_ARN_RE, "arn:aws:iam::ACCOUNT:role/NAME"),
            notification_topic_arn=_topic(get("notificationTopicArn")),
            bulk_retention_days=_int(get("bulkRetentionDays"), "bulkRetentionDays", d.bulk_retention_days, 1, 3650),
            stall_minutes=_int(get("stallMinutes"), "stallMinutes", d.stall_minutes, 5, 1440),
            rollout_failure_rate=_fraction(get("rolloutFailureRateAlarm"), d.rollout_failure_rate),
            log_retention_days=_int(get("logRetentionDays"), "logRetentionDays", d.log_retention_days, 1, 3653),
            destroy_on_delete=_bool(get("destroyOnDelete"), "destroyOnDelete"),
            data_buckets=_arns(get("dataBuckets"), "dataBuckets", BUCKET_NAME_RE, "bucket names (my-datasets)"),
            kms_key_arn=_one_arn(get("kmsKeyArn"), "kmsKeyArn", KMS_KEY_ARN_RE, "arn:aws:kms:REGION:ACCOUNT:key/KEY_ID"),
            mlflow_tracking_server_arns=_arns(get("mlflowTrackingServerArns"), "mlflowTrackingServerArns",
                                              MLFLOW_SERVER_ARN_RE,
                                              "arn:aws:sagemaker:REGION:ACCOUNT:mlflow-tracking-server/NAME or "
                                              "arn:aws:sagemaker:REGION:ACCOUNT:mlflow-app/ID"),
            sweep_minutes=_int(get("sweepMinutes"), "sweepMinutes", d.sweep_minutes, 1, 60),
            wandb_api_key_secret_arn=_one_arn(get("wandbApiKeySecretArn"), "wandbApiKeySecretArn", SECRET_ARN_RE,
                                              "arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf (the full ARN)"),
            gateway_reserved_concurrency=(None if get("gatewayReservedConcurrency") in (None, "") else _int(
                get("gatewayReservedConcurrency"), "gatewayReservedConcurrency", 0, 1, MAX_RESERVED_CONCURRENCY)),
            session_start_timeout_seconds=_optional_int(get("sessionStartTimeoutSeconds"), "sessionStartTimeoutSeconds",
                                                        *SESSION_START_TIMEOUT_RANGE),
            poll_seconds=_optional_int(get("pollSeconds"), "pollSeconds", *POLL_SECONDS_RANGE),
            create_sagemaker_role=_bool(get("createSageMakerRole"), "createSageMakerRole"),
            deploy_math_agent=_bool(get("deployMathAgent"), "deployMathAgent"),
            hugging_face_token_secret_arn=_one_arn(get("huggingFaceTokenSecretArn"), "huggingFaceTokenSecretArn",
                                                   SECRET_ARN_RE, "arn:aws:secretsmanager:REGION:ACCOUNT:secret:NAME-AbCdEf"),
            **_agent_folder(get("agentDir"), get("agentEntrypoint"), get("agentRequirements")),
            judge_model_ids=_arns(get("judgeModelIds"), "judgeModelIds", JUDGE_MODEL_RE,
                                  "a Bedrock model id (amazon.nova-micro-v1:0), a cross-Region inference profile id "
                                  "(us.amazon.nova-micro-v1:0) or the ARN of a foundation model or inference profile"),
        )

    def agent_folder(self):
        """The `infra.agent_folder.AgentFolder` of ``agentDir`` (None when not given)."""
        from infra.agent_folder import AgentFolder

        return AgentFolder.of(self.agent_dir, self.agent_entrypoint or None, self.agent_requirements or None) \
            if self.agent_dir else None

    def function_environment(self) -> dict[str, str]:
        """The handler functions' variables these settings set (only those given): the session-start
        timeout, the poll interval, the notification topic (the session sweeper reports to it), the
        W&B key's secret, the Hugging Face token's secret, the judge's models and the gateway's reserved concurrency
        (`stepwise.settings`)."""
        from stepwise.settings import (ENV_GATEWAY_CONCURRENCY, ENV_HF_TOKEN_SECRET, ENV_JUDGE_MODEL_IDS,
                                       ENV_NOTIFICATION_TOPIC_ARN, ENV_POLL_SECONDS, ENV_SESSION_START_TIMEOUT,
                                       ENV_WANDB_API_KEY_SECRET)

        env = {}
        if self.judge_model_ids:
            env[ENV_JUDGE_MODEL_IDS] = ",".join(self.judge_model_ids)
        if self.notification_topic_arn:
            env[ENV_NOTIFICATION_TOPIC_ARN] = self.notification_topic_arn
        if self.wandb_api_key_secret_arn:
            env[ENV_WANDB_API_KEY_SECRET] = self.wandb_api_key_secret_arn
        if self.hugging_face_token_secret_arn:
            env[ENV_HF_TOKEN_SECRET] = self.hugging_face_token_secret_arn
        if self.session_start_timeout_seconds is not None:
            env[ENV_SESSION_START_TIMEOUT] = str(self.session_start_timeout_seconds)
        if self.poll_seconds is not None:
            env[ENV_POLL_SECONDS] = str(self.poll_seconds)
        if self.gateway_reserved_concurrency is not None:  # the group engine's rollouts in flight (preflight)
            env[ENV_GATEWAY_CONCURRENCY] = str(self.gateway_reserved_concurrency)
        return env


def _agent_folder(folder: Any, entrypoint: Any, requirements: Any) -> dict[str, str]:
    """``agentDir`` / ``agentEntrypoint`` / ``agentRequirements``, checked (`infra.agent_folder.AgentFolder.of`)."""
    from infra.agent_folder import AgentFolder, AgentFolderError

    if folder in (None, ""):
        if entrypoint not in (None, "") or requirements not in (None, ""):
            raise SettingsError("context agentEntrypoint / agentRequirements need agentDir (the agent folder)")
        return {}
    for key, value in (("agentDir", folder), ("agentEntrypoint", entrypoint), ("agentRequirements", requirements)):
        if value is not None and not isinstance(value, str):
            raise SettingsError(f"context {key}: expected a string, got {value!r}")
    try:
        agent = AgentFolder.of(folder, entrypoint or None, requirements or None)
        agent.extra_requirements()
    except AgentFolderError as e:
        raise SettingsError(f"context agentDir: {e}") from None
    return {"agent_dir": str(agent.folder), "agent_entrypoint": agent.entrypoint,
            "agent_requirements": agent.requirements.name if agent.requirements else ""}


def _arns(value: Any, key: str, pattern: re.Pattern[str], shape: str) -> tuple[str, ...]:
    if value is None or value == "" or value == []:
        return ()
    if isinstance(value, str):
        text = value.strip()
        try:
            items = json.loads(text) if text.startswith("[") else [p.strip() for p in text.split(",") if p.strip()]
        except ValueError as e:
            raise SettingsError(f"context {key}: not a JSON list ({e}); give a comma-separated string or a "
                                f"JSON list of strings, got {value!r}") from None
        if not isinstance(items, list):
            raise SettingsError(f"context {key}: expected a JSON list of strings, got {value!r}")
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise SettingsError(f"context {key}: expected a comma-separated string or a list of ARNs, got {value!r}")
    bad = [a for a in items if not isinstance(a, str) or not pattern.match(a)]
    if bad:
        raise SettingsError(f"context {key}: {bad} are not of the form {shape}")
    return tuple(dict.fromkeys(items))


def _optional_int(value: Any, key: str, lo: int, hi: int) -> int | None:
    return None if value in (None, "") else _int(value, key, 0, lo, hi)


def _topic(value: Any) -> str:
    return _one_arn(value, "notificationTopicArn", TOPIC_ARN_RE, "arn:aws:sns:REGION:ACCOUNT:NAME")


def _one_arn(value: Any, key: str, pattern: re.Pattern[str], shape: str) -> str:
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not pattern.match(value):
        raise SettingsError(f"context {key}: {value!r} is not {shape}")
    return value


def _int(value: Any, key: str, default: int, lo: int, hi: int) -> int:
    if value in (None, ""):
        return default
    try:
        n = int(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: int(inf) (JSON's 1e999)
        raise SettingsError(f"context {key}: {value!r} is not an integer") from None
    if not lo <= n <= hi:
        raise SettingsError(f"context {key}: {n} is outside {lo}..{hi}")
    return n


def _fraction(value: Any, default: float) -> float:
    if value in (None, ""):
        return default
    try:
        x = float(value)
    except (TypeError, ValueError, OverflowError):  # OverflowError: float() of an int beyond 1e308
        raise SettingsError(f"context rolloutFailureRateAlarm: {value!r} is not a number") from None
    if not 0.0 < x <= 1.0:
        raise SettingsError(f"context rolloutFailureRateAlarm: {x} is outside (0, 1]")
    return x


def _bool(value: Any, key: str) -> bool:
    if value in (None, ""):
        return False
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise SettingsError(f"context {key}: {value!r} is not true/false")
