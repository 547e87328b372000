"""Monitoring: the training dashboard, the stalled-run and rollout-failure alarms, notifications.

Pipeline metrics are the handlers' Powertools EMF records: namespace ``Stepwise``, dimensions
``service`` (= ``stepwise``) and ``run_id`` (``stepwise.handlers._common.emit``). Graphs use
``SEARCH`` so each run is its own line; alarms must not depend on a run id, so they use the
Lambda service's own metrics of fixed functions or a Metrics Insights query over every run.
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

NAMESPACE = "Stepwise"
#: Metric names as the handlers emit them (slash-namespaced, tinker-cookbook style).
MEAN_REWARD = "sampler/mean_reward"
NUM_DATUMS = "sampler/num_datums"
EVAL_ACCURACY = "eval/accuracy"
TIME_STEP = "time/step"
TIME_ROLLOUT = "time/rollout"
TIME_TRAIN = "time/train"
ROLLOUT_FAILURE_RATE = "rollouts/failure_rate"
KEPT_GROUPS = "dapo/kept_groups"

#: Functions whose invocations show that a run is busy (rollouts, polls, planning).
ACTIVITY_FUNCTIONS = ("PlanStep", "StartRollout", "FinishRollout", "PollSession", "PollOperation")
#: The function invoked once per completed training step.
STEP_FUNCTION = "SubmitTrain"


def per_run(metric_name: str, stat: str = "Average", period_s: int = 300, label: str = "") -> cw.MathExpression:
    """One line per run: ``SEARCH`` over the handlers' ``{Stepwise,run_id,service}`` metrics."""
    return cw.MathExpression(
        expression=f"SEARCH('{{{NAMESPACE},run_id,service}} MetricName=\"{metric_name}\"', '{stat}', {period_s})",
        using_metrics={},
        label=label or metric_name,
        period=Duration.seconds(period_s),
    )


def stalled_run_expression(activity: Mapping[str, cw.IMetric], steps: cw.IMetric, period: Duration) -> cw.MathExpression:
    """1 when pipeline Lambdas ran in the period but no training step was submitted, else 0."""
    ids = {f"a{i}": m for i, m in enumerate(activity.values())}
    busy = " + ".join(f"FILL({k}, 0)" for k in ids)
    return cw.MathExpression(
        expression=f"IF(({busy}) > 0 AND FILL(steps, 0) == 0, 1, 0)",
        using_metrics={**ids, "steps": steps},
        label="stalled (busy without a training step)",
        period=period,
    )


class Monitoring(Construct):
    """Dashboard (``self.dashboard``) and alarms (``self.stalled_alarm``, ``self.rollout_failure_alarm``)."""

    def __init__(self, scope: Construct, id: str, *, state_machine: sfn.StateMachine,
                 functions: Mapping[str, lambda_.IFunction], gateway_function: lambda_.IFunction,
                 stall_minutes: int, rollout_failure_rate: float, topic: sns.ITopic | None = None) -> None:
        super().__init__(scope, id)
        period = Duration.minutes(stall_minutes)
        activity = {n: functions[n].metric_invocations(period=period, statistic="Sum")
                    for n in ACTIVITY_FUNCTIONS if n in functions}
        steps = functions[STEP_FUNCTION].metric_invocations(period=period, statistic="Sum")
        self.stalled_alarm = cw.Alarm(
            self, "StalledRun",
            alarm_description=(f"A training run is busy (rollouts, polls) but submitted no training step for "
                               f"{stall_minutes} minutes: agent results not arriving, session not starting, or "
                               f"every group filtered. See the execution's graph in the Step Functions console."),
            metric=stalled_run_expression(activity, steps, period),
            threshold=1,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        failure_query = cw.MathExpression(
            expression=(f"SELECT MAX(\"{ROLLOUT_FAILURE_RATE}\") FROM SCHEMA(\"{NAMESPACE}\", run_id, service)"),
            using_metrics={},
            label="worst run's rollout failure rate",
            period=Duration.minutes(15),
        )
        self.rollout_failure_alarm = cw.Alarm(
            self, "RolloutFailureRate",
            alarm_description=(f"More than {rollout_failure_rate:.0%} of a step's rollouts failed (agent error, "
                               f"non-200 result, timeout, throttling) in some run."),
            metric=failure_query,
            threshold=rollout_failure_rate,
            comparison_operator=cw.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
        )
        if topic is not None:
            for alarm in (self.stalled_alarm, self.rollout_failure_alarm):
                alarm.add_alarm_action(cw_actions.SnsAction(topic))

        gw_url_metric = lambda name, stat: cw.Metric(  # noqa: E731 - small local factory
            namespace="AWS/Lambda", metric_name=name, statistic=stat, period=Duration.minutes(5),
            dimensions_map={"FunctionName": gateway_function.function_name},
        )
        gateway_errors = cw.MathExpression(
            expression="100 * (FILL(e4, 0) + FILL(e5, 0)) / FILL(n, 1)",
            using_metrics={"e4": gw_url_metric("Url4xxCount", "Sum"), "e5": gw_url_metric("Url5xxCount", "Sum"),
                           "n": gw_url_metric("UrlRequestCount", "Sum")},
            label="gateway error rate (%)",
            period=Duration.minutes(5),
        )
        self.dashboard = cw.Dashboard(
            self, "Dashboard",
            dashboard_name=f"{Stack.of(self).stack_name}-training",
            default_interval=Duration.hours(6),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Mean reward per step (one line per run)", left=[per_run(MEAN_REWARD)], width=12),
            cw.GraphWidget(title="Eval accuracy", left=[per_run(EVAL_ACCURACY)], width=12),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Datums per step", left=[per_run(NUM_DATUMS, "Sum")], width=8),
            cw.GraphWidget(title="Step duration (s): whole step, rollouts, training",
                           left=[per_run(TIME_STEP), per_run(TIME_ROLLOUT), per_run(TIME_TRAIN)], width=8),
            cw.GraphWidget(title="Rollout failure rate", left=[per_run(ROLLOUT_FAILURE_RATE, "Maximum")], width=8,
                           left_annotations=[cw.HorizontalAnnotation(value=rollout_failure_rate, label="alarm")]),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Gateway latency (ms, time to first byte)",
                           left=[gw_url_metric("UrlRequestLatency", "p50"), gw_url_metric("UrlRequestLatency", "p95")],
                           width=8),
            cw.GraphWidget(title="Gateway error rate (%)", left=[gateway_errors],
                           right=[gw_url_metric("UrlRequestCount", "Sum")], width=8),
            cw.GraphWidget(title="SageMaker operation latency (s)",
                           left=[per_run(TIME_TRAIN, "Average"), per_run(TIME_TRAIN, "Maximum")],
                           right=[functions[n].metric_duration(statistic="p95") for n in ("SubmitTrain", "PollOperation", "Rebind") if n in functions],
                           width=8),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Executions", left=[state_machine.metric_started(), state_machine.metric_succeeded(),
                                                     state_machine.metric_failed(), state_machine.metric_aborted(),
                                                     state_machine.metric_timed_out()], width=12),
            cw.GraphWidget(title="Lambda errors", left=[f.metric_errors(label=n) for n, f in functions.items()], width=12),
            cw.AlarmStatusWidget(alarms=[self.stalled_alarm, self.rollout_failure_alarm], title="Alarms", width=24, height=3),
        )
