"""What the operator commands share: finding the deployment, a run's executions, its summaries.

A run is identified by its run id. Its first execution is named after it; a continuation
(continue-as-new, `stepwise.executions.continuation_name`) is named ``{run_id[:70]}--{n}``.
Everything else about a run is in the bucket: ``runs/{run_id}/state.json``, ``config.json``,
``steps/{step}/summary.json`` and ``evals/{step}/summary.json`` (docs/internals.md).

Kept light on purpose (boto3 and the stdlib only): `stepwise runs` and `stepwise --help` must not
pay for torch, the SDK or mlflow.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from stepwise import layout
from stepwise.executions import belongs_to, run_id_problem
from stepwise.stackinfo import StackInfo, StackNotFound, resolve

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


class CommandError(RuntimeError):
    """A problem the user must fix; printed without a traceback, exit code 1."""


# ------------------------------------------------------------------------------ arguments


def add_stack_arguments(parser: argparse.ArgumentParser) -> None:
    """``--stack``, ``--bucket``, ``--state-machine-arn``, ``--region`` (see `stepwise.stackinfo`)."""
    g = parser.add_argument_group("deployment (default: outputs of the CloudFormation stack 'Stepwise')")
    g.add_argument("--stack", help="CloudFormation stack name (env STEPWISE_STACK; default Stepwise)")
    g.add_argument("--bucket", help="run bucket (env STEPWISE_BUCKET; default: the stack's output)")
    g.add_argument("--state-machine-arn", help="training loop ARN (env STEPWISE_STATE_MACHINE_ARN)")
    g.add_argument("--region", help="AWS region of the stack (default: your AWS configuration)")


@dataclass
class Deployment:
    """The deployment and its boto3 clients."""

    info: StackInfo
    sfn: Any
    s3: Any

    @property
    def bucket(self) -> str:
        return self.info.bucket

    @property
    def state_machine_arn(self) -> str:
        return self.info.state_machine_arn


def deployment(args: argparse.Namespace) -> Deployment:
    """Resolve the deployment from the arguments; raises CommandError when it cannot be found."""
    import boto3

    try:
        info = resolve(stack_name=args.stack, bucket=args.bucket, state_machine_arn=args.state_machine_arn,
                       region=args.region)
    except StackNotFound as e:
        raise CommandError(str(e)) from None
    region = args.region or info.region or None
    return Deployment(info, boto3.client("stepfunctions", region_name=region), boto3.client("s3", region_name=region))


def validate_run_id(run_id: str) -> str:
    """``run_id`` if it is usable (`stepwise.executions.run_id_problem`); else CommandError naming the rule."""
    problem = run_id_problem(run_id)
    if problem is not None:
        raise CommandError(problem)
    return run_id


# ------------------------------------------------------------------------------ executions


def list_executions(sfn: Any, state_machine_arn: str, *, limit: int | None = None) -> list[dict[str, Any]]:
    """Executions of the state machine, newest first (``limit`` stops paging early)."""
    out: list[dict[str, Any]] = []
    kwargs: dict[str, Any] = {"stateMachineArn": state_machine_arn, "maxResults": 1000}
    while True:
        page = sfn.list_executions(**kwargs)
        out.extend(page.get("executions", []))
        token = page.get("nextToken")
        if not token or (limit is not None and len(out) >= limit):
            break
        kwargs["nextToken"] = token
    out.sort(key=lambda e: e["startDate"], reverse=True)
    return out if limit is None else out[:limit]


def run_executions(dep: Deployment, run_id: str) -> list[dict[str, Any]]:
    """The run's executions, oldest first (the first one, then its continuations)."""
    mine = [e for e in list_executions(dep.sfn, dep.state_machine_arn) if belongs_to(e["name"], run_id)]
    return sorted(mine, key=lambda e: e["startDate"])


def current_state_name(sfn: Any, execution_arn: str) -> str | None:
    """The state the execution entered last (from its history, newest event first)."""
    try:
        kwargs: dict[str, Any] = {"executionArn": execution_arn, "reverseOrder": True, "maxResults": 100}
        page = sfn.get_execution_history(**kwargs)
        events = list(page.get("events", []))
        # An engine that ignores reverseOrder (moto) returns the oldest events first: read them all.
        while len(events) > 1 and events[0]["id"] < events[-1]["id"] and page.get("nextToken"):
            page = sfn.get_execution_history(**kwargs, nextToken=page["nextToken"])
            events.extend(page.get("events", []))
    except Exception:  # history is a nicety; never fail the view on it
        return None
    for ev in sorted(events, key=lambda e: e["id"], reverse=True):
        det = ev.get("stateEnteredEventDetails")
        if det:
            return det.get("name")
    return None


def console_url(execution_arn: str) -> str:
    """The Step Functions console page of an execution."""
    region = execution_arn.split(":")[3] if execution_arn.count(":") > 4 else "us-east-1"
    return f"https://{region}.console.aws.amazon.com/states/home?region={region}#/v2/executions/details/{execution_arn}"


