"""What ``stepwise run-local`` tells a person, and when: what it is doing from its first second, every problem
knowable from the config before any service starts, and each eval's accuracy on the terminal as it happens.
Each test fails on the code before (noted per test)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from local import run as run_module
from local.stack import LocalStack
from stepwise.core.preflight import RunRefused

ROOT = Path(__file__).resolve().parents[2]


class StackStarted(Exception):
    """`LocalStack.start` was reached."""


@pytest.fixture
def no_stack(monkeypatch):
    """`LocalStack.start` that starts nothing: it records what the terminal had been told by then and stops the run."""
    seen: list[str] = []

    def start(self, **kwargs):
        seen.append("started")
        raise StackStarted

    monkeypatch.setattr(LocalStack, "start", start)
    monkeypatch.setattr(LocalStack, "stop", lambda self, **kwargs: None)
    return seen


def _config(tmp_path: Path, **fields) -> Path:
    cfg = {**json.loads((ROOT / "examples" / "toy.json").read_text()), **fields}
    path = tmp_path / "run.json"
    path.write_text(json.dumps(cfg))
    return path


def test_a_missing_dataset_is_refused_before_any_service_starts(no_stack, tmp_path):
    """Before: the stack started (about a minute) and the run failed at the upload (this test fails there: the
    stack's start is reached)."""
    config = _config(tmp_path, dataset_path=str(tmp_path / "nowhere" / "train.jsonl"),
                     eval_dataset_path=str(tmp_path / "nowhere" / "eval.jsonl"))
    with pytest.raises(RunRefused) as info:
        run_module.run_local(config, out_root=tmp_path / "runs", progress=False)
    assert no_stack == []
    text = str(info.value)
    assert "dataset_path:" in text and "eval_dataset_path:" in text and "train.jsonl" in text  # both, at once
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run folder either


def test_a_dataset_too_small_for_a_batch_and_an_agent_the_local_stack_cannot_serve_are_refused_first(no_stack, tmp_path):
    small = tmp_path / "small.jsonl"
    small.write_text(json.dumps({"payload": {"prompt": "1+1", "answer": "2"}}) + "\n")
    config = _config(tmp_path, dataset_path=str(small),
                     agent_runtime_arn="arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/no_such_agent-local")
    with pytest.raises(RunRefused) as info:
        run_module.run_local(config, out_root=tmp_path / "runs", progress=False)
    assert no_stack == []
    text = str(info.value)
    assert "dataset_path:" in text and "agent_runtime_arn:" in text and "no_such_agent" in text


def test_start_up_says_what_it_does_before_the_stack_starts(monkeypatch, tmp_path, capsys):
    """The first line reaches the terminal before the stack's minute of starting (before: nothing printed until
    the progress bar, 60-110 s in; this test fails there)."""
    told: list[str] = []

    def start(self, **kwargs):
        told.append(capsys.readouterr().err)
        raise StackStarted

    monkeypatch.setattr(LocalStack, "start", start)
    monkeypatch.setattr(LocalStack, "stop", lambda self, **kwargs: None)
    monkeypatch.setattr(run_module, "_finish", lambda *a, **k: None)
    with pytest.raises(StackStarted):
        run_module.run_local(ROOT / "examples" / "toy.json", out_root=tmp_path, progress=False)
    assert len(told) == 1
    assert "checking" in told[0] and "starting the local stack" in told[0], told


@pytest.mark.parametrize("bar", [False, True])
def test_an_eval_s_accuracy_reaches_the_terminal_as_it_happens(tmp_path, capsys, bar):
    """run-local's stdout is the handlers' log file (``logs/lambdas.log``) unless -v; the eval line goes to the
    terminal (stderr), with the progress bar or without. Before: it went to stdout through the bar, so into the
    log file, and nowhere without a bar (this test fails there)."""
    follower = run_module.LocalFollower.__new__(run_module.LocalFollower)
    follower.run_dir, follower.run_id, follower._seen, follower.bar = tmp_path, "r", set(), None
    if bar:
        from tqdm import tqdm

        follower.bar = tqdm(total=3, file=io.StringIO())
    log_file = io.StringIO()
    with contextlib.redirect_stdout(log_file):  # what run_local does to stdout unless -v
        follower._record("evals", 2, {"eval/accuracy": 0.625, "eval/prompts": 8})
    err = capsys.readouterr().err
    assert "eval after step 2: accuracy 0.625 on 8 prompts" in err
    assert "accuracy" not in log_file.getvalue()
