"""Small process and environment helpers shared by the local stack's services."""

from __future__ import annotations

import os
import subprocess
from typing import IO, Any


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
