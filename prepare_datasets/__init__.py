"""Dataset definitions and the scripts that write them (``python -m prepare_datasets.prepare_X``)."""

from __future__ import annotations

import random
from typing import TypeVar

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
