"""Rehearse an agent's container image (``local/agents/Dockerfile``) without Docker.

    .venv/bin/python scripts/agent_image_rehearsal.py                  # CI runs this (`make agent-rehearsal`)
    .venv/bin/python scripts/agent_image_rehearsal.py --folder FOLDER  # your agent folder (make ... AGENT_DIR=)

With no argument it rehearses two images: the example agents' (below) and, as a user's agent folder would be,
``examples/agents/strands`` copied to a temporary folder outside the repository. For an **agent folder**
(`infra.agent_folder`: ``-c agentDir``, ``stepwise agent deploy``) the steps are the same but 1: its
requirements (plus the toolkit's agent side when they do not name it) are *resolved* for CPython 3.13
manylinux_2_36 aarch64 by ``pip download`` with dependencies, wheels only (the image's pip installs wheels only
too, ``--only-binary=:all:``), and the resolved versions with the arm64 files' sha256 stand in for the lock;
the folder is laid out as its staged copy (``/app``), its ``MODULE:ATTR`` served, and the invocation is the toy
task's (``What digit comes after 7?``) with the stub answering ``8``, streamed when the agent asks for a stream
(Strands does). An unpinned requirement may resolve to a newer release at ``docker build`` time than here:
pin or lock the folder's requirements for the very versions rehearsed (the rehearsal prints them).

The example agents' image is what the stack's ``deployMathAgent`` runtime runs on AgentCore Runtime: CPython 3.13 on
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
   Dockerfile's ``COPY`` does (``local/agents/``, ``local`` a namespace package).
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


def install(python313: str, wheels: list[Path], lock_text: str, prefix: str = "agent-site") -> Path:
    key = hashlib.sha256(lock_text.encode()).hexdigest()[:16]
    site = CACHE / f"{prefix}-{key}"
    if not (site / ".complete").exists():
        for old in CACHE.glob(f"{prefix}-*"):
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
    """``/app`` as the Dockerfile lays it out for the example agents: ``local/agents/`` (the build context, ``APP_DIR``;
    ``local`` a namespace package, as in the image)."""
    app = tmp / "app"
    shutil.copytree(AGENTS, app / "local" / "agents", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return app


class StubLLM:
    """An OpenAI-compatible ``/v1/chat/completions`` on loopback that answers every request ``answer``: one JSON
    completion, or Server-Sent Events chunks (then the usage chunk and ``[DONE]``) when the request streams."""

    def __init__(self, answer: str = "16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18") -> None:
        stub = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                stub.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
                head = {"id": "chatcmpl-rehearsal", "created": int(time.time()), "model": body.get("model", "")}
                usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
                if body.get("stream"):
                    chunks = [{**head, "object": "chat.completion.chunk", "choices": [
                        {"index": 0, "delta": {"role": "assistant", "content": stub.answer}, "finish_reason": None}]},
                        {**head, "object": "chat.completion.chunk", "choices": [
                            {"index": 0, "delta": {}, "finish_reason": "stop"}]},
                        {**head, "object": "chat.completion.chunk", "choices": [], "usage": usage}]
                    data = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"
                    content_type = "text/event-stream"
                else:
                    data = json.dumps({**head, "object": "chat.completion", "usage": usage, "choices": [
                        {"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": stub.answer}}]}).encode()
                    content_type = "application/json"
                self.send_response(200)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.answer = answer
        self.requests: list[dict[str, Any]] = []
        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()


#: The invocation each kind of image is rehearsed with: its payload (``_rollout`` added) and the stub's answer.
MATH_CASE = ({"prompt": "Janet's ducks lay 16 eggs per day. She eats three and bakes with four. She sells the rest at "
                        "$2 per egg. How much does she make every day?", "answer": "18"},
             "16 - 3 - 4 = 9 eggs, 9 * 2 = 18.\n#### 18")
TOY_CASE = ({"prompt": "What digit comes after 7?", "answer": "8"}, "8")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve_and_invoke(python313: str, site: Path, app: Path, entrypoint: str = f"local.agents.{AGENT}:app",
                     case: tuple[dict[str, Any], str] = MATH_CASE) -> dict[str, Any]:
    """The image's command under 3.13 (``uvicorn ENTRYPOINT`` in ``app``), one rollout through it with ``case``'s
    payload and stub answer; returns what was measured."""
    from tests.support.gateway import BUCKET, REGION, MotoS3

    s3, llm = MotoS3(), StubLLM(case[1])
    port = free_port()
    boot = ("import runpy, sys; sys.path[:0] = sys.argv[1:3]; "
            "sys.argv = ['uvicorn', sys.argv[4], '--host', '127.0.0.1', '--port', sys.argv[3]]; "
            "runpy.run_module('uvicorn', run_name='__main__', alter_sys=True)")
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(app), "AWS_ENDPOINT_URL_S3": s3.endpoint,
           "AWS_DEFAULT_REGION": REGION, "AWS_REGION": REGION, "AWS_ACCESS_KEY_ID": "testing",
           "AWS_SECRET_ACCESS_KEY": "testing", "PYTHONUNBUFFERED": "1", "AWS_EC2_METADATA_DISABLED": "true"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([python313, *ISOLATED, "-c", boot, str(site), str(app), str(port), entrypoint], cwd=app,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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
        payload = {**case[0],
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
        if not llm.requests or llm.requests[0]["auth"] != f"Bearer {sid}" or llm.requests[0]["path"] != "/v1/chat/completions":  # noqa: E501
            raise RehearsalFailed(f"the agent did not call the LLM at _rollout.base_url with _rollout.api_key: {llm.requests[:1]}")
        rss = _vm_hwm_mb(proc.pid)
        return {"ping": ping, "started_s": started, "rss_mb": rss, "llm_calls": len(llm.requests), "result_key": key,
                "streamed": any(r["body"].get("stream") for r in llm.requests)}
    finally:
        stop_process(proc, timeout=10)
        llm.stop()
        s3.stop()


def resolve_folder(agent: Any, dest: Path) -> dict[str, tuple[str, list[str]]]:
    """An agent folder's requirements (and `AgentFolder.extra_requirements`) resolved by ``pip download`` for
    CPython 3.13 manylinux_2_36 aarch64, with dependencies, wheels only, into ``dest`` (emptied first): the pins
    ``name -> (version, [sha256 of the arm64 file])`` the image's pip would install today."""
    from packaging.utils import parse_wheel_filename

    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", *target_args(AGENT_GLIBC_MINOR, AGENT_ARCH),
           "-r", str(agent.requirements), *agent.extra_requirements(), "-d", str(dest)]
    run = subprocess.run(cmd, capture_output=True, text=True, cwd=agent.folder)
    if run.returncode != 0:
        raise RehearsalFailed(f"the folder's requirements do not resolve to wheels for {ARM64} (the image installs "
                              f"wheels only):\n{_tail(run.stderr)}")
    pins: dict[str, tuple[str, list[str]]] = {}
    for path in sorted(dest.glob("*.whl")):
        name, version, _, _ = parse_wheel_filename(path.name)
        pins[normalize(name)] = (str(version), [hashlib.sha256(path.read_bytes()).hexdigest()])
    return pins


