"""Cleanup: stop the training session when an execution ends without reaching its own stop path.

A ``Catch`` does not run when an execution is stopped (StopExecution), times out or fails
outside a caught state, so an EventBridge rule on "Step Functions Execution Status Change"
(ABORTED, TIMED_OUT, FAILED) for this state machine runs the Cleanup Lambda. EventBridge delivers
those events best-effort, so a schedule also runs the session sweeper every few minutes
(``stepwise.handlers.sweeper``): it stops any session of this stack that no execution drives.
Optionally, every terminal status is also sent to an SNS topic.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

from stepwise.executions import ABNORMAL_END_STATUSES, EXECUTION_STATUS_CHANGE, HANDED_OVER_KEY, TERMINAL_STATUSES


def status_pattern(state_machine: sfn.IStateMachine, statuses: tuple[str, ...]) -> events.EventPattern:
    """Status-change events of ``state_machine`` whose status is one of ``statuses``."""
    return events.EventPattern(
        source=["aws.states"],
        detail_type=[EXECUTION_STATUS_CHANGE],
        detail={"status": list(statuses), "stateMachineArn": [state_machine.state_machine_arn]},
    )


def run_end_pattern(state_machine: sfn.IStateMachine) -> events.EventPattern:
    """The ends of a *run*: an execution of ``state_machine`` that failed, timed out or was stopped,
    or that succeeded without handing the run over to a next execution (continue-as-new ends
    SUCCEEDED with ``{"handed_over_to": ...}`` as its output: ``stepwise.executions.HANDED_OVER_KEY``).
    EventBridge's ``anything-but`` with a ``wildcard`` on ``detail.output`` (the execution's output
    JSON text, in every status-change event) tells the two successes apart."""
    abnormal = [s for s in TERMINAL_STATUSES if s != "SUCCEEDED"]
    return events.EventPattern(
        source=["aws.states"],
        detail_type=[EXECUTION_STATUS_CHANGE],
        detail={
            "stateMachineArn": [state_machine.state_machine_arn],
            "$or": [
                {"status": abnormal},
                {"status": ["SUCCEEDED"], "output": [{"anything-but": {"wildcard": f'*"{HANDED_OVER_KEY}"*'}}]},
            ],
        },
    )


class Cleanup(Construct):
    """The cleanup rule (``self.rule``) and, with a topic, the run-notification rule."""

    def __init__(self, scope: Construct, id: str, *, state_machine: sfn.IStateMachine,
                 cleanup_function: lambda_.IFunction, sweep_function: lambda_.IFunction | None = None,
                 sweep_minutes: int = 5, topic: sns.ITopic | None = None) -> None:
        super().__init__(scope, id)
        self.rule = events.Rule(
            self, "StopSessionOnAbnormalEnd",
            description="Execution aborted, timed out or failed -> Cleanup Lambda stops the run's training session",
            event_pattern=status_pattern(state_machine, ABNORMAL_END_STATUSES),
            targets=[targets.LambdaFunction(cleanup_function, retry_attempts=8, max_event_age=Duration.hours(6))],
        )
        self.sweep_rule: events.Rule | None = None
        if sweep_function is not None:
            # A missed run is harmless (the next one sweeps the same sessions): no retries, a short event age.
            self.sweep_rule = events.Rule(
                self, "SweepSessions",
                description=f"Every {sweep_minutes} min -> stop the training sessions of this stack that no execution drives",
                schedule=events.Schedule.rate(Duration.minutes(sweep_minutes)),
                targets=[targets.LambdaFunction(sweep_function, retry_attempts=0,
                                                max_event_age=Duration.minutes(max(1, sweep_minutes)))],
            )
        self.notify_rule: events.Rule | None = None
        if topic is not None:
            detail = events.EventField.from_path
            self.notify_rule = events.Rule(
                self, "NotifyRunEnd",
                description="A training run's execution succeeded, failed, timed out or was stopped -> SNS "
                            "(not a continue-as-new hand-over)",
                event_pattern=run_end_pattern(state_machine),
                targets=[targets.SnsTopic(topic, message=events.RuleTargetInput.from_text(
                    f"Stepwise run {detail('$.detail.name')} {detail('$.detail.status')} "
                    f"(execution {detail('$.detail.executionArn')})"))],
            )
