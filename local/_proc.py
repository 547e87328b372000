"""Small process and environment helpers shared by the local stack's services."""

from __future__ import annotations

import io
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


class LineLog(io.TextIOBase):
    """A log file that many threads and pumps of one process write: each complete line goes to the file
    whole, in one ``write`` to an ``O_APPEND`` descriptor under one lock, and a thread's unfinished line
    waits for its newline in that thread's own buffer. So two writers never interleave bytes inside a
    line (two buffered file objects on one path did: a flush at a buffer boundary split a line).

    Get it with `shared_line_log` (one object per path in this process) and `close` it when done; the
    last close writes what is left of each buffer and closes the file.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        self._lock = threading.Lock()
        self._partial = threading.local()
        self._users = 1

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        text = getattr(self._partial, "text", "") + s
        complete, newline, rest = text.rpartition("\n")
        self._partial.text = rest
        if newline:
            self._append(complete + newline)
        return len(s)

    def _append(self, text: str) -> None:
        data = text.encode("utf-8", "backslashreplace")
        with self._lock:
            if self._fd < 0:
                raise ValueError("I/O operation on closed LineLog")
            while data:
                data = data[os.write(self._fd, data):]

    def flush(self) -> None:
        pass  # nothing is buffered but the threads' unfinished lines, which wait for their newline

    def close(self) -> None:
        with _LOGS_LOCK:
            self._users -= 1
            if self._users > 0:
                return
            _LOGS.pop(self.path, None)
        rest = getattr(self._partial, "text", "")
        if rest:
            self._partial.text = ""
            self._append(rest + "\n")
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
        super().close()


_LOGS: dict[str, LineLog] = {}
_LOGS_LOCK = threading.Lock()


def shared_line_log(path: str | os.PathLike[str]) -> LineLog:
    """The `LineLog` of ``path`` in this process (opened on first use); each caller `LineLog.close` s it once."""
    key = os.path.realpath(path)
    with _LOGS_LOCK:
        log = _LOGS.get(key)
        if log is not None and not log.closed:
            log._users += 1
            return log
        log = _LOGS[key] = LineLog(key)
        return log


#: The pid of the local stack process that started a service (set by `service_env`; read by `die_with_parent`).
ENV_PARENT_PID = "STEPWISE_LOCAL_PARENT_PID"


def service_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's environment) plus this process's pid as the service's parent,
    for `die_with_parent` in the service it starts."""
    return {**(os.environ if env is None else env), ENV_PARENT_PID: str(os.getpid())}


def die_with_parent(poll_seconds: float = 0.5) -> None:
    """In a local service (a Lambda worker, the simulator, the gateway, an agent app): end this process when
    the local stack process that started it is gone, however it ended (SIGKILL, a SIGTERM to it alone, a
    crash), instead of running on, holding its port and memory. A daemon thread compares ``os.getppid()``
    with the pid `service_env` recorded every ``poll_seconds`` (portable; Linux's ``PR_SET_PDEATHSIG`` has
    no Python API) and sends this process SIGTERM once they differ. No-op when started by anything else.

    It also ignores SIGINT from then on: a terminal's Ctrl-C reaches the whole foreground process group, and
    the services get their signal from the run instead (`stop_process`'s SIGTERM once the run has stopped its
    execution, run its Cleanup and collected; or their parent's end). Before, every service died of the
    Ctrl-C at once, so the run's last minute was spent on asynchronous invocations whose workers were gone
    (some 60 "asynchronous invocation dropped" warnings) and on Cleanup without a simulator."""
    import signal

    expected = os.environ.get(ENV_PARENT_PID)
    if not expected or not expected.isdigit():
        return
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    def watch() -> None:
        while os.getppid() == int(expected):
            time.sleep(poll_seconds)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


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


class EnvChanges:
    """Process environment variables a local service set, put back by ``restore()``.

    ``restore()`` puts a variable back only while it still holds the value this object set: an owner that
    changed it later (a test's ``MonkeyPatch``, another stack) and already put it back is not overwritten
    with a value from the middle of its life. Owners stop in any order and the environment still ends as it
    began (moto's ``create_functions`` sets the stack's variables after a test's monkeypatch set them; the
    monkeypatch undone first, moto's old-value restore had brought the test's values back for good). Values
    are all it can compare: when this object set the very value the other owner's undo puts back, it cannot
    tell the two apart and restores its own old value.
    """

    def __init__(self) -> None:
        self._old: dict[str, str | None] = {}
        self._new: dict[str, str] = {}

    def set(self, env: dict[str, str]) -> None:
        """Set ``env`` in ``os.environ``, remembering each variable's value before the first change."""
        for key, value in env.items():
            self._old.setdefault(key, os.environ.get(key))
            self._new[key] = value
            os.environ[key] = value

    def restore(self) -> None:
        """Put back what ``set`` changed and nobody changed since (None = unset), then forget it."""
        for key, old in self._old.items():
            if os.environ.get(key) != self._new[key]:
                continue
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        self._old.clear()
        self._new.clear()


def await_listening(proc: subprocess.Popen, pattern: re.Pattern[str], *, what: str, timeout: float,
                    log: IO[str] | None = None, log_before: bool = False) -> re.Match[str]:
    """Read ``proc``'s stdout (a text pipe) until a line matches ``pattern``, the line a local
    service prints once it listens; returns the match. A daemon thread then copies every later
    line to ``log`` (None = this process's stdout) until ``proc`` ends or ``log`` is closed;
    ``log_before`` copies the lines before the listening one to ``log`` too (a child whose stderr joins its
    stdout: an import error's traceback then reaches the log).

    Raises:
        RuntimeError: ``proc`` exited first ("WHAT exited with code N before listening"), or no
            line matched within ``timeout`` seconds ("WHAT did not report its port within Ns").
    """
    lines: queue.Queue[str] = queue.Queue()
    pump = threading.Thread(target=_pump, args=(proc, pattern, lines, log, log_before), daemon=True)
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


def _pump(proc: subprocess.Popen, pattern: re.Pattern[str], lines: "queue.Queue[str]", log: IO[str] | None,
          log_before: bool = False) -> None:
    assert proc.stdout is not None
    listening = False
    for line in proc.stdout:
        if not listening:
            lines.put(line)
            listening = bool(pattern.search(line))
            if not (log_before and log is not None) or listening:
                continue
        try:
            (log or sys.stdout).write(line)
        except ValueError:  # log closed while stopping
            return
