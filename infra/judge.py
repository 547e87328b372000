"""The group judge's Bedrock grant (context ``judgeModelIds``): what the JudgeGroups function may invoke and what
Init may look up, for exactly the configured models, and nothing at all when none is configured.

IAM is fixed at deploy time, so the models a run's ``judge.model_id`` may name are listed when the stack is
deployed: ``-c judgeModelIds=us.amazon.nova-micro-v1:0[,...]`` (ids, cross-Region inference profile ids, or ARNs of
foundation models, inference profiles and application inference profiles). Init refuses a run whose judge names
another (``STEPWISE_JUDGE_MODEL_IDS``, `stepwise.core.preflight`).

The Converse API is authorized by ``bedrock:InvokeModel`` (the Bedrock API reference's Converse page). Per model:

- a foundation model (``amazon.nova-micro-v1:0``): InvokeModel and GetFoundationModel on
  ``arn:PARTITION:bedrock:REGION::foundation-model/MODEL``;
- a cross-Region inference profile (``us.``/``eu.``/``apac.``/``global.`` + model, or its ARN): InvokeModel and
  GetInferenceProfile on the profile in the stack's region, and InvokeModel on the foundation model in every
  Region (``arn:PARTITION:bedrock:*::foundation-model/MODEL``), only when the request comes through that
  profile (condition ``bedrock:InferenceProfileArn``): the profile routes to destination Regions its
  definition names and may change, as the Bedrock user guide's "Geographic cross-Region inference" policy
  grants (it lists today's destinations; the condition keeps the wildcard to this one profile);
- an application inference profile ARN: InvokeModel and GetInferenceProfile on it, and InvokeModel on any
  foundation model only through it (its model is not in its name).
"""

from __future__ import annotations

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.permissions import add_statements
from stepwise.core.prices import BEDROCK_PROFILE_PREFIXES

#: The context value naming the models.
CONTEXT_JUDGE_MODEL_IDS = "judgeModelIds"


class JudgeModels:
    """The Bedrock models the group judge may call (``judgeModelIds``); empty: no grant."""

    def __init__(self, stack: Stack, model_ids: tuple[str, ...] = ()) -> None:
        self.stack = stack
        self.model_ids = model_ids

    def _arn(self, resource: str, name: str, *, region: str | None = None, account: str | None = None) -> str:
        return self.stack.format_arn(service="bedrock", resource=resource, resource_name=name, region=region,
                                     account=account, arn_format=ArnFormat.SLASH_RESOURCE_NAME)

    def _model(self, model_id: str) -> tuple[str, str, str]:
        """``(kind, resource ARN, foundation model id)``: kind ``model``, ``profile`` or ``application``."""
        if model_id.startswith("arn:"):
            resource = model_id.split(":", 5)[5]
            kind, _, name = resource.partition("/")
            if kind == "foundation-model":
                return "model", model_id, name
            if kind == "inference-profile":
                return "profile", model_id, _base(name)
            return "application", model_id, "*"
        if model_id.startswith(BEDROCK_PROFILE_PREFIXES):
            return "profile", self._arn("inference-profile", model_id), _base(model_id)
        return "model", self._arn("foundation-model", model_id, account=""), model_id

    def grant_invoke(self, role: iam.IGrantable) -> None:
        """``bedrock:InvokeModel`` (Converse) on each configured model (see the module doc); nothing without one."""
        for model_id in self.model_ids:
            kind, arn, base = self._model(model_id)
            add_statements(role, iam.PolicyStatement(actions=["bedrock:InvokeModel"], resources=[arn]))
            if kind != "model":
                add_statements(role, iam.PolicyStatement(
                    actions=["bedrock:InvokeModel"],
                    resources=[self._arn("foundation-model", base, region="*", account="")],
                    conditions={"StringEquals": {"bedrock:InferenceProfileArn": arn}}))
        owner = getattr(role, "role", None) or role  # a function's role holds its policy
        if any(self._model(m)[0] != "model" for m in self.model_ids) and isinstance(owner, Construct):
            self._suppress(owner)

    def grant_lookup(self, role: iam.IGrantable) -> None:
        """``bedrock:GetFoundationModel`` / ``bedrock:GetInferenceProfile`` on each configured model (Init's refusal
        before billing: the model exists in the region); nothing without one."""
        for model_id in self.model_ids:
            kind, arn, _ = self._model(model_id)
            action = "bedrock:GetFoundationModel" if kind == "model" else "bedrock:GetInferenceProfile"
            add_statements(role, iam.PolicyStatement(actions=[action], resources=[arn]))

    def _suppress(self, scope: Construct) -> None:
        NagSuppressions.add_resource_suppressions(scope, [{
            "id": "AwsSolutions-IAM5",
            "reason": "A cross-Region inference profile (context judgeModelIds) routes the judge's requests to its "
                      "foundation model in the destination Regions its definition names, which may change: the model "
                      "is granted in every Region only when the request comes through that profile (condition "
                      "bedrock:InferenceProfileArn), as the Bedrock user guide's cross-Region inference policy does.",
            "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:bedrock:\\*::foundation-model\\/.*$/"}],
        }], apply_to_children=True)


def _base(profile_id: str) -> str:
    """The foundation model id of a system inference profile id (``us.amazon.nova-micro-v1:0`` -> ``amazon...``)."""
    for prefix in BEDROCK_PROFILE_PREFIXES:
        if profile_id.startswith(prefix):
            return profile_id[len(prefix):]
    return profile_id
