"""`local._proc`: how the local stack learns a child service's port (the gateway process, the
Lambda workers), and the listen backlog of its own HTTP servers."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from local._proc import LISTEN_BACKLOG, LoopbackHTTPServer, await_listening, stop_process

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


def test_returns_the_listening_line_and_copies_later_lines_to_the_log(tmp_path):
    proc = child("print('booting', flush=True); print('svc listening on http://127.0.0.1:4321', flush=True); "
                 "print('after 1', flush=True); print('after 2', flush=True)")
    log_path = tmp_path / "svc.log"
    with open(log_path, "a") as log:
        m = await_listening(proc, LISTENING, what="svc", timeout=30, log=log)
        assert m.group(1) == "4321"
        proc.wait(30)
        deadline = time.monotonic() + 10
        while "after 2" not in log_path.read_text() and time.monotonic() < deadline:
            log.flush()
            time.sleep(0.05)
    text = log_path.read_text()
    assert text == "after 1\nafter 2\n"  # the lines before and the listening line itself are not copied


def test_a_child_that_exits_first_is_named_with_its_exit_code():
    proc = child("print('no port here', flush=True); raise SystemExit(3)")
    with pytest.raises(RuntimeError, match=r"^svc exited with code 3 before listening$"):
        await_listening(proc, LISTENING, what="svc", timeout=30)


def test_a_child_that_never_listens_times_out():
    proc = child("import time; print('still booting', flush=True); time.sleep(60)")
    try:
        with pytest.raises(RuntimeError, match=r"^svc did not report its port within 1s$"):
            await_listening(proc, LISTENING, what="svc", timeout=1)
        assert proc.poll() is None  # the caller decides what to stop
    finally:
        stop_process(proc, timeout=5)


def test_a_child_that_printed_its_listening_line_and_exited_is_not_called_dead():
    proc = child("print('svc listening on http://127.0.0.1:4321', flush=True)")
    proc.wait(30)  # it has exited before anyone read its stdout
    assert await_listening(proc, LISTENING, what="svc", timeout=30).group(1) == "4321"


def _connects_without_accept(server_class, n: int) -> int:
    """How many of ``n`` clients complete a TCP connect to a server that never accepts."""
    server = server_class(("127.0.0.1", 0), BaseHTTPRequestHandler)
    clients = []
    try:
        for _ in range(n):
            sock = socket.socket()
            sock.settimeout(0.5)
            clients.append(sock)
            try:
                sock.connect(server.server_address)
            except OSError:
                return len(clients) - 1
        return n
    finally:
        for sock in clients:
            sock.close()
        server.server_close()


def test_local_servers_queue_a_map_s_burst_of_connections_where_http_server_s_default_does_not():
    burst = 256  # a Distributed Map starting that many invocations before the server accepts one
    assert _connects_without_accept(LoopbackHTTPServer, burst) == burst
    assert LISTEN_BACKLOG >= burst
    assert _connects_without_accept(ThreadingHTTPServer, burst) < 16  # the default (5) overflows
