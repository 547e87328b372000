"""The example configs in ``examples/`` teach what works on an account: each validates, stays within
AgentCore Runtime's default invocation quota, and the GSM8K example trains on GSM8K's train split and
evaluates on its test split."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from local.datasets import DATASET_GENERATORS
from stepwise.config import load_run_config
from stepwise.core.service_limits import ACR_DEFAULT_INVOCATIONS_PER_SECOND

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CONFIGS = sorted(p for p in EXAMPLES.rglob("*.json"))


def test_there_are_examples():
    assert {p.name for p in CONFIGS} >= {"toy.json", "toy_dapo.json", "mix.json", "gsm8k.json"}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: str(p.relative_to(EXAMPLES)))
def test_each_example_validates_within_acrs_default_invocation_quota(path):
    cfg = load_run_config(path, warnings=[])
    assert cfg.acr_tps_limit <= ACR_DEFAULT_INVOCATIONS_PER_SECOND, (
        f"{path.name}: acr_tps_limit {cfg.acr_tps_limit} is above AgentCore Runtime's default quota of "
        f"{ACR_DEFAULT_INVOCATIONS_PER_SECOND} invocations per second per endpoint")


def test_the_gsm8k_example_trains_on_the_train_split_and_evaluates_on_the_test_split(tmp_path, monkeypatch):
    """Two GSM8K files of different rows: the example's training set is made from train.jsonl, its eval set
    from test.jsonl (before, both were the test split: the eval measured prompts the run had trained on)."""
    cfg = json.loads((EXAMPLES / "gsm8k.json").read_text())
    gsm8k = tmp_path / "gsm8k"
    gsm8k.mkdir()
    for split in ("train", "test"):
        (gsm8k / f"{split}.jsonl").write_text(
            json.dumps({"question": f"a {split} question?", "answer": f"work\n#### {len(split)}"}) + "\n")
    monkeypatch.setenv("STEPWISE_GSM8K_DIR", str(gsm8k))
    made = {}
    for field in ("dataset_path", "eval_dataset_path"):
        name = Path(cfg[field]).name
        out = tmp_path / name
        DATASET_GENERATORS[name](out)
        made[field] = json.loads(out.read_text().splitlines()[0])["payload"]["prompt"]
    assert made == {"dataset_path": "a train question?", "eval_dataset_path": "a test question?"}
