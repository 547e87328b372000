"""`local._proc`: how the local stack learns a child service's port (the gateway process, the
Lambda workers), and the listen backlog of its own HTTP servers."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from local._proc import LISTEN_BACKLOG, LoopbackHTTPServer, await_listening, stop_process

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")
ROOT = Path(__file__).resolve().parents[2]


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


def test_a_line_log_written_by_many_threads_and_a_worker_pipe_keeps_every_line_whole(tmp_path):
    """lambdas.log has one writer per process (`LineLog`): threads writing lines in pieces, with and
    without their newline in the same call, never interleave inside a line, and a second `shared_line_log`
    of the path is the same object, closed by its last user (two buffered file objects on one path split
    lines at their buffer boundaries)."""
    import threading

    from local._proc import shared_line_log

    path = tmp_path / "lambdas.log"
    first, second = shared_line_log(path), shared_line_log(path)
    assert first is second
    barrier = threading.Barrier(8)

    def writer(n: int) -> None:
        barrier.wait()
        for i in range(300):
            line = f"{n}:{i}:" + "x" * (i * 7 % 5000)
            first.write(line[: len(line) // 2])
            first.write(line[len(line) // 2:] + "\n")

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    first.write("unfinished")
    first.close()
    assert not second.closed
    second.close()
    lines = path.read_text().splitlines()
    assert len(lines) == 8 * 300 + 1 and lines[-1] == "unfinished"
    for line in lines[:-1]:
        n, i, xs = line.split(":")
        assert xs == "x" * (int(i) * 7 % 5000), line[:80]
    assert "\x00" not in path.read_text()


def test_local_services_end_when_the_process_that_started_them_is_killed(tmp_path):
    """A SIGKILL (or a SIGTERM to it alone) of a local run's Python process leaves no service behind: each
    service started with `service_env` runs `die_with_parent` and ends within about a second (they ran on,
    holding their ports and memory, before). The parent here starts a real Lambda worker pool and the
    simulator's process, prints their pids, and is killed."""
    import os
    import signal
    import subprocess
    import sys

    script = (
        "import sys, time\n"
        "from local.workers import WorkerPool\n"
        "from local.stack import SimulatorProcess\n"
        "pool = WorkerPool(1).wait()\n"
        "sim = SimulatorProcess(region='us-east-1', log_path=None, options=None)\n"
        "print(pool.procs[0].pid, sim.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=str(ROOT), env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        pids = [int(p) for p in parent.stdout.readline().split()]
        assert len(pids) == 2
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 30
        alive = pids
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if _alive(p)]
            time.sleep(0.2)
        assert alive == [], f"services still running after their parent was killed: {alive}"
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    import os

    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (its parent, init, has not reaped it yet) is gone for our purpose
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_terminal_s_ctrl_c_does_not_reach_a_local_service_the_run_stops_it():
    """A Ctrl-C at a terminal sends SIGINT to the whole foreground process group; a local service (started with
    `service_env`, running `die_with_parent`) ignores it and ends when the run stops it (SIGTERM), so the run can
    stop its execution, run Cleanup and collect with its services still answering. Before, every service died
    of the SIGINT at once (this test fails there: the child is gone after the SIGINT)."""
    import os
    import signal
    import subprocess
    import sys

    from local._proc import service_env, stop_process

    script = ("import time\nfrom local._proc import die_with_parent\ndie_with_parent()\n"
              "print('ready', flush=True)\ntime.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=str(ROOT),
                             env={**service_env(), "PYTHONPATH": str(ROOT)})
    try:
        assert child.stdout.readline().strip() == "ready"
        os.kill(child.pid, signal.SIGINT)
        time.sleep(1.0)
        assert child.poll() is None, "the service died of the terminal's SIGINT"
        stop_process(child, timeout=10)
        assert child.returncode == -signal.SIGTERM
    finally:
        if child.poll() is None:
            child.kill()