def rehearse(python313: str, pins: dict[str, tuple[str, list[str]]], arm: Path, key: str, *, site_prefix: str,
             app: Any, entrypoint: str, case: tuple[dict[str, Any], str], tmp: Path) -> dict[str, Any]:
    """Steps 1 (the arm64 files' tags) to 4 for ``pins`` resolved into ``arm``; ``app(tmp)`` lays out ``/app``."""
    check_wheels(pins, arm, tags=supported_tags(AGENT_GLIBC_MINOR, AGENT_ARCH), platform=ARM64)
    pins_text = "".join(f"{name}=={version}\n" for name, (version, _) in sorted(pins.items()))
    twin_reqs = tmp / "twins.txt"
    twin_reqs.write_text(pins_text)
    x86 = CACHE / f"{arm.name.replace('aarch64', 'x86_64').rsplit('-', 1)[0]}-{key}"  # agent[-folder]-wheels-x86_64-KEY
    download(twin_reqs, x86, "x86_64", hashed=False)
    files, identical, binary = twins(pins, x86)
    say(f"twins: {identical} of {len(pins)} pins are pure wheels, byte-identical to the image's (sha256 = the arm64 "
        f"file's); {len(binary)} binary pins run as their x86_64 build of the same version: {', '.join(binary)}")
    site = install(python313, files, pins_text + "".join(h for _, hs in sorted(pins.values()) for h in hs), site_prefix)
    measured = serve_and_invoke(python313, site, app(tmp), entrypoint, case)
    say(f"serve: python{PYTHON_VERSION} -m uvicorn {entrypoint} answered GET /ping {measured['ping']} after "
        f"{measured['started_s']:.1f} s; one rollout: {measured['llm_calls']} LLM call(s) to _rollout.base_url"
        f"{' (streamed)' if measured['streamed'] else ''}, result rewards 1.0 at {measured['result_key']}; peak RSS "
        f"{measured['rss_mb']:.0f} MB")
    return measured


