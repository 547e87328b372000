"""StepwiseStack: the whole serverless pipeline as one stack of named constructs.

Reads as the architecture diagram (docs/architecture.md): Storage -> Gateway -> Functions ->
TrainingLoop (state machine) -> Cleanup (EventBridge) -> Monitoring, plus the S3 result
notification that resumes rollouts; and, when the context asks for them, what a first run needs:
the training sessions' role (``infra.session_role``) and the example math agent's training runtime
(``infra.agent_runtime``).
"""

from __future__ import annotations

from aws_cdk import Aws, CfnOutput, CfnRule, CfnRuleAssertion, Fn, Stack, Token
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_notifications as s3n
from aws_cdk import aws_sns as sns
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.agent_runtime import AgentRuntime
from infra.cleanup import Cleanup
from infra.definition import substitutions
from infra.functions import HandlerFunctions
from infra.gateway import Gateway
from infra.judge import JudgeModels
from infra.monitoring import Monitoring
from infra.permissions import AgentRuntimes, TrackingServers, TrainingSessions, add_statements
from infra.session_role import SessionRole
from infra.settings import SettingsError, StackSettings
from infra.state_machine import TrainingLoop
from infra.storage import Storage
from stepwise.layout import RESULTS_PREFIX, RUNS_PREFIX, SUMMARY_NAME
from stepwise.stackinfo import region_of_arn

#: Stack output keys (the CLI finds the deployment by these; docs/internals.md "Stack outputs").
OUTPUT_BUCKET = "BucketName"
OUTPUT_STATE_MACHINE = "StateMachineArn"
OUTPUT_GATEWAY_URL = "GatewayUrl"
OUTPUT_DASHBOARD = "DashboardName"
#: With ``createSageMakerRole`` / ``deployMathAgent``: the session role and the example agent's runtime.
OUTPUT_SAGEMAKER_ROLE = "SageMakerRoleArn"
OUTPUT_MATH_AGENT_RUNTIME = "MathAgentRuntimeArn"
#: With ``agentDir``: the user's agent folder's training runtime and its execution role.
OUTPUT_AGENT_RUNTIME = "AgentRuntimeArn"
OUTPUT_AGENT_ROLE = "AgentRuntimeRoleArn"

#: Extra environment the stack gives every handler (defaults Init uses when the run config leaves them blank).
ENV_DEFAULT_S3_OUTPUT_PATH = "STEPWISE_DEFAULT_S3_OUTPUT_PATH"


def load_asl() -> str:
    """The ASL text of ``state_machine/training_loop.asl.json`` (placeholders in)."""
    from state_machine.definition import load_definition

    return load_definition()


def load_group_definition() -> str:
    """The ASL text of ``state_machine/rollout_group.asl.json`` (placeholders in)."""
    from state_machine.definition import load_group_definition as load

    return load()


