"""Choosing the model, end to end on the local stack through the operator commands.

One training run for the whole module (module fixture ``trained``), then the commands against it:

- the toy task, trained with ``early_stopping`` (patience 2 evals, min_delta 0.05), an eval every 2
  steps and ``keep_model_packages: best_and_last``: it stops within patience after its eval plateaus,
  with a final checkpoint; it names its best model package and deletes only the intermediate ones;
- `stepwise eval --model-package` of the run's best package: an eval-only run whose simulator loads
  that package from the local runs' state folder and scores what the training run's eval scored at
  the best step; `stepwise compare` of the run's baseline eval (step 0: the base model's ~0.1)
  against it and against the run's final eval (the final weights), on the same eval set;
- the mix task: `stepwise screen --k 4` of the base model over the first 12 training rows (4 prompts
  of each bucket, 48 rollouts): the eval's pass@1 / pass@4 / mixed@4 equal a direct count of its
  rollout records, and the screened dataset holds middle-bucket prompts only.

Three local stacks in all (one training run, two eval-only runs). `stepwise eval --base` runs the same
eval-only path as ``--model-package`` (tests/handlers/test_evals.py covers the base model's run). Whether a screened dataset trains
faster is a learning comparison: ``benchmarks/screening.py``, not a test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwise_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MIX, TOY = ROOT / "examples" / "mix.json", ROOT / "examples" / "toy.json"

pytestmark = pytest.mark.e2e

#: early stopping after 2 evals (every 2 steps) without a gain over 0.05; retention best_and_last
TRAIN = {"batch_size": 4, "learning_rate": 0.002, "eval_every": 2, "eval_max_prompts": 10, "save_every": -1,
         "early_stopping": {"patience": 2, "min_delta": 0.05}, "keep_model_packages": "best_and_last"}


def _json(path: Path):
    return json.loads(path.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """The parent of the module's run folders (its ``.simulator/`` keeps the model packages)."""
    return tmp_path_factory.mktemp("model-selection")


@pytest.fixture(scope="module")
def trained(runs):
    from local.run import run_local

    result = run_local(TOY, run_id="e2e-toy-es", out_root=runs, progress=False, overrides=TRAIN, timeout=1500,
                       quiet=True)
    assert result.status == "SUCCEEDED", result.failure
    return result


@pytest.mark.timeout(1800)  # the training run (~8 steps): a few minutes on an idle 2-core machine
def test_toy_run_stops_early_within_patience_names_its_best_package_and_keeps_best_and_last(trained):
    from local.report import report

    state = _json(trained.run_dir / "state.json")
    history = [(p["step"], p["value"]) for p in state["eval_history"]]
    best = state["best"]
    # stopped within patience after the plateau: two evals after the best, none better by more than 0.05
    assert state["stop_reason"].startswith("early_stopping: eval/accuracy has not improved"), state["stop_reason"]
    assert state["step"] == best["step"] + 2 * 2 < 20, history
    assert all(v <= best["value"] + 0.05 for s, v in history if s > best["step"])
    assert [s for s, _ in history] == list(range(0, state["step"] + 1, 2)), history
    assert any(c["reason"] == "final" and c["step"] == state["step"] for c in state["checkpoints"])
    # best_and_last: the intermediate sampler packages went, the best, the final weights and checkpoint stayed
    assert best["model_package_arn"] and best["model_package_arn"] not in state["deleted_packages"]
    assert state["deleted_packages"], "best_and_last deleted the intermediate sampler packages"
    final_ckpt = [c["model_package_arn"] for c in state["checkpoints"] if c["reason"] == "final"]
    assert state["sampler_model_package_arn"] not in state["deleted_packages"]
    assert not set(final_ckpt) & set(state["deleted_packages"])
    assert set(state["deleted_packages"]) <= set(state["created_packages"])
    # the run's closing lines name the best beside the last
    text = report(trained)
    assert "best model: " in text and best["model_package_arn"] in text and "stop reason: early_stopping" in text


