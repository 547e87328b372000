"""Rehearse the Lambda images without Docker: what `docker build` would install, run by the
images' Python against the local stack.

    .venv/bin/python scripts/image_rehearsal.py        # CI runs this (`make image-rehearsal`)

1. **Resolve** ``lambdas/requirements.lock`` for the image platform with pip (``pip download
   --only-binary=:all: --platform manylinux_2_34_x86_64 ... --python-version 3.13
   --implementation cp --abi cp313 --require-hashes --no-deps``) into a wheel cache, and check
   every file is a wheel of the pinned version, with the pinned sha256, whose tags the image's
   CPython 3.13 on glibc 2.34 x86_64 accepts.
2. **Install** them with pyenv's CPython 3.13 ``pip install --target SITE --no-index`` (the
   image's ``pip install`` of the same lock), and report SITE's size and file count.
3. **Import** every handler a function's CMD names (``stepwise.functions.FUNCTIONS``) and the
   gateway's entrypoint, each in a fresh ``python3.13 -I -S`` that sees only SITE and
   ``lambdas/`` (``scripts/image_child.py``): first-import time and peak RSS.
4. **Invoke** a representative chain of handlers with the events the state machine sends
   (Init -> PollSession -> PlanStep -> StartRollout -> OnRolloutResult -> FinishRollout ->
   ComputeAdvantages -> SubmitTrain (-> PollOperation while not done) -> Rebind -> PlanStep -> Checkpoint ->
   PlanStep -> StopSession, then Cleanup's EventBridge event), each in a fresh
   3.13 process, against moto (server mode) and the SageMaker simulator started here from the
   dev venv as loopback servers, with a loopback agent standing in for ACR: first-invocation
   peak RSS (``VmHWM``: ``ru_maxrss`` survives execve, see image_child.py) against the
   function's ``memory_mb``.
5. **Serve** the gateway by ``lambdas/Dockerfile.gateway``'s ENTRYPOINT (``python3.13 -m stepwise.gateway``),
   its interpreter looked up by name as the image does, among what the base image is known to have
   (``infra.image_platform.INTERPRETER``), and GET ``/healthz``.
6. **Unit tests** of the handler package (``FAST_TESTS``) under 3.13, pytest and hypothesis
   installed in their own ``--target`` folder.

Wheels, SITE and the test tools are cached under ``~/.cache/stepwise-image`` (or
``$STEPWISE_IMAGE_CACHE``), keyed by the lock's content, so a rerun only re-checks. Exit status
is non-zero on any failure (a message says which step).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas")]

from infra.image_platform import (  # noqa: E402
    INTERPRETER, LOCK, PYTHON_VERSION, image_entrypoint, normalize, read_lock, supported_tags, target_args, target_python)
from local._proc import stop_process  # noqa: E402

LAMBDAS = ROOT / "lambdas"
CHILD = Path(__file__).resolve().parent / "image_child.py"
CACHE = Path(os.environ.get("STEPWISE_IMAGE_CACHE", "~/.cache/stepwise-image")).expanduser()
#: How every 3.13 process runs: no environment variables, user or site folders (-I, -S), and no
#: .pyc written into the installed folder (-B; the image sets PYTHONDONTWRITEBYTECODE=1 too).
ISOLATED = ("-I", "-S", "-B")

#: The handler package's fast unit tests (no torch, no CDK, no local stack), and the gateway's
#: tests that need only moto's S3 and the agents' real OpenAI/Anthropic clients: they must pass
#: on the image's Python too.
FAST_TESTS = (
    "tests/core/test_advantages.py", "tests/core/test_dapo.py", "tests/core/test_datums.py",
    "tests/core/test_replay.py", "tests/core/test_rewards.py", "tests/config/test_validation.py",
    "tests/gateway/test_session_records.py", "tests/core/test_planning.py", "tests/handlers/test_metrics.py",
    "tests/aws/test_tracking_mlflow.py", "tests/docs/test_config_reference.py",
    "tests/gateway/test_transformers_parsing.py", "tests/gateway/test_refusals.py",
    "tests/gateway/test_wire_protocols.py", "tests/gateway/test_replay_parity.py",
    "tests/gateway/test_toolkit_seams.py",
)
#: Test tools for FAST_TESTS under 3.13, at the dev venv's own versions (pyproject's dev and
#: local extras), in their own folder after the image's on sys.path.
TEST_TOOLS = ("pytest", "hypothesis", "pytest-timeout", "moto[server,s3]", "openai", "anthropic")


class RehearsalFailed(Exception):
    """A step of the rehearsal failed; the message says which and why."""


def say(line: str) -> None:
    print(line, flush=True)


# ------------------------------------------------------------------------- 1. resolve


def resolve(pins: dict[str, tuple[str, list[str]]], wheels: Path) -> list[Path]:
    """pip-download the lock for the image platform into ``wheels``; check each file against the lock."""
    wheels.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", *target_args(), "--require-hashes", "--no-deps",
           "-r", str(LOCK), "-d", str(wheels)]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RehearsalFailed(f"pip download of the lock for the image platform failed:\n{_tail(run.stderr)}")
    return check_wheels(pins, wheels)


def check_wheels(pins: dict[str, tuple[str, list[str]]], wheels: Path, *, tags: set | None = None,
                 platform: str = "manylinux_2_34_x86_64") -> list[Path]:
    """The lock's wheels in ``wheels``, one per pin: the file of the pinned version whose sha256
    the lock lists. RehearsalFailed for a file that is not a wheel, a pin without such a file, or
    one whose tags the image's CPython 3.13 on ``platform`` (``tags``: `supported_tags` of it; default
    the Lambda images', glibc 2.34 x86_64) does not accept. Other files (an older lock's) are left alone."""
    from packaging.utils import parse_wheel_filename

    ok = supported_tags() if tags is None else tags
    found: dict[str, Path] = {}
    for path in sorted(wheels.iterdir()):
        if not path.name.endswith(".whl"):
            raise RehearsalFailed(f"{path.name}: not a wheel (the image must not build from source)")
        name, version, _, file_tags = parse_wheel_filename(path.name)
        name = normalize(name)
        if name not in pins or str(version) != pins[name][0]:
            continue
        if hashlib.sha256(path.read_bytes()).hexdigest() not in pins[name][1]:
            continue
        if not set(file_tags) & ok:
            raise RehearsalFailed(f"{path.name}: no tag the image's CPython {PYTHON_VERSION} {platform} accepts")
        found[name] = path
    missing = sorted(f"{name}=={pins[name][0]}" for name in set(pins) - set(found))
    if missing:
        raise RehearsalFailed(f"no wheel with the lock's sha256 for {missing}")
    kinds: dict[str, int] = {}
    for path in found.values():
        abi, wheel_platform = path.name[:-4].split("-")[-2:]
        kind = "pure (none-any)" if wheel_platform == "any" else f"{'abi3' if abi == 'abi3' else abi} manylinux"
        kinds[kind] = kinds.get(kind, 0) + 1
    say(f"lock: {len(found)} pinned packages -> {len(found)} wheels, 0 sdists, every tag accepted by "
        f"CPython {PYTHON_VERSION} {platform}; sha256 = lock")
    say("lock: wheels by kind: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))
    return sorted(found.values())


# ------------------------------------------------------------------------- 2. install


def install(python313: str, wheels: Path, lock_text: str) -> Path:
    """The lock installed with 3.13's pip into a cached ``--target`` folder (reused while the lock is unchanged)."""
    key = hashlib.sha256(lock_text.encode()).hexdigest()[:16]
    site = CACHE / f"site-{key}"
    if not (site / ".complete").exists():
        for old in CACHE.glob("site-*"):
            shutil.rmtree(old, ignore_errors=True)
        cmd = [python313, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--root-user-action=ignore",
               "--target", str(site), "--no-index", "--find-links", str(wheels), *target_args(),
               "--require-hashes", "--no-deps", "-r", str(LOCK)]
        t0 = time.perf_counter()
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RehearsalFailed(f"pip install --target of the lock failed:\n{_tail(run.stderr)}")
        (site / ".complete").touch()
        say(f"install: python{PYTHON_VERSION} -m pip install --target --no-index ({time.perf_counter() - t0:.0f} s)")
    else:
        say(f"install: reused {site} (same lock)")
    size, files = 0, 0
    for path in site.rglob("*"):
        if path.is_file() and path.name != ".complete":
            size += path.stat().st_size
            files += 1
    say(f"install: {size / 1e6:.0f} MB in {files} files (installed packages, .pyc included; the base image adds its own)")
    return site


