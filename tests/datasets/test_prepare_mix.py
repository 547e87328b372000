"""The mix task's dataset rows (``prepare_datasets/prepare_mix.py``)."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from local.agents import toy_task
from prepare_datasets import prepare_mix
from stepwise.datasets import load_payloads


def test_prepare_mix_writes_deterministic_rows_with_every_prompt_once_per_cycle(tmp_path):
    a, b, c = tmp_path / "a.jsonl", tmp_path / "b.jsonl", tmp_path / "c.jsonl"
    assert prepare_mix.main(["--output", str(a), "--rows", "70", "--seed", "3"]) == 0
    prepare_mix.main(["--output", str(b), "--rows", "70", "--seed", "3"])
    prepare_mix.main(["--output", str(c), "--rows", "70", "--seed", "4"])
    assert a.read_text() == b.read_text() != c.read_text()
    assert all(set(json.loads(line)) == {"payload"} for line in a.read_text().splitlines())
    payloads = load_payloads(str(a))
    assert len(payloads) == 70
    first_cycle = payloads[:30]
    assert len({(p["system"], p["prompt"]) for p in first_cycle}) == 30
    assert Counter(p["difficulty"] for p in first_cycle) == {"easy": 10, "middle": 10, "hard": 10}
    assert all(toy_task.score(p, p["answer"]) == 1.0 for p in payloads)
    with pytest.raises(ValueError, match="difficulty"):
        prepare_mix.make_payload("medium", 0)
