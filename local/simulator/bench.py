"""Throughput of the simulator through the real SDK: ``python -m local.simulator.bench``.

Prints sampling calls/s (toy-task prompts, one sample per call, sequential and with 16 in
flight) and forward_backward tokens/s (toy-sized and GSM8K-sized datums), end to end over HTTP.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="duration of each sampling measurement")
    args = parser.parse_args(argv)
    from local.agents import toy_task
    from prepare_datasets import prepare_toy
    from local.simulator import start_simulator

    with start_simulator() as sim, sim.environ():
        from sagemaker.train.training_session import SamplingParams, ServiceClient

        svc = ServiceClient(role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn, s3_output_path=sim.s3_output_path)
        tc = svc.create_lora_training_client(base_model="stepwise-tiny")
        try:
            tok = tc.get_tokenizer()
            sc = tc.create_sampling_client()
            prompts = []
            for n in range(10):
                text = tok.apply_chat_template(toy_task.messages(prepare_toy.make_payload(n)), add_generation_prompt=True, tokenize=False)
                prompts.append(tok.encode(text, add_special_tokens=False))
            params = SamplingParams(max_tokens=512, temperature=1.0)

            def one(i: int) -> int:
                return len(sc.sample(prompts[i % 10], num_samples=1, sampling_params=params).result().sequences)

            for label, workers in (("sequential", 1), ("16 in flight", 16)):
                calls, started = 0, time.monotonic()
                with ThreadPoolExecutor(workers) as pool:
                    while time.monotonic() - started < args.seconds:
                        calls += sum(pool.map(one, range(calls, calls + workers * 4)))
                elapsed = time.monotonic() - started
                print(f"sampling ({label}): {calls / elapsed:.1f} calls/s ({calls} calls, {elapsed:.1f}s)")
            started = time.monotonic()
            seqs = sc.sample(prompts[0], num_samples=8, sampling_params=params).result().sequences
            print(f"sampling (num_samples=8, one call): {time.monotonic() - started:.3f}s for {len(seqs)} sequences")

            for label, n_datums, length in (("toy-sized 64 x 80", 64, 80), ("GSM8K-sized 8 x 1000", 8, 1000)):
                ids = [(i * 7) % 250 for i in range(length)]
                datum = {
                    "modelInput": {"chunks": [{"tokens": ids[:-1], "type": "encoded_text"}]},
                    "lossFnInputs": {
                        "target_tokens": {"data": ids[1:], "dtype": "int64"},
                        "weights": {"data": [1.0] * (length - 1), "dtype": "float32"},
                    },
                }
                tc.forward_backward([datum] * n_datums).result()  # warm-up
                started, reps = time.monotonic(), 3
                for _ in range(reps):
                    tc.forward_backward([datum] * n_datums).result()
                elapsed = time.monotonic() - started
                tokens = reps * n_datums * (length - 1)
                print(f"forward_backward ({label}): {tokens / elapsed:,.0f} tokens/s ({elapsed / reps:.3f}s per call)")
        finally:
            tc.stop()
    print(f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
