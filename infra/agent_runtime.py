"""The example math agent's training runtime on AgentCore Runtime, created by the stack with CDK context
``deployMathAgent=true`` (off by default: it adds a runtime, an ECR image and an IAM role to the account).

Training needs a runtime of its own: the toolkit's ``@app.rollout_entrypoint`` answers every invocation at
once (``{"status": "processing"}``) and writes the agent's result to S3, so this runtime cannot serve an
application's traffic (docs/agent-contract.md).

- **Image**: ``local/agents/Dockerfile`` (build context ``local/agents/``), built for ``linux/arm64``, the
  platform AgentCore Runtime runs ("AgentCore Runtime" developer guide: containers must be ARM64), from
  ``local/agents/requirements.lock`` (every wheel pinned and hashed; ``scripts/lock_image.py --image
  agent``), serving ``local.agents.math_agent:app`` on 0.0.0.0:8080 (POST /invocations, GET /ping). The
  image asset is built and pushed by ``cdk deploy`` (Docker with arm64 emulation, or an arm64 machine);
  ``cdk synth`` needs neither.
- **Runtime**: ``AWS::BedrockAgentCore::Runtime``, protocol HTTP, network mode ``PUBLIC`` (its only
  outbound call is the gateway's Function URL, an HTTPS endpoint on the internet, and S3), session idle
  timeout 15 minutes and lifetime 8 hours (the service's defaults, stated).
- **Role**: trusted by ``bedrock-agentcore.amazonaws.com`` for this account's runtimes only
  (``aws:SourceAccount``, ``aws:SourceArn``); pulls its image from the asset repository
  (``ecr:GetAuthorizationToken`` takes no resource); writes its logs under
  ``/aws/bedrock-agentcore/runtimes/``; writes its results under the run bucket's ``rollout-results/``
  ("IAM Permissions for AgentCore Runtime", execution role; the toolkit's ``AgentCoreRLApp.save_result``).
- **Gateway access**: the agent reaches the gateway with the URL and key each rollout's ``_rollout`` carries;
  no grant is involved (the Function URL's identity is the rollout's session id).
"""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.permissions import add_statements

#: The build context: the example agents' package (``local/agents/``), its Dockerfile and lock.
AGENTS_DIR = Path(__file__).resolve().parents[1] / "local" / "agents"
ASSET_EXCLUDE = ["**/__pycache__", "**/*.pyc"]
#: The module whose ``app`` the image serves.
MATH_AGENT = "math_agent"
#: ``lifecycleConfiguration`` (seconds): idle timeout and maximum lifetime of one runtime session.
IDLE_SESSION_TIMEOUT_S = 900
MAX_SESSION_LIFETIME_S = 28_800
#: The service principal of AgentCore Runtime.
AGENTCORE_PRINCIPAL = "bedrock-agentcore.amazonaws.com"
#: Runtime log groups the service creates for a runtime ("/aws/bedrock-agentcore/runtimes/{id}-{endpoint}").
RUNTIME_LOG_GROUPS = "/aws/bedrock-agentcore/runtimes/*"


def runtime_name(stack_name: str, agent: str = MATH_AGENT) -> str:
    """The runtime's name: ``{stack}_{agent}``, letters, digits and ``_`` only, at most 48 characters
    (``AWS::BedrockAgentCore::Runtime`` ``AgentRuntimeName``: ``[a-zA-Z][a-zA-Z0-9_]{0,47}``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"{stack_name}_{agent}")
    if not name[:1].isalpha():
        name = "A" + name
    return name[:48]


class ExampleAgentRuntime(Construct):
    """The math agent's image, role and runtime (``self.runtime_arn``); see the module doc."""

    def __init__(self, scope: Construct, id: str, *, storage, agent: str = MATH_AGENT) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        self.image = ecr_assets.DockerImageAsset(
            self, "Image", directory=str(AGENTS_DIR), file="Dockerfile", build_args={"AGENT": agent},
            platform=ecr_assets.Platform.LINUX_ARM64, exclude=ASSET_EXCLUDE)
        self.role = iam.Role(
            self, "Role",
            assumed_by=iam.ServicePrincipal(AGENTCORE_PRINCIPAL, conditions={
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {"aws:SourceArn": stack.format_arn(service="bedrock-agentcore", resource="*",
                                                              arn_format=ArnFormat.NO_RESOURCE_NAME)},
            }),
            description=f"Stepwise RL: execution role of the example agent {agent}'s training runtime",
        )
        self.image.repository.grant_pull(self.role)
        logs = stack.format_arn(service="logs", resource="log-group", resource_name=RUNTIME_LOG_GROUPS,
                                arn_format=ArnFormat.COLON_RESOURCE_NAME)
        add_statements(
            self.role,
            iam.PolicyStatement(actions=["logs:CreateLogGroup", "logs:DescribeLogStreams"], resources=[logs]),
            iam.PolicyStatement(actions=["logs:CreateLogStream", "logs:PutLogEvents"],
                                resources=[f"{logs}:log-stream:*"]),
        )
        storage.grant_write_results(self.role)
        self.runtime = agentcore.CfnRuntime(
            self, "Runtime",
            agent_runtime_name=runtime_name(stack.stack_name, agent),
            description=f"Stepwise RL: training runtime of the example agent local/agents/{agent}.py",
            agent_runtime_artifact=agentcore.CfnRuntime.AgentRuntimeArtifactProperty(
                container_configuration=agentcore.CfnRuntime.ContainerConfigurationProperty(
                    container_uri=self.image.image_uri)),
            network_configuration=agentcore.CfnRuntime.NetworkConfigurationProperty(network_mode="PUBLIC"),
            protocol_configuration="HTTP",
            lifecycle_configuration=agentcore.CfnRuntime.LifecycleConfigurationProperty(
                idle_runtime_session_timeout=IDLE_SESSION_TIMEOUT_S, max_lifetime=MAX_SESSION_LIFETIME_S),
            role_arn=self.role.role_arn,
        )
        # The role's policy must exist before the service validates the runtime's image pull.
        self.runtime.node.add_dependency(self.role)
        NagSuppressions.add_resource_suppressions(self.role, [
            {"id": "AwsSolutions-IAM5",
             "reason": "ecr:GetAuthorizationToken supports no resource-level permission; AgentCore Runtime names "
                       "each runtime's log group after the runtime id it assigns at creation "
                       "(/aws/bedrock-agentcore/runtimes/ID-ENDPOINT), and the agent writes one result object per "
                       "rollout under rollout-results/ (the layout in docs/internals.md).",
             "appliesTo": ["Resource::*",
                           {"regex": "/^Resource::arn:<AWS::Partition>:logs:<AWS::Region>:<AWS::AccountId>:"
                                     "log-group:\\/aws\\/bedrock-agentcore\\/runtimes\\/\\*(:log-stream:\\*)?$/"},
                           {"regex": "/^Resource::<StorageBucket[0-9A-F]+\\.Arn>\\/rollout-results\\/\\*$/"}]},
        ], apply_to_children=True)

    @property
    def runtime_arn(self) -> str:
        """``arn:PARTITION:bedrock-agentcore:REGION:ACCOUNT:runtime/ID`` (a token until deploy)."""
        return self.runtime.attr_agent_runtime_arn
