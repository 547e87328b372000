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
an agent. Like ACR, calls above ``tps_limit`` per second (per runtime; InvokeAgentRuntime and
StopRuntimeSession share it, as the toolkit's own rate limiter assumes) are throttled. Faults can be
injected (``Faults`` / ``inject``): throttle the next N calls, fail them with a 500, accept
them but never produce a result (the agent is not called), or accept them and write a
malformed / ``status_code`` 500 result object at the toolkit's result key.

Runtime sessions live as ACR's do (``SessionLifecycle``; AgentCore developer guide, "Configure
lifecycle settings" and "Stop a running session"; quotas page, "Active session workloads per account"):

- the first ``InvokeAgentRuntime`` of a ``runtimeSessionId`` starts a session; it is *active* (it
  bills and counts against the quota) until it ends. Each runtime session is its own microVM on
  ACR; here the agent process is shared, and it reports which sessions still run background work
  (`local.agents.serve`).
- a session ends when ``StopRuntimeSession`` stops it (``sessions_stopped``), when it has been idle
  (no invocation in flight, no background work: ACR's ``Healthy`` rather than ``HealthyBusy``)
  for ``idle_timeout_s`` (default 900), or when it reaches ``max_lifetime_s`` (default 28800);
  both count as ``sessions_timed_out``. Its agent's work is cancelled and writes nothing more.
- a new session beyond ``session_quota`` active sessions is refused with
  ServiceQuotaExceededException (402); invoking an active session again is not a new session.
- stopping a session that is not active answers ResourceNotFoundException (404), as ACR does
  for a session "not found or already terminated".

``counters`` (`AcrCounters`) holds, besides the request outcomes, ``sessions_started``,
``sessions_stopped``, ``sessions_timed_out``, ``sessions_active``, ``peak_active_sessions`` and
``session_seconds`` (wall seconds from each session's start to its end, or to now while it is
active: what ACR bills memory for); `session_counters()` returns them up to date, and other
processes read the same names from ``GET /_acr/state``. These names are a contract (the cost
ledger reads ``session_seconds``): extend, do not rename.
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

from local._proc import service_env, stop_process

log = logging.getLogger(__name__)

SESSION_HEADER = "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id"
ERROR_TYPE_HEADER = "X-Amzn-ErrorType"
_STATUS = {
    "ThrottlingException": 429,
    "ServiceQuotaExceededException": 402,
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

    def __init__(self, spec: str, env: dict[str, str], log_path: str | None = None, *, python: str | None = None,
                 cwd: str | None = None):
        self.spec = spec
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "ab") if log_path else None  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [python or sys.executable, "-m", "local.agents.serve", spec, "--fd", str(sock.fileno())],
            env=service_env(env),
            cwd=cwd,
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
class SessionLifecycle:
    """How long runtime sessions live and how many may be active (ACR's defaults; tests scale them down).

    Attributes:
        idle_timeout_s: a session idle this long ends (``lifecycleConfiguration.idleRuntimeSessionTimeout``,
            default 900 s, range 60..28800 on ACR).
        max_lifetime_s: a session ends this long after it started, busy or not (``maxLifetime``, default 28800 s).
        session_quota: active sessions per account before ServiceQuotaExceededException (the quotas page's
            "Active session workloads per account": 500 outside us-east-1/us-west-2, 1,000 there; adjustable);
            None = no quota.
    """

    idle_timeout_s: float = 900.0
    max_lifetime_s: float = 28800.0
    session_quota: int | None = 500

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> "SessionLifecycle":
        """From ``STEPWISE_LOCAL_ACR_IDLE_TIMEOUT``, ``STEPWISE_LOCAL_ACR_MAX_LIFETIME`` (seconds) and
        ``STEPWISE_LOCAL_ACR_SESSION_QUOTA`` (``0`` = no quota); unset = ACR's defaults."""
        env = os.environ if env is None else env
        out = cls()
        if env.get(ENV_IDLE_TIMEOUT):
            out.idle_timeout_s = float(env[ENV_IDLE_TIMEOUT])
        if env.get(ENV_MAX_LIFETIME):
            out.max_lifetime_s = float(env[ENV_MAX_LIFETIME])
        if env.get(ENV_SESSION_QUOTA):
            quota = int(env[ENV_SESSION_QUOTA])
            out.session_quota = quota if quota > 0 else None
        return out


ENV_IDLE_TIMEOUT = "STEPWISE_LOCAL_ACR_IDLE_TIMEOUT"
ENV_MAX_LIFETIME = "STEPWISE_LOCAL_ACR_MAX_LIFETIME"
ENV_SESSION_QUOTA = "STEPWISE_LOCAL_ACR_SESSION_QUOTA"


@dataclass
class RuntimeSession:
    """One ``runtimeSessionId`` the emulator started (times are ``time.monotonic()`` seconds)."""

    sid: str
    arn: str
    started: float
    last_active: float
    run_id: str = ""  # from the payload's ``_rollout.exp_id`` (``rollout-results/{run_id}``), when it has one
    in_flight: int = 0  # invocations being answered
    busy: bool = False  # its agent reported background work at the last look
    ended: float | None = None
    end_reason: str = ""  # "stopped" | "idle_timeout" | "max_lifetime"


@dataclass
class AcrCounters:
    """What the emulator did, by outcome; the ``sessions_*`` and ``session_seconds`` names are a
    contract (module doc), read them through `AcrEmulator.session_counters` for current values."""

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
    stop_calls: int = 0  # StopRuntimeSession requests answered (any outcome)
    sessions_started: int = 0
    sessions_stopped: int = 0  # ended by StopRuntimeSession
    sessions_timed_out: int = 0  # ended by the idle timeout or the maximum lifetime
    sessions_active: int = 0
    peak_active_sessions: int = 0
    session_seconds: float = 0.0  # of ended sessions; session_counters() adds the active ones'
    quota_refusals: int = 0  # ServiceQuotaExceededException answers
    forward_seconds: float = 0.0  # summed wall time of forwarded invocations (agent answer included)
    max_forward_seconds: float = 0.0
    by_session: dict[str, int] = field(default_factory=dict)


class AcrEmulator:
    """Loopback ``InvokeAgentRuntime`` server.

    Args:
        agents: runtime ARN -> ``MODULE[:ATTR]`` of its app (or a `local.agent_env.AgentLaunch`: an agent
            folder's app in its own environment); other ARNs resolve by
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
        lifecycle: session lifetimes and the active-session quota (default: `SessionLifecycle.from_env`).
    """

    def __init__(self, agents: dict[str, str] | None = None, *, tps_limit: float | None = None,
                 faults: Faults | None = None, agent_env: dict[str, str] | None = None, autostart: bool = True,
                 log_dir: str | None = None, region: str | None = None, account: str = "123456789012",
                 allowed_runtime_arns: tuple[str, ...] | list[str] = (), lifecycle: SessionLifecycle | None = None):
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
        self.lifecycle = lifecycle or SessionLifecycle.from_env()
        self.sessions: dict[str, RuntimeSession] = {}  # every session started, by sid (ended ones too)
        self._reaper: threading.Thread | None = None
        self._stopping = threading.Event()
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
        self._stopping.clear()
        self._reaper = threading.Thread(target=self._reap_loop, name="acr-session-reaper", daemon=True)
        self._reaper.start()
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
        app.router.add_get("/_acr/state", self._state)

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
        """Stop the server and every agent process (sessions still active stay counted as active)."""
        self._stopping.set()
        if self._reaper is not None:
            self._reaper.join(10)
            self._reaper = None
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
            # a spec, or a launch (`local.agent_env.AgentLaunch`: the agent folder's own interpreter and folder)
            launch = self._specs.get(arn)
            spec = getattr(launch, "spec", launch)
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
            agent = AgentProcess(spec, {**env, **getattr(launch, "env", {})}, log_path,
                                 python=getattr(launch, "python", None), cwd=getattr(launch, "cwd", None))
            try:
                agent.wait_ready()
            except BaseException as exc:  # a Ctrl-C while it starts leaves it running no more than a failure
                agent.stop()
                if not isinstance(exc, RuntimeError):
                    raise
                log.error("could not start agent %s for %s: %s (its output: %s)", spec, arn, exc, log_path or "not kept")
                return None
            self._agents[arn] = agent
            log.info("agent %s serving %s on %s", spec, arn, agent.url)
            return agent

    # ------------------------------------------------------------------ runtime sessions

    def _begin_invoke(self, arn: str, sid: str, body: bytes) -> bool:
        """Count an invocation of session ``sid``, starting the session when it is not active.
        False when starting it would pass the active-session quota (nothing is counted then)."""
        now = time.monotonic()
        with self._lock:
            session = self.sessions.get(sid)
            if session is None or session.ended is not None:
                quota = self.lifecycle.session_quota
                if quota is not None and self.counters.sessions_active >= quota:
                    self.counters.quota_refusals += 1
                    return False
                session = self.sessions[sid] = RuntimeSession(sid, arn, now, now, run_id=_run_id_of(body))
                self.counters.sessions_started += 1
                self.counters.sessions_active += 1
                self.counters.peak_active_sessions = max(self.counters.peak_active_sessions, self.counters.sessions_active)
            session.in_flight += 1
            session.last_active = now
            return True

    def _end_invoke(self, sid: str) -> None:
        with self._lock:
            session = self.sessions.get(sid)
            if session is not None:
                session.in_flight = max(0, session.in_flight - 1)
                session.last_active = time.monotonic()

    def _end_session(self, session: RuntimeSession, reason: str, now: float) -> None:
        """End an active ``session`` (caller holds ``_lock``); its agent's work is cancelled after."""
        session.ended = now
        session.end_reason = reason
        self.counters.sessions_active -= 1
        self.counters.session_seconds += now - session.started
        if reason == "stopped":
            self.counters.sessions_stopped += 1
        else:
            self.counters.sessions_timed_out += 1

    def _cancel_agent_work(self, session: RuntimeSession) -> None:
        agent = self._agents.get(session.arn)
        if agent is None:
            return
        import urllib.request

        from local.agents.serve import STOP_PATH

        request = urllib.request.Request(f"{agent.url}{STOP_PATH}", data=json.dumps({"sid": session.sid}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=5) as resp:
                resp.read()
        except OSError as exc:  # the agent is gone: its work with it
            log.debug("could not cancel session %s in %s: %s", session.sid, agent.spec, exc)

    def _busy_sessions(self) -> set[str] | None:
        """The sessions whose agents report background work, or None when an agent could not be asked."""
        import urllib.request

        from local.agents.serve import SESSIONS_PATH

        busy: set[str] = set()
        for agent in list(self._agents.values()):
            try:
                with urllib.request.urlopen(f"{agent.url}{SESSIONS_PATH}", timeout=5) as resp:
                    busy.update(json.loads(resp.read()).get("busy", {}))
            except (OSError, ValueError):
                return None
        return busy

    def reap(self) -> list[RuntimeSession]:
        """One look at every active session: end those idle for ``idle_timeout_s`` or older than
        ``max_lifetime_s`` (their agents' work is cancelled); returns the sessions it ended."""
        busy = self._busy_sessions()
        now = time.monotonic()
        ended: list[RuntimeSession] = []
        with self._lock:
            for session in self.sessions.values():
                if session.ended is not None:
                    continue
                if busy is not None:
                    session.busy = session.sid in busy
                if session.busy or session.in_flight:
                    session.last_active = now
                if now - session.started >= self.lifecycle.max_lifetime_s:
                    self._end_session(session, "max_lifetime", now)
                elif now - session.last_active >= self.lifecycle.idle_timeout_s:
                    self._end_session(session, "idle_timeout", now)
                else:
                    continue
                ended.append(session)
        for session in ended:
            log.info("runtime session %s ended: %s", session.sid, session.end_reason)
            self._cancel_agent_work(session)
        return ended

    def _reap_loop(self) -> None:
        tick = max(0.02, min(1.0, self.lifecycle.idle_timeout_s / 4, self.lifecycle.max_lifetime_s / 4))
        while not self._stopping.wait(tick):
            try:
                self.reap()
            except Exception:  # keep reaping
                log.exception("reaping runtime sessions")

    def session_counters(self) -> dict[str, Any]:
        """The session counters now (``session_seconds`` includes the active sessions' seconds so far)."""
        now = time.monotonic()
        with self._lock:
            running = sum(now - s.started for s in self.sessions.values() if s.ended is None)
            c = self.counters
            return {"sessions_started": c.sessions_started, "sessions_stopped": c.sessions_stopped,
                    "sessions_timed_out": c.sessions_timed_out, "sessions_active": c.sessions_active,
                    "peak_active_sessions": c.peak_active_sessions,
                    "session_seconds": round(c.session_seconds + running, 3), "quota_refusals": c.quota_refusals,
                    "stop_calls": c.stop_calls}

    def active_sessions(self, run_id: str | None = None) -> list[str]:
        """The sids of the active sessions (of ``run_id`` only, when given)."""
        with self._lock:
            return [s.sid for s in self.sessions.values()
                    if s.ended is None and (run_id is None or s.run_id == run_id)]

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
        if not self._begin_invoke(arn, sid, body):
            return self._error("ServiceQuotaExceededException",
                               f"The number of active runtime sessions would exceed the account's quota of "
                               f"{self.lifecycle.session_quota} (Active session workloads per account)")
        try:
            return await self._answer(request, arn, sid, body, agent, fault)
        finally:
            self._end_invoke(sid)

    async def _answer(self, request: Any, arn: str, sid: str, body: bytes, agent: AgentProcess, fault: str | None) -> Any:
        """The invocation of an active session: a faulty acceptance, or the agent's own answer."""
        from aiohttp import web

        loop = asyncio.get_running_loop()
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
        """``StopRuntimeSession`` (the toolkit's ``AgentCoreHttpSession`` calls it after each rollout): ends
        the active session (its agent's work is cancelled); ResourceNotFoundException for a session that
        is not active ("not found or already terminated"). Shares the runtime's rate with invokes."""
        from aiohttp import web

        self._count("stop_calls")
        arn = unquote(request.match_info["arn"])
        sid = request.headers.get(SESSION_HEADER, "")
        if not self.may_invoke(arn):
            self._count("access_denied")
            return self._error("AccessDeniedException",
                               f"User is not authorized to perform: bedrock-agentcore:StopRuntimeSession on resource: {arn}")
        if self._over_tps(arn):
            self._count("throttled")
            return self._error("ThrottlingException", f"Rate exceeded: more than {self.tps_limit:g} calls per second for {arn}")
        now = time.monotonic()
        with self._lock:
            session = self.sessions.get(sid)
            active = session is not None and session.ended is None and session.arn == arn
            if active:
                self._end_session(session, "stopped", now)
        if not active:
            return self._error("ResourceNotFoundException", f"runtime session {sid!r} not found or already terminated")
        await asyncio.get_running_loop().run_in_executor(None, self._cancel_agent_work, session)
        return web.json_response({"runtimeSessionId": sid}, headers={SESSION_HEADER: sid})

    async def _state(self, request: Any) -> Any:
        """``GET /_acr/state``: ``{"counters": session_counters(), "active": [sid, ...]}`` for other processes."""
        from aiohttp import web

        return web.json_response({"counters": self.session_counters(), "active": self.active_sessions()})


def _run_id_of(body: bytes) -> str:
    """``run_id`` of an invocation payload whose ``_rollout.exp_id`` is ``rollout-results/{run_id}``; '' otherwise."""
    try:
        exp_id = json.loads(body or b"{}")["_rollout"]["exp_id"]
    except (ValueError, KeyError, TypeError):
        return ""
    prefix, _, run_id = str(exp_id).partition("/")
    return run_id if prefix == "rollout-results" else ""


def _put_object(bucket: str, key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body, ContentType="application/json")
