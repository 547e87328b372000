"""Write the toy-task dataset: ``python -m prepare_datasets.prepare_toy --output X.jsonl``.

Each line is ``{"payload": {"prompt": ..., "answer": ...}}`` (the ``payload`` column every
dataset of ours has). Deterministic for a given ``--rows`` and ``--seed``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from local.agents.toy_task import sample_payloads


def write_rows(output: Path, rows: int, seed: int) -> int:
    """Write ``rows`` payload rows to ``output`` (JSON Lines); returns the row count."""
    output.parent.mkdir(parents=True, exist_ok=True)
    payloads = sample_payloads(rows, seed)
    with output.open("w") as fh:
        for payload in payloads:
            fh.write(json.dumps({"payload": payload}) + "\n")
    return len(payloads)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", required=True, type=Path, help="JSONL file to write")
    parser.add_argument("--rows", type=int, default=200, help="number of rows (default 200)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    args = parser.parse_args(argv)
    n = write_rows(args.output, args.rows, args.seed)
    print(f"wrote {n} rows to {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
