"""An agent's training runtime on AgentCore Runtime: its arm64 image, its execution role and the
``AWS::BedrockAgentCore::Runtime``. The stack creates one for the example math agent (CDK context
``deployMathAgent=true``) and one for a user's agent folder (``agentDir=FOLDER``, with ``agentEntrypoint`` and
``agentRequirements``; ``stepwise agent deploy FOLDER`` passes them; `infra.agent_folder`). Both are off by
default: each adds a runtime, an ECR image and an IAM role to the account.

Training needs a runtime of its own: the toolkit's ``@app.rollout_entrypoint`` answers every invocation at
once (``{"status": "processing"}``) and writes the agent's result to S3, so this runtime cannot serve an
application's traffic (docs/agent-contract.md).

- **Image**: ``local/agents/Dockerfile`` built by the CDK's ``DockerImageAsset`` for ``linux/arm64``, the
  platform AgentCore Runtime runs ("AgentCore Runtime" developer guide: containers must be ARM64), pushed to the
  CDK's asset repository by ``cdk deploy`` (Docker with buildx and arm64 emulation, or an arm64 machine;
  ``cdk synth`` needs neither). The example agents: build context ``local/agents/`` and its hashed lock
  ``requirements.lock``, serving ``local.agents.math_agent:app``. An agent folder: build context a staged copy
  of the folder (`infra.agent_folder.AgentFolder.stage_context`, under the CDK's output directory), its own
  requirements plus the toolkit's agent side, serving its ``MODULE:ATTR``. Both serve on 0.0.0.0:8080
  (POST /invocations, GET /ping).
- **Runtime**: protocol HTTP, network mode ``PUBLIC`` (its only outbound calls are the gateway's Function URL, an
  HTTPS endpoint on the internet, and S3: the gateway wiring a rollout needs arrives in its payload's
  ``_rollout``, its ``base_url`` and ``api_key``), session idle timeout 15 minutes and lifetime 8 hours (the
  service's defaults, stated).
- **Role** (`AGENT_RUNTIME_STATEMENTS`): the execution role the AgentCore Runtime developer guide documents
  ("IAM Permissions for AgentCore Runtime", section "Execution role for running an agent in AgentCore
  Runtime"), scoped: trusted by ``bedrock-agentcore.amazonaws.com`` for this account's runtimes in this region
  only (``aws:SourceAccount``, ``aws:SourceArn``); pulls its image from the asset repository (the guide's
  ``ecr:BatchGetImage`` and ``ecr:GetDownloadUrlForLayer`` on the repository, ``ecr:GetAuthorizationToken``
  on ``*``); its log groups and streams under ``/aws/bedrock-agentcore/runtimes/`` and
  ``logs:DescribeLogGroups``; X-Ray traces (``xray:PutTraceSegments``, ``PutTelemetryRecords``,
  ``GetSamplingRules``, ``GetSamplingTargets``, which take no resource); ``cloudwatch:PutMetricData`` only in
  the ``bedrock-agentcore`` namespace; the workload access tokens of its own workload identity
  (``GetWorkloadAccessToken``, ``...ForJWT``, ``...ForUserId`` on the default directory and
  ``workload-identity/{runtime name}-*``). ``logs:DescribeLogGroups`` is granted on ``*``: the guide writes
  ``log-group:*``, the Service Authorization Reference lists no resource type for this list action. The
  guide's ``bedrock:InvokeModel`` statement is left out on purpose: the agent's model calls go to the
  gateway, never to Bedrock. Plus ``s3:PutObject`` on the run
  bucket's ``rollout-results/*``, where the toolkit's ``AgentCoreRLApp.save_result`` writes.
"""

from __future__ import annotations

import re
from pathlib import Path

from aws_cdk import ArnFormat, Stack, Stage
from aws_cdk import aws_bedrockagentcore as agentcore
from aws_cdk import aws_ecr_assets as ecr_assets
from aws_cdk import aws_iam as iam
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.agent_folder import STAGED_DOCKERFILE, AgentFolder
from infra.permissions import add_statements

