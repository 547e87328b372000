"""The rollout gateway: the agent's LLM endpoint (OpenAI and Anthropic wire formats).

Serves the toolkit's own aiohttp adapters with three seams of ours: a per-session sampler
(``sampling.py``), a turn recorder writing each turn to S3 (``recorder.py``) and session
state read from the session record (``session.py``); see ``app.py``. Run it with
``python -m stepwise.gateway --port N`` (loopback, or behind the Lambda Web Adapter), or
in-process with :func:`start_gateway`. Heavy imports (aiohttp app, transformers) are lazy.
"""

from __future__ import annotations

from typing import Any

__all__ = ["GatewayHandle", "build_app", "start_gateway"]


def __getattr__(name: str) -> Any:
    if name == "build_app":
        from .app import build_app

        return build_app
    if name in ("GatewayHandle", "start_gateway"):
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
