"""Dataset definitions and the scripts that write them (``python -m prepare_datasets.prepare_X``)."""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def shuffled_cycles(items: list[T], rows: int, seed: int) -> list[T]:
    """``rows`` of ``items``: every item once per cycle, each cycle shuffled with ``seed``
    (``random.Random``), so a run of ``len(items)`` rows from a cycle start sees each once.

    Raises:
        ValueError: ``rows`` < 1 or ``items`` is empty.
    """
    if rows < 1:
        raise ValueError(f"rows must be >= 1, got {rows}")
    if not items:
        raise ValueError("no items to sample rows from")
    rng = random.Random(seed)
    out: list[T] = []
    while len(out) < rows:
        cycle = list(items)
        rng.shuffle(cycle)
        out.extend(cycle)
    return out[:rows]


def write_payload_rows(output: Path, payloads: Sequence[dict[str, Any]]) -> int:
    """Write one ``{"payload": ...}`` JSON line per payload to ``output`` (parents made);
    returns the row count."""
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w") as fh:
        for payload in payloads:
            fh.write(json.dumps({"payload": payload}) + "\n")
    return len(payloads)


def sampled_rows_main(argv: list[str] | None, description: str, default_rows: int,
                      write_rows: Callable[[Path, int, int], int]) -> int:
    """The command line of a sampled dataset script: ``--output X.jsonl [--rows N] [--seed S]``,
    then ``write_rows(output, rows, seed)``; prints what it wrote and returns the exit code 0."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", required=True, type=Path, help="JSONL file to write")
    parser.add_argument("--rows", type=int, default=default_rows, help=f"number of rows (default {default_rows})")
    parser.add_argument("--seed", type=int, default=0, help="shuffle seed (default 0)")
    args = parser.parse_args(argv)
    n = write_rows(args.output, args.rows, args.seed)
    print(f"wrote {n} rows to {args.output}")
    return 0
