"""Weights & Biases tracking (`stepwise.aws.wandb_tracking`), offline, read back with W&B's own reader.

Each call opens and finishes the W&B run, as the Track Lambda does once per summary: the calls of
several executions (continue-as-new, a resume) land in one W&B run id.
"""

from __future__ import annotations

import pytest

from stepwise.aws import wandb_tracking
from stepwise.config import ConfigError, load_run_config
from tests.support.runs import config
from tests.support.wandb_reader import history

TABLE = {"step": 0, "kind": "train", "groups": [{"label": "best", "input_id": "p0", "rollouts": [
    {"member": 0, "sid": "s", "reward": 1.0, "advantage": 1.0, "status": "ok", "num_turns": 1,
     "messages": [{"role": "user", "content": "What digit comes after 6?"}, {"role": "assistant", "content": "7"}],
     "records": [[{"region": "prompt", "trained": False, "text": "<prompt>"}, {"region": "response", "trained": True, "text": "7"}]]}]}]}


@pytest.fixture
def offline(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.setenv("WANDB_SILENT", "true")
    return tmp_path


def test_steps_evals_and_tables_land_in_one_run_across_executions(offline):
    cfg = load_run_config(config(wandb_project="stepwise-tests", wandb_run_name="toy", wandb_entity="team"))
    for step in (0, 1, 2):  # each call is one Track invocation, whichever execution wrote the summary
        assert wandb_tracking.step_warning(cfg, "run-w", "train", step, {"step": step, "sampler/mean_reward": step / 4,
                                                                          "decision": "train"}, {**TABLE, "step": step}) is None
    assert wandb_tracking.step_warning(cfg, "run-w", "eval", 2, {"step": 2, "eval/accuracy": 0.9}) is None
    assert wandb_tracking.finish(cfg, "run-w", "FINISHED", {"reason": "finished"}) is None

    ids, rows, exits = history(offline, "run-w")
    assert ids == {wandb_tracking.wandb_run_id("run-w")} == {"run-w"}
    train = sorted((r["step"], r["sampler/mean_reward"]) for r in rows if "sampler/mean_reward" in r)
    assert train == [(0, 0.0), (1, 0.25), (2, 0.5)]
    assert [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r] == [(2, 0.9)]
    tables = sorted(r["step"] for r in rows if r.get("samples/train._type") == "table-file")
    assert tables == [0, 1, 2] and all(r["samples/train.nrows"] == 1 for r in rows if "samples/train.nrows" in r)
    assert exits == [0, 0, 0, 0, 0]


def test_rows_carry_the_conversation_and_the_trained_text():
    (row,) = wandb_tracking.table_rows(TABLE)
    assert len(row) == len(wandb_tracking.TABLE_COLUMNS)
    named = dict(zip(wandb_tracking.TABLE_COLUMNS, row))
    assert named["conversation"] == "[user] What digit comes after 6?\n[assistant] 7" and named["trained_text"] == "7"


def test_a_failure_is_a_warning_not_an_exception(offline, monkeypatch):
    blocker = offline / "file"
    blocker.write_text("W&B cannot make its folder under a file")
    monkeypatch.setenv("WANDB_DIR", str(blocker / "wandb"))
    cfg = load_run_config(config(wandb_project="stepwise-tests"))
    warning = wandb_tracking.step_warning(cfg, "run-x", "train", 3, {"step": 3, "sampler/mean_reward": 0.5})
    assert warning.startswith("W&B tracking to project stepwise-tests failed at train step 3: ")
    assert wandb_tracking.step_warning(load_run_config(config()), "run-x", "train", 3, {}) is None  # off: nothing


def test_the_reference_fields_are_real_fields_now():
    cfg = load_run_config(config(wandb_project="p", wandb_run_name="n"))
    assert (cfg.wandb_project, cfg.wandb_run_name, cfg.wandb_entity) == ("p", "n", "")
    with pytest.raises(ConfigError, match="wandb_project: .*must not contain /"):
        load_run_config(config(wandb_project="a/b"))
