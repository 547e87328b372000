"""Monitoring: the training dashboard, the stalled-run and rollout-failure alarms, notifications.

Pipeline metrics are the handlers' Powertools EMF records: namespace ``Stepwise``, dimensions
``service`` (= ``stepwise``) and ``run_id`` (``stepwise.handlers._common.emit``). Graphs use
``SEARCH`` so each run is its own line. Alarms must not depend on a run id, so they use the
Lambda service's metrics of fixed functions and a metric filter on FinishRollout's log group
(the warnings it logs for each rollout that failed or whose reward was zeroed).
"""

from __future__ import annotations

from collections.abc import Mapping

from aws_cdk import Duration, Stack
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk import aws_stepfunctions as sfn
from constructs import Construct

NAMESPACE = "Stepwise"
#: Metric names as the handlers emit them (slash-namespaced, tinker-cookbook style):
#: stepwise.core.rewards.reward_metrics, stepwise.core.dapo, stepwise.core.behaviour, handlers/advantages.py,
#: handlers/train.py.
MEAN_REWARD = "sampler/mean_reward"
NUM_DATUMS = "sampler/num_datums"
NUM_ROLLOUTS = "sampler/num_rollouts"
ZEROED_ROLLOUTS = "sampler/zeroed_rollouts"
KEPT_GROUPS = "sampling/kept_groups"
FILTERED_FRACTION = "sampling/filtered_fraction"
EVAL_ACCURACY = "eval/accuracy"
TIME_ROLLOUT = "time/rollout"
TIME_TRAIN = "time/train"
#: Behaviour per step (stepwise.core.behaviour.behaviour_metrics, core.rewards, core.advantages).
REWARD_MIN = "sampler/reward_min"
REWARD_MAX = "sampler/reward_max"
TURNS_PER_ROLLOUT = "behaviour/turns_per_rollout"
TOOL_CALLS_PER_ROLLOUT = "behaviour/tool_calls_per_rollout"
SAMPLED_TOKENS_PER_ROLLOUT = "behaviour/sampled_tokens_per_rollout"
TRUNCATED_TURNS = "behaviour/truncated_turns_fraction"
ILL_FORMED_TURNS = "behaviour/ill_formed_turns_fraction"
ZERO_ADVANTAGE_GROUPS = "advantages/zero_groups_fraction"
ROLLOUT_DURATION_P50 = "time/rollout_duration_p50"
ROLLOUT_DURATION_P95 = "time/rollout_duration_p95"
ROLLOUT_STATUS_COUNTS = ("rollouts/num_ok", "rollouts/num_error", "rollouts/num_timeout")
#: Overlapped steps (``max_staleness`` 1; stepwise.core.staleness): policy versions between the
#: sampler and the trained policy, and how long the training session was busy and idle per step.
STALENESS_MEAN = "staleness/mean"
STALENESS_MAX = "staleness/max"
SESSION_BUSY = "time/session_busy"
SESSION_IDLE = "time/session_idle"
#: Deep asynchrony (admission group; stepwise.core.groups): the share of each step's wall time the
#: session is busy (what a user pays for), the trainer's wait for data and for stale groups, and the two
#: figures that must stay 0 (a trained rollout past max_staleness, a rollout discarded).
SESSION_BUSY_FRACTION = "session/busy_fraction"
TRAINER_WAIT = ("time/trainer_wait_data", "time/trainer_wait_stale")
MUST_STAY_ZERO = ("staleness/past_k", "rollouts/discarded")
#: The cost ledger (stepwise.core.ledger.close_step): the run's total and the step's cost in USD, by
#: part, and the training session's hours so far (emitted by Rebind, or ComputeAdvantages for a skipped step).
COST_TOTAL = "cost/total_usd"
COST_STEP = "cost/step_usd"
COST_PARTS = ("cost/session_usd", "cost/agent_usd", "cost/judge_usd", "cost/lambda_usd", "cost/step_functions_usd",
              "cost/s3_usd")
SESSION_HOURS = "cost/session_hours"
#: Published by this stack's metric filter on FinishRollout's logs (no run dimension: alarmable).
FAILED_ROLLOUTS = "rollouts/failed"
#: FinishRollout's Powertools log messages for a rollout that failed or whose reward was zeroed
#: (handlers/rollout.py ``finish``); the metric filter counts them.
FAILED_ROLLOUT_MESSAGES = ("rollout did not complete*", "reward zeroed*")

