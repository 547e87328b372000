"""Rehearse the example agents' container image (``local/agents/Dockerfile``) without Docker.

    .venv/bin/python scripts/agent_image_rehearsal.py        # CI runs this (`make agent-rehearsal`)

The image is what the stack's ``deployMathAgent`` runtime runs on AgentCore Runtime: CPython 3.13 on
Debian 12 (glibc 2.36) for **linux/arm64**, ``local/agents/requirements.lock`` installed with
``--require-hashes``, serving ``local.agents.math_agent:app`` with uvicorn on port 8080. This machine is
x86_64 and cannot run arm64 code, so the rehearsal proves what can be proven here and says what it cannot:

1. **Resolve for arm64**: ``pip download`` of the lock for CPython 3.13 manylinux_2_36 aarch64 (wheels
   only, ``--require-hashes``): every pin has a wheel of its version with the lock's sha256, whose tags
   the image's pip accepts. So ``docker build`` installs without compiling and picks exactly these files.
2. **The same versions on this machine**: the lock's versions resolved for x86_64. A pure wheel
   (``py3-none-any``) is one file for every platform: its sha256 must be the lock's, so the image imports
   the very bytes rehearsed here. A binary wheel (aiohttp, pydantic-core, ...) is a different build of
   the same version: the rehearsal runs its x86_64 twin, not the arm64 file.
3. **Install** them with pyenv's CPython 3.13 ``pip install --target`` (no index), lay out ``/app`` as the
   Dockerfile's ``COPY`` does (``local/agents/`` plus an empty ``local/__init__.py``).
4. **Start** the image's command (``python -m uvicorn local.agents.math_agent:app``) in ``python3.13 -I -S``
   that sees only that folder and ``/app``; ``GET /ping`` answers; ``POST /invocations`` with a GSM8K
   payload whose ``_rollout`` points at a loopback OpenAI-compatible stub answers ``processing``, and the
   agent writes its result (``rewards`` 1.0 for the right ``#### 18``) to moto's S3 at the toolkit's key.

What only a real deploy proves: that the arm64 binary wheels import and run on AgentCore Runtime's
hardware; ``docker build`` itself (the base image pulled, ``--platform linux/arm64`` under emulation or on
an arm64 builder); the image's size against ACR's limit; the runtime reaching READY and its role pulling the
image and writing ``rollout-results/`` (docs/first-run.md lists these).

Wheels and the installed folder are cached under ``~/.cache/stepwise-image`` (``$STEPWISE_IMAGE_CACHE``),
keyed by the lock's content. Exit status is non-zero on any failure (the message says which step).
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "lambdas"), str(ROOT / "scripts")]

from image_rehearsal import CACHE, RehearsalFailed, _tail, _vm_hwm_mb, check_wheels, say  # noqa: E402

from infra.image_platform import (  # noqa: E402
    AGENT_ARCH, AGENT_GLIBC_MINOR, AGENT_LOCK, PYTHON_VERSION, normalize, read_lock, supported_tags, target_args,
    target_python)
from local._proc import stop_process  # noqa: E402

AGENTS = ROOT / "local" / "agents"
ISOLATED = ("-I", "-S", "-B")
AGENT = "math_agent"
ARM64 = f"manylinux_2_{AGENT_GLIBC_MINOR}_{AGENT_ARCH}"


def download(lock: Path, dest: Path, arch: str, *, hashed: bool) -> None:
    """``pip download`` of ``lock`` (its pins; ``hashed``: with ``--require-hashes``) for CPython 3.13 on
    glibc 2.36 ``arch``, wheels only, into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", *target_args(AGENT_GLIBC_MINOR, arch), "--no-deps",
           "-r", str(lock), "-d", str(dest)]
    if hashed:
        cmd.insert(-4, "--require-hashes")
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode != 0:
        raise RehearsalFailed(f"pip download of the agent lock for {arch} failed:\n{_tail(run.stderr)}")


