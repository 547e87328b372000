"""`stepwise simulator`: run the SageMaker Training Sessions simulator until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--port", type=int, default=8765, help="loopback port (0 = any free port; default 8765)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--region", default="us-west-2")
    parser.add_argument("--result-wait", type=float, default=5.0, help="seconds Get*OperationResult waits for completion (default 5)")
    parser.add_argument("--session-start-seconds", type=float, default=0.0, help="seconds a new session stays Created")
    parser.add_argument("--session-stop-seconds", type=float, default=0.0, help="seconds a stopped session stays Stopping")
    parser.add_argument("--session-start", choices=("ok", "hang", "fail"), default="ok", help="hang: never reaches Running; fail: ends Failed")
    parser.add_argument("--warmup-seconds", type=float, default=0.0,
                        help="seconds a Running session's runtime still answers 503 (warming up; default 0)")
    parser.add_argument("--binding-seconds", type=float, default=0.0,
                        help="seconds sampling a just-saved model package answers 503 (binding; default 0)")
    parser.add_argument(
        "--fault", action="append", default=[], metavar="KIND:TARGET:N|RATE|SECONDSs",
        help="inject a fault, e.g. throttle:ExecuteTrainingOperation:3, internal:GetSamplingOperationResult:0.1, "
             "unavailable:ExecuteSamplingOperation:4s, fail:optim_step:1, expire:DescribeTrainingSession:1",
    )
    parser.add_argument(
        "--latency", action="append", default=[], metavar="TARGET=SECONDS",
        help="delay an operation kind or API, e.g. optim_step=0.5 or sample=0.05",
    )
    parser.add_argument("--serving", choices=("several", "latest", "switching", "disturbing"), default="several",
                        help="what a session samples once it loaded new weights: several (the package named, "
                             "default), latest (only the package loaded last; refuses others), switching (the "
                             "package loaded last, whatever is named), disturbing (a load spoils samples in flight)")
    parser.add_argument("--sampling-contention-seconds", type=float, default=0.0,
                        help="added to each sampling operation that runs while a training operation runs (default 0)")
    parser.add_argument("--fault-seed", type=int, default=0)
    parser.add_argument("--state-dir", default=None, help="keep model packages here across restarts (default: memory only)")
    parser.add_argument("-v", "--verbose", action="store_true", help="log every request")


def _latency(specs: list[str]) -> dict[str, float]:
    out = {}
    for spec in specs:
        target, sep, seconds = spec.partition("=")
        if not sep:
            raise SystemExit(f"--latency {spec!r}: expected TARGET=SECONDS, e.g. optim_step=0.5")
        out[target] = float(seconds)
    return out


def run(args: argparse.Namespace) -> int:
    from local._proc import die_with_parent
    from local.simulator import start_simulator

    die_with_parent()  # started by a local stack: ends with it (a no-op when started by hand)

    handle = start_simulator(
        port=args.port,
        host=args.host,
        faults=args.fault,
        latency=_latency(args.latency),
        verbose=args.verbose,
        region=args.region,
        result_wait_seconds=args.result_wait,
        session_start_seconds=args.session_start_seconds,
        session_stop_seconds=args.session_stop_seconds,
        session_start=args.session_start,
        warmup_seconds=args.warmup_seconds,
        binding_seconds=args.binding_seconds,
        fault_seed=args.fault_seed,
        state_dir=args.state_dir,
        serving=args.serving,
        sampling_contention_seconds=args.sampling_contention_seconds,
    )
    print(f"# SageMaker Training Sessions simulator on {handle.url} (base model: stepwise-tiny)")
    print("# Point the SDK and boto3 at it:")
    for line in handle.export_lines():
        print(line)
    print("# Ctrl-C to stop.", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        while not done.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        handle.stop()
        print("# simulator stopped", file=sys.stderr)
    return 0
