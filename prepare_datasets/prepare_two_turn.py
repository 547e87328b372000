"""The two-turn toy task's dataset: ``python -m prepare_datasets.prepare_two_turn --output X.jsonl``.

The toy task's ten questions ("What digit comes after N?", ``prepare_toy.py``), each row also naming
the question of the agent's second, *free* turn (``free_prompt``): the two-turn agent
(``local/agents/two_turn_agent.py``) asks ``prompt`` first, and that answer alone decides the reward;
then it asks ``free_prompt`` in a fresh conversation and ignores the answer. By default the free
question is the same one, so a trajectory reward, which credits both turns with the first turn's
outcome, pushes the free answer to the very question being learned up or down at random; per-turn
rewards (``[outcome, 0.0]``) give the free turn no credit. Each line is
``{"payload": {"prompt", "answer", "free_prompt"}}``. Deterministic for a given ``--rows`` and ``--seed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prepare_datasets import sampled_rows_main, shuffled_cycles, write_payload_rows
from prepare_datasets.prepare_toy import NUM_PROMPTS, make_payload, prompt_text


def make_two_turn_payload(n: int, free: int | None = None) -> dict[str, str]:
    """Prompt ``n``'s payload: the toy payload plus ``free_prompt`` (question ``free``, default ``n``).

    Raises:
        ValueError: ``n`` or ``free`` outside 0..9.
    """
    return {**make_payload(n), "free_prompt": prompt_text(n if free is None else free)}


def sample_payloads(rows: int, seed: int = 0) -> list[dict[str, str]]:
    """``rows`` payloads: every question once per cycle, each cycle shuffled with ``seed``."""
    return shuffled_cycles([make_two_turn_payload(n) for n in range(NUM_PROMPTS)], rows, seed)


def write_rows(output: Path, rows: int, seed: int) -> int:
    """Write ``rows`` payload rows to ``output`` (JSON Lines); returns the row count."""
    return write_payload_rows(output, sample_payloads(rows, seed))


def main(argv: list[str] | None = None) -> int:
    return sampled_rows_main(argv, __doc__.splitlines()[0], 200, write_rows)


if __name__ == "__main__":
    sys.exit(main())
