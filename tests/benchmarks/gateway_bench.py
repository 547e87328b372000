"""Gateway measurements (not a test): cold start, per-turn overhead excluding sampling, and
bytes written to S3 per turn. Run: ``python tests/benchmarks/gateway_bench.py`` (moto S3 on loopback,
a zero-latency scripted sampler, the tiny model's tokenizer)."""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: tests.support


def main() -> None:
    t0 = time.perf_counter()
    from stepwise.gateway.app import GATEWAY, GatewaySettings, build_app  # noqa: F401
    t_import = time.perf_counter() - t0

    import openai

    from tests.support.gateway import BUCKET, MotoS3, ScriptedSampler, api_key, cache_tokenizer, open_session
    from stepwise.gateway import start_gateway
    from stepwise.records import SessionRecord

    s3 = MotoS3()
    cache_tokenizer(s3.client, "bench")
    holder: dict = {}
    t0 = time.perf_counter()
    app = build_app(GatewaySettings(bucket=BUCKET), s3=s3.new_client(),
                    sampler_factory=lambda record: holder["sampler"])
    t_build = time.perf_counter() - t0
    sid, record = open_session(s3.client, "bench")
    t0 = time.perf_counter()
    renderer = asyncio.run(app[GATEWAY]["renderers"].get(SessionRecord.model_validate(record)))
    t_tok = time.perf_counter() - t0
    holder["sampler"] = ScriptedSampler(renderer.tokenizer, default="The answer is 42.")
    print(f"cold start: import {t_import*1e3:.0f} ms + build_app {t_build*1e3:.0f} ms + first tokenizer load "
          f"(S3 download + AutoTokenizer + renderer) {t_tok*1e3:.0f} ms = {(t_import+t_build+t_tok)*1e3:.0f} ms")

    gw = start_gateway(app=app)
    stats = app[GATEWAY]["stats"]
    try:
        # single-turn sessions
        for _ in range(100):
            sid, _ = open_session(s3.client, "bench")
            openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0).chat.completions.create(
                model="m", messages=[{"role": "system", "content": "You are terse."},
                                     {"role": "user", "content": "What is six times seven?"}])
        over = sorted(stats.overhead_seconds)
        print(f"per-turn overhead excl. sampling, {len(over)} turns: p50 {statistics.median(over)*1e3:.1f} ms, "
              f"p95 {over[int(0.95*len(over))-1]*1e3:.1f} ms; bytes/turn {statistics.median(stats.turn_bytes):.0f}")
        # one 10-turn conversation: history grows, so does each turn's object
        stats.turn_bytes.clear()
        sid, _ = open_session(s3.client, "bench")
        client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
        messages = [{"role": "user", "content": "Count with me."}]
        for i in range(10):
            reply = client.chat.completions.create(model="m", messages=messages).choices[0].message
            messages += [reply.model_dump(exclude_none=True), {"role": "user", "content": f"next {i}"}]
        sizes = list(stats.turn_bytes)
        print(f"10-turn conversation bytes/turn: first {sizes[0]}, last {sizes[-1]}, total {sum(sizes)}")
    finally:
        gw.stop()
        s3.stop()


if __name__ == "__main__":
    main()
