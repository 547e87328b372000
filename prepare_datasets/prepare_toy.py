"""The toy task's dataset: ``python -m prepare_datasets.prepare_toy --output X.jsonl``.

"What digit comes after N?": ten distinct prompts (N = 0..9), the answer ``(N + 1) % 10`` as one
digit; the toy agent (``local/agents/toy_agent.py``, ``local/agents/toy_task.py``) asks it and
scores exact match. Each line is ``{"payload": {"prompt": ..., "answer": ...}}`` (the ``payload``
column every dataset of ours has), e.g. ``{"prompt": "What digit comes after 3?", "answer": "4"}``.
Deterministic for a given ``--rows`` and ``--seed``. ``--no-answer`` leaves the answer key out
(``{"prompt": ...}`` only): the training set of the judged toy task (examples/toy_judge.json), where the
group judge's rubric, not the agent, knows what a right answer is.
"""

from __future__ import annotations

import sys
from pathlib import Path

from prepare_datasets import sampled_rows_main, shuffled_cycles, write_payload_rows

NUM_PROMPTS = 10
#: The system prompt the toy agent sends when a payload names none (``local/agents/toy_task.py`` holds the
#: agent's copy, since the agents' image holds only ``local/agents/``; a test keeps the two equal).
SYSTEM_PROMPT = "Reply with one digit."
#: A system prompt under which the base model answers the toy question correctly (pre-trained so:
#: ``local/simulator/build_assets.py``); the mix task's easy bucket uses it.
KNOWING_SYSTEM_PROMPT = "You are good at counting. Reply with the next digit."


def prompt_text(n: int) -> str:
    """The user message for digit ``n`` (0..9)."""
    if not 0 <= n < NUM_PROMPTS:
        raise ValueError(f"toy task digit must be in 0..{NUM_PROMPTS - 1}, got {n!r}")
    return f"What digit comes after {n}?"


def answer_for(n: int) -> str:
    return str((n + 1) % 10)


def make_payload(n: int) -> dict[str, str]:
    """The payload for prompt ``n``: ``{"prompt": ..., "answer": ...}``."""
    return {"prompt": prompt_text(n), "answer": answer_for(n)}


def all_payloads() -> list[dict[str, str]]:
    return [make_payload(n) for n in range(NUM_PROMPTS)]


def sample_payloads(rows: int, seed: int = 0) -> list[dict[str, str]]:
    """``rows`` payloads: every prompt once per cycle, each cycle shuffled with ``seed``."""
    return shuffled_cycles(all_payloads(), rows, seed)


def write_rows(output: Path, rows: int, seed: int) -> int:
    """Write ``rows`` payload rows to ``output`` (JSON Lines); returns the row count."""
    return write_payload_rows(output, sample_payloads(rows, seed))


def write_unlabelled_rows(output: Path, rows: int, seed: int) -> int:
    """Write ``rows`` payload rows without the answer key (``{"prompt": ...}``; the same prompts in the same
    order as `write_rows`); returns the row count."""
    return write_payload_rows(output, [{"prompt": p["prompt"]} for p in sample_payloads(rows, seed)])


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--no-answer" in args:
        args.remove("--no-answer")
        return sampled_rows_main(args, __doc__.splitlines()[0], 200, write_unlabelled_rows)
    return sampled_rows_main(args, __doc__.splitlines()[0], 200, write_rows)


if __name__ == "__main__":
    sys.exit(main())
