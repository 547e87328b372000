"""Cleanup: stop the training session when an execution ends without reaching its own stop path.

A ``Catch`` does not run when an execution is stopped (StopExecution), times out or fails
outside a caught state, so an EventBridge rule on "Step Functions Execution Status Change"
(ABORTED, TIMED_OUT, FAILED) for this state machine runs the Cleanup Lambda (DESIGN.md
section 6). Optionally, every terminal status is also sent to an SNS topic.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from stepwise.executions import ABNORMAL_END_STATUSES, EXECUTION_STATUS_CHANGE, TERMINAL_STATUSES


def status_pattern(state_machine: sfn.IStateMachine, statuses: tuple[str, ...]) -> events.EventPattern:
    """Status-change events of ``state_machine`` whose status is one of ``statuses``."""
    return events.EventPattern(
        source=["aws.states"],
        detail_type=[EXECUTION_STATUS_CHANGE],
        detail={"status": list(statuses), "stateMachineArn": [state_machine.state_machine_arn]},
    )


class Cleanup(Construct):
    """The cleanup rule (``self.rule``) and, with a topic, the run-notification rule."""

    def __init__(self, scope: Construct, id: str, *, state_machine: sfn.IStateMachine,
                 cleanup_function: lambda_.IFunction, topic: sns.ITopic | None = None) -> None:
        super().__init__(scope, id)
        self.rule = events.Rule(
            self, "StopSessionOnAbnormalEnd",
            description="Execution aborted, timed out or failed -> Cleanup Lambda stops the run's training session",
            event_pattern=status_pattern(state_machine, ABNORMAL_END_STATUSES),
            targets=[targets.LambdaFunction(cleanup_function, retry_attempts=8, max_event_age=Duration.hours(6))],
        )
        self.notify_rule: events.Rule | None = None
        if topic is not None:
            detail = events.EventField.from_path
            self.notify_rule = events.Rule(
                self, "NotifyRunEnd",
                description="A training run's execution succeeded, failed, timed out or was stopped -> SNS",
                event_pattern=status_pattern(state_machine, TERMINAL_STATUSES),
                targets=[targets.SnsTopic(topic, message=events.RuleTargetInput.from_text(
                    f"Stepwise run {detail('$.detail.name')} {detail('$.detail.status')} "
                    f"(execution {detail('$.detail.executionArn')})"))],
            )
