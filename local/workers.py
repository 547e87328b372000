"""Lambda handlers in worker processes: the local engine's dispatch off moto's GIL.

The run-local process hosts moto (S3, the Step Functions interpreter, Lambda). When the handlers
ran there too, every S3 request of a rollout was serialized and parsed on both sides under one
GIL (benchmarks/README.md section 5). ``WorkerPool`` starts ``n`` processes
(``python -m local.workers``), each a threaded HTTP server on loopback that runs the real handler
of ``stepwise.functions`` for each ``POST /invoke``, like a Lambda execution environment but with
many invocations at once (the Map's children share a few processes, as they shared one before).

Functions that produce what a person reads beside the loop (`stepwise.functions.FunctionSpec.beside_loop`:
Track) go to a process of their own started at a lower CPU priority (`BESIDE_LOOP_NICE`): on this
stack they share the machine's cores with the handlers, moto and the simulator, and a page rendered
at the loop's priority slowed its steps (Track took 8.5 s an invocation idle, about 50 s under load).

Each invocation carries the parent's environment (the stack's variables and endpoints, which the
parent may change between runs), so a worker never serves with a stale one. Handlers registered
with a callable (tests) are not sent here: they run in-process, as before. No handler here reaches
AWS: a request to a host that is not loopback fails (`local.no_aws`).
"""

from __future__ import annotations

import argparse
import http.client
import importlib
import itertools
import json
import os
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from typing import Any

from local._proc import LoopbackHTTPServer, await_listening, die_with_parent, service_env, shared_line_log, stop_process

_LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
#: Environment variable: worker processes for run-local's handlers (0 = in-process).
ENV_WORKERS = "STEPWISE_LOCAL_WORKERS"
DEFAULT_WORKERS = 2
#: The niceness of the process that runs the functions beside the loop (0 = the loop's, 19 = the lowest).
#: 10 gives it about a tenth of a core's share against one busy loop process (Linux CFS weights 110 vs
#: 1,024), so a Track invocation of 8.5 s still ends well inside its 300 s when the loop keeps both cores busy.
BESIDE_LOOP_NICE = 10
#: Environment variable: that niceness (an integer 0..19; ``0`` = no process of its own: the functions beside
#: the loop share the loop's workers, as before).
ENV_BESIDE_LOOP_NICE = "STEPWISE_LOCAL_BESIDE_LOOP_NICE"


def beside_loop_nice_from_env() -> int:
    """``STEPWISE_LOCAL_BESIDE_LOOP_NICE`` (0..19), else `BESIDE_LOOP_NICE`."""
    raw = os.environ.get(ENV_BESIDE_LOOP_NICE)
    return BESIDE_LOOP_NICE if raw in (None, "") else max(0, min(19, int(raw)))


def workers_from_env() -> int:
    """``STEPWISE_LOCAL_WORKERS`` (an integer >= 0), else 2."""
    return max(0, int(os.environ.get(ENV_WORKERS) or DEFAULT_WORKERS))


