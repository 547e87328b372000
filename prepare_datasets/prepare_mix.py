"""The mix task's dataset: ``python -m prepare_datasets.prepare_mix --output X.jsonl``.

A toy-task variant with a difficulty mix, for DAPO's regime (most groups all-equal at the start,
as the seed's GSM8K run filtered 74-81% of its groups), on what the simulator's base model was
pre-trained on (``local/simulator/build_assets.py``):

* ``easy``: "What digit comes after N?" under ``prepare_toy.KNOWING_SYSTEM_PROMPT``: the base
  model answers right (sampled solve rate ~1.0), so every group is all-correct;
* ``middle``: the toy task itself (the toy system prompt): right ~20% of the time, learnable by
  GRPO (``examples/toy.json``);
* ``hard``: "What number comes after M?" for M = 10..19 (a two-digit answer): the base model
  always answers one digit, so every group is all-wrong and nothing can be learned from it.

Ten prompts per bucket. With 8 responses per prompt, a group is all-equal with probability ~1
(easy, hard) and ~0.8^8 = 0.17 (middle), so about 72% of groups are all-equal at the start
(``tests/simulator/test_mix_task_base_model.py`` measures it on the base model).

Rows are ``{"payload": {"prompt", "answer", "system", "difficulty"}}``; the toy agent
(``local/agents/toy_agent.py``) sends the payload's ``system`` prompt and scores exact match.
Deterministic for a given ``--rows`` and ``--seed``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prepare_datasets import prepare_toy, sampled_rows_main, shuffled_cycles, write_payload_rows

DIFFICULTIES = ("easy", "middle", "hard")
PROMPTS_PER_DIFFICULTY = 10


def make_payload(difficulty: str, n: int) -> dict[str, str]:
    """Prompt ``n`` (0..9) of a difficulty bucket: ``{"prompt", "answer", "system", "difficulty"}``.

    Raises:
        ValueError: unknown difficulty or ``n`` outside 0..9.
    """
    if difficulty not in DIFFICULTIES:
        raise ValueError(f"difficulty must be one of {', '.join(DIFFICULTIES)}, got {difficulty!r}")
    if difficulty == "hard":
        if not 0 <= n < PROMPTS_PER_DIFFICULTY:
            raise ValueError(f"mix task prompt index must be in 0..{PROMPTS_PER_DIFFICULTY - 1}, got {n!r}")
        prompt, answer, system = f"What number comes after {10 + n}?", str(11 + n), prepare_toy.SYSTEM_PROMPT
    else:
        toy = prepare_toy.make_payload(n)
        prompt, answer = toy["prompt"], toy["answer"]
        system = prepare_toy.KNOWING_SYSTEM_PROMPT if difficulty == "easy" else prepare_toy.SYSTEM_PROMPT
    return {"prompt": prompt, "answer": answer, "system": system, "difficulty": difficulty}


def all_payloads() -> list[dict[str, str]]:
    """Every prompt of the task once: 10 per difficulty, in ``DIFFICULTIES`` order."""
    return [make_payload(d, n) for d in DIFFICULTIES for n in range(PROMPTS_PER_DIFFICULTY)]


def sample_payloads(rows: int, seed: int = 0) -> list[dict[str, str]]:
    """``rows`` payloads: every prompt once per cycle of 30, each cycle shuffled with ``seed``."""
    return shuffled_cycles(all_payloads(), rows, seed)


def write_rows(output: Path, rows: int, seed: int) -> int:
    """Write ``rows`` payload rows to ``output`` (JSON Lines); returns the row count."""
    return write_payload_rows(output, sample_payloads(rows, seed))


def main(argv: list[str] | None = None) -> int:
    return sampled_rows_main(argv, __doc__.splitlines()[0], 240, write_rows)


if __name__ == "__main__":
    sys.exit(main())