# ------------------------------------------------------------------------- 3/4. handlers in 3.13


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment (endpoints, dummy credentials) as a Lambda would see it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["HF_HOME"] = str(CACHE / "tmp" / "huggingface")  # the image's HF_HOME=/tmp/huggingface
    env.update(extra or {})
    return env


class Runner:
    """Runs one function's handler in a fresh ``python3.13 -I -S`` (``image_child.py invoke``)."""

    def __init__(self, python313: str, site: Path) -> None:
        self.python313, self.site = python313, site
        self.rows: dict[str, dict[str, Any]] = {}

    def invoke(self, spec: Any, events: list[Any], env: dict[str, str] | None = None,
               timeout: float = 600) -> list[Any]:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp, "report.json")
            cmd = [self.python313, *ISOLATED, str(CHILD), str(self.site), str(LAMBDAS), "invoke", str(out),
                   spec.handler, spec.name, str(spec.memory_mb), str(spec.timeout_s)]
            run = subprocess.run(cmd, input=json.dumps(events), capture_output=True, text=True,
                                 env=child_env(env), timeout=timeout)
            report = json.loads(out.read_text()) if out.exists() else {}
        if run.returncode != 0 or "error" in report:
            raise RehearsalFailed(f"{spec.name} ({spec.handler}) failed under python{PYTHON_VERSION}:\n"
                                  f"{report.get('error') or _tail(run.stderr)}\n{_tail(run.stdout)}")
        if not report["python"].startswith(PYTHON_VERSION + "."):
            raise RehearsalFailed(f"{spec.name} ran on Python {report['python']}, not {PYTHON_VERSION}")
        stdlib = str(Path(self.python313).resolve().parents[1] / "lib")
        leaked = [p for p in report["path"] if p not in (str(self.site), str(LAMBDAS)) and not p.startswith(stdlib)]
        if leaked or any("site-packages" in p for p in report["path"]):
            raise RehearsalFailed(f"{spec.name}'s interpreter sees more than the image folder and lambdas/: {report['path']}")
        row = self.rows.setdefault(spec.name, {"memory_mb": spec.memory_mb})
        if events:
            if "first_invoke_s" not in row:
                row.update(first_invoke_s=report["first_invoke_s"], invoke_rss_mb=report["maxrss_mb"])
        else:
            row.update(import_s=report["import_s"], import_rss_mb=report["maxrss_mb"])
        return report["outputs"]