def execution_lines(run_id: str, execution_arn: str) -> list[str]:
    """The lines `stepwise start` and `stepwise resume` end with: the execution they started (or
    redrove), its console page, and how to follow the run."""
    return [f"  execution  {execution_arn}", f"  console    {console_url(execution_arn)}",
            f"  follow it  stepwise watch {run_id}"]


# ------------------------------------------------------------------------------ S3 objects


def get_json(s3: Any, bucket: str, key: str) -> Any | None:
    """The JSON object at ``key``, or None when it does not exist."""
    from botocore.exceptions import ClientError

    try:
        return json.loads(s3.get_object(Bucket=bucket, Key=key)["Body"].read())
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
            return None
        raise


def run_state(dep: Deployment, run_id: str) -> dict[str, Any] | None:
    return get_json(dep.s3, dep.bucket, layout.state_key(run_id))


def run_config(dep: Deployment, run_id: str) -> dict[str, Any] | None:
    return get_json(dep.s3, dep.bucket, layout.config_key(run_id))


def failure_message(cause: Any) -> str:
    """An execution's cause as an operator reads it: a Lambda error's cause is the JSON
    ``{"errorType", "errorMessage", "stackTrace"}``, whose message is what the handler said (the
    counts and causes of a ``RolloutsFailed``); any other cause is returned as it is."""
    text = str(cause or "")
    try:
        body = json.loads(text)
    except ValueError:
        return text
    return str(body["errorMessage"]) if isinstance(body, dict) and "errorMessage" in body else text


