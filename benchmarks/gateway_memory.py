"""The gateway's memory as one Lambda execution environment uses it: one process serving streamed
turns one at a time (Lambda gives an environment one request at a time), from readiness on.

A real gateway process (``python -m stepwise.gateway``, the image's command) serves the tiny model's
tokenizer from moto's S3 and samples from the SageMaker simulator through the unmodified SDK. The
script reads the process's resident memory (``VmRSS``) and its peak (``VmHWM``) after readiness, then
after each of ``--turns`` streamed turns of a short prompt and of a 3,000-token prompt (the tiny
model's context is 4,096) (OpenAI
client, ``stream=True``, 512 new tokens at most). The peak is what the function's ``memory_mb`` must
hold (plus the Lambda Web Adapter extension's own few MB); a production tokenizer adds its size (the
tiny model's is byte-level, a few hundred KB; a 150k-token vocabulary's ``tokenizer.json`` is ~10 MB
on disk and ~100-200 MB loaded).

``--image`` runs the gateway as the image does: CPython 3.13 (pyenv) with only the image's locked
wheels (the folder `make image-rehearsal` installs, ``scripts/image_child.py``) and ``lambdas/``: no
torch, which this repository's venv has and transformers imports when it can (it adds ~350 MB).

Usage: ``python -m benchmarks.gateway_memory [--turns 5] [--image]``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result


def proc_memory_mb(pid: int) -> dict[str, float]:
    """``{"rss": VmRSS, "peak": VmHWM}`` of process ``pid``, MB (Linux ``/proc``)."""
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out["rss" if key == "VmRSS" else "peak"] = int(value.split()[0]) / 1024
    return out


class ImageGateway:
    """``python -m stepwise.gateway`` as the gateway image runs it: python3.13 -I -S over the image's
    locked wheels and ``lambdas/`` (`scripts/image_child.py`, the folder `make image-rehearsal` fills)."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        import hashlib
        import re

        from infra.image_platform import LOCK, target_python
        from local._proc import await_listening
        from scripts.image_rehearsal import CACHE, CHILD, ISOLATED

        site = Path(os.environ.get("STEPWISE_IMAGE_SITE") or
                    CACHE / f"site-{hashlib.sha256(LOCK.read_text().encode()).hexdigest()[:16]}")
        if not (site / ".complete").exists():
            raise SystemExit(f"{site} is missing: run `make image-rehearsal` once to install the image's wheels "
                             "(or point STEPWISE_IMAGE_SITE at a folder the lock was installed into)")
        self._log = open(log_path, "a")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen([target_python(), *ISOLATED, str(CHILD), str(site), str(REPO_ROOT / "lambdas"),
                                      "gateway", "--host", "127.0.0.1", "--port", "0"],
                                     env=env, stdout=subprocess.PIPE, stderr=self._log, text=True)
        self.url = await_listening(self.proc, re.compile(r"listening on (http://127\.0\.0\.1:\d+)"), what="gateway",
                                   timeout=120, log=self._log).group(1)

    def stop(self) -> None:
        from local._proc import stop_process

        stop_process(self.proc, self._log, timeout=10)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=5, help="streamed turns per prompt size")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--image", action="store_true",
                        help="the image's interpreter and locked wheels (run make image-rehearsal once first)")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO_ROOT))
    import openai

    from benchmarks.gateway_overhead import prompts
    from local.gateway import GatewayProcess
    from local.simulator import start_simulator
    from tests.support.gateway import BUCKET, MotoS3, cache_tokenizer, load_tokenizer, open_session
    from tests.support.simulator import create_session

    s3 = MotoS3()
    sim = start_simulator()
    try:
        session = create_session(sim, "gateway-memory")
        run_id = "gateway-memory"
        cache_tokenizer(s3.client, run_id)
        env = {**os.environ, **sim.env, "STEPWISE_BUCKET": BUCKET, "AWS_ENDPOINT_URL_S3": s3.endpoint,
               "AWS_REGION": sim.region, "AWS_DEFAULT_REGION": sim.region}
        args.out.mkdir(parents=True, exist_ok=True)
        gateway = (ImageGateway(env, args.out / "gateway_memory.log") if args.image
                   else GatewayProcess(env, log_path=str(args.out / "gateway_memory.log")))
        try:
            pid = gateway.proc.pid
            ready = proc_memory_mb(pid)
            tokenizer = load_tokenizer()
            rows = []
            for kind in ("short", "3k"):  # the tiny model's context is 4,096 tokens
                messages = prompts("short", tokenizer) if kind == "short" else prompts("8k", tokenizer, 3000)
                for _ in range(args.turns):
                    sid, _ = open_session(s3.client, run_id, training_session_name=session, region=sim.region,
                                          sampler_model_package_arn="", max_context_tokens=16384,
                                          sampling_defaults={"max_new_tokens": 512, "temperature": 1.0})
                    client = openai.OpenAI(base_url=gateway.url + "/v1", api_key=sid, max_retries=0)
                    t0 = time.perf_counter()
                    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=512, stream=True)
                    tokens = sum(1 for _ in stream)
                    rows.append({"prompt": kind, "seconds": round(time.perf_counter() - t0, 3), "chunks": tokens,
                                 **{k: round(v, 1) for k, v in proc_memory_mb(pid).items()}})
            result = {"ready_mb": {k: round(v, 1) for k, v in ready.items()}, "turns": rows,
                      "peak_mb": max(r["peak"] for r in rows), "load_average": load_average()}
        finally:
            gateway.stop()
    finally:
        sim.stop()
        s3.stop()
    result["interpreter"] = "image (python3.13, locked wheels)" if args.image else f"venv (python{sys.version.split()[0]})"
    path = write_result(args.out, "gateway_memory" + ("_image" if args.image else ""), result)
    print(f"{result['interpreter']}: gateway ready: RSS {result['ready_mb']['rss']:.0f} MB; after {len(rows)} streamed turns one at a time: "
          f"peak RSS {result['peak_mb']:.0f} MB (load {result['load_average']}) -> {path}")
    for r in rows:
        print(f"  {r['prompt']:>5}  {r['seconds']:6.2f} s  rss {r['rss']:6.1f} MB  peak {r['peak']:6.1f} MB")
    return result


if __name__ == "__main__":
    main()
