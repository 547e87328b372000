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