def run_weights(state: dict[str, Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """``(checkpoints, final weights)`` of a ``state.json`` body, each a dict with ``step``, ``kind``,
    ``reason`` and ``model_package_arn`` (`stepwise.core.phases.final_weights`; ``None`` when no step was
    trained), a checkpoint also ``deleted`` (retention ``best_and_last`` deleted its model package). Fields this version does not know are ignored, so an older CLI reads a newer state."""
    from stepwise.core.phases import final_weights
    from stepwise.records import RunState

    if not state:
        return [], None
    known = RunState.model_validate({k: v for k, v in state.items() if k in RunState.model_fields})
    fields = {"step", "kind", "reason", "model_package_arn"}
    final = final_weights(known)
    gone = set(known.deleted_packages)  # a state written before checkpoints carried the mark lists them here
    checkpoints = [{**c.model_dump(include=fields), "deleted": c.deleted or c.model_package_arn in gone}
                   for c in known.checkpoints]
    return checkpoints, (final.model_dump(include=fields) if final else None)


# The run's best model, said as the report page says it (`stepwise.views.summary`, the read side's one home).
from stepwise.views.summary import best_model, best_text  # noqa: E402,F401


def checkpoint_text(c: dict[str, Any]) -> str:
    gone = " [deleted by keep_model_packages best_and_last: it no longer exists]" if c.get("deleted") else ""
    return f"step {c['step']} {c['kind']} ({c.get('reason') or '-'}): {c['model_package_arn']}{gone}"


def checkpoint_lines(checkpoints: list[dict[str, Any]], final: dict[str, Any] | None) -> list[str]:
    """``  checkpoint: ...`` per checkpoint, then ``  final weights: ...`` unless ``final`` is None
    (`run_weights`' pair)."""
    lines = [f"  checkpoint: {checkpoint_text(c)}" for c in checkpoints]
    if final is not None:
        lines.append(f"  final weights: {checkpoint_text(final)}")
    return lines


def weights_lines(state: dict[str, Any] | None, region: str) -> list[str]:
    """The lines a run's report ends with: each checkpoint, the best model package (`best_model`) and
    the model packages retention deleted, then the final weights' model package ARN and how to sample
    or deploy it (`stepwise.core.operations.weights_usage`)."""
    from stepwise.core.operations import weights_usage

    checkpoints, final = run_weights(state)
    lines = checkpoint_lines(checkpoints, final)
    best = best_model(state)
    if best is not None:
        lines.insert(len(checkpoints), f"  best model: {best_text(best)}")
    deleted = (state or {}).get("deleted_packages") or []
    if deleted:
        lines.insert(len(checkpoints), f"  deleted by keep_model_packages best_and_last: {len(deleted)} model "
                                       f"package(s): {', '.join(deleted)}")
    if (state or {}).get("eval_only"):
        lines.append(f"  evaluated: {(state or {}).get('sampler_model_package_arn') or 'the base model'}")
        return lines
    if final is None:
        lines.append("  final weights: none (no optimizer step was applied; the sampler is still the base model)")
        return lines
    lines += [f"    {line}" for line in weights_usage(final["model_package_arn"], region).splitlines()]
    return lines


def step_folders(s3: Any, bucket: str, prefix: str) -> list[int]:
    """The numeric sub-folders of ``prefix`` (``.../steps/0/``, ``.../steps/1/``, ...), sorted."""
    out: list[int] = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix, Delimiter="/"):
        for cp in page.get("CommonPrefixes", []):
            name = cp["Prefix"][len(prefix):].rstrip("/")
            if name.isdigit():
                out.append(int(name))
    return sorted(out)


# ------------------------------------------------------------------------------ metrics


def metric(summary: dict[str, Any] | None, *names: str) -> float | None:
    """The first of ``names`` that holds a number in the summary (booleans are not numbers)."""
    if not summary:
        return None
    for n in names:
        v = summary.get(n)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return float(v)
    return None


def mean_reward(summary: dict[str, Any] | None) -> float | None:
    """``sampler/mean_reward`` (the reference's name) of a step summary."""
    return metric(summary, "sampler/mean_reward", "reward/mean")


def eval_accuracy(summary: dict[str, Any] | None) -> float | None:
    """``eval/accuracy`` (the unnamed eval set's mean reward), else the first named set's
    (``eval/NAME/accuracy``, a run with named eval sets only)."""
    value = metric(summary, "eval/accuracy")
    if value is None and summary and isinstance(summary.get("eval_sets"), list) and summary["eval_sets"]:
        value = metric(summary, f"eval/{summary['eval_sets'][0]}/accuracy")
    return value


class BehaviourMetric(NamedTuple):
    """A behaviour metric of a step summary, as `stepwise watch` prints it and the plot draws it.

    ``title`` and ``spec``: its column in the watch table and the number's format (None: not a
    column); ``label`` and ``axis``: its line in the plot's second panel, ``count`` = per-rollout
    amounts and seconds (left axis, symlog), ``fraction`` = 0..1 (right axis).
    """

    key: str
    title: str | None
    spec: str | None
    label: str
    axis: Literal["count", "fraction"]


#: The behaviour metrics (`stepwise.core.behaviour`, ``zero_adv`` from `stepwise.core.advantages`,
#: ``stale`` = policy versions between the sampler and the trained policy, mean over the step's
#: datums, from `stepwise.core.staleness`: 0 on-policy, at most ``max_staleness``),
#: in the order of the table's columns and of the plot's lines (and colours). Fractions print as
#: fractions (0.25, not 25%). ``rollouts/failed_fraction`` is derived (error + timeout rollouts of
#: all, `stepwise_cli.plot.behaviour_curves`); the table shows the two counts as ``err/to``.
BEHAVIOUR_METRICS = (
    BehaviourMetric("behaviour/turns_per_rollout", "turns", ".2f", "turns / rollout", "count"),
    BehaviourMetric("behaviour/tool_calls_per_rollout", "tools", ".2f", "tool calls / rollout", "count"),
    BehaviourMetric("behaviour/sampled_tokens_per_rollout", "tokens", ".1f", "sampled tokens / rollout", "count"),
    BehaviourMetric("time/rollout_duration_p50", "p50_s", ".1f", "rollout p50 (s)", "count"),
    BehaviourMetric("time/rollout_duration_p95", "p95_s", ".1f", "rollout p95 (s)", "count"),
    BehaviourMetric("behaviour/truncated_turns_fraction", "trunc", ".2f", "truncated turns", "fraction"),
    BehaviourMetric("behaviour/ill_formed_turns_fraction", "illf", ".2f", "ill-formed turns", "fraction"),
    BehaviourMetric("advantages/zero_groups_fraction", "zero_adv", ".2f", "zero-advantage groups", "fraction"),
    BehaviourMetric("staleness/mean", "stale", ".2f", "staleness (policy versions)", "count"),
    BehaviourMetric("rollouts/failed_fraction", None, None, "error + timeout rollouts", "fraction"),
)


def step_seconds(summary: dict[str, Any] | None) -> float | None:
    """Rollout plus training time of a step (``time/rollout`` + ``time/train``) when reported."""
    parts = [metric(summary, "time/rollout"), metric(summary, "time/train")]
    known = [p for p in parts if p is not None]
    return sum(known) if known else None


def fmt(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return EXIT_FAILED


def load_config(path: str | Path, sets: list[str] | None = None, *, warnings: list[str] | None = None) -> Any:
    """The run config of file ``path`` (JSON or YAML) with ``--set FIELD=JSON`` values (`stepwise_cli.grammar.
    parse_sets`) in place of its fields, validated (`stepwise.config.load_run_config`: every problem at once).

    Raises:
        stepwise.config.ConfigError: the file cannot be read, or the config with its overrides is invalid
            (the message names the file).
        stepwise_cli.grammar.UsageError: a ``--set`` without ``FIELD=``.
    """
    from stepwise.config import ConfigError, load_run_config, read_config_file
    from stepwise_cli.grammar import parse_sets

    overrides = parse_sets(sets)
    if not overrides:
        return load_run_config(path, warnings=warnings)
    raw = read_config_file(path)
    if not isinstance(raw, dict):
        return load_run_config(path, warnings=warnings)  # its own error, naming the file
    try:
        return load_run_config({**raw, **overrides}, warnings=warnings)
    except ConfigError as e:
        raise ConfigError(e.errors, f"{path} with --set") from None
