"""Serve an agent app the way an ACR container does: ``python -m local.agents.serve MODULE[:ATTR]`` (or
``PATH.py[:ATTR]``: a user's agent file outside this repository, with its own imports; `load_app`).

The app is any ASGI app built on the toolkit's ``AgentCoreRLApp`` (POST /invocations,
GET /ping, session id in the ``X-Amzn-Bedrock-AgentCore-Runtime-Session-Id`` header).
``--fd N`` serves on an already-bound listening socket inherited from the parent (so the
parent picks a free loopback port with no race); ``--port`` binds 127.0.0.1:PORT instead.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import socket
import sys


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


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("app", help="MODULE[:ATTR] or PATH.py[:ATTR] of the AgentCoreRLApp (ATTR defaults to 'app')")
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
