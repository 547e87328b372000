"""A loopback stand-in for the Hugging Face Hub's access check (``GET /api/models/{org}/{name}/auth-check``, what
``huggingface_hub.HfApi.auth_check`` asks): public repositories answer 200; a gated one answers 200 only to a token
in ``tokens``, else 401 with ``X-Error-Code: GatedRepo`` (the client raises ``GatedRepoError``); others 404
``RepoNotFound``. Point the client at it with ``HF_ENDPOINT`` or ``HfApi(endpoint=...)``."""

from __future__ import annotations

import http.server
import threading
from typing import Any


class FakeHub:
    def __init__(self, public: set[str], gated: set[str], tokens: set[str]) -> None:
        hub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                hub.requests.append((self.path, self.headers.get("Authorization")))
                repo = self.path.removeprefix("/api/models/").removesuffix("/auth-check")
                token = (self.headers.get("Authorization") or "").removeprefix("Bearer ")
                if repo in hub.public or (repo in hub.gated and token in hub.tokens):
                    status, code = 200, ""
                elif repo in hub.gated:
                    status, code = (401 if not token else 403), "GatedRepo"
                else:
                    status, code = 404, "RepoNotFound"
                body = b'{"error": "' + code.encode() + b'"}' if code else b"{}"
                self.send_response(status)
                if code:
                    self.send_header("X-Error-Code", code)
                    self.send_header("X-Error-Message", f"{code}: {repo}")
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.public, self.gated, self.tokens = public, gated, tokens
        self.requests: list[tuple[str, str | None]] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
