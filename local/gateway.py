"""The gateway on loopback, as it runs inside the Lambda: its own process, same app.

``python -m stepwise.gateway --port 0`` binds a free loopback port and prints
``stepwise gateway listening on http://127.0.0.1:PORT``; we read that line to learn the URL.
The process gets the handlers' environment (bucket, moto and simulator endpoints).
"""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
import urllib.request

from local._proc import stop_process

_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


class GatewayProcess:
    """A running gateway process. ``url`` is its base (agents use ``url + "/v1"``)."""

    def __init__(self, env: dict[str, str], *, timeout: float = 60.0, log_path: str | None = None):
        self._log = open(log_path, "a") if log_path else None  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "stepwise.gateway", "--host", "127.0.0.1", "--port", "0"],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(lines,), daemon=True).start()
        deadline = time.monotonic() + timeout
        self.url = ""
        while time.monotonic() < deadline and not self.url:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with code {self.proc.returncode} before listening")
            try:
                m = _LISTENING.search(lines.get(timeout=0.2))
            except queue.Empty:
                continue
            if m:
                self.url = m.group(1)
        if not self.url:
            self.stop()
            raise RuntimeError(f"gateway did not report its port within {timeout:.0f}s")

    def _pump(self, lines: "queue.Queue[str]") -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not self.url:
                lines.put(line)
            else:
                try:
                    (self._log or sys.stdout).write(line)
                except ValueError:  # log closed while stopping
                    return

    def healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=2) as resp:
                return resp.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop_process(self.proc, self._log, timeout=10)
