"""Serve an agent app the way an ACR container does: ``python -m local.agents.serve MODULE[:ATTR]`` (or
``PATH.py[:ATTR]``: a user's agent file outside this repository, with its own imports; `load_app`). ``--check``
only imports it (`local.agent_env` runs that before a run starts). It imports nothing of this repository but
``local.no_aws``, so it also runs in an agent folder's own environment (`local.agent_env` copies both files).

The app is any ASGI app built on the toolkit's ``AgentCoreRLApp`` (POST /invocations,
GET /ping, session id in the ``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`` header).
``--fd N`` serves on an already-bound listening socket inherited from the parent (so the
parent picks a free loopback port with no race); ``--port`` binds 127.0.0.1:PORT instead.

One process serves every runtime session of its runtime (ACR gives each session a microVM of its
own), so the ACR emulator (`local.acr`) asks this process what each session is doing and ends it:

- ``GET /_stepwise/sessions`` -> ``{"busy": {sid: background tasks}}``: the sessions whose
  background work (the toolkit's ``rollout_entrypoint`` task, registered with ``add_async_task``,
  which is what turns ACR's ping to ``HealthyBusy``) still runs. ACR counts a session idle only
  when it is not busy (its idle timeout runs from then).
- ``POST /_stepwise/sessions/stop`` with ``{"sid": ...}``: what ACR's StopRuntimeSession (or a
  lifetime ending) does to the session's microVM: its background tasks are cancelled and nothing
  more of it reaches S3 (the toolkit would save a ``status_code`` 500 result on cancellation; a
  terminated microVM saves nothing).

Tasks are attributed to sessions through the toolkit's request context (``BedrockAgentCoreContext``'s
session id, a context variable the background task inherits from its request).

A botocore request of the app to a host that is not loopback fails (`local.no_aws`): the local stack never calls AWS.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.util
import json
import socket
import sys
import threading
from typing import Any

SESSIONS_PATH = "/_stepwise/sessions"
STOP_PATH = "/_stepwise/sessions/stop"


def split_spec(spec: str) -> tuple[str, str]:
    """``(module or file, attr)`` of ``MODULE[:ATTR]`` or ``PATH.py[:ATTR]`` (attr defaults to ``app``)."""
    target, sep, attr = spec.rpartition(":")
    if not sep or not attr.isidentifier():  # no ``:ATTR`` (a drive letter's colon is not one)
        return spec, "app"
    return target, attr


def load_app(spec: str):
    """The app ``spec`` names (attr defaults to ``app``):

    - ``pkg.module:attr``: imported as Python would (the current directory first, as ``python -m`` puts it);
    - ``path/to/agent.py:attr``: that file, imported as the module of its name with its folder first on
      ``sys.path``, so it imports the modules beside it as it would if run there (``python agent.py``).

    Raises:
        ImportError / FileNotFoundError / AttributeError: naming what could not be loaded.
    """
    target, attr = split_spec(spec)
    if target.endswith(".py"):
        import os

        path = os.path.abspath(target)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"agent file {path} does not exist")
        folder, name = os.path.dirname(path), os.path.splitext(os.path.basename(path))[0]
        sys.path.insert(0, folder)
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    try:
        return getattr(module, attr)
    except AttributeError:
        raise AttributeError(f"{target} has no {attr!r}: name the AgentCoreRLApp as {target}:NAME") from None


def _current_sid() -> str | None:
    try:
        from bedrock_agentcore.runtime.context import BedrockAgentCoreContext

        return BedrockAgentCoreContext.get_session_id()
    except Exception:  # not a toolkit app, or no request context
        return None


class SessionTracker:
    """Which runtime session each background task of ``app`` belongs to; cancels a session's tasks.

    Wraps the app's ``add_async_task`` / ``complete_async_task`` (the toolkit's rollout task calls
    both) and ``save_result`` (nothing is saved for a stopped session)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.tasks: dict[int, tuple[str, asyncio.Task | None]] = {}
        self.stopped: set[str] = set()
        add, complete = getattr(app, "add_async_task", None), getattr(app, "complete_async_task", None)
        save = getattr(app, "save_result", None)
        if add is None or complete is None:
            return
        tracker = self

        def add_async_task(name: str, metadata: dict | None = None) -> int:
            task_id = add(name, metadata)
            sid = _current_sid()
            if sid:
                try:
                    task = asyncio.current_task()
                except RuntimeError:
                    task = None
                with tracker.lock:
                    tracker.tasks[task_id] = (sid, task)
            return task_id

        def complete_async_task(task_id: int) -> bool:
            with tracker.lock:
                tracker.tasks.pop(task_id, None)
            return complete(task_id)

        app.add_async_task = add_async_task
        app.complete_async_task = complete_async_task
        if save is not None:
            def save_result(*args: Any, **kwargs: Any) -> Any:
                if _current_sid() in tracker.stopped:
                    return None
                return save(*args, **kwargs)

            app.save_result = save_result

    def busy(self) -> dict[str, int]:
        """sid -> background tasks still running."""
        out: dict[str, int] = {}
        with self.lock:
            for sid, _ in self.tasks.values():
                out[sid] = out.get(sid, 0) + 1
        return out

    def stop(self, sid: str) -> int:
        """Cancel ``sid``'s background tasks (and save nothing more for it); returns how many."""
        with self.lock:
            self.stopped.add(sid)
            tasks = [task for s, task in self.tasks.values() if s == sid and task is not None]
        for task in tasks:
            task.cancel()
        return len(tasks)