#: The build context of the example agents: their package (``local/agents/``), its Dockerfile and lock.
AGENTS_DIR = Path(__file__).resolve().parents[1] / "local" / "agents"
ASSET_EXCLUDE = ["**/__pycache__", "**/*.pyc"]
#: The example module whose ``app`` the math agent's image serves.
MATH_AGENT = "math_agent"
#: ``lifecycleConfiguration`` (seconds): idle timeout and maximum lifetime of one runtime session.
IDLE_SESSION_TIMEOUT_S = 900
MAX_SESSION_LIFETIME_S = 28_800
#: The service principal of AgentCore Runtime.
AGENTCORE_PRINCIPAL = "bedrock-agentcore.amazonaws.com"
#: Runtime log groups the service creates for a runtime ("/aws/bedrock-agentcore/runtimes/{id}-{endpoint}").
RUNTIME_LOG_GROUPS = "/aws/bedrock-agentcore/runtimes/*"
#: The documented execution role's actions, by statement (the module doc; tests/infra check the template's).
AGENT_RUNTIME_STATEMENTS: dict[str, tuple[str, ...]] = {
    "image": ("ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer"),
    "image_token": ("ecr:GetAuthorizationToken",),
    "log_groups": ("logs:DescribeLogStreams", "logs:CreateLogGroup"),
    "describe_log_groups": ("logs:DescribeLogGroups",),
    "log_streams": ("logs:CreateLogStream", "logs:PutLogEvents"),
    "traces": ("xray:PutTraceSegments", "xray:PutTelemetryRecords", "xray:GetSamplingRules", "xray:GetSamplingTargets"),
    "metrics": ("cloudwatch:PutMetricData",),
    "workload_tokens": ("bedrock-agentcore:GetWorkloadAccessToken", "bedrock-agentcore:GetWorkloadAccessTokenForJWT",
                        "bedrock-agentcore:GetWorkloadAccessTokenForUserId"),
    "results": ("s3:PutObject",),
}
#: ``cloudwatch:namespace`` the runtime's metrics are allowed in.
METRICS_NAMESPACE = "bedrock-agentcore"
#: ARN fields as a suppression's regex sees them: a token (``<AWS::Region>``) or, with ``CDK_DEFAULT_*`` set,
#: the concrete value (``us-west-2``); so the suppressions hold for both the environment-agnostic synth and the
#: one ``cdk deploy`` makes.
_FIELD = r"(?:<AWS::[A-Za-z]+>|[a-z0-9-]+)"


