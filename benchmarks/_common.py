"""Shared helpers for the benchmark scripts: machine facts, load average, percentiles, output."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path
from typing import Any, Sequence

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "runs-bench"


def load_average() -> str:
    """``os.getloadavg()`` as "1m/5m/15m" (the machine is shared: note it beside every figure)."""
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def machine() -> dict[str, Any]:
    """CPU count, model name, Python and torch versions of this machine."""
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu": model, "python": platform.python_version(), "platform": platform.platform()}


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default). Raises ValueError when empty."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def summary(values: Sequence[float]) -> dict[str, float]:
    """``{n, median, p90, mean}`` of ``values`` (seconds or ms, as given)."""
    return {"n": len(values), "median": statistics.median(values), "p90": percentile(values, 90),
            "mean": statistics.fmean(values)}


def write_result(out_dir: Path, name: str, result: dict[str, Any]) -> Path:
    """Write ``result`` (plus machine and load average) to ``out_dir/name.json`` and return the path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{name}.json"
    path.write_text(json.dumps({"machine": machine(), "load_average_end": load_average(), **result}, indent=2,
                               default=str))
    return path


#: Process role by a piece of its command line (first match wins); the benchmark's own process is "main".
_ROLES = (("local.workers", "workers"), ("stepwise.gateway", "gateway"), ("local.agents.serve", "agent"),
          ("simulator", "simulator"))


def process_role(cmdline: str) -> str:
    """``workers``, ``gateway``, ``agent``, ``simulator`` or ``other`` for a child's command line."""
    return next((role for part, role in _ROLES if part in cmdline), "other")


class CpuMonitor:
    """CPU seconds (user + system, from ``/proc``) of this process and every descendant, sampled every
    ``interval`` s on a daemon thread, so a window of wall time (one loop's steps) gets its CPU per
    process role. On this 2-core machine a loop whose processes need more than ~2 CPU-seconds per wall
    second is CPU-bound, and its step time follows its CPU per step, not its concurrency.

    Each sample reads ``/proc/PID/stat`` of every process once (parent links, then the descendants'
    times): a few ms per sample, whatever the thread count of the processes watched (reading each
    thread's ``children`` file cost the watched process ~20% of its GIL time with moto's hundreds of
    threads). Linux only; elsewhere `window` answers ``{}``.
    """

    def __init__(self, interval: float = 0.5) -> None:
        import threading

        self.interval = interval
        self.timeline: list[tuple[float, dict[int, float]]] = []
        self.roles: dict[int, str] = {os.getpid(): "main"}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-monitor", daemon=True)
        self._tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100

    def __enter__(self) -> "CpuMonitor":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(5)

    def _sample(self) -> dict[int, float]:
        """``{pid: CPU seconds}`` of this process and its descendants."""
        parent: dict[int, int] = {}
        cpu: dict[int, float] = {}
        try:
            pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
        except OSError:
            return {}
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            parent[pid] = int(fields[1])
            cpu[pid] = (int(fields[11]) + int(fields[12])) / self._tick
        me, out = os.getpid(), {}
        for pid in cpu:
            p, hops = pid, 0
            while p not in (me, 0, 1) and hops < 32:
                p, hops = parent.get(p, 0), hops + 1
            if p == me:
                out[pid] = cpu[pid]
                if pid not in self.roles:
                    try:
                        self.roles[pid] = process_role(Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " "))
                    except OSError:
                        self.roles[pid] = "other"
        return out

    def _run(self) -> None:
        import time

        last: dict[int, float] = {}
        while not self._stop.is_set():
            last.update(self._sample())  # an exited process keeps its last figure
            self.timeline.append((time.time(), dict(last)))
            self._stop.wait(self.interval)

    def window(self, t0: float, t1: float) -> dict[str, float]:
        """CPU seconds per role (and ``total``) spent between wall-clock times ``t0`` and ``t1``
        (``time.time()``), from the samples nearest to them; ``{}`` without samples."""
        if not self.timeline or t1 <= t0:
            return {}
        a = min(self.timeline, key=lambda s: abs(s[0] - t0))[1]
        b = min(self.timeline, key=lambda s: abs(s[0] - t1))[1]
        out: dict[str, float] = {}
        for pid, cpu in b.items():
            role = self.roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + max(0.0, cpu - a.get(pid, 0.0))
        out = {k: round(v, 2) for k, v in sorted(out.items())}
        out["total"] = round(sum(out.values()), 2)
        return out
