#!/usr/bin/env python3
"""CDK app: ``cdk deploy`` (or ``python app.py`` to synthesize into ``cdk.out``).

Context values (``-c key=value``; all optional, see docs/deploy.md and ``infra.settings``):
stackName, agentRuntimeArns, sagemakerRoleArns, agentRoleArns, notificationTopicArn,
bulkRetentionDays, stallMinutes, rolloutFailureRateAlarm, logRetentionDays, destroyOnDelete,
dataBuckets, kmsKeyArn, mlflowTrackingServerArns, wandbApiKeySecretArn, sweepMinutes, gatewayReservedConcurrency,
sessionStartTimeoutSeconds, pollSeconds, createSageMakerRole, deployMathAgent, agentDir, agentEntrypoint,
agentRequirements, huggingFaceTokenSecretArn, judgeModelIds.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import aws_cdk as cdk

from infra.nag import apply_checks
from infra.settings import StackSettings
from infra.stack import StepwiseStack

__all__ = ["apply_checks", "build_app", "default_context"]

CDK_JSON = Path(__file__).resolve().with_name("cdk.json")


def default_context() -> dict:
    """``cdk.json``'s context (feature flags and defaults) when not run by the CDK CLI.

    The CLI passes it itself (``CDK_CONTEXT_JSON``); ``python app.py`` and the tests read it
    here, so they synthesize the template ``cdk synth`` / ``cdk deploy`` would.
    """
    if "CDK_CONTEXT_JSON" in os.environ or not CDK_JSON.exists():
        return {}
    return dict(json.loads(CDK_JSON.read_text()).get("context", {}))


def build_app(context: dict | None = None) -> tuple[cdk.App, StepwiseStack]:
    """The app with its one stack and cdk-nag's AwsSolutions checks applied.

    ``context`` overrides ``cdk.json``'s values (like ``-c key=value``).
    """
    app = cdk.App(context={**default_context(), **(context or {})} or None)
    settings = StackSettings.from_context(app.node.try_get_context)
    env = None
    if os.environ.get("CDK_DEFAULT_ACCOUNT") and os.environ.get("CDK_DEFAULT_REGION"):
        env = cdk.Environment(account=os.environ["CDK_DEFAULT_ACCOUNT"], region=os.environ["CDK_DEFAULT_REGION"])
    stack = StepwiseStack(app, app.node.try_get_context("stackName") or "Stepwise", settings=settings, env=env)
    apply_checks(app)
    return app, stack


if __name__ == "__main__":
    build_app()[0].synth()