@pytest.mark.timeout(1800)  # one eval-only run of 10 greedy prompts (plus the training run if alone)
def test_eval_of_the_best_package_and_compare_with_the_base_models_eval(trained, runs, capsys):
    state = _json(trained.run_dir / "state.json")
    best = state["best"]
    history = {p["step"]: p["value"] for p in state["eval_history"]}
    base = _json(trained.run_dir / "evals" / "0" / "summary.json")  # the baseline eval: the base model
    assert base["evaluated_model_package_arn"] == "" and base["eval/accuracy"] == history[0] <= 0.2

    # the best package loads in a later simulator (on the state folder the training run left) and, a
    # greedy eval of the same weights on the same prompts, scores what the run's eval scored at that step
    code = main(["eval", str(TOY), "--model-package", best["model_package_arn"], "--local", "--runs-dir", str(runs),
                 "--run-id", "e2e-toy-best", "--no-progress", "--timeout", "900"])
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    best_eval = _json(runs / "e2e-toy-best" / "evals" / "0" / "summary.json")
    assert best_eval["evaluated_model_package_arn"] == best["model_package_arn"]
    assert best_eval["eval/accuracy"] == best["value"] == history[best["step"]]
    assert best_eval["eval/accuracy"] >= base["eval/accuracy"] + 0.5

    # base (the run's eval at step 0) against the best package's eval-only run, then against the run's
    # final weights (its newest eval), prompt by prompt on the same eval set
    assert main(["compare", str(trained.run_dir), str(runs / "e2e-toy-best"), "--eval-a", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (default,) = data["sets"]
    assert data["a"]["evaluated"].startswith("the base model") and data["b"]["step"] == 0
    assert default["metrics"]["accuracy"] == [base["eval/accuracy"], best_eval["eval/accuracy"]]
    assert default["wins"] >= 5 and default["losses"] == 0
    assert main(["compare", str(trained.run_dir), str(trained.run_dir), "--eval-a", "0", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (default,) = data["sets"]
    assert (data["a"]["step"], data["b"]["step"]) == (0, state["step"])
    assert default["metrics"]["accuracy"] == [history[0], history[state["step"]]]
    assert default["wins"] + default["losses"] + default["ties"] == 10 and default["wins"] >= 5


@pytest.mark.timeout(900)  # one eval-only run of 48 rollouts
def test_mix_screen_removes_the_always_and_never_solved_buckets_and_its_pass_at_k_is_a_direct_count(
        runs, tmp_path, capsys):
    out = tmp_path / "mix_screened.jsonl"
    code = main(["screen", str(MIX), "--k", "4", "--out", str(out), "--local", "--runs-dir", str(runs),
                 "--run-id", "e2e-mix-screen", "--no-progress", "--mirror-s3", "--timeout", "840",
                 "--set", "max_prompts=12"])
    assert code == 0, capsys.readouterr().err
    run = runs / "e2e-mix-screen"
    summary = _json(run / "evals" / "0" / "summary.json")

    # the direct count, from the rollout records of the same run and the payloads of its prompts
    s3 = run / "s3" / "runs" / "e2e-mix-screen" / "evals" / "0"
    payloads = _json(s3 / "prompts.json")
    solved: dict[str, list[int]] = {}
    for path in (s3 / "rollouts").glob("*.json"):
        record = _json(path)
        solved.setdefault(record["input_id"], []).append(int(record["reward"] >= 1.0))
    assert len(solved) == 12 and all(len(v) == 4 for v in solved.values())
    counts = [sum(v) for v in solved.values()]
    assert summary["eval/pass@1"] == pytest.approx(sum(c / 4 for c in counts) / 12)
    assert summary["eval/pass@4"] == pytest.approx(sum(c > 0 for c in counts) / 12)
    assert summary["eval/mixed@4"] == pytest.approx(sum(0 < c < 4 for c in counts) / 12)
    by_bucket: dict[str, list[int]] = {}
    for input_id, c in zip(solved, counts):
        by_bucket.setdefault(payloads[input_id]["difficulty"], []).append(c)
    assert sorted(len(v) for v in by_bucket.values()) == [4, 4, 4]
    assert min(by_bucket["easy"]) == 4 and max(by_bucket["hard"]) == 0

    kept = [json.loads(line)["payload"] for line in out.read_text().splitlines()]
    assert kept and {p["difficulty"] for p in kept} == {"middle"}
    report = _json(out.with_suffix(".screen.json"))
    verdicts = {(p["payload"]["difficulty"], p["verdict"]) for p in report["prompts"]}
    assert ("easy", "kept") not in verdicts and ("hard", "kept") not in verdicts
    # every all-pass prompt removed as too easy, every all-fail one (the hard bucket and any middle
    # prompt no rollout solved) as too hard: a direct count of the same rollouts
    assert report["removed_too_easy_rows"] == sum(c == 4 for c in counts) >= 4
    assert report["removed_too_hard_rows"] == sum(c == 0 for c in counts) >= 4
    assert report["kept_rows"] == len(kept) == sum(0 < c < 4 for c in counts)
    assert report["mixed@4_after"] > report["mixed@4_before"]