def twins(pins: dict[str, tuple[str, list[str]]], wheels: Path) -> tuple[list[Path], int, list[str]]:
    """The x86_64 wheels of the lock's versions in ``wheels``: ``(files, pure wheels whose sha256 is the
    lock's, binary twins)``. RehearsalFailed when a pure wheel's bytes differ from the lock's file."""
    from packaging.utils import parse_wheel_filename

    files, identical, binary = [], 0, []
    for path in sorted(wheels.glob("*.whl")):
        name, version, _, tags = parse_wheel_filename(path.name)
        name = normalize(name)
        if name not in pins or str(version) != pins[name][0]:
            continue
        files.append(path)
        if all(t.platform == "any" for t in tags):
            if hashlib.sha256(path.read_bytes()).hexdigest() not in pins[name][1]:
                raise RehearsalFailed(f"{path.name}: a pure wheel whose sha256 is not the lock's (another file "
                                      f"for every platform?)")
            identical += 1
        else:
            binary.append(f"{name}=={version}")
    missing = sorted(set(pins) - {normalize(parse_wheel_filename(p.name)[0]) for p in files})
    if missing:
        raise RehearsalFailed(f"no x86_64 wheel of the locked version for {missing}")
    return files, identical, binary


def install(python313: str, wheels: list[Path], lock_text: str) -> Path:
    key = hashlib.sha256(lock_text.encode()).hexdigest()[:16]
    site = CACHE / f"agent-site-{key}"
    if not (site / ".complete").exists():
        for old in CACHE.glob("agent-site-*"):
            shutil.rmtree(old, ignore_errors=True)
        cmd = [python313, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--root-user-action=ignore",
               "--target", str(site), "--no-index", "--no-deps", *map(str, wheels)]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode != 0:
            raise RehearsalFailed(f"pip install --target of the agent's wheels failed:\n{_tail(run.stderr)}")
        (site / ".complete").touch()
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file())
    say(f"install: {len(wheels)} wheels into {site} ({size / 1e6:.0f} MB installed, x86_64 twins)")
    return site


