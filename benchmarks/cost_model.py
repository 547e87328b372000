"""Cost per training step of the serverless pipeline at 8x4, 32x4, 128x4, next to an always-on EC2 host.

Pipeline units per step (Lambda GB-seconds and requests, Step Functions state transitions, S3
PUT/GET-class requests) come from ``stepwise_cli.cost.estimate`` (the ASL walked along a step's
path, handler memory from ``stepwise.functions``, the handlers' S3 calls) priced at its us-east-1
list prices. S3 bytes written per step are the measured ones from ``runs-bench/scaling.json`` when
``benchmarks.scaling`` has run, else blank.

The comparison: the reference loop (``train_grpo``) needs one host up for the whole run; for the
same wall time per step it costs ``EC2_USD_PER_HOUR * step_seconds / 3600``. The step's wall time
on AWS is set by ACR rollouts and the training session, which both set-ups pay alike (not
counted here): ``seconds_per_turn * turns + train_seconds + rebind_seconds`` from the cost model's
assumptions unless ``--step-seconds``.

Usage: ``python -m benchmarks.cost_model [--sizes 8x4,32x4,128x4] [--step-seconds 75]``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, write_result
from benchmarks.scaling import parse_size

#: On-demand Linux list prices, us-east-1, USD per hour (AWS EC2 pricing page; not re-checked
#: online from this machine). m7i.large: 2 vCPU / 8 GiB; t3.medium: 2 vCPU / 4 GiB (burstable).
EC2_USD_PER_HOUR = {"m7i.large": 0.1008, "t3.medium": 0.0416}
#: S3 Standard storage, USD per GB-month (first 50 TB), for the bytes a step leaves behind (kept 30 days).
S3_USD_PER_GB_MONTH = 0.023


def measured_bytes(out: Path) -> dict[str, float]:
    """size -> S3 bytes written per step, from a previous ``benchmarks.scaling`` run (if any)."""
    path = out / "scaling.json"
    if not path.exists():
        return {}
    return {r["size"]: r["s3_bytes_per_step"] for r in json.loads(path.read_text()).get("rows", [])}


def cost_rows(sizes: list[str], *, config: dict[str, Any], step_seconds: float | None,
              bytes_by_size: dict[str, float]) -> list[dict[str, Any]]:
    """One row per size: units and USD per step for the pipeline and the EC2 hosts."""
    from stepwise.config import load_run_config
    from stepwise_cli.cost import Assumptions, estimate

    a = Assumptions()
    rows = []
    for size in sizes:
        b, k = parse_size(size)
        cfg = load_run_config({**config, "batch_size": b, "responses_per_prompt": k, "eval_dataset_path": "",
                               "eval_every": 0})
        est = estimate(cfg, a)
        u, usd = est["usage_per_step"], est["usd_per_step"]
        secs = step_seconds if step_seconds is not None else (
            a.seconds_per_turn * est["assumptions"]["turns_per_rollout"] + a.train_seconds + a.rebind_seconds)
        nbytes = bytes_by_size.get(size)
        storage = (nbytes / 1e9 * S3_USD_PER_GB_MONTH) if nbytes else 0.0
        rows.append({
            "size": size, "rollouts": b * k, "lambda_gb_seconds": u["lambda_gb_seconds"],
            "lambda_requests": u["lambda_requests"], "state_transitions": u["state_transitions"],
            "s3_put_class": u["s3_put_class"], "s3_get_class": u["s3_get_class"], "s3_bytes": nbytes,
            "usd_pipeline": usd["total"] + storage, "usd_by_service": {**usd, "s3_storage_month": storage},
            "step_seconds": secs,
            "usd_ec2": {name: price * secs / 3600 for name, price in EC2_USD_PER_HOUR.items()},
        })
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=REPO_ROOT / "examples" / "toy.json")
    parser.add_argument("--sizes", default="8x4,32x4,128x4")
    parser.add_argument("--step-seconds", type=float, help="wall time per step on AWS (default: from the assumptions)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    rows = cost_rows(args.sizes.split(","), config=json.loads(args.config.read_text()),
                     step_seconds=args.step_seconds, bytes_by_size=measured_bytes(args.out))
    print(f"{'size':>7} {'GB-s':>8} {'λ req':>6} {'transit':>7} {'S3 PUT':>6} {'S3 GET':>6} {'S3 KB':>8} "
          f"{'$ pipeline':>10} {'step s':>6} " + " ".join(f"{'$ ' + n:>12}" for n in EC2_USD_PER_HOUR))
    for r in rows:
        kb = f"{r['s3_bytes'] / 1024:.0f}" if r["s3_bytes"] else "-"
        print(f"{r['size']:>7} {r['lambda_gb_seconds']:>8.1f} {r['lambda_requests']:>6.0f} {r['state_transitions']:>7.0f} "
              f"{r['s3_put_class']:>6.0f} {r['s3_get_class']:>6.0f} {kb:>8} {r['usd_pipeline']:>10.5f} "
              f"{r['step_seconds']:>6.0f} " + " ".join(f"{v:>12.5f}" for v in r["usd_ec2"].values()))
    print(f"written: {write_result(args.out, 'cost_model', {'rows': rows})}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
