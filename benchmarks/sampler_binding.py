"""What each ``sampler_binding`` costs per turn, and how long `stepwise probe-service` takes on the simulator.

Part 1, per turn: our gateway (aiohttp, moto S3 on loopback, as ``benchmarks/gateway_overhead.py``)
with a zero-latency ``ScriptedSampler``, the run's current sampler written as Rebind writes it, gate
open. Each round serves one turn per binding, in turn (so load drift hits every binding alike), on a
fresh session of that binding. Figures per binding: client latency p50/p95, added over ``per_rollout``
(the record's package: no request), and the S3 requests the binding made per turn (counted on the
gateway's S3 client: lease PUT/DELETE, current-sampler GET). ``next_turn`` reads the current sampler
at most once per ``CURRENT_SAMPLER_MAX_AGE_SECONDS`` per container: back-to-back turns share a read,
so its per-turn figure is a floor; its worst case is one GET.

Part 2 (``--probe``): `stepwise probe-service`'s run time against the simulator in each ``serving``
mode, with the latencies its CI test sets (a sample 1 s, a load 0.3 s, a forward_backward 2 s), and
whether it named the mode.

Usage: ``python -m benchmarks.sampler_binding [--rounds 200] [--probe]``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from typing import Any

from benchmarks._common import DEFAULT_OUT, load_average, percentile, write_result

BINDINGS = ("per_rollout", "next_turn", "turn_gate")
SERVINGS = ("several", "latest", "switching", "disturbing")


def per_turn(rounds: int) -> dict[str, Any]:
    """Client latency and S3 requests per turn of each binding, ``rounds`` turns each after 10 warm-up rounds."""
    import logging

    import openai

    from stepwise.gateway import start_gateway
    from stepwise.gateway.app import GatewaySettings, build_app
    from stepwise.layout import current_sampler_key, key_kind
    from stepwise.records import RunSampler
    from tests.support.gateway import BUCKET, MotoS3, ScriptedSampler, api_key, cache_tokenizer, load_tokenizer, open_session

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    logging.getLogger("stepwise").setLevel(logging.WARNING)  # one "turn served" line per turn
    run = "bench-bind"
    s3 = MotoS3()
    sampler = ScriptedSampler(load_tokenizer(), default="4")
    client = s3.new_client()
    counts: Counter = Counter()
    current = {"binding": ""}
    client.meta.events.register("before-send.s3", lambda request, **_: counts.update(
        [(current["binding"], request.method, key_kind(request.url.split(f"/{BUCKET}/", 1)[-1].split("?", 1)[0]))]))
    app = build_app(GatewaySettings(bucket=BUCKET), s3=client, sampler_factory=lambda record: sampler)
    gw = start_gateway(app=app)
    newer = RunSampler(training_session_name="ts-test", sampler_model_package_arn="arn:aws:sagemaker:us-west-2:1:model-package/p/4",
                       policy_version=4, updated_at=time.time())
    for binding in BINDINGS:  # a run per binding: a container keeps one current sampler per run
        cache_tokenizer(s3.client, f"{run}-{binding}")
        s3.client.put_object(Bucket=BUCKET, Key=current_sampler_key(f"{run}-{binding}"), Body=newer.model_dump_json().encode())
    msgs = [{"role": "user", "content": "What digit comes after 3?"}]
    times: dict[str, list[float]] = {b: [] for b in BINDINGS}
    try:
        for i in range(rounds + 10):
            for binding in BINDINGS:
                sid, _ = open_session(s3.client, f"{run}-{binding}", sampler_binding=binding, max_turns=0, max_total_tokens=0,
                                      sampling_defaults={"max_new_tokens": 16, "temperature": 1.0})
                oa = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
                current["binding"] = binding if i >= 10 else ""
                t0 = time.perf_counter()
                oa.chat.completions.create(model="m", messages=msgs, max_tokens=16)
                if i >= 10:
                    times[binding].append(time.perf_counter() - t0)
                oa.close()
    finally:
        gw.stop()
        s3.stop()
    out: dict[str, Any] = {"rounds": rounds, "load_average": load_average()}
    base50 = percentile(times["per_rollout"], 50)
    base95 = percentile(times["per_rollout"], 95)
    for b in BINDINGS:
        reqs = {f"{m} {k}": n / rounds for (bb, m, k), n in counts.items() if bb == b and k in ("lease", "sampler")}
        out[b] = {"p50_ms": 1e3 * percentile(times[b], 50), "p95_ms": 1e3 * percentile(times[b], 95),
                  "added_p50_ms": 1e3 * (percentile(times[b], 50) - base50),
                  "added_p95_ms": 1e3 * (percentile(times[b], 95) - base95),
                  "binding_requests_per_turn": reqs,
                  "all_requests_per_turn": sum(n for (bb, _, _), n in counts.items() if bb == b) / rounds}
    return out


def probe_times() -> dict[str, Any]:
    """`run_probe` against the simulator in each serving mode: seconds and the behaviour it named."""
    from local.simulator import start_simulator
    from stepwise_cli.commands import probe_service

    out: dict[str, Any] = {"load_average": load_average()}
    sim = start_simulator(sampling_workers=8, latency={"sample": 1.0, "load_weights_for_sampling": 0.3,
                                                       "forward_backward": 2.0})
    try:
        with sim.environ():
            target = probe_service.Target(region=sim.region, role_arn=sim.role_arn, base_model="stepwise-tiny",
                                          model_package_group_arn=sim.model_package_group_arn,
                                          s3_output_path=sim.s3_output_path)
            for mode in SERVINGS:
                sim.set_serving(mode)
                t0 = time.monotonic()
                findings, _ = probe_service.run_probe(target, samples=2, say=lambda _: None)
                out[mode] = {"seconds": round(time.monotonic() - t0, 1), "behaviour": findings.behaviour,
                             "recommended": findings.recommended, "loads_s": [x["seconds"] for x in findings.loads]}
    finally:
        sim.stop()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--probe", action="store_true", help="also time `stepwise probe-service` on the simulator")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    args = parser.parse_args(argv)
    from pathlib import Path

    result: dict[str, Any] = {"per_turn": per_turn(args.rounds)}
    r = result["per_turn"]
    print(f"per turn ({args.rounds} rounds, load {r['load_average']}):")
    print(f"{'binding':<12} {'p50 ms':>7} {'p95 ms':>7} {'added p50':>9} {'added p95':>9}  S3 requests per turn (binding's)")
    for b in BINDINGS:
        x = r[b]
        reqs = ", ".join(f"{k} {v:.2f}" for k, v in sorted(x["binding_requests_per_turn"].items())) or "none"
        print(f"{b:<12} {x['p50_ms']:>7.1f} {x['p95_ms']:>7.1f} {x['added_p50_ms']:>9.1f} {x['added_p95_ms']:>9.1f}  {reqs}")
    if args.probe:
        result["probe"] = p = probe_times()
        print(f"probe-service on the simulator (load {p['load_average']}):")
        for mode in SERVINGS:
            x = p[mode]
            print(f"  serving {mode:<11} {x['seconds']:>5.1f} s  -> {x['behaviour']} ({x['recommended']})")
    print(f"written: {write_result(Path(args.out), 'sampler_binding', result)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
