"""Choosing the model, end to end on the local stack through the operator commands.

Two tests share few runs:

- the mix task: `stepwise screen --k 4` of the base model (one eval-only run, its S3 objects mirrored):
  the eval's pass@1 / pass@4 / mixed@4 equal a direct count of its rollout records, and the screened
  dataset holds the middle bucket only (always-solved easy and never-solved hard prompts removed);
- the toy task: a training run with early stopping stops within patience after its eval plateaus,
  with a final checkpoint, and names its best model package, which loads in a simulator started on
  the local runs' state folder and scores what the run's eval scored; `stepwise eval --base` (the base
  model's ~0.1) and `stepwise eval --model-package` of the final weights (from that same state folder),
  then `stepwise compare`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwise_cli.main import main

ROOT = Path(__file__).resolve().parents[2]
MIX, TOY = ROOT / "examples" / "mix.json", ROOT / "examples" / "toy.json"

pytestmark = pytest.mark.e2e


def _json(path: Path):
    return json.loads(path.read_text())


@pytest.mark.timeout(900)  # one eval-only run of 120 rollouts: about a minute on an idle 2-core machine
def test_mix_screen_removes_the_always_and_never_solved_buckets_and_its_pass_at_k_is_a_direct_count(tmp_path, capsys):
    out = tmp_path / "mix_screened.jsonl"
    code = main(["screen", str(MIX), "--k", "4", "--out", str(out), "--local", "--runs-out", str(tmp_path / "runs"),
                 "--run-id", "e2e-mix-screen", "--no-progress", "--mirror-s3", "--timeout", "900"])
    assert code == 0, capsys.readouterr().err
    run = tmp_path / "runs" / "e2e-mix-screen"
    summary = _json(run / "evals" / "0" / "summary.json")

    # the direct count, from the rollout records of the same run and the payloads of its prompts
    s3 = run / "s3" / "runs" / "e2e-mix-screen" / "evals" / "0"
    payloads = _json(s3 / "prompts.json")
    solved: dict[str, list[int]] = {}
    for path in (s3 / "rollouts").glob("*.json"):
        record = _json(path)
        solved.setdefault(record["input_id"], []).append(int(record["reward"] >= 1.0))
    assert len(solved) == 30 and all(len(v) == 4 for v in solved.values())
    counts = [sum(v) for v in solved.values()]
    assert summary["eval/pass@1"] == pytest.approx(sum(c / 4 for c in counts) / 30)
    assert summary["eval/pass@4"] == pytest.approx(sum(c > 0 for c in counts) / 30)
    assert summary["eval/mixed@4"] == pytest.approx(sum(0 < c < 4 for c in counts) / 30)
    by_bucket: dict[str, list[int]] = {}
    for input_id, c in zip(solved, counts):
        by_bucket.setdefault(payloads[input_id]["difficulty"], []).append(c)
    assert by_bucket["easy"] and min(by_bucket["easy"]) == 4 and max(by_bucket["hard"]) == 0

    kept = [json.loads(line)["payload"] for line in out.read_text().splitlines()]
    assert kept and {p["difficulty"] for p in kept} == {"middle"}
    report = _json(out.with_suffix(".screen.json"))
    verdicts = {(p["payload"]["difficulty"], p["verdict"]) for p in report["prompts"]}
    assert ("easy", "kept") not in verdicts and ("hard", "kept") not in verdicts
    assert report["removed_too_easy_rows"] > 0 and report["removed_too_hard_rows"] > 0
    assert report["mixed@4_after"] > report["mixed@4_before"]


@pytest.mark.timeout(1800)  # ~8 training steps and two eval-only runs: a few minutes on an idle 2-core machine
def test_toy_early_stopping_the_best_model_and_base_versus_trained(tmp_path, capsys):
    from local.run import run_local

    runs = tmp_path / "runs"
    over = {"learning_rate": 0.002, "eval_every": 2, "eval_max_prompts": 10, "save_every": -1,
            "early_stopping": {"patience": 2, "min_delta": 0.05}, "keep_model_packages": "best_and_last"}
    trained = run_local(TOY, run_id="e2e-toy-es", out_root=runs, progress=False, overrides=over, timeout=1500,
                        quiet=True)
    assert trained.status == "SUCCEEDED", trained.failure
    state = _json(trained.run_dir / "state.json")
    history = [(p["step"], p["value"]) for p in state["eval_history"]]
    best = state["best"]
    # stopped within patience after the plateau: two evals after the best, none better by more than 0.05
    assert state["stop_reason"].startswith("early_stopping: eval/accuracy has not improved"), state["stop_reason"]
    assert state["step"] == best["step"] + 2 * 2 < 20, history
    assert all(v <= best["value"] + 0.05 for s, v in history if s > best["step"])
    assert any(c["reason"] == "final" and c["step"] == state["step"] for c in state["checkpoints"])
    assert best["model_package_arn"] and best["model_package_arn"] not in state["deleted_packages"]
    assert state["deleted_packages"], "best_and_last deleted the intermediate sampler packages"

    def eval_of(*flags: str, run_id: str) -> dict:
        code = main(["eval", str(TOY), *flags, "--local", "--out", str(runs), "--run-id", run_id, "--no-progress",
                     "--timeout", "900"])
        assert code == 0, capsys.readouterr().err
        capsys.readouterr()
        return _json(runs / run_id / "evals" / "0" / "summary.json")

    base = eval_of("--base", run_id="e2e-toy-base")
    final_arn = state["sampler_model_package_arn"]
    final = eval_of("--model-package", final_arn, run_id="e2e-toy-final")
    assert base["evaluated_model_package_arn"] == "" and base["eval/accuracy"] <= 0.2
    # a greedy eval of the same weights on the same prompts: what the training run measured at its end
    assert final["evaluated_model_package_arn"] == final_arn and final["eval/accuracy"] == history[-1][1]
    assert final["eval/accuracy"] >= base["eval/accuracy"] + 0.5

    # the best package loads in the simulator (a later one, on the state folder the runs left) and
    # answers the toy prompts as the training run's eval at the best step scored them
    assert _greedy_accuracy(runs, best["model_package_arn"]) == best["value"]

    assert main(["compare", str(runs / "e2e-toy-base"), str(runs / "e2e-toy-final"), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    (default,) = data["sets"]
    assert default["metrics"]["accuracy"] == [base["eval/accuracy"], final["eval/accuracy"]]
    assert default["wins"] >= 5 and default["losses"] == 0


def _greedy_accuracy(runs: Path, model_package_arn: str) -> float:
    """Greedy toy accuracy of a model package, sampled through the SDK from a simulator started on the
    local runs' state folder (the tokenizer renders the toy agent's chat, the toy task scores it)."""
    from local.agents import toy_task
    from local.run import simulator_state_dir
    from local.simulator import start_simulator
    from prepare_datasets import prepare_toy
    from sagemaker.train.training_session import SamplingParams, ServiceClient

    sim = start_simulator(state_dir=str(simulator_state_dir(runs)))
    try:
        with sim.environ():
            svc = ServiceClient(region="us-east-1", role_arn=sim.role_arn, model_package_group_arn=sim.model_package_group_arn,
                                s3_output_path=sim.s3_output_path)
            with svc.create_sampling_client(model_package_arn=model_package_arn) as sc:
                tok = sc.get_tokenizer()
                scores = []
                for payload in prepare_toy.all_payloads():
                    text = tok.apply_chat_template(toy_task.messages(payload), add_generation_prompt=True, tokenize=False)
                    ids = tok.encode(text, add_special_tokens=False)
                    seq = sc.sample(ids, num_samples=1, sampling_params=SamplingParams(max_tokens=512, temperature=0.0)
                                    ).result().sequences[0]
                    scores.append(toy_task.score(payload, tok.decode(seq.tokens, skip_special_tokens=True)))
        return sum(scores) / len(scores)
    finally:
        sim.stop()