#: Published by this stack's metric filter on the session sweeper's logs: one per training session it
#: stopped because no execution drove it (stepwise.handlers.sweeper; the log message is SWEPT_MESSAGE).
SWEPT_SESSIONS = "sessions/swept"
SWEPT_SESSION_MESSAGE = "training session swept"

#: Functions whose invocations show that a run is busy (rollouts, polls, planning).
ACTIVITY_FUNCTIONS = ("PlanStep", "StartRollout", "FinishRollout", "PollSession", "PollOperation")
#: The function invoked once per completed training step.
STEP_FUNCTION = "SubmitTrain"


def per_run(metric_name: str, stat: str = "Average", period_s: int = 300, label: str = "") -> cw.MathExpression:
    """One line per run: ``SEARCH`` over the handlers' ``{Stepwise,run_id,service}`` metrics."""
    return cw.MathExpression(
        expression=f"SEARCH('{{{NAMESPACE},run_id,service}} MetricName=\"{metric_name}\"', '{stat}', {period_s})",
        using_metrics={},
        # A dynamic label: one legend entry per run id.
        label=f"{label or metric_name} " + "${PROP('Dim.run_id')}",
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
                 functions: Mapping[str, lambda_.IFunction], log_groups: Mapping[str, logs.ILogGroup],
                 gateway_function: lambda_.IFunction,
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
        # One count per failed rollout (FinishRollout runs once per rollout, ok or not).
        failed_filter = logs.MetricFilter(
            self, "FailedRollouts",
            log_group=log_groups["FinishRollout"],
            filter_pattern=logs.FilterPattern.any(
                *(logs.FilterPattern.string_value("$.message", "=", m) for m in FAILED_ROLLOUT_MESSAGES)),
            metric_namespace=NAMESPACE,
            metric_name=FAILED_ROLLOUTS,
            metric_value="1",
            default_value=0,
        )
        self.swept_sessions: cw.IMetric | None = None
        if "SweepSessions" in log_groups:
            self.swept_sessions = logs.MetricFilter(
                self, "SweptSessions",
                log_group=log_groups["SweepSessions"],
                filter_pattern=logs.FilterPattern.string_value("$.message", "=", SWEPT_SESSION_MESSAGE),
                metric_namespace=NAMESPACE,
                metric_name=SWEPT_SESSIONS,
                metric_value="1",
                default_value=0,
            ).metric(statistic="Sum", period=Duration.hours(1), label="training sessions swept (no execution drove them)")
        window = Duration.minutes(15)
        failure_rate = cw.MathExpression(
            expression="FILL(failed, 0) / IF(FILL(finished, 0) > 0, finished, 1)",
            using_metrics={"failed": failed_filter.metric(statistic="Sum", period=window),
                           "finished": functions["FinishRollout"].metric_invocations(statistic="Sum", period=window)},
            label="rollout failure rate (all runs)",
            period=window,
        )
        self.failure_rate = failure_rate
        self.rollout_failure_alarm = cw.Alarm(
            self, "RolloutFailureRate",
            alarm_description=(f"More than {rollout_failure_rate:.0%} of the rollouts finished in 15 minutes failed "
                               f"or had their reward zeroed (agent error, non-200 result, missing reward, timeout, "
                               f"throttling). FinishRollout's log group has each one with its reason."),
            metric=failure_rate,
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
            cw.GraphWidget(title="Mean reward per step (one line per run)", left=[per_run(MEAN_REWARD)],
                           right=[per_run(REWARD_MIN, "Minimum"), per_run(REWARD_MAX, "Maximum")], width=12),
            cw.GraphWidget(title="Eval accuracy", left=[per_run(EVAL_ACCURACY)], width=12),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Datums and kept groups per step",
                           left=[per_run(NUM_DATUMS, "Sum")], right=[per_run(KEPT_GROUPS, "Sum")], width=8),
            cw.GraphWidget(title="Step duration (s): rollouts, training",
                           left=[per_run(TIME_ROLLOUT), per_run(TIME_TRAIN)], stacked=True, width=8),
            cw.GraphWidget(title="Rollout failure rate (all runs) and zeroed rollouts per run",
                           left=[failure_rate], right=[per_run(ZEROED_ROLLOUTS, "Sum")], width=8,
                           left_annotations=[cw.HorizontalAnnotation(value=rollout_failure_rate, label="alarm")]),
        )
        # Agent behaviour beside the reward: reward hacking usually shows here first.
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Turns and tool calls per rollout (left), sampled tokens per rollout (right)",
                           left=[per_run(TURNS_PER_ROLLOUT), per_run(TOOL_CALLS_PER_ROLLOUT)],
                           right=[per_run(SAMPLED_TOKENS_PER_ROLLOUT)], width=6),
            cw.GraphWidget(title="Truncated and ill-formed turns, zero-advantage groups (fraction)",
                           left=[per_run(TRUNCATED_TURNS), per_run(ILL_FORMED_TURNS), per_run(ZERO_ADVANTAGE_GROUPS)],
                           left_y_axis=cw.YAxisProps(min=0, max=1), width=6),
            cw.GraphWidget(title="Rollout duration (s): p50, p95",
                           left=[per_run(ROLLOUT_DURATION_P50), per_run(ROLLOUT_DURATION_P95)], width=6),
            cw.GraphWidget(title="Rollouts per step by status (ok, error, timeout)",
                           left=[per_run(name, "Sum") for name in ROLLOUT_STATUS_COUNTS], stacked=True, width=6),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Gateway latency (ms, time to first byte)",
                           left=[gw_url_metric("UrlRequestLatency", "p50"), gw_url_metric("UrlRequestLatency", "p95")],
                           width=6),
            cw.GraphWidget(title="Gateway error rate (%)", left=[gateway_errors],
                           right=[gw_url_metric("UrlRequestCount", "Sum")], width=6),
            # max_staleness 1: how far behind the trained policy each step's datums were sampled, and
            # what the overlap bought (the billed session idle while rollouts run).
            cw.GraphWidget(title="Staleness (policy versions: mean, max) and session busy/idle (s) per step",
                           left=[per_run(STALENESS_MEAN), per_run(STALENESS_MAX, "Maximum")],
                           right=[per_run(SESSION_BUSY), per_run(SESSION_IDLE)], width=6),
            cw.GraphWidget(title="SageMaker operation latency (s)",
                           left=[per_run(TIME_TRAIN, "Average"), per_run(TIME_TRAIN, "Maximum")],
                           right=[functions[n].metric_duration(statistic="p95") for n in ("SubmitTrain", "PollOperation", "Rebind") if n in functions],
                           width=6),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Deep asynchrony: session busy fraction (left), trainer wait for data / stale "
                                 "groups (s, right)",
                           left=[per_run(SESSION_BUSY_FRACTION)], right=[per_run(n) for n in TRAINER_WAIT],
                           left_y_axis=cw.YAxisProps(min=0, max=1), width=12),
            cw.GraphWidget(title="Must stay 0: trained rollouts past max_staleness, rollouts discarded",
                           left=[per_run(n, "Sum") for n in MUST_STAY_ZERO], width=12),
        )
        # What the run has cost so far and what each step cost, by part (the cost ledger), beside the
        # training session's hours: what the budget limits (max_cost_usd, max_session_hours) bound.
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Cost so far (USD, left) and training session-hours (right), per run",
                           left=[per_run(COST_TOTAL, "Maximum")], right=[per_run(SESSION_HOURS, "Maximum")], width=12),
            cw.GraphWidget(title="Cost per step by part (USD): session, agent, Lambda, Step Functions, S3",
                           left=[per_run(name, "Sum") for name in COST_PARTS], stacked=True, width=12),
        )
        self.dashboard.add_widgets(
            cw.GraphWidget(title="Executions", left=[state_machine.metric_started(), state_machine.metric_succeeded(),
                                                     state_machine.metric_failed(), state_machine.metric_aborted(),
                                                     state_machine.metric_timed_out()], width=12),
            cw.GraphWidget(title="Lambda errors; training sessions the sweeper stopped (right)",
                           left=[f.metric_errors(label=n) for n, f in functions.items()],
                           right=[self.swept_sessions] if self.swept_sessions is not None else [], width=12),
            cw.AlarmStatusWidget(alarms=[self.stalled_alarm, self.rollout_failure_alarm], title="Alarms", width=24, height=3),
        )
