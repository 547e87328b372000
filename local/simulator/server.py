"""HTTP front of the simulator: one loopback port serves both wire protocols.

* ``sagemaker`` (JSON 1.1): ``POST /`` with ``X-Amz-Target: SageMaker.<Operation>``.
* ``sagemakertrainingsessionruntime`` (rest-json): the four operation routes of its botocore
  model (``/v1/training-sessions/{trainingSessionName}/operations[/{operationId}]`` and
  ``.../sampling-operations[/{operationId}]``).
* ``/_simulator/state`` (GET) and ``/_simulator/faults`` (POST ``{"faults": [...],
  "latency": {...}, "clear": bool, "serving": mode}``): counters, sessions (their statuses and the seconds each
  served, ``session_seconds``) and fault control for drills run from another process.

Errors carry the botocore error code in ``__type`` and ``x-amzn-ErrorType``.
Signatures are not checked.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any
from urllib.parse import unquote, urlsplit

from local._proc import LoopbackHTTPServer
from local.simulator.service import Simulator, check_serving
from local.simulator.validation import CONTROL, RUNTIME, ApiError, error

_ROUTES = [
    ("POST", re.compile(r"^/v1/training-sessions/(?P<trainingSessionName>[^/]+)/operations$"), "ExecuteTrainingOperation"),
    ("GET", re.compile(r"^/v1/training-sessions/(?P<trainingSessionName>[^/]+)/operations/(?P<operationId>[^/]+)$"), "GetTrainingOperationResult"),
    ("POST", re.compile(r"^/v1/training-sessions/(?P<trainingSessionName>[^/]+)/sampling-operations$"), "ExecuteSamplingOperation"),
    ("GET", re.compile(r"^/v1/training-sessions/(?P<trainingSessionName>[^/]+)/sampling-operations/(?P<operationId>[^/]+)$"), "GetSamplingOperationResult"),
]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go out as separate writes
    server: "SimulatorHTTPServer"

    def log_message(self, format: str, *args: Any) -> None:  # quiet by default
        if self.server.verbose:
            super().log_message(format, *args)

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, payload: dict[str, Any], content_type: str, error_code: str | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("x-amzn-RequestId", str(uuid.uuid4()))
        if error_code:
            self.send_header("x-amzn-ErrorType", error_code)
        self.end_headers()
        self.wfile.write(data)

    def _send_error(self, e: ApiError, content_type: str) -> None:
        self._send(e.status, {"__type": e.code, "message": e.message}, content_type, e.code)

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_GET(self) -> None:
        self._dispatch("GET")

    def _dispatch(self, method: str) -> None:
        sim = self.server.simulator
        body = self._body()
        path = urlsplit(self.path).path
        target = self.headers.get("X-Amz-Target")
        if target:
            ctype = "application/x-amz-json-1.1"
            operation = target.split(".", 1)[-1]
            try:
                params = json.loads(body or b"{}")
                self._send(200, sim.call(CONTROL, operation, params), ctype)
            except ApiError as e:
                self._send_error(e, ctype)
            except json.JSONDecodeError as e:
                self._send_error(error(CONTROL, "validation", f"request body is not JSON: {e}"), ctype)
            return
        if path.startswith("/_simulator/"):
            self._admin(method, path, body)
            return
        ctype = "application/json"
        for route_method, pattern, operation in _ROUTES:
            m = pattern.match(path)
            if m and route_method == method:
                try:
                    params = json.loads(body) if body else {}
                    params.update({k: unquote(v) for k, v in m.groupdict().items()})
                    self._send(200, sim.call(RUNTIME, operation, params), ctype)
                except ApiError as e:
                    self._send_error(e, ctype)
                except json.JSONDecodeError as e:
                    self._send_error(error(RUNTIME, "validation", f"request body is not JSON: {e}"), ctype)
                return
        self._send_error(ApiError("UnknownOperationException", f"no operation at {method} {path}", 404), ctype)

    def _admin(self, method: str, path: str, body: bytes) -> None:
        sim = self.server.simulator
        if method == "GET" and path == "/_simulator/state":
            self._send(
                200,
                {"counters": sim.counters, "sessions": sim.session_statuses(), "running_sessions": sim.running_sessions(),
                 "session_seconds": sim.session_seconds(), **sim.faults.describe()},
                "application/json",
            )
            return
        if method == "POST" and path == "/_simulator/faults":
            try:
                req = json.loads(body or b"{}")
                if req.get("clear"):
                    sim.faults.clear()
                for spec in req.get("faults", []):
                    sim.faults.add(spec)
                for target, seconds in (req.get("latency") or {}).items():
                    sim.faults.set_latency(target, float(seconds))
                for key in ("warmup_seconds", "binding_seconds", "sampling_contention_seconds"):
                    if key in req:
                        setattr(sim, key, float(req[key]))
                if "serving" in req:
                    sim.serving = check_serving(str(req["serving"]))
                for name in req.get("expire", []):
                    sim.expire_session(str(name))
            except (ValueError, TypeError) as e:
                self._send(400, {"message": str(e)}, "application/json")
                return
            self._send(200, sim.faults.describe(), "application/json")
            return
        self._send(404, {"message": f"no admin route {method} {path}"}, "application/json")


class SimulatorHTTPServer(LoopbackHTTPServer):
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], simulator: Simulator, verbose: bool = False) -> None:
        super().__init__(address, _Handler)
        self.simulator = simulator
        self.verbose = verbose


def serve_in_thread(server: SimulatorHTTPServer) -> threading.Thread:
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, name="sim-http", daemon=True)
    thread.start()
    return thread