class StepwiseStack(Stack):
    """Bucket, handler and gateway Lambdas, the training loop, cleanup, dashboard and alarms."""

    def __init__(self, scope: Construct, id: str, *, settings: StackSettings | None = None,
                 definition: str | None = None, **kwargs) -> None:
        super().__init__(scope, id, description="Stepwise RL: serverless GRPO/DAPO training of AgentCore agents", **kwargs)
        settings = settings or StackSettings()
        definition = load_asl() if definition is None else definition

        self.storage = Storage(
            self, "Storage",
            bulk_retention_days=settings.bulk_retention_days,
            destroy_on_delete=settings.destroy_on_delete,
            agent_role_arns=settings.agent_role_arns,
            sagemaker_role_arns=settings.sagemaker_role_arns,
            data_buckets=settings.data_buckets,
        )
        bucket = self.storage.bucket
        _pin_region(self, settings)
        # What a first run needs, when asked for: the sessions' role and the example agent's training runtime.
        # Each joins the grants as if it had been given in sagemakerRoleArns / agentRuntimeArns.
        self.session_role = (SessionRole(self, "SageMakerSessionRole", storage=self.storage,
                                         kms_key_arn=settings.kms_key_arn) if settings.create_sagemaker_role else None)
        self.math_agent = AgentRuntime(self, "MathAgent", storage=self.storage) if settings.deploy_math_agent else None
        folder = settings.agent_folder()
        self.agent = AgentRuntime(self, "Agent", storage=self.storage, folder=folder) if folder else None
        sagemaker_role_arns = settings.sagemaker_role_arns + ((self.session_role.role_arn,) if self.session_role else ())
        agent_runtime_arns = settings.agent_runtime_arns
        for runtime in (self.math_agent, self.agent):
            if runtime is not None and agent_runtime_arns:  # an allow-list: the new runtime joins it
                agent_runtime_arns += (runtime.runtime_arn,)
        self.gateway = Gateway(self, "Gateway", bucket=bucket, log_retention_days=settings.log_retention_days,
                               reserved_concurrency=settings.gateway_reserved_concurrency)
        self.functions = HandlerFunctions(
            self, "Functions",
            bucket=bucket,
            gateway_url=self.gateway.url,
            log_retention_days=settings.log_retention_days,
            extra_environment={ENV_DEFAULT_S3_OUTPUT_PATH: self.storage.default_sagemaker_output_path,
                               **settings.function_environment()},
            agent_runtime_arns=agent_runtime_arns,
            data_buckets=settings.data_buckets,
        )
        fns = self.functions.functions
        function_arns = {n: f.function_arn for n, f in fns.items()}
        # The group engine's executions (admission: group), one per group, started by the training loop's
        # functions: created first, the training loop's definition names it.
        self.rollout_group = TrainingLoop(
            self, "RolloutGroup",
            definition=load_group_definition(),
            substitutions=substitutions(function_arns=function_arns, bucket_name=bucket.bucket_name,
                                        partition=Aws.PARTITION),
            functions=fns,
            bucket=bucket,
            log_retention_days=settings.log_retention_days,
            bulk_retention_days=settings.bulk_retention_days,
            log_name="rollout-group",
            comment="Stepwise RL rollout group: one group's rollouts (admission: group), started by the training loop",
        )
        self.training_loop = TrainingLoop(
            self, "TrainingLoop",
            definition=definition,
            substitutions=substitutions(function_arns=function_arns, bucket_name=bucket.bucket_name,
                                        partition=Aws.PARTITION,
                                        group_state_machine_arn=self.rollout_group.state_machine.state_machine_arn),
            functions=fns,
            bucket=bucket,
            log_retention_days=settings.log_retention_days,
            bulk_retention_days=settings.bulk_retention_days,
        )
        state_machine = self.training_loop.state_machine
        self._grant(settings, sagemaker_role_arns=sagemaker_role_arns, agent_runtime_arns=agent_runtime_arns)

        # Agent results resume their rollout: S3 ObjectCreated under rollout-results/ -> OnRolloutResult.
        bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(fns["OnRolloutResult"]),
            s3.NotificationKeyFilter(prefix=RESULTS_PREFIX),
        )
        # Summaries (steps, evals, the run's end) -> Track: MLflow, W&B and the report page, beside the loop.
        bucket.add_event_notification(
            s3.EventType.OBJECT_CREATED,
            s3n.LambdaDestination(fns["Track"]),
            s3.NotificationKeyFilter(prefix=RUNS_PREFIX, suffix=SUMMARY_NAME),
        )

        topic = (sns.Topic.from_topic_arn(self, "NotificationTopic", settings.notification_topic_arn)
                 if settings.notification_topic_arn else None)
        self.cleanup = Cleanup(self, "Cleanup", state_machine=state_machine, cleanup_function=fns["Cleanup"],
                               sweep_function=fns["SweepSessions"], sweep_minutes=settings.sweep_minutes, topic=topic)
        if topic is not None:
            topic.grant_publish(fns["SweepSessions"])
            topic.grant_publish(fns["PlanStep"])  # budget warnings (stepwise.core.stopping.record_checks)
        self.monitoring = Monitoring(
            self, "Monitoring",
            state_machine=state_machine,
            functions=fns,
            log_groups=self.functions.log_groups,
            gateway_function=self.gateway.function,
            stall_minutes=settings.stall_minutes,
            rollout_failure_rate=settings.rollout_failure_rate,
            topic=topic,
        )

        CfnOutput(self, OUTPUT_BUCKET, value=bucket.bucket_name, description="Run bucket (datasets, run state, results)")
        CfnOutput(self, OUTPUT_STATE_MACHINE, value=state_machine.state_machine_arn,
                  description="Training loop: start one execution per run, named after the run id")
        CfnOutput(self, OUTPUT_GATEWAY_URL, value=self.gateway.url, description="The agents' LLM base URL")
        CfnOutput(self, OUTPUT_DASHBOARD, value=self.monitoring.dashboard.dashboard_name,
                  description="CloudWatch dashboard of the training runs")
        if self.session_role is not None:
            CfnOutput(self, OUTPUT_SAGEMAKER_ROLE, value=self.session_role.role_arn,
                      description="The training sessions' execution role: a run config's role_arn")
        if self.math_agent is not None:
            CfnOutput(self, OUTPUT_MATH_AGENT_RUNTIME, value=self.math_agent.runtime_arn,
                      description="The example math agent's training runtime: a run config's agent_runtime_arn")
        if self.agent is not None:
            CfnOutput(self, OUTPUT_AGENT_RUNTIME, value=self.agent.runtime_arn,
                      description=f"The training runtime of the agent folder {folder.name} ({folder.entrypoint}): "
                                  "a run config's agent_runtime_arn (stepwise agent config fills it in)")
            CfnOutput(self, OUTPUT_AGENT_ROLE, value=self.agent.role_arn,
                      description="The agent's execution role (the AgentCore Runtime execution role, documented)")

        _suppress_stack_level(self, settings)

    def _grant(self, settings: StackSettings, *, sagemaker_role_arns: tuple[str, ...],
               agent_runtime_arns: tuple[str, ...]) -> None:
        """Who may do what: each role gets, from the construct or resource that owns it, exactly what
        its handler calls (tests/infra/test_stack_iam_coverage.py records every AWS call of a local
        run and checks it against the synthesized roles)."""
        storage, loop, fns, gateway = self.storage, self.training_loop, self.functions.functions, self.gateway.function
        sessions = TrainingSessions(self, sagemaker_role_arns=sagemaker_role_arns, kms_key_arn=settings.kms_key_arn)
        agents = AgentRuntimes(self, agent_runtime_arns)
        tracking = TrackingServers(settings.mlflow_tracking_server_arns, settings.wandb_api_key_secret_arn)
        judge = JudgeModels(self, settings.judge_model_ids)  # the group judge: nothing without judgeModelIds
        for fn in fns.values():  # every handler reads and writes the run's state
            storage.grant_run_state(fn)
        # Init looks the agent runtime up before any session (stepwise.core.preflight): the runtimes StartRollout may invoke.
        sessions.grant_lifecycle(fns["Init"])
        storage.grant_data_read_write(fns["Init"])
        agents.grant_lookup(fns["Init"])
        if settings.hugging_face_token_secret_arn:  # a gated tokenizer's token (stepwise.aws.hub.token_sources)
            add_statements(fns["Init"], iam.PolicyStatement(actions=["secretsmanager:GetSecretValue"],
                                                            resources=[settings.hugging_face_token_secret_arn]))
        # PlanStep reads its execution's history before each step (its length: continue-as-new on a
        # budget; its new events: the cost ledger's state transitions), as StopSession, Cleanup and
        # ContinueRun do for an execution's last transitions.
        storage.grant_data_read(fns["PlanStep"])
        for name in ("PlanStep", "StopSession", "Cleanup", "ContinueRun"):
            loop.grant_read_history(fns[name])
        agents.grant_invoke(fns["StartRollout"])
        # Every rollout's runtime session is stopped when the rollout ends (FinishRollout), when its invoke
        # failed (StartRollout), or when the run stops with the rollout in flight (StopSession, Cleanup, and
        # the sweeper for what they leave: stepwise.handlers._leftovers).
        for name in ("StartRollout", "FinishRollout", "StopSession", "Cleanup", "SweepSessions"):
            agents.grant_stop_sessions(fns[name])
        for name in ("StartRollout", "OnRolloutResult", "FinishRollout", "StopSession", "Cleanup", "SweepSessions"):
            storage.grant_session_records(fns[name])
        for name in ("StopSession", "Cleanup", "SweepSessions"):
            storage.grant_leftovers(fns[name])  # the clean-up a run's end hands over
        for name in ("OnRolloutResult", "FinishRollout"):
            storage.grant_read_results(fns[name])
        loop.grant_task_response(fns["OnRolloutResult"])
        # The operation driver (``stepwise.aws.sagemaker.drive``: SubmitTrain, PollOperation, Rebind,
        # Checkpoint, PollSession) may submit or poll either kind of operation; PollSession also drives
        # the resume phase (load_state, save_weights, load_weights_for_sampling).
        for name in ("PollSession", "SubmitTrain", "PollOperation", "Rebind", "Checkpoint"):
            sessions.grant_training_operations(fns[name])
            sessions.grant_sampling_operations(fns[name])
        sessions.grant_describe(fns["PollSession"])
        for name in ("PollSession", "Checkpoint"):
            sessions.grant_read_model_packages(fns[name])
        loop.grant_continue_run(fns["ContinueRun"])
        # The group engine (admission: group): AdmitGroups and RecordGroupComplete start groups and read their
        # prompts; AwaitGroups and RecordGroupComplete resume the trainer's wait; AwaitGroups asks about groups
        # past their time; a run's end stops its running groups.
        groups = self.rollout_group
        for name in ("AdmitGroups", "RecordGroupComplete"):
            groups.grant_start_executions(fns[name])
            storage.grant_data_read(fns[name])
        for name in ("AwaitGroups", "RecordGroupComplete"):
            loop.grant_task_response(fns[name])
        for name in ("AwaitGroups", "StopSession", "Cleanup", "SweepSessions"):  # the sweeper: a swept run's groups
            groups.grant_stop_executions(fns[name])
        for name in ("StopSession", "Cleanup"):
            sessions.grant_stop(fns[name])
        # The session sweeper: this stack's active sessions, its runs' states (above), their executions.
        sessions.grant_sweep(fns["SweepSessions"])
        loop.grant_describe_executions(fns["SweepSessions"])
        for name in ("StopSession", "Cleanup", "SweepSessions"):  # retention best_and_last, at a run's end or after
            sessions.grant_prune_model_packages(fns[name])
        # Track logs every summary to MLflow (and W&B) and ends the runs, beside the loop; no function
        # of the loop logs anything.
        tracking.grant_tracking(fns["Track"])
        # The group judge calls Bedrock (Converse) on the configured models; Init looks them up before billing.
        judge.grant_invoke(fns["JudgeGroups"])
        judge.grant_lookup(fns["Init"])
        # The gateway: session records, tokenizers and captured turns, and the sampler.
        storage.grant_gateway_objects(gateway)
        sessions.grant_sampling_operations(gateway)
        loop.grant_task_heartbeat(gateway)  # the agent's LLM calls are its rollout's heartbeat


