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

TABLE = {"step": 0, "kind": "train", "groups": [{"label": "best", "input_id": "p0", "selection": "trained", "rollouts": [
    {"sid": "s", "member": 0, "row": {"member": 0, "sid": "s", "reward": 1.0, "advantage": 1.0, "status": "ok",
                                      "num_turns": 1, "cause": ""},
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
    assert (named["selection"], named["advantage"], named["reward"]) == ("trained", 1.0, 1.0)


def test_the_rollout_columns_are_the_w_and_b_tables_columns():
    """A column added to `stepwise.views.columns.ROLLOUT_COLUMNS` is a column of the W&B table too."""
    from stepwise.views.columns import ROLLOUT_COLUMNS

    assert [c.key for c in ROLLOUT_COLUMNS] == wandb_tracking.TABLE_COLUMNS[5:-2]


def _files(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() or p.is_symlink())


def test_calls_leave_no_folder_behind_in_the_lambdas_tmp(monkeypatch, tmp_path):
    """On Lambda W&B writes under ``/tmp`` (`WANDB_ROOT`): every call left a ``run-{time}-{id}`` folder (its
    logs, history and the table's file, tens of KB) and nothing removed it, so a long run filled the
    container's 512 MB. Now a call removes what it wrote there once W&B finished: the folder holds the same
    files after the fifth call as after the first (W&B's own service log, one line per call, aside)."""
    root = tmp_path / "wandb"
    monkeypatch.setattr(wandb_tracking, "WANDB_ROOT", str(root))
    for var, sub in (("WANDB_DIR", ""), ("WANDB_CACHE_DIR", "cache"), ("WANDB_CONFIG_DIR", "config"),
                     ("WANDB_DATA_DIR", "data"), ("WANDB_ARTIFACT_DIR", "artifacts")):
        monkeypatch.setenv(var, str(root / sub) if sub else str(root))
    monkeypatch.setenv("WANDB_MODE", "offline")  # no server here: W&B writes exactly what it would upload
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = load_run_config(config(wandb_project="stepwise-tests"))
    seen = []
    for step in range(5):
        assert wandb_tracking.step_warning(cfg, "run-tmp", "train", step, {"step": step, "sampler/mean_reward": 0.5},
                                           {**TABLE, "step": step}) is None
        seen.append(_files(root))
    assert wandb_tracking.finish(cfg, "run-tmp", "FINISHED") is None
    seen.append(_files(root))
    assert not any("run-" in f.split("/")[-2] if "/" in f else False for f in seen[-1]), seen[-1]
    assert all(files == seen[0] for files in seen), seen


def test_a_wandb_dir_the_environment_names_is_kept(offline):
    """The local stack names ``WANDB_DIR`` (the run folder): its offline runs are the data, never removed."""
    cfg = load_run_config(config(wandb_project="stepwise-tests"))
    for step in range(2):
        assert wandb_tracking.step_warning(cfg, "run-keep", "train", step, {"step": step, "sampler/mean_reward": 0.5}) is None
    assert len(history(offline, "run-keep")[1]) == 2


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


def _processes_with(env_entry: str) -> list[int]:
    """Pids of this machine's processes whose environment holds ``env_entry`` (``VAR=value``)."""
    import os

    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if env_entry.encode() in f.read().split(b"\0"):
                    found.append(int(pid))
        except OSError:
            continue
    return found


def test_a_hung_wandb_call_is_stopped_with_its_processes_and_the_next_call_is_not_blocked(offline, monkeypatch):
    """W&B's ``wandb.init`` that never returns (here: W&B online against a server that accepts and never
    answers) used to hold the module's lock in the Track worker for good, and every later call of the
    process failed waiting for it. Each call runs W&B in a process of its own now: at `CHILD_SECONDS` it
    is killed with W&B's service process, the call is a warning, and the next call runs at once."""
    import time

    from tests.support.hung_server import HungServer

    server = HungServer()
    try:
        monkeypatch.setenv("WANDB_MODE", "online")
        monkeypatch.setenv("WANDB_BASE_URL", f"http://127.0.0.1:{server.port}")
        monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
        monkeypatch.setattr(wandb_tracking, "CHILD_SECONDS", 6.0)
        cfg = load_run_config(config(wandb_project="stepwise-tests"))
        t0 = time.monotonic()
        warning = wandb_tracking.step_warning(cfg, "run-hung", "train", 0, {"step": 0, "sampler/mean_reward": 0.5})
        assert time.monotonic() - t0 < 20
        assert warning == "W&B tracking to project stepwise-tests failed at train step 0: W&B did not answer within 6 s; its process was stopped"
        assert server.accepted > 0  # W&B did reach the server: the hang was W&B's own wait
        deadline = time.monotonic() + 10
        while _processes_with(f"WANDB_DIR={offline}") and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _processes_with(f"WANDB_DIR={offline}") == []  # the call's process and W&B's service are gone
    finally:
        server.close()
    monkeypatch.setenv("WANDB_MODE", "offline")
    assert wandb_tracking.step_warning(cfg, "run-hung", "train", 1, {"step": 1, "sampler/mean_reward": 0.5}) is None
    assert [r["step"] for r in history(offline, "run-hung")[1]] == [1]
