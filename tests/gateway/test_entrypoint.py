"""``python -m stepwise.gateway --port 0``: the process the Lambda Web Adapter (and the local
stack) runs — binds loopback, reports its URL, answers readiness and refuses strangers."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from tests.support.gateway import BUCKET, REGION, TINY_MODEL, MotoS3, api_key, open_session

from stepwise.gateway.server import default_port


@pytest.fixture(scope="module")
def s3():
    server = MotoS3()
    yield server
    server.stop()


def test_process_serves_readiness_and_authenticates_against_s3(s3):
    env = {**os.environ, "STEPWISE_BUCKET": BUCKET, "AWS_ENDPOINT_URL_S3": s3.endpoint, "AWS_DEFAULT_REGION": REGION,
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    proc = subprocess.Popen([sys.executable, "-m", "stepwise.gateway", "--port", "0"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        t0 = time.perf_counter()
        line = proc.stdout.readline()
        started = time.perf_counter() - t0
        assert line.startswith("stepwise gateway listening on http://127.0.0.1:"), line
        url = line.split(" on ", 1)[1].strip()
        assert httpx.get(url + "/healthz").json() == {"ok": True}
        closed, _ = open_session(s3.client, "run-entry", closed=True)
        r = httpx.post(url + "/v1/chat/completions", headers={"authorization": f"Bearer {api_key(closed)}"},
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 401 and "closed" in r.text
        assert started < 30
    finally:
        proc.terminate()
        proc.wait(10)


def test_process_without_bucket_fails_with_a_clear_error():
    env = {k: v for k, v in os.environ.items() if k != "STEPWISE_BUCKET"}
    out = subprocess.run([sys.executable, "-m", "stepwise.gateway", "--port", "0"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "STEPWISE_BUCKET" in out.stderr


def test_port_follows_the_web_adapter():
    assert default_port({"AWS_LWA_PORT": "9001"}) == 9001
    assert default_port({"PORT": "7000"}) == 7000
    assert default_port({}) == 8080


def test_tokenizer_loads_from_concurrent_threads_in_a_fresh_process():
    """The server's warm-up import and a first turn's load (or two runs' first turns) run in
    parallel threads; transformers' lazy import is not thread-safe on its own."""
    code = """
import threading
from stepwise.gateway.renderers import auto_tokenizer_class, load_tokenizer_dir
errors = []
def run(fn):
    try:
        fn()
    except Exception as e:
        errors.append(repr(e))
threads = [threading.Thread(target=run, args=(auto_tokenizer_class,))] + [
    threading.Thread(target=run, args=(lambda: load_tokenizer_dir(%r),)) for _ in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
print("errors:", errors)
""" % str(TINY_MODEL)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "errors: []" in out.stdout, out.stdout
