"""Serve an agent app the way an ACR container does: ``python -m local.agents.serve MODULE[:ATTR]``.

The app is any ASGI app built on the toolkit's ``AgentCoreRLApp`` (POST /invocations,
GET /ping, session id in the ``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`` header).
``--fd N`` serves on an already-bound listening socket inherited from the parent (so the
parent picks a free loopback port with no race); ``--port`` binds 127.0.0.1:PORT instead.
"""

from __future__ import annotations

import argparse
import importlib
import socket
import sys


def load_app(spec: str):
    """``"pkg.module:attr"`` (attr defaults to ``app``) -> the object."""
    module_name, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module_name), attr or "app")


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", help="MODULE[:ATTR] of the AgentCoreRLApp (ATTR defaults to 'app')")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--fd", type=int, help="inherited listening socket file descriptor")
    group.add_argument("--port", type=int, help="port to bind on 127.0.0.1")
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)

    app = load_app(args.app)
    # Keep-alive longer than the caller's pool idle time (aiohttp: 15 s), or uvicorn's 5 s default
    # closes a pooled connection just as the ACR emulator reuses it ("Connection reset by peer").
    config = uvicorn.Config(app, host="127.0.0.1", port=args.port or 0, log_level=args.log_level,
                            access_log=False, lifespan="on", timeout_keep_alive=75)
    server = uvicorn.Server(config)
    sockets = [socket.socket(fileno=args.fd)] if args.fd is not None else None
    server.run(sockets=sockets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
