"""Peak RSS of Init and PlanStep against dataset size (10 MB and 600 MB, JSONL and Parquet).

Generates GSM8K-shaped datasets under ``--data`` (default ``/tmp/stepwise-bench-data``; never the
repo), uploads them to a moto S3 server in this process, then runs each handler's dataset work in a
**fresh child process** (a Lambda container is one process; its "Max Memory Used" is the process's
peak RSS), reporting the child's peak RSS (``VmHWM``) after importing the handler module (baseline) and after
the call (peak), against the function's ``FunctionSpec.memory_mb``:

* Init: ``stepwise.handlers.init.snapshot_dataset`` (``validate_inputs`` before the snapshot
  existed): everything Init does with the dataset; its config, runtime, session and tokenizer work
  does not depend on the dataset's size;
* PlanStep: ``stepwise.handlers.plan.plan`` planning a training generation batch in the middle of
  the dataset (batch 32 x 4), after Init wrote the run's config and state.

moto runs in this (parent) process, so the dataset bytes it holds are not in the child's RSS.

Usage: ``python -m benchmarks.dataset_memory [--sizes 10,600] [--formats jsonl,parquet] [--data DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._common import DEFAULT_OUT, REPO_ROOT, load_average, write_result

BUCKET = "stepwise-bench-memory"
BATCH_SIZE = 32
RESPONSES = 4
#: One GSM8K-like row: question, worked answer, an id (~560 bytes of JSON).
QUESTION = ("Natalia sold clips to {n} of her friends in April, and then she sold half as many clips in May. "
            "How many clips did Natalia sell altogether in April and May? ")
ANSWER = ("Natalia sold {n}/2 = <<{n}/2={h}>>{h} clips in May. Natalia sold {n}+{h} = <<{n}+{h}={t}>>{t} "
          "clips altogether in April and May. The reasoning is written out step by step. #### {t}")


def row(i: int, rng: random.Random) -> dict[str, Any]:
    """Row ``i``: GSM8K-shaped text plus a random note, so Parquet compresses it like real text, not 10x."""
    n = 2 * (i % 5000) + 2
    note = rng.randbytes(90).hex()
    return {"payload": {"id": i, "question": QUESTION.format(n=n) + note,
                        "answer": ANSWER.format(n=n, h=n // 2, t=n + n // 2)}}


def peak_rss_mb() -> float:
    """This process's peak RSS in MB (``VmHWM``: unlike ``ru_maxrss``, not inherited across fork+exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def generate(data_dir: Path, size_mb: int, fmt: str) -> tuple[Path, int]:
    """``(path, rows)`` of a dataset of about ``size_mb`` MB (reused when already generated)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    jsonl = data_dir / f"gsm8k_like_{size_mb}mb.jsonl"
    meta = data_dir / f"gsm8k_like_{size_mb}mb.rows"
    if not jsonl.exists() or not meta.exists():
        target, rows, rng = size_mb * 1_000_000, 0, random.Random(size_mb)
        with jsonl.open("w") as f:
            written = 0
            while written < target:
                line = json.dumps(row(rows, rng)) + "\n"
                f.write(line)
                written += len(line)
                rows += 1
        meta.write_text(str(rows))
    rows = int(meta.read_text())
    if fmt == "jsonl":
        return jsonl, rows
    parquet = data_dir / f"gsm8k_like_{size_mb}mb.parquet"
    if not parquet.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        # pyarrow's default row groups (up to 1Mi rows): what `pq.write_table` / pandas write.
        payloads = [json.loads(line)["payload"] for line in jsonl.open()]
        pq.write_table(pa.table({"payload": pa.array(payloads)}), parquet)
        del payloads
    return parquet, rows


def child(kind: str, config: dict[str, Any], run_id: str) -> dict[str, Any]:
    """In the child process: import the handler, run its dataset work, report RSS (MB)."""
    from stepwise.handlers import init, plan
    from stepwise.events import RunEvent
    from stepwise.handlers._common import store

    baseline = peak_rss_mb()
    t0 = time.monotonic()
    if kind == "init":
        if hasattr(init, "snapshot_dataset"):  # validates while writing the run's dataset snapshot
            rows = init.snapshot_dataset(store(), run_id, "train", config["dataset_path"], BATCH_SIZE).rows
        else:  # before the snapshot existed: validate_inputs read the whole dataset
            _, rows, _ = init.validate_inputs(config, store())
        out: dict[str, Any] = {"rows": rows}
    else:
        res = plan.plan(RunEvent.model_validate({"run": {"run_id": run_id, "execution_arn": "arn:bench"}}))
        out = {"num_items": res.get("num_items")}
    out.update(seconds=time.monotonic() - t0, baseline_mb=baseline,
               peak_mb=peak_rss_mb())
    return out


def run_child(kind: str, config: dict[str, Any], run_id: str, env: dict[str, str]) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.dataset_memory", "--child", kind, "--run-id", run_id,
           "--config", json.dumps(config)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=REPO_ROOT, check=False)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_run(s3: Any, run_id: str, config: dict[str, Any], rows: int) -> None:
    """config.json and state.json as Init leaves them, positioned in the middle of the dataset."""
    from stepwise.config import load_run_config
    from stepwise.layout import config_key, state_key
    from stepwise.records import RunState
    from stepwise.aws.runstore import RunStore

    rs = RunStore(BUCKET, s3)
    rs.put_json(config_key(run_id), load_run_config(config).model_dump(mode="json"))
    mid = (rows // 2) // BATCH_SIZE * BATCH_SIZE
    rs.put_json(state_key(run_id), RunState(
        run_id=run_id, owner_execution_arn="arn:bench", training_session_name="bench", session_status="Running",
        dataset_rows=rows, cursor=mid, step=mid // BATCH_SIZE, segment_start_step=mid // BATCH_SIZE).model_dump())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="10,600", help="dataset sizes in MB, comma-separated")
    p.add_argument("--formats", default="jsonl,parquet")
    p.add_argument("--data", type=Path, default=Path("/tmp/stepwise-bench-data"))
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--child", choices=["init", "plan"], help=argparse.SUPPRESS)
    p.add_argument("--run-id", help=argparse.SUPPRESS)
    p.add_argument("--config", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, json.loads(args.config), args.run_id)))
        return 0

    from local.engine import MotoServer
    from stepwise.functions import by_name
    from stepwise.layout import upload_key

    limits = {"init": by_name("Init").memory_mb, "plan": by_name("PlanStep").memory_mb}
    rows_out: list[dict[str, Any]] = []
    load_start = load_average()
    with MotoServer() as moto:
        s3 = moto.client("s3")
        s3.create_bucket(Bucket=BUCKET)
        env = {**os.environ, "STEPWISE_BUCKET": BUCKET,
               "PYTHONPATH": os.pathsep.join([str(REPO_ROOT / "lambdas"), str(REPO_ROOT)])}
        for size in [int(s) for s in args.sizes.split(",")]:
            for fmt in args.formats.split(","):
                path, rows = generate(args.data, size, fmt)
                run_id = f"bench-{size}mb-{fmt}-{int(time.time())}"
                key = upload_key(run_id, path.name)
                s3.upload_file(str(path), BUCKET, key)
                config = {"region": "us-east-1", "role_arn": "arn:aws:iam::123456789012:role/r",
                          "base_model_arn": "stepwise-tiny",
                          "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a",
                          "dataset_path": f"s3://{BUCKET}/{key}", "batch_size": BATCH_SIZE,
                          "responses_per_prompt": RESPONSES}
                init_res = run_child("init", config, run_id, env)
                write_run(s3, run_id, config, rows)
                plan_res = run_child("plan", config, run_id, env)
                row_out = {"size_mb": size, "format": fmt, "file_mb": round(path.stat().st_size / 1e6, 1),
                           "rows": rows, "init": init_res, "plan": plan_res}
                rows_out.append(row_out)
                print(f"{size:>4} MB {fmt:<8} file {row_out['file_mb']:>6} MB  rows {rows:>8}  "
                      f"Init peak {init_res.get('peak_mb', float('nan')):7.0f} MB "
                      f"(baseline {init_res.get('baseline_mb', float('nan')):4.0f}, {init_res.get('seconds', 0):5.1f} s; "
                      f"limit {limits['init']})  PlanStep peak {plan_res.get('peak_mb', float('nan')):7.0f} MB "
                      f"(baseline {plan_res.get('baseline_mb', float('nan')):4.0f}, {plan_res.get('seconds', 0):5.1f} s; "
                      f"limit {limits['plan']})"
                      + "".join(f"  {k} error: {r['error']}" for k, r in (("Init", init_res), ("PlanStep", plan_res))
                                if "error" in r), flush=True)
                s3.delete_object(Bucket=BUCKET, Key=key)
    write_result(args.out, "dataset_memory", {"load_average_start": load_start, "limits_mb": limits,
                                              "rows": rows_out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
