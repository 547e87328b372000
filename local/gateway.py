"""The gateway on loopback, as it runs inside the Lambda: its own process, same app.

``python -m stepwise.gateway --port 0`` binds a free loopback port and prints
``stepwise gateway listening on http://127.0.0.1:PORT``; we read that line to learn the URL.
The process gets the handlers' environment (bucket, moto and simulator endpoints) and runs under
``python -m local.no_aws``: a client that missed its emulator's endpoint fails saying so, never reaching AWS.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import urllib.request

from local._proc import await_listening, service_env, stop_process

_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


class GatewayProcess:
    """A running gateway process. ``url`` is its base (agents use ``url + "/v1"``)."""

    def __init__(self, env: dict[str, str], *, timeout: float = 60.0, log_path: str | None = None):
        self._log = open(log_path, "a") if log_path else None  # noqa: SIM115 (closed in stop)
        root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # `local` importable from anywhere
        env = service_env({**os.environ, **env})
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "local.no_aws", "stepwise.gateway", "--host", "127.0.0.1", "--port", "0"],
            env={**env, "PYTHONPATH": os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)},
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        try:
            self.url = await_listening(self.proc, _LISTENING, what="gateway", timeout=timeout, log=self._log).group(1)
        except BaseException:  # it did not start, or a Ctrl-C came first: not left running either way
            self.stop()
            raise

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc, self._log, timeout=10)
