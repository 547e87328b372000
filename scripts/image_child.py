"""One Lambda container, played by pyenv's CPython 3.13 for scripts/image_rehearsal.py.

Run as ``python3.13 -I -S -B image_child.py SITE LAMBDAS MODE ...``: ``-I -S`` leave only the
standard library on ``sys.path``; this adds exactly the image's installed folder (SITE, the
lock installed with ``pip --target``) and ``lambdas/`` (the image's ``/var/task``), so nothing
of the developer's environment can satisfy an import.

Modes:
- ``invoke OUT HANDLER FUNCTION MEMORY_MB TIMEOUT_S``: import ``HANDLER`` (``module.function``,
  a function's CMD), then call it once per event of the JSON list on stdin with a Lambda-like
  context; writes ``{"python", "path", "import_s", "first_invoke_s", "maxrss_mb", "outputs"}`` (or
  ``{"error"}``) to OUT. ``maxrss_mb`` is the peak RSS after the first invocation (after the import if there is no event).
- ``gateway ARGS...``: ``python3.13 -m stepwise.gateway ARGS...`` (the gateway image's ENTRYPOINT).
"""

import sys

SITE, LAMBDAS, MODE = sys.argv[1:4]
sys.path[:0] = [SITE, LAMBDAS]

import importlib  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import runpy  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
import uuid  # noqa: E402


class LambdaContext:
    """The Lambda context attributes handlers and Powertools read."""

    def __init__(self, function_name: str, memory_mb: int, timeout_s: int) -> None:
        self.function_name = function_name
        self.function_version = "$LATEST"
        self.invoked_function_arn = f"arn:aws:lambda:us-east-1:123456789012:function:{function_name}"
        self.memory_limit_in_mb = memory_mb
        self.aws_request_id = str(uuid.uuid4())
        self.log_group_name = f"/aws/lambda/{function_name}"
        self.log_stream_name = "rehearsal"
        self._deadline = time.monotonic() + timeout_s

    def get_remaining_time_in_millis(self) -> int:
        return max(0, int((self._deadline - time.monotonic()) * 1000))


def _maxrss_mb() -> float:
    """This process's peak RSS in MiB: ``VmHWM``, which execve resets. ``ru_maxrss`` alone is not
    enough here: Linux carries it across execve, so a child forked from the rehearsal (torch and
    the simulator loaded, ~700 MB) would report at least its parent's size."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def invoke(out: str, handler: str, function: str, memory_mb: str, timeout_s: str) -> int:
    report: dict = {"python": sys.version.split()[0], "path": list(sys.path)}
    try:
        events = json.load(sys.stdin)
        module, _, name = handler.rpartition(".")
        t0 = time.perf_counter()
        fn = getattr(importlib.import_module(module), name)
        report["import_s"] = time.perf_counter() - t0
        report["maxrss_mb"] = _maxrss_mb()
        outputs = []
        for i, event in enumerate(events):
            t0 = time.perf_counter()
            outputs.append(fn(event, LambdaContext(function, int(memory_mb), int(timeout_s))))
            if i == 0:
                report["first_invoke_s"] = time.perf_counter() - t0
                report["maxrss_mb"] = _maxrss_mb()
        report["outputs"] = outputs
        code = 0
    except BaseException:  # reported to the rehearsal, which fails
        report["error"] = traceback.format_exc()
        code = 1
    with open(out, "w") as f:
        json.dump(report, f, default=str)
    return code


if __name__ == "__main__":
    if MODE == "invoke":
        sys.exit(invoke(*sys.argv[4:9]))
    elif MODE == "gateway":
        sys.argv = ["stepwise.gateway", *sys.argv[4:]]
        runpy.run_module("stepwise.gateway", run_name="__main__", alter_sys=True)
    else:
        sys.exit(f"unknown mode {MODE!r}")