def rehearse_example(python313: str) -> None:
    """The example agents' image: its hashed lock, ``local.agents.math_agent:app``."""
    lock_text = AGENT_LOCK.read_text()
    pins = read_lock(lock_text)
    key = hashlib.sha256(lock_text.encode()).hexdigest()[:16]
    say(f"agent image (examples): python:{PYTHON_VERSION}-slim-bookworm linux/arm64 ({ARM64}); stand-in {python313} "
        f"(x86_64)")
    arm = CACHE / "agent-wheels-aarch64"
    download(AGENT_LOCK, arm, AGENT_ARCH, hashed=True)
    with tempfile.TemporaryDirectory() as tmp:
        rehearse(python313, pins, arm, key, site_prefix="agent-site", app=app_folder, case=MATH_CASE,
                 entrypoint=f"local.agents.{AGENT}:app", tmp=Path(tmp))


def rehearse_folder(python313: str, folder: Path, entrypoint: str | None = None) -> None:
    """An agent folder's image: its requirements resolved for arm64, its staged copy as ``/app``, its entrypoint."""
    from infra.agent_folder import AgentFolder, AgentFolderError

    try:
        agent = AgentFolder.of(folder, entrypoint)
    except AgentFolderError as e:
        raise RehearsalFailed(str(e)) from None
    say(f"agent image (folder {agent.folder}, {agent.entrypoint}): python:{PYTHON_VERSION}-slim-bookworm linux/arm64 "
        f"({ARM64}); stand-in {python313} (x86_64)")
    key = agent.digest()
    arm = CACHE / f"agent-folder-wheels-aarch64-{key}"
    for old in CACHE.glob("agent-folder-wheels-aarch64-*"):
        if old != arm:
            shutil.rmtree(old, ignore_errors=True)
    pins = resolve_folder(agent, arm)
    say(f"resolve: {agent.requirements.name}{' + ' + ' '.join(agent.extra_requirements()) if agent.extra_requirements() else ''}"
        f" -> {len(pins)} wheels for {ARM64}: " + ", ".join(f"{n}=={v}" for n, (v, _) in sorted(pins.items())))
    with tempfile.TemporaryDirectory() as tmp:
        rehearse(python313, pins, arm, key, site_prefix="agent-folder-site", entrypoint=agent.entrypoint,
                 app=lambda t: agent.stage_context(t / "app"), case=TOY_CASE, tmp=Path(tmp))


def main(argv: list[str] | None = None) -> int:
    import argparse
    import logging

    parser = argparse.ArgumentParser(description="Rehearse an agent's linux/arm64 image without Docker")
    parser.add_argument("--folder", help="an agent folder (default: the example agents, then examples/agents/strands "
                                         "copied outside the repository)")
    parser.add_argument("--entrypoint", help="with --folder: its MODULE:ATTR (default agent:app)")
    args = parser.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request lines
    t_start = time.perf_counter()
    try:
        python313 = target_python()
        if args.folder:
            rehearse_folder(python313, Path(args.folder), args.entrypoint)
        else:
            rehearse_example(python313)
            with tempfile.TemporaryDirectory(prefix="stepwise-sample-agent-") as outside:
                sample = Path(outside) / "strands-agent"
                shutil.copytree(ROOT / "examples" / "agents" / "strands", sample)
                rehearse_folder(python313, sample)
    except (RehearsalFailed, SystemExit, AssertionError, subprocess.TimeoutExpired) as e:
        say(f"agent image rehearsal FAILED: {e}")
        return 1
    say(f"agent image rehearsal passed in {time.perf_counter() - t_start:.0f} s (not proven here: the arm64 binary "
        f"wheels running, docker build, ACR; see the module docstring)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