def context_arn_regions(settings: StackSettings) -> dict[str, set[str]]:
    """Region -> the context keys whose ARNs name it (runtimes, topic, KMS key, tracking servers)."""
    named = {"agentRuntimeArns": settings.agent_runtime_arns, "notificationTopicArn": (settings.notification_topic_arn,),
             "kmsKeyArn": (settings.kms_key_arn,), "mlflowTrackingServerArns": settings.mlflow_tracking_server_arns,
             "wandbApiKeySecretArn": (settings.wandb_api_key_secret_arn,),
             "huggingFaceTokenSecretArn": (settings.hugging_face_token_secret_arn,),
             "judgeModelIds": tuple(m for m in settings.judge_model_ids if m.startswith("arn:"))}
    out: dict[str, set[str]] = {}
    for key, arns in named.items():
        for arn in arns:
            if arn:
                out.setdefault(region_of_arn(arn), set()).add(key)
    return out


def _pin_region(stack: Stack, settings: StackSettings) -> None:
    """Every grant is scoped to the stack's region: refuse context ARNs of another region.

    With a concrete region (``CDK_DEFAULT_REGION``) the synth fails; an environment-agnostic
    template gets a CloudFormation rule, so ``cdk deploy`` into another region fails before
    any resource is created.

    Raises:
        SettingsError: the ARNs name more than one region, or not the stack's.
    """
    regions = context_arn_regions(settings)
    if len(regions) > 1:
        raise SettingsError(f"context ARNs name several regions {dict(sorted((r, sorted(k)) for r, k in regions.items()))}; "
                            f"one stack serves one region")
    if not regions:
        return
    ((region, keys),) = regions.items()
    if not Token.is_unresolved(stack.region):
        if stack.region != region:
            raise SettingsError(f"context {sorted(keys)} name region {region} but the stack deploys to {stack.region}")
        return
    CfnRule(stack, "DeployRegionMatchesContextArns", assertions=[CfnRuleAssertion(
        assert_=Fn.condition_equals(Aws.REGION, region),
        assert_description=f"This template's context values ({', '.join(sorted(keys))}) name resources in {region}: "
                           f"deploy it to {region}.",
    )])


