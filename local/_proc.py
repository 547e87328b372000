"""Small process and environment helpers shared by the local stack's services."""

from __future__ import annotations

import os
import queue
import re
import subprocess
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import IO, Any

# Listen backlog of the local stack's own HTTP servers. http.server's default of 5 resets
# connections when a Distributed Map starts hundreds of invocations at once (a drill at 256
# rollouts lost two to "Connection reset by peer"); Lambda itself has no such queue to overflow.
LISTEN_BACKLOG = 1024


class LoopbackHTTPServer(ThreadingHTTPServer):
    """`ThreadingHTTPServer` for a local service: daemon request threads and a listen backlog of
    `LISTEN_BACKLOG` connections (the kernel caps it at ``net.core.somaxconn``)."""

    daemon_threads = True
    request_queue_size = LISTEN_BACKLOG


def stop_process(proc: subprocess.Popen, log: IO[Any] | None = None, *, timeout: float = 10.0) -> None:
    """Terminate ``proc`` (SIGTERM, then SIGKILL after ``timeout`` seconds) and close its log file."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
    if log is not None:
        log.close()


def restore_env(saved: dict[str, str | None]) -> None:
    """Put back the environment variables ``saved`` recorded (None = was unset), then forget them."""
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value
    saved.clear()


def await_listening(proc: subprocess.Popen, pattern: re.Pattern[str], *, what: str, timeout: float,
                    log: IO[str] | None = None) -> re.Match[str]:
    """Read ``proc``'s stdout (a text pipe) until a line matches ``pattern``, the line a local
    service prints once it listens; returns the match. A daemon thread then copies every later
    line to ``log`` (None = this process's stdout) until ``proc`` ends or ``log`` is closed.

    Raises:
        RuntimeError: ``proc`` exited first ("WHAT exited with code N before listening"), or no
            line matched within ``timeout`` seconds ("WHAT did not report its port within Ns").
    """
    lines: queue.Queue[str] = queue.Queue()
    pump = threading.Thread(target=_pump, args=(proc, pattern, lines, log), daemon=True)
    pump.start()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            m = pattern.search(lines.get(timeout=0.2))
        except queue.Empty:
            # A child may print its listening line and exit before we look: read what it wrote
            # (the pump ends at EOF; 1 s bounds a pipe a grandchild keeps open) before calling it dead.
            if proc.poll() is not None:
                pump.join(1.0)
                if lines.empty():
                    raise RuntimeError(f"{what} exited with code {proc.returncode} before listening") from None
            continue
        if m:
            return m
    raise RuntimeError(f"{what} did not report its port within {timeout:.0f}s")


def _pump(proc: subprocess.Popen, pattern: re.Pattern[str], lines: "queue.Queue[str]", log: IO[str] | None) -> None:
    assert proc.stdout is not None
    listening = False
    for line in proc.stdout:
        if not listening:
            lines.put(line)
            listening = bool(pattern.search(line))
            continue
        try:
            (log or sys.stdout).write(line)
        except ValueError:  # log closed while stopping
            return