def runtime_name(stack_name: str, agent: str = MATH_AGENT) -> str:
    """The runtime's name: ``{stack}_{agent}``, letters, digits and ``_`` only, at most 48 characters
    (``AWS::BedrockAgentCore::Runtime`` ``AgentRuntimeName``: ``[a-zA-Z][a-zA-Z0-9_]{0,47}``)."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", f"{stack_name}_{agent}")
    if not name[:1].isalpha():
        name = "A" + name
    return name[:48]


class AgentRuntime(Construct):
    """An agent's image, execution role and runtime (``self.runtime_arn``); see the module doc.

    Args:
        storage: the stack's `infra.storage.Storage` (the role writes its ``rollout-results/``).
        folder: the agent folder to build (`infra.agent_folder.AgentFolder`); None = the example math agent.
    """

    def __init__(self, scope: Construct, id: str, *, storage, folder: AgentFolder | None = None) -> None:
        super().__init__(scope, id)
        stack = Stack.of(self)
        if folder is None:
            agent, described = MATH_AGENT, f"the example agent local/agents/{MATH_AGENT}.py"
            self.image = ecr_assets.DockerImageAsset(
                self, "Image", directory=str(AGENTS_DIR), file="Dockerfile",
                build_args={"ENTRYPOINT": f"local.agents.{MATH_AGENT}:app"},
                platform=ecr_assets.Platform.LINUX_ARM64, exclude=ASSET_EXCLUDE)
        else:
            # The folder's staged copy under the CDK's output directory: the build context (the module doc).
            agent, described = folder.name, f"the agent folder {folder.name} ({folder.entrypoint})"
            context = folder.stage_context(Path(Stage.of(self).outdir) / f"stepwise-agent-{self.node.addr}")
            self.image = ecr_assets.DockerImageAsset(
                self, "Image", directory=str(context), file=STAGED_DOCKERFILE, build_args=folder.build_args(),
                platform=ecr_assets.Platform.LINUX_ARM64)
        image = self.image
        name = runtime_name(stack.stack_name, agent)
        self.role = iam.Role(
            self, "Role",
            assumed_by=iam.ServicePrincipal(AGENTCORE_PRINCIPAL, conditions={
                "StringEquals": {"aws:SourceAccount": stack.account},
                "ArnLike": {"aws:SourceArn": stack.format_arn(service="bedrock-agentcore", resource="*",
                                                              arn_format=ArnFormat.NO_RESOURCE_NAME)},
            }),
            description=f"Stepwise RL: execution role of the training runtime {name}",
        )
        logs = stack.format_arn(service="logs", resource="log-group", resource_name=RUNTIME_LOG_GROUPS,
                                arn_format=ArnFormat.COLON_RESOURCE_NAME)
        directory = stack.format_arn(service="bedrock-agentcore", resource="workload-identity-directory",
                                     resource_name="default", arn_format=ArnFormat.SLASH_RESOURCE_NAME)
        s = AGENT_RUNTIME_STATEMENTS
        add_statements(
            self.role,
            iam.PolicyStatement(actions=list(s["image"]), resources=[image.repository.repository_arn]),
            iam.PolicyStatement(actions=list(s["image_token"]), resources=["*"]),
            iam.PolicyStatement(actions=list(s["log_groups"]), resources=[logs]),
            # The guide writes log-group:*; the Service Authorization Reference gives DescribeLogGroups no resource
            # type (a list action: '*'), which also covers the guide's form.
            iam.PolicyStatement(actions=list(s["describe_log_groups"]), resources=["*"]),
            iam.PolicyStatement(actions=list(s["log_streams"]), resources=[f"{logs}:log-stream:*"]),
            iam.PolicyStatement(actions=list(s["traces"]), resources=["*"]),
            iam.PolicyStatement(actions=list(s["metrics"]), resources=["*"],
                                conditions={"StringEquals": {"cloudwatch:namespace": METRICS_NAMESPACE}}),
            iam.PolicyStatement(actions=list(s["workload_tokens"]),
                                resources=[directory, f"{directory}/workload-identity/{name}-*"]),
        )
        storage.grant_write_results(self.role)
        self.runtime = agentcore.CfnRuntime(
            self, "Runtime",
            agent_runtime_name=name,
            description=f"Stepwise RL: training runtime of {described}",
            agent_runtime_artifact=agentcore.CfnRuntime.AgentRuntimeArtifactProperty(
                container_configuration=agentcore.CfnRuntime.ContainerConfigurationProperty(
                    container_uri=image.image_uri)),
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
             "reason": "The execution role AgentCore Runtime documents: ecr:GetAuthorizationToken and the X-Ray "
                       "actions support no resource-level permission, cloudwatch:PutMetricData is limited to the "
                       "bedrock-agentcore namespace by condition, logs:DescribeLogGroups lists log groups; the "
                       "service names each runtime's log group and workload identity after the runtime id it "
                       "assigns at creation (runtimes/ID-ENDPOINT, workload-identity/NAME-ID); the agent writes one "
                       "result object per rollout under rollout-results/ (the layout in docs/internals.md).",
             "appliesTo": [
                 "Resource::*",
                 {"regex": f"/^Resource::arn:{_FIELD}:logs:{_FIELD}:{_FIELD}:log-group:"
                           r"\/aws\/bedrock-agentcore\/runtimes\/\*(:log-stream:\*)?$/"},
                 {"regex": f"/^Resource::arn:{_FIELD}:bedrock-agentcore:{_FIELD}:{_FIELD}:workload-identity-"
                           r"directory\/default\/workload-identity\/[A-Za-z0-9_]+-\*$/"},
                 {"regex": r"/^Resource::<StorageBucket[0-9A-F]+\.Arn>\/rollout-results\/\*$/"}]},
        ], apply_to_children=True)

    @property
    def runtime_arn(self) -> str:
        """``arn:PARTITION:bedrock-agentcore:REGION:ACCOUNT:runtime/ID`` (a token until deploy)."""
        return self.runtime.attr_agent_runtime_arn

    @property
    def role_arn(self) -> str:
        return self.role.role_arn
