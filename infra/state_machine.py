"""TrainingLoop: the Standard state machine whose definition is exactly ``state_machine/training_loop.asl.json``.

The ASL text goes to ``DefinitionBody.from_string`` unchanged and its ``${...}`` placeholders
to ``definition_substitutions`` (``infra.definition.substitutions``), so the deployed
definition is the file the local stack runs. Because CDK cannot see inside a string
definition, this construct reads the ASL to grant what it uses:

- ``lambda:InvokeFunction`` on each function a Task names (``Resource: ${XFunctionArn}`` or
  ``lambda:invoke[.waitForTaskToken]`` with ``FunctionName: ${XFunctionArn}``);
- for a Distributed Map: ``states:StartExecution`` on itself, ``DescribeExecution`` /
  ``StopExecution`` / ``RedriveExecution`` on its executions (child executions are named
  ``{name}/{map run label}:{id}``), ``s3:GetObject`` for the ``ItemReader`` and the
  ``ResultWriter``'s multipart writes under its prefix;
- any other service integration is refused with an error naming it, so a permission can
  never be silently missing.
The self-referencing grants live in a separate policy (as CDK's own DistributedMap does),
which breaks the function -> role policy -> state machine cycle.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from aws_cdk import ArnFormat, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_stepfunctions as sfn
from cdk_nag import NagSuppressions
from constructs import Construct

from infra.definition import INTEGRATION_PLACEHOLDERS, used_substitutions
from infra.functions import _retention
from state_machine.definition import PLACEHOLDER_RE
from stepwise.layout import RUNS_PREFIX

#: Task-token responses (:meth:`TrainingLoop.grant_task_response`).
TASK_RESPONSE_ACTIONS = ("states:SendTaskSuccess", "states:SendTaskFailure", "states:SendTaskHeartbeat")
#: Service integrations this construct grants, by what follows ``arn:PARTITION:states:::``.
LAMBDA_INTEGRATIONS = ("lambda:invoke", "lambda:invoke.waitForTaskToken")
ITEM_READER_INTEGRATIONS = ("s3:getObject",)
RESULT_WRITER_INTEGRATIONS = ("s3:putObject",)
_INTEGRATION_RE = re.compile(r"^arn:aws[a-z\-]*:states:::(.+)$")


def integration(resource: Any) -> str | None:
    """``lambda:invoke`` for ``${StatesLambdaInvoke}`` or ``arn:aws:states:::lambda:invoke`` (else None)."""
    if not isinstance(resource, str):
        return None
    m = PLACEHOLDER_RE.fullmatch(resource)
    if m:
        return INTEGRATION_PLACEHOLDERS.get(m.group(1))
    m = _INTEGRATION_RE.match(resource)
    return m.group(1) if m else None


@dataclass
class AslNeeds:
    """What an ASL document needs from IAM (see :func:`asl_needs`)."""

    invoked_placeholders: set[str] = field(default_factory=set)
    distributed_map: bool = False
    item_reader: bool = False
    result_writer_prefixes: set[str] = field(default_factory=set)


def _states(container: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    for name, state in container.get("States", {}).items():
        yield name, state
        for key in ("ItemProcessor", "Iterator"):
            if key in state:
                yield from _states(state[key])
        for branch in state.get("Branches", []):
            yield from _states(branch)


def _placeholder(value: Any, where: str) -> str:
    m = PLACEHOLDER_RE.fullmatch(value or "") if isinstance(value, str) else None
    if not m:
        raise ValueError(f"state {where!r}: the Lambda must be named by a ${{<Name>FunctionArn}} placeholder, got {value!r}")
    return m.group(1)


def asl_needs(definition: str) -> AslNeeds:
    """Walk an ASL text (placeholders left in) and list the permissions its states need.

    Raises:
        ValueError: a Task uses an integration this stack does not grant, or names its
            Lambda other than by placeholder; the message names the state.
    """
    needs = AslNeeds()
    for name, state in _states(json.loads(definition)):
        if state.get("Type") == "Task":
            resource = state.get("Resource", "")
            if integration(resource) in LAMBDA_INTEGRATIONS:
                needs.invoked_placeholders.add(_placeholder(state.get("Parameters", {}).get("FunctionName"), name))
            elif PLACEHOLDER_RE.fullmatch(resource) and resource[2:-1] not in INTEGRATION_PLACEHOLDERS:
                needs.invoked_placeholders.add(_placeholder(resource, name))
            else:
                raise ValueError(
                    f"state {name!r} uses integration {resource!r}; infra/state_machine.py grants only Lambda "
                    f"({', '.join(LAMBDA_INTEGRATIONS)}) - add its permissions there"
                )
        if state.get("Type") == "Map" and state.get("ItemProcessor", {}).get("ProcessorConfig", {}).get("Mode") == "DISTRIBUTED":
            needs.distributed_map = True
            reader = state.get("ItemReader")
            if reader:
                if integration(reader.get("Resource")) not in ITEM_READER_INTEGRATIONS:
                    raise ValueError(f"state {name!r}: ItemReader {reader.get('Resource')!r} is not granted (only s3:getObject)")
                needs.item_reader = True
            writer = state.get("ResultWriter")
            if writer:
                if integration(writer.get("Resource")) not in RESULT_WRITER_INTEGRATIONS:
                    raise ValueError(f"state {name!r}: ResultWriter {writer.get('Resource')!r} is not granted (only s3:putObject)")
                prefix = writer.get("Parameters", {}).get("Prefix", "")
                if not isinstance(prefix, str) or not prefix:
                    raise ValueError(f"state {name!r}: ResultWriter needs a literal Prefix so its writes can be scoped")
                needs.result_writer_prefixes.add(prefix.rstrip("/") + "/")
    return needs


class TrainingLoop(Construct):
    """The training loop state machine (``self.state_machine``) and its permissions."""

    def __init__(self, scope: Construct, id: str, *, definition: str, substitutions: Mapping[str, str],
                 functions: Mapping[str, lambda_.IFunction], bucket: s3.Bucket, log_retention_days: int,
                 bulk_retention_days: int, log_name: str = "training-loop",
                 comment: str = "Stepwise RL training loop (GRPO/DAPO on SageMaker Training Sessions)") -> None:
        super().__init__(scope, id)
        needs = asl_needs(definition)
        used = used_substitutions(definition, substitutions)
        self.log_group = logs.LogGroup(
            self, "Logs",
            # The vendedlogs prefix keeps CloudWatch Logs' resource policy small (Step Functions docs).
            log_group_name=f"/aws/vendedlogs/states/{Stack.of(self).stack_name}-{log_name}",
            retention=_retention(log_retention_days),
            removal_policy=RemovalPolicy.DESTROY,
        )
        self.state_machine = sfn.StateMachine(
            self,
            "StateMachine",
            comment=comment,
            definition_body=sfn.DefinitionBody.from_string(definition),
            definition_substitutions=dict(used),
            state_machine_type=sfn.StateMachineType.STANDARD,
            logs=sfn.LogOptions(destination=self.log_group, level=sfn.LogLevel.ALL, include_execution_data=False),
            tracing_enabled=True,
        )
        role = self.state_machine.role
        by_placeholder = {f"{name}FunctionArn": fn for name, fn in functions.items()}
        for placeholder in sorted(needs.invoked_placeholders):
            if placeholder not in by_placeholder:
                raise ValueError(f"the ASL invokes {placeholder} but the stack has no such function; "
                                 f"known: {sorted(by_placeholder)}")
            by_placeholder[placeholder].grant_invoke(role)

        # Grants that name the state machine itself go in a separate policy: the state machine
        # must not depend on them (CDK's DistributedMap does the same).
        if not (needs.distributed_map or needs.item_reader or needs.result_writer_prefixes):
            _suppress_findings(self)  # an inline Map only (the rollout group): nothing names itself
            return
        self_policy = iam.Policy(self, "SelfReferencePolicy")
        role.attach_inline_policy(self_policy)
        executions = [self.execution_arns("*")]
        if needs.distributed_map:
            self.state_machine.grant_start_execution(self_policy)
            self_policy.add_statements(
                iam.PolicyStatement(actions=["states:DescribeExecution", "states:StopExecution"],
                                    resources=[*executions, self.execution_arns("*", child=True)]),
                iam.PolicyStatement(actions=["states:RedriveExecution"], resources=[self.execution_arns("*", child=True)]),
            )
        if needs.item_reader:
            self_policy.add_statements(
                iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(f"{RUNS_PREFIX}*")]),
                iam.PolicyStatement(actions=["s3:ListBucket"], resources=[bucket.bucket_arn]),
            )
        for prefix in sorted(needs.result_writer_prefixes):
            self_policy.add_statements(iam.PolicyStatement(
                actions=["s3:PutObject", "s3:GetObject", "s3:ListMultipartUploadParts", "s3:AbortMultipartUpload"],
                resources=[bucket.arn_for_objects(f"{prefix}*")],
            ))
            bucket.add_lifecycle_rule(id=f"expire-{prefix.strip('/')}", prefix=prefix,
                                      expiration=Duration.days(bulk_retention_days))
        _suppress_findings(self)

    # --- grants to function roles. Those that name the state machine get a policy of their own,
    # for the reason above (the state machine depends on the functions, so their default policies
    # must not depend on it).

    def grant_task_response(self, function: lambda_.IFunction) -> None:
        """SendTaskSuccess/Failure/Heartbeat for the loop's callback tasks (OnRolloutResult). The
        Service Authorization Reference lists no resource type for them (the token, here from a
        Distributed Map child execution, is the authorization), so '*'."""
        function.add_to_role_policy(iam.PolicyStatement(actions=list(TASK_RESPONSE_ACTIONS), resources=["*"]))

    def grant_task_heartbeat(self, function: lambda_.IFunction) -> None:
        """SendTaskHeartbeat only (the gateway: a rollout's LLM calls keep its callback task alive); '*'
        for the reason `grant_task_response` gives."""
        function.add_to_role_policy(iam.PolicyStatement(actions=["states:SendTaskHeartbeat"], resources=["*"]))

    def grant_continue_run(self, function: lambda_.IFunction) -> None:
        """StartExecution of this state machine and DescribeExecution of its executions (ContinueRun:
        the run goes on as a new execution)."""
        policy = iam.Policy(self, f"{function.node.id}StartExecutionPolicy", statements=[
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[self.state_machine.state_machine_arn]),
            iam.PolicyStatement(actions=["states:DescribeExecution"], resources=[self.execution_arns("*")])])
        function.role.attach_inline_policy(policy)
        _suppress_findings(policy)

    def grant_start_executions(self, function: lambda_.IFunction) -> None:
        """StartExecution of this state machine and DescribeExecution of its executions (the rollout group:
        AdmitGroups and RecordGroupComplete start groups; a group is named at run time)."""
        policy = iam.Policy(self, f"{function.node.id}StartGroupsPolicy", statements=[
            iam.PolicyStatement(actions=["states:StartExecution"], resources=[self.state_machine.state_machine_arn]),
            iam.PolicyStatement(actions=["states:DescribeExecution"], resources=[self.execution_arns("*")])])
        function.role.attach_inline_policy(policy)
        _suppress_findings(policy)

    def grant_stop_executions(self, function: lambda_.IFunction) -> None:
        """StopExecution and DescribeExecution of this state machine's executions (the rollout group:
        StopSession and Cleanup stop the running groups of a run that ends; AwaitGroups asks about groups
        past their time)."""
        policy = iam.Policy(self, f"{function.node.id}StopExecutionsPolicy", statements=[iam.PolicyStatement(
            actions=["states:StopExecution", "states:DescribeExecution"], resources=[self.execution_arns("*")])])
        function.role.attach_inline_policy(policy)
        _suppress_findings(policy)

    def grant_describe_executions(self, function: lambda_.IFunction) -> None:
        """DescribeExecution of this state machine's executions (the session sweeper reads whether a
        run's owner and successor still run)."""
        policy = iam.Policy(self, f"{function.node.id}DescribeExecutionsPolicy", statements=[iam.PolicyStatement(
            actions=["states:DescribeExecution"], resources=[self.execution_arns("*")])])
        function.role.attach_inline_policy(policy)
        _suppress_findings(policy)

    def grant_read_history(self, function: lambda_.IFunction) -> None:
        """GetExecutionHistory of this state machine's executions (PlanStep's history budget)."""
        policy = iam.Policy(self, f"{function.node.id}ReadHistoryPolicy", statements=[iam.PolicyStatement(
            actions=["states:GetExecutionHistory"], resources=[self.execution_arns("*")])])
        function.role.attach_inline_policy(policy)
        _suppress_findings(policy)

    def execution_arns(self, suffix: str, *, child: bool = False) -> str:
        """``arn:...:execution:{name}:{suffix}`` (or ``{name}/{suffix}`` for Map child executions)."""
        sep = "/" if child else ":"
        return Stack.of(self).format_arn(
            service="states", resource="execution",
            resource_name=f"{self.state_machine.state_machine_name}{sep}{suffix}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )


def _suppress_findings(scope: Construct) -> None:
    """The wildcard findings of the loop's policies (its role's, and those it attaches to function
    roles), each with why it cannot be narrower. ``scope``'s children as they are now: called again
    for each policy a grant adds later."""
    NagSuppressions.add_resource_suppressions(
        scope,
        [
            {"id": "AwsSolutions-IAM5",
             "reason": "Step Functions' log delivery and X-Ray actions support no resource-level permissions.",
             "appliesTo": ["Resource::*"]},
            {"id": "AwsSolutions-IAM5",
             "reason": "Invoking a function also names its versions/aliases (ARN:*), as CDK's grantInvoke does.",
             "appliesTo": [{"regex": "/^Resource::<Functions.*\\.Arn>:\\*$/"}]},
            {"id": "AwsSolutions-IAM5",
             "reason": "Distributed Map child executions and continued runs are named at run time "
                       "(execution:NAME:* and execution:NAME/LABEL:*) - scoped to this state machine.",
             "appliesTo": [{"regex": "/^Resource::arn:<AWS::Partition>:states:<AWS::Region>:<AWS::AccountId>:execution:.*\\*$/"}]},
            {"id": "AwsSolutions-IAM5",
             "reason": "The Map reads its items from runs/{run_id}/steps/{step}/gen{g}/items.json and writes "
                       "its results under its ResultWriter prefix; keys are chosen at run time.",
             "appliesTo": [{"regex": "/^Resource::<StorageBucket[0-9A-F]+\\.Arn>\\/.*\\*$/"}]},
        ],
        apply_to_children=True,
    )
