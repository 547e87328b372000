"""ACR emulator: ``InvokeAgentRuntime`` on loopback, in front of real ``AgentCoreRLApp`` agents.

Wire format (botocore ``bedrock-agentcore`` 2024-02-28, rest-json): ``POST
/runtimes/{agentRuntimeArn}/invocations`` (the ARN URL-encoded in the path, optional
``?qualifier=``), body = the payload, session id in the
``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`` header (echoed back); the response body
streams the agent's answer with its ``Content-Type``. Errors are ``{"message": ...}``
with ``X-Amzn-ErrorType``: ThrottlingException (429), ResourceNotFoundException (404),
ValidationException (400), RuntimeClientError (424: the agent answered non-2xx or could not
be reached), InternalServerException (500). boto3 reaches the emulator through
``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE``.

Behind it, one agent app per runtime ARN, each served as an ACR container would be
(``python -m local.agents.serve MODULE:ATTR`` -- POST /invocations, GET /ping) in its own
process on an inherited loopback socket. A runtime ARN ``.../runtime/NAME-SUFFIX`` with no
explicit mapping resolves to ``local.agents.NAME:app`` (e.g. ``runtime/toy_agent-local`` ->
``local/agents/toy_agent.py``).

``GetAgentRuntime`` (botocore ``bedrock-agentcore-control``: ``GET /runtimes/{agentRuntimeId}/``,
region from the request's SigV4 credential scope; boto3 reaches it through
``AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL``) answers for the runtimes the emulator hosts: the
mapped ARNs, and (``autostart``) ``runtime/NAME-...`` of the emulator's own region and account
whose ``local.agents.NAME`` module exists; others get ResourceNotFoundException (404).

As ACR behind the stack's IAM grant would, ``InvokeAgentRuntime`` is refused with
AccessDeniedException (403) for a runtime outside ``allowed_runtime_arns`` (or, when that is
empty, outside the emulator's region and account: the stack grants ``runtime/*`` of its own
region), and with ResourceNotFoundException (404) for a runtime it does not host; neither starts
an agent. Like ACR, invokes above ``tps_limit`` per second (per runtime) are throttled. Faults can be
injected (``Faults`` / ``inject``): throttle the next N calls, fail them with a 500, accept
them but never produce a result (the agent is not called), or accept them and write a
malformed / ``status_code`` 500 result object at the toolkit's result key.
"""

from __future__ import annotations

import asyncio
import collections
import fnmatch
import importlib.util
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import unquote

from local._proc import stop_process

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
ERROR_TYPE_HEADER = "X-Amzn-ErrorType"
_STATUS = {
    "ThrottlingException": 429,
    "ResourceNotFoundException": 404,
    "AccessDeniedException": 403,
    "ValidationException": 400,
    "RuntimeClientError": 424,
    "InternalServerException": 500,
}


def runtime_id_of(arn: str) -> str:
    """``ID`` of ``...:runtime/ID``; '' when the ARN names no runtime."""
    _, sep, resource = arn.partition(":runtime/")
    return resource.split("/", 1)[0] if sep else ""


def _module_exists(spec: str) -> bool:
    try:
        return importlib.util.find_spec(spec.split(":", 1)[0]) is not None
    except (ImportError, ValueError):
        return False


def signed_region(authorization: str) -> str:
    """The region of a SigV4 ``Authorization`` header's credential scope
    (``Credential=AKID/DATE/REGION/SERVICE/aws4_request``); '' when absent."""
    _, sep, rest = authorization.partition("Credential=")
    parts = rest.split(",", 1)[0].split("/") if sep else []
    return parts[2] if len(parts) >= 5 else ""


def agent_spec_for_arn(arn: str) -> str:
    """The default agent module for a runtime ARN: ``runtime/NAME-...`` -> ``local.agents.NAME:app``.

    Raises:
        ValueError: the ARN has no ``runtime/`` resource.
    """
    _, sep, resource = arn.partition(":runtime/")
    if not sep or not resource:
        raise ValueError(f"not an AgentCore runtime ARN (expected ...:runtime/NAME-ID): {arn!r}")
    return f"local.agents.{resource.split('-', 1)[0]}:app"


