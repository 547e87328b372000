"""`stepwise stop RUN [--wait SECONDS]`: stop a run's execution and make sure its training session stops.

``StopExecution`` ends the run's running execution (the first one or a continuation). A
stopped execution runs no ``Catch``, so the stack's EventBridge rule runs the Cleanup Lambda,
which stops the training session. This command then confirms it: it polls
``DescribeTrainingSession`` for up to ``--wait`` seconds (default 60), and if the session is
still not stopping it stops it itself (``ServiceClient.stop_session``, as the pipeline does) and
says so. A billed session is never left running by a successful `stepwise stop`.

Exit code 0 when the session is stopping or stopped (or was never created), 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from stepwise_cli.commands._runs import (
    EXIT_FAILED,
    EXIT_OK,
    CommandError,
    Deployment,
    add_stack_arguments,
    deployment,
    run_config,
    run_executions,
    run_state,
)

#: Session statuses that need no stopping (sagemaker DescribeTrainingSession).
STOPPED_STATUSES = frozenset({"Stopping", "Stopped", "Failed", "Deleting", "Deleted", "DeletionFailed"})


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (the execution name)")
    parser.add_argument("--wait", type=float, default=60.0,
                        help="seconds to wait for the Cleanup Lambda to stop the session before stopping it here "
                             "(default 60)")
    parser.add_argument("--cause", default="stopped with `stepwise stop`", help="cause recorded on the execution")
    from stepwise_cli.grammar import add_json

    add_json(parser, "{run_id, stopped_executions, session, status, stopped_here}")
    add_stack_arguments(parser)


def session_status(region: str, session_name: str) -> str:
    """DescribeTrainingSession status ('NotFound' when the session does not exist)."""
    from botocore.exceptions import ClientError

    from stepwise.aws import sagemaker

    try:
        return sagemaker.describe_session(sagemaker.control_plane(region), session_name)[0]
    except ClientError as e:
        if e.response.get("Error", {}).get("Code") in ("ResourceNotFound", "ValidationException"):
            return "NotFound"
        raise


def stop_execution(dep: Deployment, run_id: str, cause: str) -> list[str]:
    """StopExecution of every running execution of the run; returns the stopped ARNs."""
    stopped = []
    for e in run_executions(dep, run_id):
        if e["status"] == "RUNNING":
            dep.sfn.stop_execution(executionArn=e["executionArn"], error="StoppedByUser", cause=cause)
            stopped.append(e["executionArn"])
    return stopped


def ensure_session_stopped(dep: Deployment, run_id: str, *, wait: float, poll: float = 2.0) -> dict[str, Any]:
    """Wait up to ``wait`` seconds for the run's session to be stopping, else stop it.

    Returns ``{"session": name or None, "status": last status, "stopped_here": bool}``.
    """
    from stepwise.aws import sagemaker
    from stepwise.config import RunConfig

    state = run_state(dep, run_id)
    raw_cfg = run_config(dep, run_id)
    if state is None or raw_cfg is None:
        return {"session": None, "status": "NotCreated", "stopped_here": False}
    cfg = RunConfig.model_validate(raw_cfg)
    name = state["training_session_name"]
    deadline = time.monotonic() + wait
    status = session_status(cfg.region, name)
    while status not in STOPPED_STATUSES and status != "NotFound" and time.monotonic() < deadline:
        time.sleep(min(poll, max(0.0, deadline - time.monotonic())))
        status = session_status(cfg.region, name)
    if status in STOPPED_STATUSES or status == "NotFound":
        return {"session": name, "status": status, "stopped_here": False}
    sagemaker.stop_session(cfg, name)
    return {"session": name, "status": session_status(cfg.region, name), "stopped_here": True}


def run(args: argparse.Namespace) -> int:
    dep = deployment(args)
    executions = run_executions(dep, args.run)
    if not executions and run_state(dep, args.run) is None:
        raise CommandError(f"no run {args.run!r}: no execution of that name and no runs/{args.run}/state.json "
                           f"in s3://{dep.bucket}")
    stopped = stop_execution(dep, args.run, args.cause)
    say = (lambda line: None) if args.json else print
    if stopped:
        for arn in stopped:
            say(f"stopped execution {arn}")
    else:
        newest = executions[-1]["status"] if executions else "none"
        say(f"no running execution of run {args.run} (newest: {newest})")
    result = ensure_session_stopped(dep, args.run, wait=args.wait if stopped else 0.0)
    code = EXIT_OK if result["session"] is None or result["status"] in STOPPED_STATUSES or \
        result["status"] == "NotFound" else EXIT_FAILED
    if args.json:
        print(json.dumps({"run_id": args.run, "stopped_executions": stopped, **result}, default=str))
        return code
    if result["session"] is None:
        print("no training session was created for this run")
        return EXIT_OK
    if result["stopped_here"]:
        print(f"training session {result['session']} was still running after {args.wait:g}s; "
              f"stopped it here (StopTrainingSession): now {result['status']}")
    else:
        print(f"training session {result['session']}: {result['status']}")
    return EXIT_OK if result["status"] in STOPPED_STATUSES or result["status"] == "NotFound" else EXIT_FAILED