def import_every_handler(runner: Runner) -> None:
    from stepwise.functions import FUNCTIONS

    for spec in FUNCTIONS:
        runner.invoke(spec, [], env={"STEPWISE_BUCKET": "rehearsal"})
        say(f"import: {spec.name:18s} {spec.handler:42s} {runner.rows[spec.name]['import_s']:.2f} s")


def invoke_representative_handlers(runner: Runner) -> None:
    """The state machine's first step, each task a fresh process (see the module docstring)."""
    from tests.support.pipeline import FakeAgent, Stack, execution_arn, run_ref

    from stepwise.functions import by_name
    from stepwise.layout import result_key, run_summary_key, summary_key

    stack = Stack()
    agent = FakeAgent()
    try:
        env = {"AWS_ENDPOINT_URL_BEDROCK_AGENTCORE": agent.url}
        # one step, then the run ends: PlanStep plans the final save_state; Track logs it to W&B (offline)
        config = stack.config(max_prompts=2, epochs=1, wandb_project="stepwise-rehearsal")
        wandb_env = {**env, "WANDB_MODE": "offline", "WANDB_DIR": tempfile.mkdtemp(prefix="stepwise-rehearsal-wandb-")}
        run_id = f"rehearsal-{int(time.time())}"
        run = run_ref(run_id)

        def call(name: str, *events: Any) -> list[Any]:
            t0 = time.perf_counter()
            outs = runner.invoke(by_name(name), list(events), env=wandb_env if name == "Track" else env)
            row = runner.rows[name]
            say(f"invoke: {name:18s} x{len(events)}  {time.perf_counter() - t0:5.1f} s wall, first invocation "
                f"{row['first_invoke_s']:.2f} s, peak RSS {row['invoke_rss_mb']:.0f} MB of {row['memory_mb']} MB")
            return outs

        (init,) = call("Init", {"input": config, "execution_arn": execution_arn(run_id), "execution_name": run_id})
        assert init["run"] == run, init
        (session,) = call("PollSession", {"run": run})
        if not session["ready"]:
            raise RehearsalFailed(f"the simulator's session is not Running after Init: {session}")
        (plan,) = call("PlanStep", {"run": run})
        if plan["action"] != "rollout":
            raise RehearsalFailed(f"PlanStep planned {plan['action']!r}, not a rollout: {plan}")
        items = json.loads(stack.s3.get_object(Bucket=stack.bucket, Key=plan["items_key"])["Body"].read())
        batch = plan["batch"]
        started = call("StartRollout", *({"task_token": f"rehearsal-token-{item['i']}", "run": run, "batch": batch,
                                          "item": item} for item in items))
        keys = [result_key(run_id, item["input_id"], out["sid"]) for item, out in zip(items, started)]
        _wait_for_objects(stack.s3, stack.bucket, keys)
        records = [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put",
                    "s3": {"bucket": {"name": stack.bucket}, "object": {"key": urllib.parse.quote_plus(k)}}} for k in keys]
        (notified,) = call("OnRolloutResult", {"Records": records})
        # the tokens are not a live execution's, so Step Functions refuses them: counted, not raised
        if notified["ignored"] + notified["resumed"] != len(keys):
            raise RehearsalFailed(f"OnRolloutResult handled {notified} of {len(keys)} results")
        finished = call("FinishRollout", *({"run": run, "batch": batch, "item": item, "error": None,
                                            "result": {"sid": out["sid"], "result_key": key}}
                                           for item, out, key in zip(items, started, keys)))
        if any(f.get("status") != "ok" for f in finished):
            raise RehearsalFailed(f"FinishRollout: {finished}")
        (adv,) = call("ComputeAdvantages", {"run": run, "batch": batch})
        def until_done(first: str, then: str, attempts: int = 10) -> dict[str, Any]:
            """``first``, then ``then`` while the operation is not done (the state machine's poll loop)."""
            (op,) = call(first, {"run": run})
            for _ in range(attempts):
                if op["done"]:
                    return op
                (op,) = call(then, {"run": run})
            raise RehearsalFailed(f"{first} -> {then}: not done after {attempts} polls: {op}")

        until_done("SubmitTrain", "PollOperation")  # the simulator usually completes inside the inline wait
        op = until_done("Rebind", "Rebind")
        if op.get("policy_version") != 1:
            raise RehearsalFailed(f"after one step the policy version is {op.get('policy_version')}, expected 1")
        # the step summary's S3 notification: sample table, W&B (offline), report page
        (tracked,) = call("Track", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "s3": {
            "bucket": {"name": stack.bucket}, "object": {"key": urllib.parse.quote_plus(summary_key(run_id, 0))}}}]})
        published = tracked["published"]
        if len(published) != 1 or published[0].get("warnings") or not published[0].get("report_bytes"):
            raise RehearsalFailed(f"Track did not publish step 0 cleanly: {tracked}")
        (plan,) = call("PlanStep", {"run": run})
        if plan["action"] != "checkpoint":
            raise RehearsalFailed(f"after the last step PlanStep planned {plan}, not the final checkpoint")
        until_done("Checkpoint", "Checkpoint")
        (plan,) = call("PlanStep", {"run": run})
        if plan["action"] != "finish":
            raise RehearsalFailed(f"after the final checkpoint PlanStep planned {plan}, not finish")
        (stopped,) = call("StopSession", {"execution_arn": run["execution_arn"], "execution_name": run_id,
                                          "input": config, "reason": "finished"})
        # EventBridge's status-change event for the same execution: a second stop is idempotent
        (cleaned,) = call("Cleanup", {"version": "0", "source": "aws.states",
                                      "detail-type": "Step Functions Execution Status Change",
                                      "detail": {"executionArn": run["execution_arn"], "name": run_id,
                                                 "status": "ABORTED", "input": json.dumps(config)}})
        if not cleaned.get("stopped"):
            raise RehearsalFailed(f"Cleanup of an aborted execution stopped nothing: {cleaned}")
        (ended,) = call("Track", {"Records": [{"eventSource": "aws:s3", "eventName": "ObjectCreated:Put", "s3": {
            "bucket": {"name": stack.bucket}, "object": {"key": urllib.parse.quote_plus(run_summary_key(run_id))}}}]})
        if not ended["published"] or not ended["published"][0].get("report_bytes"):
            raise RehearsalFailed(f"Track did not publish the run's end: {ended}")
        say(f"invoke: a one-step run on moto + simulator: {len(items)} rollouts (results {notified}), "
            f"advantages {adv}, final checkpoint, {plan['action']}: {plan['reason']}, session stopped: {stopped}")
    finally:
        agent.stop()
        stack.stop()


