"""The local stack's S3 requests counted at moto's server, by operation and run-store key kind: what a rollout
costs in requests (``timing.json`` ``s3_requests``), whoever made them (the handlers, the gateway, the agents)."""

from __future__ import annotations

import threading
from typing import Any

from stepwise.layout import key_kind


# --------------------------------------------------------------------------------------
# S3 request log (what a rollout costs in requests, by kind)
# --------------------------------------------------------------------------------------

def s3_request_kind(method: str, path: str, query: str) -> tuple[str, str]:
    """``(operation, object kind)`` of one path-style S3 request.

    Operation: ``GET``, ``PUT``, ``HEAD``, ``DELETE``, ``POST`` or ``LIST`` (a GET of the bucket
    itself); object kind: the layout's kind of the key it touches (`stepwise.layout.key_kind`: ``state``, ``session``, ``turn``, ...;
    ``bucket`` for bucket-level calls, ``other`` for keys outside the layout). For a LIST the kind
    is the one of its ``prefix`` (``turn`` for a session's turns).
    """
    from urllib.parse import parse_qs, unquote

    parts = unquote(path).lstrip("/").split("/", 1)
    key = parts[1] if len(parts) > 1 else ""
    op = method.upper()
    if not key:
        if op != "GET":
            return op, "bucket"
        prefix = parse_qs(query).get("prefix", [""])[0]
        op, key = "LIST", prefix
        if not key:
            return op, "bucket"
    return op, key_kind(key)


class S3RequestLog:
    """Counts the S3 requests a moto server answers, by ``(operation, object kind)``.

    Installed around moto's WSGI app (every process's S3 client reaches the same server: the
    handlers, the gateway, the agents), so the figure is the whole run's, as S3 would bill it.
    A request is S3 when its SigV4 credential scope names ``s3``.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._lock = threading.Lock()
        self.counts: dict[tuple[str, str], int] = {}

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        if "/s3/aws4_request" in environ.get("HTTP_AUTHORIZATION", ""):
            kind = s3_request_kind(environ.get("REQUEST_METHOD", ""), environ.get("PATH_INFO", ""),
                                   environ.get("QUERY_STRING", ""))
            with self._lock:
                self.counts[kind] = self.counts.get(kind, 0) + 1
        return self.app(environ, start_response)

    def snapshot(self) -> dict[str, int]:
        """``{"OP kind": count}``, sorted by key (JSON-ready)."""
        with self._lock:
            return {f"{op} {kind}": n for (op, kind), n in sorted(self.counts.items())}


# --------------------------------------------------------------------------------------
# The moto server
# --------------------------------------------------------------------------------------