def app_folder(tmp: Path) -> Path:
    """``/app`` as the Dockerfile lays it out: ``local/agents/`` (the build context) and ``local/__init__.py``."""
    app = tmp / "app"
    shutil.copytree(AGENTS, app / "local" / "agents", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (app / "local" / "__init__.py").write_text("")
    return app


class StubLLM:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback that answers every request ``#### 18``."""

    def __init__(self) -> None:
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                answer = json.dumps({
                    "id": "chatcmpl-rehearsal", "object": "chat.completion", "created": int(time.time()),
                    "model": body.get("model", ""), "choices": [{"index": 0, "finish_reason": "stop", "message": {
                        "role": "assistant", "content": "16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18"}}],
                    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, *args: Any) -> None:
                pass

        self.requests: list[dict[str, Any]] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_invoke(python313: str, site: Path, app: Path) -> dict[str, Any]:
    """The image's command under 3.13, one rollout through it; returns what was measured."""
    from tests.support.gateway import BUCKET, REGION, MotoS3

    s3, llm = MotoS3(), StubLLM()
    port = free_port()
    boot = ("import runpy, sys; sys.path[:0] = sys.argv[1:3]; "
            f"sys.argv = ['uvicorn', 'local.agents.{AGENT}:app', '--host', '127.0.0.1', '--port', sys.argv[3]]; "
            "runpy.run_module('uvicorn', run_name='__main__', alter_sys=True)")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(app), "AWS_ENDPOINT_URL_S3": s3.endpoint,
           "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "PYTHONUNBUFFERED": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([python313, *ISOLATED, "-c", boot, str(site), str(app), str(port)], cwd=app, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RehearsalFailed(f"the agent exited with {proc.returncode} before serving:\n{_tail(proc.stdout.read())}")
            try:
                with urllib.request.urlopen(f"{url}/ping", timeout=2) as r:
                    ping = json.loads(r.read())
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RehearsalFailed("the agent did not answer GET /ping within 60 s") from None
                time.sleep(0.1)
        started = time.perf_counter() - t0
        sid, run_id = str(uuid.uuid4()), "rehearsal"
        payload = {"prompt": "Janet's ducks lay 16 eggs per day. She eats three and bakes with four. She sells the "
                             "rest at $2 per egg. How much does she make every day?", "answer": "18",
                   "_rollout": {"exp_id": f"rollout-results/{run_id}", "input_id": "q0", "s3_bucket": BUCKET,
                                "base_url": llm.url, "model_id": "stepwise-rehearsal", "api_key": sid,
                                "sampling_params": {"temperature": 1.0, "max_tokens": 512}}}
        req = urllib.request.Request(f"{url}/invocations", data=json.dumps(payload).encode(), method="POST",
                                     headers={"Content-Type": "application/json",
                                              "X-Amzn-Bedrock-AgentCore-Runtime-Session-Id": sid})
        with urllib.request.urlopen(req, timeout=30) as r:
            answer = json.loads(r.read())
        if answer.get("status") != "processing":
            raise RehearsalFailed(f"POST /invocations answered {answer}, not the toolkit's 'processing'")
        key = f"rollout-results/{run_id}/q0/{sid}.json"
        deadline = time.monotonic() + 60
        while True:
            try:
                result = json.loads(s3.client.get_object(Bucket=BUCKET, Key=key)["Body"].read())
                break
            except s3.client.exceptions.NoSuchKey:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RehearsalFailed(f"the agent wrote no result at s3://{BUCKET}/{key}:\n{_tail(proc.stdout.read())}")
                time.sleep(0.1)
        if result.get("rewards") != 1.0 or result.get("status_code") != 200:
            raise RehearsalFailed(f"the agent's result is not a reward of 1.0 with status 200: {result}")
        if not llm.requests or llm.requests[0]["auth"] != f"Bearer {sid}" or llm.requests[0]["path"] != "/v1/chat/completions":
            raise RehearsalFailed(f"the agent did not call the LLM at _rollout.base_url with _rollout.api_key: {llm.requests[:1]}")
        rss = _vm_hwm_mb(proc.pid)
        return {"ping": ping, "started_s": started, "rss_mb": rss, "llm_calls": len(llm.requests), "result_key": key}
    finally:
        stop_process(proc, timeout=10)
        llm.stop()
        s3.stop()


def main(argv: list[str] | None = None) -> int:
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    t_start = time.perf_counter()
    try:
        python313 = target_python()
        lock_text = AGENT_LOCK.read_text()
        pins = read_lock(lock_text)
        key = hashlib.sha256(lock_text.encode()).hexdigest()[:16]
        say(f"agent image: python:{PYTHON_VERSION}-slim-bookworm linux/arm64 ({ARM64}); stand-in {python313} (x86_64)")
        arm = CACHE / "agent-wheels-aarch64"
        download(AGENT_LOCK, arm, AGENT_ARCH, hashed=True)
        check_wheels(pins, arm, tags=supported_tags(AGENT_GLIBC_MINOR, AGENT_ARCH), platform=ARM64)
        with tempfile.TemporaryDirectory() as tmp:
            twin_reqs = Path(tmp, "twins.txt")
            twin_reqs.write_text("".join(f"{name}=={version}\n" for name, (version, _) in sorted(pins.items())))
            x86 = CACHE / f"agent-wheels-x86_64-{key}"
            download(twin_reqs, x86, "x86_64", hashed=False)
            files, identical, binary = twins(pins, x86)
            say(f"twins: {identical} of {len(pins)} pins are pure wheels, byte-identical to the image's (sha256 = lock); "
                f"{len(binary)} binary pins run as their x86_64 build of the same version: {', '.join(binary)}")
            site = install(python313, files, lock_text)
            measured = serve_and_invoke(python313, site, app_folder(Path(tmp)))
        say(f"serve: python{PYTHON_VERSION} -m uvicorn local.agents.{AGENT}:app answered GET /ping {measured['ping']} "
            f"after {measured['started_s']:.1f} s; one rollout: {measured['llm_calls']} LLM call(s) to _rollout.base_url, "
            f"result rewards 1.0 at {measured['result_key']}; peak RSS {measured['rss_mb']:.0f} MB")
    except (RehearsalFailed, SystemExit, AssertionError, subprocess.TimeoutExpired) as e:
        say(f"agent image rehearsal FAILED: {e}")
        return 1
    say(f"agent image rehearsal passed in {time.perf_counter() - t_start:.0f} s (not proven here: the arm64 binary "
        f"wheels running, docker build, ACR; see the module docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