def _wait_for_objects(s3: Any, bucket: str, keys: list[str], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    for key in keys:
        while True:
            try:
                s3.head_object(Bucket=bucket, Key=key)
                break
            except s3.exceptions.ClientError:
                if time.monotonic() > deadline:
                    raise RehearsalFailed(f"the agent wrote no result {key} within {timeout:.0f} s")
                time.sleep(0.1)


# ------------------------------------------------------------------------- 5. gateway


def entrypoint_interpreter(entrypoint: list[str], python313: str, bin_dir: Path) -> str:
    """The interpreter the gateway image's ``entrypoint`` starts, found as the image finds it: by PATH
    lookup of its first word in a ``bin_dir`` that holds what the base image is known to have there,
    ``INTERPRETER`` (a link to ``python313``). Raises RehearsalFailed for any other name (a bare
    ``python``) or an entrypoint that does not run ``-m stepwise.gateway``."""
    if entrypoint[1:3] != ["-m", "stepwise.gateway"]:
        raise RehearsalFailed(f"Dockerfile.gateway's ENTRYPOINT {entrypoint} does not run -m stepwise.gateway")
    link = bin_dir / INTERPRETER
    if not link.exists():
        link.symlink_to(python313)
    found = shutil.which(entrypoint[0], path=str(bin_dir))
    if found is None:
        raise RehearsalFailed(f"Dockerfile.gateway's ENTRYPOINT starts {entrypoint[0]!r}, which the base image is not "
                              f"known to have on its PATH (its interpreter: /var/lang/bin/{INTERPRETER})")
    return found


def serve_gateway(python313: str, site: Path, runner: Runner) -> None:
    """The gateway image's ENTRYPOINT (``python3.13 -m stepwise.gateway``) with ``--port 0`` under 3.13
    (moto's S3 as its bucket): readiness answers."""
    from stepwise.functions import GATEWAY_FUNCTION as spec

    entry = image_entrypoint()
    with tempfile.TemporaryDirectory() as bin_dir:
        interpreter = entrypoint_interpreter(entry, python313, Path(bin_dir))
        _serve_gateway(interpreter, entry, site, runner, spec)


def _serve_gateway(interpreter: str, entry: list[str], site: Path, runner: Runner, spec: Any) -> None:
    from tests.support.gateway import BUCKET, REGION, MotoS3

    s3 = MotoS3()
    cmd = [interpreter, *ISOLATED, str(CHILD), str(site), str(LAMBDAS), "gateway", *entry[3:], "--port", "0"]
    env = child_env({"STEPWISE_BUCKET": BUCKET, "AWS_ENDPOINT_URL_S3": s3.endpoint,
                     "AWS_DEFAULT_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"})
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        listening = time.perf_counter() - t0
        if not line.startswith("stepwise gateway listening on http://127.0.0.1:"):
            proc.kill()
            raise RehearsalFailed(f"the gateway did not start under python{PYTHON_VERSION}: {line!r}\n{_tail(proc.stderr.read())}")
        url = line.split(" on ", 1)[1].strip()
        with urllib.request.urlopen(url + "/healthz", timeout=30) as r:
            body = json.loads(r.read())
        if body != {"ok": True}:
            raise RehearsalFailed(f"GET /healthz answered {body}")
        time.sleep(3)  # the server warms transformers' tokenizer imports off the request path
        rss = _vm_hwm_mb(proc.pid)
        runner.rows[spec.name] = {"memory_mb": spec.memory_mb, "import_s": listening, "invoke_rss_mb": rss}
        say(f"gateway: {' '.join(entry)} listening after {listening:.2f} s; GET /healthz -> {body}; "
            f"peak RSS {rss:.0f} MB of {spec.memory_mb} MB (3 s after readiness, tokenizer imports warmed)")
    finally:
        stop_process(proc, timeout=10)
        s3.stop()


def _vm_hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


# ------------------------------------------------------------------------- 6. unit tests


def run_unit_tests(python313: str, site: Path) -> None:
    from importlib.metadata import version

    pins = [f"{tool}=={version(tool.split('[', 1)[0])}" for tool in TEST_TOOLS]
    tools = CACHE / ("tools-" + hashlib.sha256(" ".join(pins).encode()).hexdigest()[:12])
    if not (tools / ".complete").exists():
        shutil.rmtree(tools, ignore_errors=True)
        run = subprocess.run([python313, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                              "--root-user-action=ignore", "--only-binary=:all:", "--target", str(tools), *pins],
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise RehearsalFailed(f"installing {pins} for python{PYTHON_VERSION} failed:\n{_tail(run.stderr)}")
        (tools / ".complete").touch()
    ini = CACHE / "pytest-3.13.ini"  # not pyproject's: its pythonpath would put the repo root on sys.path
    ini.write_text("[pytest]\ntimeout = 300\naddopts = -ra -p no:cacheprovider\n")
    # The tests import their helpers as ``tests.support.*`` and pytest imports them as ``tests.<folder>.*``
    # from the folder above ``tests/``: a folder holding only a link to tests/ is that import root, so the
    # repository's other packages (local, infra, ...) stay off sys.path as in the image.
    # One per checkout (the cache is shared by the checkouts of a machine; a link made by another, or by a
    # checkout since moved, would run its tests or none).
    test_root = CACHE / ("test-root-" + hashlib.sha256(str(ROOT).encode()).hexdigest()[:12])
    test_root.mkdir(parents=True, exist_ok=True)
    if not (test_root / "tests").is_symlink():
        (test_root / "tests").symlink_to(ROOT / "tests", target_is_directory=True)
    boot = ("import sys; sys.path[:0] = sys.argv[1:4]; import pytest; "
            "sys.exit(pytest.main(['-q', '-c', sys.argv[4], '--rootdir', sys.argv[5], *sys.argv[6:]]))")
    t0 = time.perf_counter()
    run = subprocess.run([python313, *ISOLATED, "-c", boot, str(site), str(LAMBDAS), str(tools), str(ini), str(test_root),
                          *(str(test_root / test) for test in FAST_TESTS)], cwd=ROOT, capture_output=True, text=True,
                         env=child_env())
    summary = (run.stdout.strip().splitlines() or ["(no output)"])[-1]
    if run.returncode != 0:
        raise RehearsalFailed(f"the handler package's unit tests fail under python{PYTHON_VERSION}:\n{_tail(run.stdout, 60)}")
    say(f"tests: {len(FAST_TESTS)} files under python{PYTHON_VERSION} ({', '.join(pins)}): {summary} "
        f"({time.perf_counter() - t0:.0f} s)")


# ------------------------------------------------------------------------- main


def _tail(text: str | None, lines: int = 30) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


def report(rows: dict[str, dict[str, Any]]) -> None:
    """The per-function table; RehearsalFailed if any peak RSS exceeds its ``memory_mb``."""
    say(f"{'function':18s} {'memory_mb':>9s} {'import':>7s} {'RSS':>7s} {'1st invoke':>10s} {'peak RSS':>8s} {'of memory':>9s}")
    over = []
    for name, row in rows.items():
        rss = row.get("invoke_rss_mb")
        first = f"{row['first_invoke_s']:.2f} s" if "first_invoke_s" in row else "-"
        share = f"{100 * rss / row['memory_mb']:.0f}%" if rss else "-"
        imported = f"{row['import_rss_mb']:.0f} MB" if "import_rss_mb" in row else "-"
        say(f"{name:18s} {row['memory_mb']:9d} {row.get('import_s', 0):5.2f} s {imported:>7s} {first:>10s} "
            f"{(f'{rss:.0f} MB' if rss else '-'):>8s} {share:>9s}")
        if max(rss or 0, row.get("import_rss_mb", 0)) > row["memory_mb"]:
            over.append(name)
    say("(import: first import of the CMD's module in a fresh python3.13 and the RSS after it; "
        "1st invoke / peak RSS: the first invocation's time and the process's peak RSS, VmHWM)")
    if over:
        raise RehearsalFailed(f"peak RSS above the function's memory_mb: {over} (raise memory_mb in stepwise/functions.py)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="re-install the image folder even if cached")
    parser.add_argument("--skip-tests", action="store_true", help="skip the 3.13 unit tests")
    args = parser.parse_args(argv)
    t_start = time.perf_counter()
    try:
        python313 = target_python()
        say(f"image: amazon/aws-lambda-python:{PYTHON_VERSION} stand-in {python313}")
        lock_text = LOCK.read_text()
        pins = read_lock(lock_text)
        CACHE.mkdir(parents=True, exist_ok=True)
        if args.fresh:
            for old in CACHE.glob("site-*"):
                shutil.rmtree(old, ignore_errors=True)
        t0 = time.perf_counter()
        resolve(pins, CACHE / "wheels")
        say(f"lock: resolved in {time.perf_counter() - t0:.0f} s")
        site = install(python313, CACHE / "wheels", lock_text)
        runner = Runner(python313, site)
        import_every_handler(runner)
        invoke_representative_handlers(runner)
        serve_gateway(python313, site, runner)
        report(runner.rows)
        if not args.skip_tests:
            run_unit_tests(python313, site)
    except (RehearsalFailed, SystemExit, AssertionError, subprocess.TimeoutExpired) as e:
        say(f"image rehearsal FAILED: {e}")
        return 1
    say(f"image rehearsal passed in {time.perf_counter() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
