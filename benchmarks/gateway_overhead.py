"""Gateway overhead per turn: our gateway (S3-backed, as in the Lambda) vs the toolkit's in-process gateway.

Both gateways serve on a loopback thread in this process and sample from the same zero-latency
``ScriptedSampler`` (``tests/support/gateway.py``: the reply is scripted text, tokenized, no
model), so a turn's client-side latency is the gateway's own cost plus the HTTP round trip.
Ours reads its session record from moto S3 (loopback) and writes the captured turn to S3 before
answering; the toolkit's keeps both in memory. Each turn is one OpenAI ``chat.completions.create``
on a fresh single-turn session (the toy agent's pattern); prompts are "short" (two short
messages, ~40 tokens) or "8k" (a user message of ~8,000 tokens; the tiny tokenizer is byte-level).

Figures: p50/p95/p99 of the client latency per turn for each gateway, ours minus the toolkit's at
each percentile (the added latency), our gateway's own server-side overhead excluding sampling
(its ``stats.overhead_seconds``), and bytes written to S3 per turn (``stats.turn_bytes``).

Usage: ``python -m benchmarks.gateway_overhead [--turns 200]``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from benchmarks._common import DEFAULT_OUT, load_average, percentile, write_result

PCTS = (50, 95, 99)


def prompts(kind: str, tokenizer: Any, target_tokens: int = 8000) -> list[dict[str, str]]:
    """The chat messages of a ``short`` or ``8k`` turn."""
    if kind == "short":
        return [{"role": "system", "content": "Reply with one digit."},
                {"role": "user", "content": "What digit comes after 3?"}]
    unit = "the quick brown fox jumps over the lazy dog. "
    text = unit * (target_tokens // max(1, len(tokenizer.encode(unit, add_special_tokens=False))) + 1)
    ids = tokenizer.encode(text, add_special_tokens=False)[:target_tokens]
    return [{"role": "user", "content": tokenizer.decode(ids)}]


def _time_turns(base_url: str, open_session: Any, messages: list[dict[str, str]], turns: int) -> list[float]:
    import openai

    out = []
    for _ in range(turns):
        key = open_session()
        client = openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)
        t0 = time.perf_counter()
        client.chat.completions.create(model="m", messages=messages, max_tokens=16)
        out.append(time.perf_counter() - t0)
        client.close()
    return out


def measure(turns: int, kinds: tuple[str, ...] = ("short", "8k")) -> dict[str, Any]:
    """Run ``turns`` timed turns (after 10 warm-up turns) per gateway and prompt kind."""
    from tests.support.gateway import (BUCKET, MotoS3, ReferenceGateway, ScriptedSampler, api_key, cache_tokenizer,
                                        load_tokenizer, open_session)
    from stepwise.gateway import start_gateway
    from stepwise.gateway.app import GATEWAY, GatewaySettings, build_app

    import logging

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one access-log line per S3 call
    tokenizer = load_tokenizer()
    sampler = ScriptedSampler(tokenizer, default="4")
    s3 = MotoS3()
    cache_tokenizer(s3.client, "bench")
    app = build_app(GatewaySettings(bucket=BUCKET), s3=s3.new_client(), sampler_factory=lambda record: sampler)
    ours = start_gateway(app=app)
    stats = app[GATEWAY]["stats"]
    ref = ReferenceGateway(sampler, tokenizer)
    result: dict[str, Any] = {"turns": turns}
    try:
        for kind in kinds:
            msgs = prompts(kind, tokenizer)
            fields = {"max_context_tokens": 16384, "sampling_defaults": {"max_new_tokens": 16, "temperature": 1.0}}

            def ours_session() -> str:  # our gateway: the rollout's api key
                return api_key(open_session(s3.client, "bench", **fields)[0])

            def ref_session() -> str:
                sid, record = open_session(s3.client, "bench-ref", **fields)
                ref.open(sid, record)
                return sid  # the in-process reference: the sid is its key

            _time_turns(ours.base_url, ours_session, msgs, 10)
            _time_turns(f"{ref.url}/v1", ref_session, msgs, 10)
            stats.overhead_seconds.clear()
            stats.turn_bytes.clear()
            load = load_average()
            t_ours = _time_turns(ours.base_url, ours_session, msgs, turns)
            t_ref = _time_turns(f"{ref.url}/v1", ref_session, msgs, turns)
            server = list(stats.overhead_seconds)
            row = {
                "prompt_tokens": len(tokenizer.encode(tokenizer.apply_chat_template(msgs, add_generation_prompt=True,
                                                                                   tokenize=False),
                                                     add_special_tokens=False)),
                "ours_ms": {p: 1e3 * percentile(t_ours, p) for p in PCTS},
                "toolkit_ms": {p: 1e3 * percentile(t_ref, p) for p in PCTS},
                "ours_server_overhead_ms": {p: 1e3 * percentile(server, p) for p in PCTS} if server else None,
                "s3_bytes_per_turn": statistics.median(stats.turn_bytes) if stats.turn_bytes else None,
                "load_average": load,
            }
            row["added_ms"] = {p: row["ours_ms"][p] - row["toolkit_ms"][p] for p in PCTS}
            result[kind] = row
    finally:
        ours.stop()
        ref.stop()
        s3.stop()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--kinds", default="short,8k")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    from pathlib import Path

    result = measure(args.turns, tuple(args.kinds.split(",")))
    print(f"{'prompt':<6} {'tokens':>6} {'gateway':<8} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}")
    for kind in args.kinds.split(","):
        r = result[kind]
        for name, key in (("toolkit", "toolkit_ms"), ("ours", "ours_ms"), ("added", "added_ms"),
                          ("ours-srv", "ours_server_overhead_ms")):
            if r.get(key):
                v = r[key]
                print(f"{kind:<6} {r['prompt_tokens']:>6} {name:<8} {v[50]:>7.1f} {v[95]:>7.1f} {v[99]:>7.1f}")
        print(f"{kind:<6} S3 bytes written per turn (median): {r['s3_bytes_per_turn']:.0f}  (load {r['load_average']})")
    print(f"written: {write_result(Path(args.out), 'gateway_overhead', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
