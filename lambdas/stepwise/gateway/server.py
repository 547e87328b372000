"""Serving the gateway app: in a background thread (tests, the local stack) or as a
process (``python -m stepwise.gateway``; on Lambda behind the Web Adapter)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import threading
from types import SimpleNamespace
from typing import Any

from aiohttp import web


@dataclasses.dataclass
class GatewayHandle:
    """A gateway served on a loopback thread.

    Attributes:
        url: ``http://127.0.0.1:PORT`` (the agent's ``base_url`` is ``url + "/v1"``).
        app: the aiohttp app (``app[stepwise.gateway.app.GATEWAY]`` holds its seams).
    """

    url: str
    app: web.Application
    _server: Any

    @property
    def base_url(self) -> str:
        return self.url + "/v1"

    def stop(self) -> None:
        self._server.shutdown()


def start_gateway(*, host: str = "127.0.0.1", port: int = 0, app: web.Application | None = None,
                  **build_kwargs: Any) -> GatewayHandle:
    """Build (unless ``app`` is given) and serve the gateway on a daemon thread; returns
    once it is bound. Uses the toolkit's ``ThreadedGatewayServer`` (handler cancellation
    on client disconnect, filtered access log)."""
    from agentcore_rl_toolkit.rollout_gateway.server import ThreadedGatewayServer

    from .app import build_app

    app = app if app is not None else build_app(**build_kwargs)
    server = ThreadedGatewayServer(SimpleNamespace(app=app), host=host, port=port)
    server.start()
    return GatewayHandle(url=f"http://{host}:{server.port}", app=app, _server=server)


def default_port(env: dict[str, str] | None = None) -> int:
    """The Lambda Web Adapter forwards to ``AWS_LWA_PORT`` (or ``PORT``), default 8080."""
    env = os.environ if env is None else env
    return int(env.get("AWS_LWA_PORT") or env.get("PORT") or 8080)


def _warm_imports() -> None:
    """Import transformers' tokenizer machinery off the request path (the first turn of a
    container would otherwise pay ~2 s for it; more where torch is installed)."""
    from .renderers import auto_tokenizer_class

    try:
        auto_tokenizer_class()
    except Exception:  # the first turn will report it
        pass


async def _serve(host: str, port: int) -> None:
    from agentcore_rl_toolkit.rollout_gateway.server import FilteredAccessLogger

    from .app import build_app

    threading.Thread(target=_warm_imports, name="warm-imports", daemon=True).start()
    runner = web.AppRunner(build_app(), handler_cancellation=True, access_log_class=FilteredAccessLogger)
    await runner.setup()
    site = web.TCPSite(runner, host=host, port=port)
    await site.start()
    bound = site._server.sockets[0].getsockname()[1] if site._server and site._server.sockets else port
    print(f"stepwise gateway listening on http://{host}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepwise.gateway", description="Serve the rollout gateway.")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None,
                        help="port; 0 picks a free one (default $AWS_LWA_PORT, $PORT or 8080)")
    args = parser.parse_args(argv)
    port = default_port() if args.port is None else args.port
    try:
        asyncio.run(_serve(args.host, port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