class SessionControl:
    """ASGI wrapper: `SESSIONS_PATH` and `STOP_PATH` answered here, everything else by the app."""

    def __init__(self, app: Any, tracker: SessionTracker) -> None:
        self.app = app
        self.tracker = tracker

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path") if scope.get("type") == "http" else None
        if path == SESSIONS_PATH:
            return await self._json(send, {"busy": self.tracker.busy()})
        if path == STOP_PATH:
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if not message.get("more_body"):
                    break
            try:
                sid = str(json.loads(body or b"{}")["sid"])
            except (ValueError, KeyError, TypeError):
                return await self._json(send, {"message": "expected {\"sid\": ...}"}, status=400)
            return await self._json(send, {"cancelled": self.tracker.stop(sid)})
        await self.app(scope, receive, send)

    @staticmethod
    async def _json(send: Any, value: Any, status: int = 200) -> None:
        data = json.dumps(value).encode()
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]})
        await send({"type": "http.response.body", "body": data})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", help="MODULE[:ATTR] or PATH.py[:ATTR] of the AgentCoreRLApp (ATTR defaults to 'app')")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--fd", type=int, help="inherited listening socket file descriptor")
    group.add_argument("--port", type=int, help="port to bind on 127.0.0.1")
    group.add_argument("--check", action="store_true",
                       help="only import the app and exit 0 (a missing module's ImportError is the exit's message)")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    from local._proc import die_with_parent
    from local.no_aws import install

    die_with_parent()
    install()  # the agent's clients (the toolkit's result write to S3) reach moto, never AWS
    app = load_app(args.app)
    if args.check:
        print(f"{args.app}: {type(app).__module__}.{type(app).__name__}")
        return 0
    import uvicorn

    served = SessionControl(app, SessionTracker(app))
    # Keep-alive longer than the caller's pool idle time (aiohttp: 15 s), or uvicorn's 5 s default
    # closes a pooled connection just as the ACR emulator reuses it ("Connection reset by peer").
    config = uvicorn.Config(served, host="127.0.0.1", port=args.port or 0, log_level=args.log_level,
                            access_log=False, lifespan="on", timeout_keep_alive=75)
    server = uvicorn.Server(config)
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    server.run(sockets=sockets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