@dataclass
class Faults:
    """Counts of the next invocations to fail, each kind consumed in this order.

    Attributes:
        throttle: answered 429 ThrottlingException (Step Functions retries these).
        invoke_error: answered 500 InternalServerException.
        drop_result: accepted (200, "processing") but the agent never runs: no result object.
        malformed_result: accepted; a non-JSON object is written at the result key.
        error_result: accepted; ``{"status_code": 500, ...}`` is written at the result key.
    """

    throttle: int = 0
    invoke_error: int = 0
    drop_result: int = 0
    malformed_result: int = 0
    error_result: int = 0


class AgentProcess:
    """One agent app served in its own process on an inherited loopback socket."""

    def __init__(self, spec: str, env: dict[str, str], log_path: str | None = None):
        self.spec = spec
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "local.agents.serve", spec, "--fd", str(sock.fileno())],
            env=env,
            pass_fds=(sock.fileno(),),
            stdout=self._log,
            stderr=subprocess.STDOUT if self._log else None,
        )
        sock.close()  # the child holds its own copy

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Poll GET /ping until the app answers. Raises RuntimeError if it dies or times out."""
        import urllib.request

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"agent {self.spec} exited with code {self.proc.returncode} before serving")
            try:
                with urllib.request.urlopen(f"{self.url}/ping", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"agent {self.spec} did not answer /ping within {timeout:.0f}s")

    def stop(self) -> None:
        stop_process(self.proc, self._log, timeout=10)


@dataclass
class AcrCounters:
    """What the emulator did, by outcome."""

    invocations: int = 0
    forwarded: int = 0
    throttled: int = 0
    invoke_errors: int = 0
    dropped: int = 0
    malformed_results: int = 0
    error_results: int = 0
    not_found: int = 0
    access_denied: int = 0
    get_runtime_calls: int = 0
    agent_errors: int = 0
    stopped_sessions: int = 0
    forward_seconds: float = 0.0  # summed wall time of forwarded invocations (agent answer included)
    max_forward_seconds: float = 0.0
    by_session: dict[str, int] = field(default_factory=dict)


class AcrEmulator:
    """Loopback ``InvokeAgentRuntime`` server.

    Args:
        agents: runtime ARN -> ``MODULE[:ATTR]`` of its app; other ARNs resolve by
            ``agent_spec_for_arn`` and start on first use (``autostart``).
        tps_limit: invokes per second per runtime before ThrottlingException; None = no limit.
        faults: faults armed at start-up.
        agent_env: extra environment for the agent processes (e.g. the moto S3 endpoint).
        log_dir: where each agent's output goes (``agent-NAME.log``); None = inherit.
        region: the stack's region: autostarted runtimes live here, and with no
            ``allowed_runtime_arns`` only its runtimes may be invoked (default ``AWS_REGION``, else us-east-1).
        account: the account of autostarted runtimes and of the default grant.
        allowed_runtime_arns: the stack's allow-list (``STEPWISE_AGENT_RUNTIME_ARNS``); empty = the
            grant is ``arn:aws:bedrock-agentcore:{region}:{account}:runtime/*``.
    """

    def __init__(self, agents: dict[str, str] | None = None, *, tps_limit: float | None = None,
                 faults: Faults | None = None, agent_env: dict[str, str] | None = None, autostart: bool = True,
                 log_dir: str | None = None, region: str | None = None, account: str = "123456789012",
                 allowed_runtime_arns: tuple[str, ...] | list[str] = ()):
        self.region = region or os.environ.get("AWS_REGION") or "us-east-1"
        self.account = account
        self.allowed_runtime_arns = tuple(allowed_runtime_arns)
        self._statuses: dict[str, str] = {}
        self.log_dir = log_dir
        self._specs = dict(agents or {})
        self.tps_limit = tps_limit
        self.faults = faults or Faults()
        self.agent_env = dict(agent_env or {})
        self.autostart = autostart
        self.counters = AcrCounters()
        self._agents: dict[str, AgentProcess] = {}
        self._windows: dict[str, collections.deque[float]] = collections.defaultdict(collections.deque)
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: Any = None
        self._client: Any = None
        self.url = ""

    # ------------------------------------------------------------------ lifecycle

    @property
    def env(self) -> dict[str, str]:
        """The variables that point boto3's ``bedrock-agentcore`` client at this emulator."""
        return {"AWS_ENDPOINT_URL_BEDROCK_AGENTCORE": self.url, "AWS_ENDPOINT_URL_BEDROCK_AGENTCORE_CONTROL": self.url}

    def start(self) -> "AcrEmulator":
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="acr-emulator", daemon=True)
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("ACR emulator did not start")
        for arn in self._specs:
            self._agent(arn)
        return self

    def _serve(self, ready: threading.Event) -> None:
        from aiohttp import web

        self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self._loop)
        app = web.Application(client_max_size=100 * 1024 * 1024)
        app.router.add_post("/runtimes/{arn:.+}/invocations", self._handle)
        app.router.add_post("/runtimes/{arn:.+}/stopruntimesession", self._stop_session)
        app.router.add_get("/runtimes/{runtime_id}/", self._get_runtime)

        async def setup() -> None:
            import aiohttp

            self._client = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120))
            self._runner = web.AppRunner(app, access_log=None)
            await self._runner.setup()
            site = web.TCPSite(self._runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            self.url = f"http://127.0.0.1:{port}"

        self._loop.run_until_complete(setup())
        ready.set()
        self._loop.run_forever()

    def stop(self) -> None:
        """Stop the server and every agent process."""
        if self._loop is not None:
            async def teardown() -> None:
                if self._client is not None:
                    await self._client.close()
                if self._runner is not None:
                    await self._runner.cleanup()

            asyncio.run_coroutine_threadsafe(teardown(), self._loop).result(15)
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(15)
            self._loop.close()
            self._loop = None
        for agent in self._agents.values():
            agent.stop()
        self._agents.clear()

    def __enter__(self) -> "AcrEmulator":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    def inject(self, **counts: int) -> None:
        """Arm faults for the next invocations, e.g. ``inject(throttle=3)`` (see ``Faults``)."""
        known = {f.name for f in fields(Faults)}
        unknown = set(counts) - known
        if unknown:
            raise ValueError(f"unknown fault(s) {sorted(unknown)}; known: {sorted(known)}")
        with self._lock:
            for name, n in counts.items():
                setattr(self.faults, name, getattr(self.faults, name) + int(n))

    def add_agent(self, arn: str, spec: str) -> None:
        """Map ``arn`` to the app ``spec`` and start it now."""
        self._specs[arn] = spec
        self._agent(arn)

    def agent_for(self, arn: str) -> AgentProcess | None:
        """The running agent process of the runtime ``arn`` (None when it is not started or did not start)."""
        return self._agents.get(arn)

    def host(self, arn: str, spec: str | None = None, *, status: str = "READY") -> None:
        """Host the runtime ``arn`` (any region or account) with the app ``spec`` (default: by its
        name), started on its first invoke: GetAgentRuntime finds it from now on, in ``status``
        (one of the model's ``AgentRuntimeStatus`` values, e.g. ``CREATING``)."""
        self._specs[arn] = spec or agent_spec_for_arn(arn)
        self._statuses[arn] = status

    # ------------------------------------------------------------------ what exists, who may invoke

    def granted_resources(self) -> tuple[str, ...]:
        """The IAM resources of the stack's InvokeAgentRuntime grant (``infra.permissions``' form)."""
        if self.allowed_runtime_arns:
            return tuple(r for arn in self.allowed_runtime_arns for r in (arn, f"{arn}/runtime-endpoint/*"))
        return (f"arn:aws:bedrock-agentcore:{self.region}:{self.account}:runtime/*",)

    def may_invoke(self, arn: str) -> bool:
        """Whether IAM lets the stack invoke ``arn`` (IAM's ``*`` wildcard matching)."""
        return any(fnmatch.fnmatchcase(arn, pattern) for pattern in self.granted_resources())

    def hosted_arn(self, runtime_id: str, region: str) -> str:
        """The ARN of the runtime ``runtime_id`` hosted in ``region``, or '' when there is none."""
        for arn in self._specs:
            if runtime_id_of(arn) == runtime_id and arn.split(":")[3] == region:
                return arn
        if self.autostart and region == self.region:
            arn = f"arn:aws:bedrock-agentcore:{region}:{self.account}:runtime/{runtime_id}"
            try:
                if _module_exists(agent_spec_for_arn(arn)):
                    return arn
            except ValueError:
                pass
        return ""

    def hosts(self, arn: str) -> bool:
        """Whether ``arn`` names a runtime this emulator hosts (see the module doc)."""
        parts = arn.split(":")
        return len(parts) > 5 and self.hosted_arn(runtime_id_of(arn), parts[3]) == arn

    def _agent(self, arn: str) -> AgentProcess | None:
        with self._start_lock:
            agent = self._agents.get(arn)
            if agent is not None:
                return agent
            spec = self._specs.get(arn)
            if spec is None:
                if not self.hosts(arn):
                    return None
                try:
                    spec = agent_spec_for_arn(arn)
                except ValueError:
                    return None
            env = {**os.environ, **self.agent_env}
            log_path = None
            if self.log_dir:
                from local.agents.serve import split_spec

                target = split_spec(spec)[0]
                name = os.path.splitext(os.path.basename(target))[0] if target.endswith(".py") else target.rsplit(".", 1)[-1]
                log_path = os.path.join(self.log_dir, f"agent-{name}.log")
            agent = AgentProcess(spec, env, log_path)
            try:
                agent.wait_ready()
            except RuntimeError:
                agent.stop()
                log.exception("could not start agent %s for %s", spec, arn)
                return None
            self._agents[arn] = agent
            log.info("agent %s serving %s on %s", spec, arn, agent.url)
            return agent

    # ------------------------------------------------------------------ request path

    def _take_fault(self) -> str | None:
        with self._lock:
            for f in fields(Faults):
                n = getattr(self.faults, f.name)
                if n > 0:
                    setattr(self.faults, f.name, n - 1)
                    return f.name
        return None

    def _over_tps(self, arn: str) -> bool:
        if self.tps_limit is None:
            return False
        now = time.monotonic()
        with self._lock:
            window = self._windows[arn]
            while window and now - window[0] >= 1.0:
                window.popleft()
            if len(window) >= self.tps_limit:
                return True
            window.append(now)
            return False

    def _count(self, name: str) -> None:
        with self._lock:
            setattr(self.counters, name, getattr(self.counters, name) + 1)

    @staticmethod
    def _error(kind: str, message: str) -> Any:
        from aiohttp import web

        return web.json_response({"message": message}, status=_STATUS[kind], headers={ERROR_TYPE_HEADER: kind})

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        self._count("invocations")
        arn = unquote(request.match_info["arn"])
        sid = request.headers.get(SESSION_HEADER) or str(uuid.uuid4())
        with self._lock:
            self.counters.by_session[sid] = self.counters.by_session.get(sid, 0) + 1
        body = await request.read()

        if not self.may_invoke(arn):  # IAM decides before ACR looks the runtime up
            self._count("access_denied")
            return self._error("AccessDeniedException",
                               f"User is not authorized to perform: bedrock-agentcore:InvokeAgentRuntime on resource: {arn} "
                               f"(the stack grants {', '.join(self.granted_resources())})")
        if self._over_tps(arn):
            self._count("throttled")
            return self._error("ThrottlingException", f"Rate exceeded: more than {self.tps_limit:g} InvokeAgentRuntime per second for {arn}")
        fault = self._take_fault()
        if fault == "throttle":
            self._count("throttled")
            return self._error("ThrottlingException", "Rate exceeded (injected fault)")
        if fault == "invoke_error":
            self._count("invoke_errors")
            return self._error("InternalServerException", "internal error (injected fault)")

        if not self.hosts(arn):
            self._count("not_found")
            return self._error("ResourceNotFoundException", f"no agent runtime {arn!r} in the local ACR emulator")
        loop = asyncio.get_running_loop()
        agent = self._agents.get(arn) or await loop.run_in_executor(None, self._agent, arn)
        if agent is None:  # hosted, but its container would not start
            self._count("agent_errors")
            return self._error("RuntimeClientError", f"the agent of runtime {arn!r} did not start")

        if fault in ("drop_result", "malformed_result", "error_result"):
            try:
                payload = json.loads(body or b"{}")
                ro = payload["_rollout"]
                bucket, key = ro["s3_bucket"], f"{ro['exp_id']}/{ro['input_id']}/{sid}.json"
            except (ValueError, KeyError, TypeError) as exc:
                return self._error("ValidationException", f"payload has no usable _rollout for fault {fault}: {exc}")
            if fault == "drop_result":
                self._count("dropped")
            else:
                self._count("malformed_results" if fault == "malformed_result" else "error_results")
                data = (b"{not json" if fault == "malformed_result" else json.dumps(
                    {"status_code": 500, "stop_reason": "injected fault", "input_id": ro["input_id"]}).encode())
                await loop.run_in_executor(None, _put_object, bucket, key, data)
            return web.json_response({"status": "processing", "s3_bucket": bucket, "result_key": key},
                                     headers={SESSION_HEADER: sid})

        headers = {"Content-Type": request.headers.get("Content-Type", "application/json"), SESSION_HEADER: sid}
        t0 = time.monotonic()
        try:
            async with self._client.post(f"{agent.url}/invocations", data=body, headers=headers) as resp:
                answer = await resp.read()
                status = resp.status
                ctype = resp.headers.get("Content-Type", "application/json")
        except Exception as exc:  # the container is gone or hung
            self._count("agent_errors")
            return self._error("RuntimeClientError", f"agent {agent.spec} unreachable: {exc!r}")
        if status >= 300:
            self._count("agent_errors")
            return self._error("RuntimeClientError", f"agent answered {status}: {answer[:500].decode(errors='replace')}")
        self._count("forwarded")
        elapsed = time.monotonic() - t0
        with self._lock:
            self.counters.forward_seconds += elapsed
            self.counters.max_forward_seconds = max(self.counters.max_forward_seconds, elapsed)
        return web.Response(body=answer, status=200, headers={"Content-Type": ctype, SESSION_HEADER: sid})


    async def _get_runtime(self, request: Any) -> Any:
        """``GetAgentRuntime``: the hosted runtime with this id in the request's signed region."""
        from aiohttp import web

        self._count("get_runtime_calls")
        runtime_id = request.match_info["runtime_id"]
        region = signed_region(request.headers.get("Authorization", "")) or self.region
        arn = self.hosted_arn(runtime_id, region)
        if not arn:
            return self._error("ResourceNotFoundException", f"AgentRuntime {runtime_id} not found in {region}")
        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        return web.json_response({
            "agentRuntimeArn": arn, "agentRuntimeName": runtime_id.split("-", 1)[0], "agentRuntimeId": runtime_id,
            "agentRuntimeVersion": "1", "createdAt": now, "lastUpdatedAt": now,
            "status": self._statuses.get(arn, "READY"),
            "roleArn": f"arn:aws:iam::{arn.split(':')[4]}:role/AgentCoreRuntimeRole",
            "lifecycleConfiguration": {"idleRuntimeSessionTimeout": 900, "maxLifetime": 28800},
        })

    async def _stop_session(self, request: Any) -> Any:
        """``StopRuntimeSession`` (the toolkit's ``AgentCoreHttpSession`` calls it after each rollout):
        counted and acknowledged; agent processes here are shared, not per session."""
        from aiohttp import web

        self._count("stopped_sessions")
        sid = request.headers.get(SESSION_HEADER, "")
        return web.json_response({}, headers={SESSION_HEADER: sid})


def _put_object(bucket: str, key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
