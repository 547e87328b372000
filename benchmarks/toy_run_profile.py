"""Where a toy run's seconds go: `stepwise run-local examples/toy.json` (what ``make run`` runs) timed by part.

    .venv/bin/python -m benchmarks.toy_run_profile [--set max_prompts=80] [--label after] [--repo CHECKOUT]

Runs the toy config once as a subprocess and, every ``--every`` seconds, reads the CPU seconds of it and
of every process it started from ``/proc`` (moto, the Step Functions interpreter and the ACR emulator live in
the run-local process; the handlers in the loop's workers; Track in the niced worker beside the loop; the
gateway; the simulator; the agent apps). Then prints, from the run folder's ``timing.json``:

- the run's wall seconds and its phases (start-up, execution, end) and the end's parts;
- a step's mean seconds by part (the execution histories' states: rollouts, advantages, training,
  orchestration) and the training session's start;
- each function's invocations and handler seconds per step (Track's beside the loop), the ACR emulator's
  throttled invokes (``acr_tps_limit``'s pacing) and session stops, the S3 requests per rollout;
- CPU seconds by process and per step.

``--repo``: run another checkout's code (its folder first on ``PYTHONPATH``, this environment's packages), e.g.
the code before a change, for the same table. The machine is shared: the load average is printed before and after. Results: ``runs-bench/toy_run_profile-LABEL.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

CLK_TCK = os.sysconf("SC_CLK_TCK")
#: How a process is named in the table, by what its command line holds (first match).
KINDS = (("--beside-loop", "Track worker (niced)"), ("local.workers", "loop workers (handlers)"),
         ("stepwise.gateway", "gateway"), ("simulator", "simulator"), ("local.agents.serve", "agent apps"),
         ("run-local", "run-local (moto, ASL, ACR emulator)"))


def _children() -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            out.setdefault(ppid, []).append(int(d))
    return out


def _tree(root: int) -> list[int]:
    kids, seen, todo = _children(), [], [root]
    while todo:
        pid = todo.pop()
        seen.append(pid)
        todo += kids.get(pid, [])
    return seen


def _cpu(pid: int) -> tuple[str, float] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    return cmd, (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def kind_of(cmd: str) -> str:
    """The table's name of a process by its command line."""
    return next((name for needle, name in KINDS if needle in cmd), "other")


def profile(args: argparse.Namespace) -> dict[str, Any]:
    out_root = Path(args.out).resolve() / "toy_run_profile"
    repo = Path(args.repo).resolve() if args.repo else REPO_ROOT
    cmd = [sys.executable, "-m", "stepwise_cli", "run-local", str(repo / args.config), "--no-progress",
           "--out", str(out_root), *sum((["--set", s] for s in args.set), [])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(repo), str(repo / "lambdas"),
                                                       *filter(None, [os.environ.get("PYTHONPATH")])])}
    load_before = load_average()
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=repo, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    cpu: dict[int, tuple[str, float]] = {}
    while proc.poll() is None:
        for pid in _tree(proc.pid):
            if (got := _cpu(pid)) is not None:  # the command line as first seen (an exiting process has none)
                cpu[pid] = (cpu[pid][0] if pid in cpu and cpu[pid][0] else got[0], got[1])
        time.sleep(args.every)
    wall = time.monotonic() - t0
    text = proc.stdout.read() if proc.stdout else ""
    run_dir = next((Path(line.split("-> ", 1)[1].strip()) for line in text.splitlines()
                    if line.startswith("run ") and "-> " in line), None)
    timing = json.loads((run_dir / "timing.json").read_text()) if run_dir else {}
    by_kind: dict[str, float] = {}
    for c, s in cpu.values():
        by_kind[kind_of(c)] = by_kind.get(kind_of(c), 0.0) + s
    return {"wall_seconds": round(wall, 1), "load_before": load_before, "load_after": load_average(),
            "exit_code": proc.returncode, "closing_lines": text.splitlines()[-14:], "timing": timing,
            "cpu_seconds": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])}}


def table(result: dict[str, Any]) -> str:
    t = result["timing"]
    steps = max(1, int(t.get("steps") or 0))
    rows = [f"wall {result['wall_seconds']:.0f} s (load {result['load_before']} -> {result['load_after']}), "
            f"{t.get('steps')} steps; phases {t.get('phases')}; the end's parts {t.get('end_seconds')}",
            "per step (s): " + ", ".join(f"{k} {v:.2f}" for k, v in (t.get("per_step") or {}).items())
            + f"; session start {(t.get('seconds') or {}).get('session_start', 0):.1f} s once",
            "| part | invocations | handler s per step |", "|---|---|---|"]
    for name, st in sorted((t.get("lambdas") or {}).items(), key=lambda kv: -kv[1]["seconds"]):
        rows.append(f"| {name} | {st['count']} ({st['errors']} errors) | {st['seconds'] / steps:.2f} |")
    acr = t.get("acr") or {}
    rows.append(f"ACR: {acr.get('invocations')} invokes, {acr.get('throttled')} throttled (acr_tps_limit), "
                f"{acr.get('stop_calls')} session stops; S3 per rollout {(t.get('s3_requests') or {}).get('per_rollout')}")
    rows += ["| process | CPU s | CPU s per step |", "|---|---|---|"]
    for kind, s in result["cpu_seconds"].items():
        rows.append(f"| {kind} | {s:.1f} | {s / steps:.2f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/toy.json")
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=JSON", help="run-local --set")
    ap.add_argument("--every", type=float, default=1.0, help="seconds between /proc reads")
    ap.add_argument("--label", default="run")
    ap.add_argument("--repo", help="another checkout to run (default: this one)")
    ap.add_argument("--out", default=str(DEFAULT_OUT))
    args = ap.parse_args(argv)
    result = profile(args)
    print(table(result))
    print("\n".join(result["closing_lines"][-3:]))
    print(f"-> {write_result(Path(args.out), f'toy_run_profile-{args.label}', result)}")
    return 0 if result["exit_code"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