class WorkerPool:
    """``n`` worker processes, spawned at construction; ``call`` sends one invocation to the next
    one (round robin), after `wait`.

    Args:
        n: processes to start (>= 1) for the loop's functions.
        log_path: where their stdout/stderr go (the handlers' Powertools lines); None = inherit.
        timeout: seconds to wait for each process to listen.
        nice: start one more process, ``nice`` steps of niceness below this one's, for the functions beside
            the loop (``call(..., beside_loop=True)``); 0 = none (they share the loop's workers). Default
            `beside_loop_nice_from_env`.
    """

    def __init__(self, n: int, *, log_path: str | None = None, timeout: float = 60.0,
                 nice: int | None = None) -> None:
        nice = beside_loop_nice_from_env() if nice is None else nice
        # one writer of the file for every worker: their stdout and stderr come through one pipe each,
        # line by line (local._proc.LineLog), never two buffers flushing into one file
        self._log = shared_line_log(log_path) if log_path else None
        self.procs: list[subprocess.Popen] = []
        self.ports: list[int] = []
        self._timeout = timeout
        self._lock = threading.Lock()
        self._next: Any = None
        self._n = max(1, n)
        self._beside = nice > 0
        try:
            for _ in range(self._n):  # they import in parallel
                self._spawn()
            if self._beside:
                self._spawn(nice=nice)
        except Exception:
            self.stop()
            raise

    def wait(self) -> "WorkerPool":
        """Block until every worker listens (their imports take seconds: spawn early, wait late).
        Raises RuntimeError (after stopping them) when one exits first or stays silent too long."""
        with self._lock:
            if self._next is None:
                try:
                    self.ports = [int(await_listening(proc, _LISTENING, what="Lambda worker", timeout=self._timeout,
                                                      log=self._log, log_before=True).group(1)) for proc in self.procs]
                except Exception:
                    self.stop()
                    raise
                self._next = itertools.cycle(range(self._n))
        return self

    def _spawn(self, nice: int = 0) -> None:
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `local` importable from anywhere
        env = {**service_env(), "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p),
               "PYTHONUNBUFFERED": "1"}  # each line leaves the worker as one write, not a block-buffer split
        proc = subprocess.Popen([sys.executable, "-m", "local.workers", "--port", "0",
                                 *(["--beside-loop"] if nice else [])], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT if self._log else None, text=True)
        self.procs.append(proc)
        if nice:  # relative to this process (run-local may itself run under `nice`)
            os.setpriority(os.PRIO_PROCESS, proc.pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))

    def call(self, handler_path: str, event: Any, context: dict[str, Any], timeout_s: float, *,
             beside_loop: bool = False) -> tuple[bytes, str | None, float, float]:
        """Run ``handler_path`` on ``event`` in a worker (``beside_loop``: the low-priority one); returns
        (payload bytes, error kind or None, measured peak MB, the handler's own seconds in the worker), as
        `local.engine.run_handler` does in-process (limits included)."""
        self.wait()
        with self._lock:
            port = self.ports[-1] if beside_loop and self._beside else self.ports[next(self._next)]
        body = json.dumps({"handler": handler_path, "event": event, "context": context,
                           "env": dict(os.environ)}, default=str).encode()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s + 30)
        try:
            conn.request("POST", "/invoke", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            error = resp.getheader("X-Function-Error") or None
            return (resp.read(), error, float(resp.getheader("X-Peak-MB") or 0.0),
                    float(resp.getheader("X-Handler-Seconds") or 0.0))
        finally:
            conn.close()

    def stop_beside_loop(self) -> bool:
        """Stop the process of the functions beside the loop, whatever it is running (its invocations then fail
        with an OSError); the loop's workers go on. Returns whether there was one to stop."""
        if not self._beside or not self.procs:
            return False
        stop_process(self.procs[-1], None, timeout=5)
        return True

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc, None, timeout=5)
        if self._log is not None:
            self._log.close()
            self._log = None


# ---------------------------------------------------------------------------------- the worker

_ENV_LOCK = threading.Lock()
_HANDLERS: dict[str, Any] = {}


def _handler(path: str) -> Any:
    if path not in _HANDLERS:
        module_name, _, attr = path.rpartition(".")
        _HANDLERS[path] = getattr(importlib.import_module(module_name), attr)
    return _HANDLERS[path]


def _apply_env(env: dict[str, str]) -> None:
    with _ENV_LOCK:
        for key, value in env.items():
            if os.environ.get(key) != value:
                os.environ[key] = value


class _Invoke(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802 (http.server's name)
        from local.dispatch import LambdaContext, run_handler

        req = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        _apply_env(req.get("env") or {})
        c = req["context"]
        ctx = LambdaContext(c["function_name"], c["memory_limit_in_mb"], c["invoked_function_arn"], c["timeout_s"])
        t0 = time.monotonic()
        payload, error, peak = run_handler(c["function_name"], _handler(req["handler"]), req["event"], ctx)
        seconds = time.monotonic() - t0  # the invocation itself, as Lambda would bill it (no hand-off)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.send_header("X-Peak-MB", f"{peak:.1f}")
        self.send_header("X-Handler-Seconds", f"{seconds:.6f}")
        if error:
            self.send_header("X-Function-Error", error)
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:  # one line per invocation: keep quiet
        pass


def _warm(beside_loop: bool = False) -> None:
    """Import every handler of ``stepwise.functions`` before listening (``beside_loop``: only the
    functions beside the loop, which is all that process serves): the stack spawns the workers early, so
    the first rollouts do not wait for pydantic, boto3 and Powertools to import."""
    from stepwise import functions

    import local.engine  # noqa: F401  (run_handler, LambdaContext)

    for spec in functions.FUNCTIONS:
        if beside_loop and not spec.beside_loop:
            continue
        try:
            _handler(spec.handler)
        except Exception as exc:  # an import error surfaces on the invocation, as in Lambda
            print(f"could not import {spec.handler}: {exc!r}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a local Lambda worker (run by local.workers.WorkerPool)")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--beside-loop", action="store_true", help="serve the functions beside the loop (Track)")
    args = parser.parse_args(argv)
    die_with_parent()
    from local.no_aws import install

    install()  # a handler whose client missed its emulator's endpoint fails saying so, never reaching AWS
    _warm(args.beside_loop)
    server = LoopbackHTTPServer(("127.0.0.1", args.port), _Invoke)
    print(f"stepwise lambda worker listening on http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