def _suppress_stack_level(stack: Stack, settings: StackSettings) -> None:
    """Findings on resources CDK creates for us, and the deliberate fallbacks of unset settings."""
    NagSuppressions.add_stack_suppressions(
        stack,
        [
            {"id": "AwsSolutions-IAM4",
             "reason": "CDK's own helper Lambdas (S3 notification and auto-delete custom resources) use "
                       "AWSLambdaBasicExecutionRole for their logs; they are not part of the pipeline.",
             "appliesTo": ["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"]},
            {"id": "AwsSolutions-L1",
             "reason": "CDK's own helper Lambdas pick their runtime; the pipeline's functions are container images."},
        ],
    )
    for child in stack.node.children:
        if child.node.id.startswith("BucketNotificationsHandler"):
            NagSuppressions.add_resource_suppressions(
                child,
                [{"id": "AwsSolutions-IAM5",
                  "reason": "CDK's bucket-notification custom resource calls PutBucketNotification, granted on '*' by CDK.",
                  "appliesTo": ["Resource::*"]}],
                apply_to_children=True,
            )
    fallbacks = []
    if not settings.agent_runtime_arns:
        fallbacks.append({
            "id": "AwsSolutions-IAM5",
            "reason": "No agentRuntimeArns context value was given, so StartRollout may invoke any AgentCore "
                      "runtime of this account and region. Set -c agentRuntimeArns=ARN[,ARN] to scope it.",
            "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:bedrock-agentcore:<AWS::Region>:<AWS::AccountId>:runtime\\/\\*$/"}],
        })
    else:
        fallbacks.append({
            "id": "AwsSolutions-IAM5",
            "reason": "InvokeAgentRuntime also authorizes the runtime's endpoint (runtime/ID/runtime-endpoint/NAME); "
                      "scoped to the configured runtimes.",
            "appliesTo": [{"regex": "/^Resource::arn:.*:bedrock-agentcore:.*:runtime\\/.*\\/runtime-endpoint\\/\\*$/"},
                          # the example math agent's runtime (deployMathAgent) joins the allow-list by its ARN attribute
                          {"regex": "/^Resource::<(Math)?AgentRuntime[0-9A-F]+\\.AgentRuntimeArn>\\/runtime-endpoint\\/\\*$/"}],
        })
    if not settings.sagemaker_role_arns and not settings.create_sagemaker_role:
        fallbacks.append({
            "id": "AwsSolutions-IAM5",
            "reason": "No sagemakerRoleArns context value was given, so Init may pass any role of this account - "
                      "and only to sagemaker.amazonaws.com (iam:PassedToService). Set -c sagemakerRoleArns=ARN to scope it.",
            "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:iam::<AWS::AccountId>:role\\/\\*$/"}],
        })
    if fallbacks:
        NagSuppressions.add_resource_suppressions(stack.node.find_child("Functions"), fallbacks, apply_to_children=True)
