"""`stepwise compare` and `stepwise screen`'s outputs on run folders as `stepwise run-local` writes them
(``evals/{step}/summary.json`` and ``results.json``): per-set metric deltas, per-prompt wins, losses and
ties, the screened dataset and its report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepwise.core.evals import summarize_eval, EvalRollout
from stepwise.core.screening import screen
from stepwise.records import EvalSetRows, SamplerPolicy
from stepwise_cli.main import main
from stepwise_cli.commands import screen as screen_cmd

PAYLOADS = {f"e0p{i}": {"prompt": f"q{i}"} for i in range(4)}


def _run_folder(root: Path, name: str, rewards_P: list[list[float]], arn: str = "") -> Path:
    """A run folder with one eval of 4 prompts (the unnamed set's rows 0-1, set 'hard' rows 0-1)."""
    rollouts = [EvalRollout(f"e0p{i}", i, m, r, "ok") for i, rewards in enumerate(rewards_P) for m, r in enumerate(rewards)]
    sets = [EvalSetRows(name="", kind="eval", rows=2, offset=0), EvalSetRows(name="hard", kind="eval-hard", rows=2, offset=2)]
    summary, results = summarize_eval(rollouts, sets=sets, payloads=PAYLOADS, threshold=1.0, ks=[1, 2], step=0,
                                      final=True, eval_only=True, policy=SamplerPolicy(training_session_name="s",
                                                                                       sampler_model_package_arn=arn))
    folder = root / name / "evals" / "0"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps(summary))
    (folder / "results.json").write_text(results.model_dump_json())
    (root / name / "state.json").write_text("{}")
    return root / name


def test_compare_prints_each_sets_metrics_and_per_prompt_wins_losses_and_ties(tmp_path, capsys):
    a = _run_folder(tmp_path, "base", [[0, 0], [1, 0], [0, 0], [1, 1]])
    b = _run_folder(tmp_path, "trained", [[1, 1], [1, 0], [0, 0], [0, 0]],
                    arn="arn:aws:sagemaker:us-east-1:123456789012:model-package/g/7")
    assert main(["compare", str(a), str(b), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    default, hard = data["sets"]
    assert default["set"] == "" and default["metrics"]["accuracy"] == [0.25, 0.75]
    assert (default["wins"], default["losses"], default["ties"]) == (1, 0, 1)
    assert (hard["wins"], hard["losses"], hard["ties"]) == (0, 1, 1)
    assert hard["metrics"]["pass@2"] == [0.5, 0.0]
    assert data["b"]["evaluated"].endswith("model-package/g/7") and data["a"]["evaluated"].startswith("the base model")
    assert main(["compare", str(a), str(b)]) == 0
    text = capsys.readouterr().out
    assert "B wins 1, loses 0, ties 1" in text and "eval set hard:" in text and "0.000 -> 1.000  q0" in text


def test_compare_refuses_a_folder_without_evals(tmp_path, capsys):
    empty = tmp_path / "empty"
    (empty / "evals").mkdir(parents=True)
    assert main(["compare", str(empty), str(empty)]) == 1
    assert "no eval recorded" in capsys.readouterr().err


def test_screen_writes_the_kept_rows_and_a_report_naming_every_prompt(tmp_path):
    folder = _run_folder(tmp_path, "screen", [[1, 1], [1, 0], [0, 0], [0, 1]])
    from stepwise_cli.commands._evals import LocalRunEvals

    results = LocalRunEvals(label=str(folder), folder=folder).results(0)
    prompts = [p.model_copy(update={"row": i}) for i, p in enumerate(results.prompts)]  # one dataset of 4 rows
    result = screen(prompts, 2, order="easy_first")
    out = tmp_path / "data" / "screened.jsonl"
    report = screen_cmd.write_outputs(out, result, {i: {"prompt": f"q{i}"} for i in range(4)}, {"order": "easy_first"})
    assert [json.loads(x)["payload"]["prompt"] for x in out.read_text().splitlines()] == ["q1", "q3"]
    body = json.loads(report.read_text())
    assert report.name == "screened.screen.json" and body["kept_rows"] == 2 and body["removed_too_easy_rows"] == 1
    assert [p["verdict"] for p in body["prompts"]] == ["too_easy", "kept", "too_hard", "kept"]
    assert body["prompts"][1]["pass_rate"] == 0.5 and body["prompts"][1]["mixed@2"] == 1.0


def test_screen_set_max_prompts_limits_the_rows_screened_not_only_the_run(tmp_path, monkeypatch, capsys):
    rows = tmp_path / "train.jsonl"
    rows.write_text("".join(json.dumps({"payload": {"prompt": f"q{i % 5}"}}) + "\n" for i in range(20)))
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"dataset_path": str(rows), "max_prompts": 20}))
    launched = {}

    def launch(args, overrides, kind):
        launched.update(overrides)
        raise screen_cmd.CommandError("stop here")

    monkeypatch.setattr(screen_cmd, "launch", launch)
    out = tmp_path / "screened.jsonl"
    assert main(["screen", str(cfg), "--k", "4", "--out", str(out), "--local", "--set", "max_prompts=3"]) == 1
    distinct = [json.loads(x)["payload"]["prompt"] for x in screen_cmd.prompts_path(out).read_text().splitlines()]
    assert distinct == ["q0", "q1", "q2"], "the first 3 rows, not the config's 20"
    assert launched["eval_group_size"] == 4 and launched["eval_dataset_path"] == str(screen_cmd.prompts_path(out).resolve())
    assert "3 rows, 3 distinct prompts x 4" in capsys.readouterr().err


@pytest.mark.parametrize("name, body, fragment", [
    ("summary.json", "[1]", "evals/0/summary.json is not a JSON object (got list)"),
    ("summary.json", "{not json", "summary.json: not JSON"),
    ("results.json", '{"prompts": 5}', "evals/0/results.json is not an eval's per-prompt results"),
    ("results.json", '"x"', "evals/0/results.json is not a JSON object (got str)"),
])
def test_compare_and_eval_name_a_corrupt_eval_file_in_one_line(tmp_path, capsys, name, body, fragment):
    """A run folder's eval summary or results that is not what an eval writes: one ``error:`` line naming the
    file, exit 1 (an AttributeError or a pydantic ValidationError traceback before)."""
    a = _run_folder(tmp_path, "a", [[0, 0], [1, 0], [0, 0], [1, 1]])
    b = _run_folder(tmp_path, "b", [[1, 1], [1, 0], [0, 0], [0, 0]])
    (b / "evals" / "0" / name).write_text(body)
    assert main(["compare", str(a), str(b)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and fragment in err[0], err


def test_compare_refuses_a_negative_prompts_count(tmp_path, capsys):
    a = _run_folder(tmp_path, "a", [[0, 0], [1, 0], [0, 0], [1, 1]])
    assert main(["compare", str(a), str(a), "--prompts", "-1"]) == 1
    assert "--prompts must be 0 or more, got -1" in capsys.readouterr().err


def test_screen_refuses_bad_input_before_any_run_with_one_line(tmp_path, monkeypatch, capsys):
    """--out a folder or under a file, --k 0 and a dataset that does not exist: one ``error:`` line, exit 1,
    and no run launched (an --out that cannot be written failed only after the billed screen, with a
    traceback; a missing local dataset was a DatasetError traceback)."""
    rows = tmp_path / "train.jsonl"
    rows.write_text(json.dumps({"payload": {"prompt": "q"}}) + "\n")
    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"dataset_path": str(rows)}))
    missing = tmp_path / "missing.json"
    missing.write_text(json.dumps({"dataset_path": str(tmp_path / "nope.jsonl")}))
    monkeypatch.setattr(screen_cmd, "launch", lambda *a: pytest.fail("launched a run"))
    (tmp_path / "a-file").write_text("x")
    for config, k, out, fragment in [(cfg, "4", tmp_path, "is a folder"),
                                     (cfg, "4", tmp_path / "a-file" / "o.jsonl", "cannot write"),
                                     (cfg, "0", tmp_path / "o.jsonl", "--k must be at least 1"),
                                     (missing, "4", tmp_path / "o.jsonl", "nope.jsonl: cannot read")]:
        assert main(["screen", str(config), "--k", k, "--out", str(out)]) == 1, fragment
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and fragment in err[0], err
    assert not (tmp_path / "o.jsonl").exists()


def test_eval_base_and_model_package_start_an_eval_only_run_of_that_model_and_print_its_table(
        tmp_path, monkeypatch, capsys):
    from stepwise_cli.commands import eval as eval_cmd
    from stepwise_cli.commands._evals import LocalRunEvals

    arn = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/4"
    launched = []

    def launch(args, overrides, kind):
        launched.append(overrides)
        evaluated = overrides["eval_model_package_arn"]
        folder = _run_folder(tmp_path, f"run{len(launched)}", [[1, 0], [0, 0], [1, 1], [0, 1]], arn=evaluated)
        return LocalRunEvals(label=str(folder), folder=folder)

    monkeypatch.setattr(eval_cmd, "launch", launch)
    assert main(["eval", "cfg.json", "--base", "--local"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("eval of the base model") and "0.250" in out  # the unnamed set: rewards 1,0,0,0
    assert main(["eval", "cfg.json", "--model-package", arn, "--local", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluated_model_package_arn"] == arn
    assert [(o["eval_only"], o["eval_model_package_arn"], o["eval_every"]) for o in launched] == [
        (True, "", 0), (True, arn, 0)]


def test_eval_on_the_deployed_stack_refuses_a_bad_config_before_looking_the_stack_up(tmp_path, monkeypatch, capsys):
    """``stepwise eval CONFIG --model-package bad`` (or a bad --set): exit 2 naming the field, before any AWS
    call (the stack was looked up first: without a reachable stack, a botocore traceback instead of the error)."""
    from stepwise_cli.commands import _evals

    cfg = tmp_path / "run.json"
    cfg.write_text(json.dumps({"role_arn": "arn:aws:iam::123456789012:role/r", "base_model_arn": "Qwen3-4B",
                               "agent_runtime_arn": "arn:aws:bedrock-agentcore:us-east-1:123456789012:runtime/a-1",
                               "dataset_path": "s3://bucket-1/x.jsonl", "eval_dataset_path": "s3://bucket-1/e.jsonl"}))
    monkeypatch.setattr(_evals, "deployment", lambda args: pytest.fail("looked the stack up"))
    for argv, fragment in ((["--model-package", "bad"], "eval_model_package_arn"),
                           (["--base", "--set", "eval_group_size=0"], "eval_group_size")):
        assert main(["eval", str(cfg), *argv]) == 2
        assert fragment in capsys.readouterr().err


def test_compare_reads_runs_of_the_deployed_stack_from_their_bucket(moto_dep, tmp_path, capsys):
    from stepwise import layout

    for run_id, rewards_P in (("base-run", [[0, 0], [1, 0], [0, 0], [1, 1]]), ("trained-run", [[1, 1], [1, 1], [0, 0], [1, 1]])):
        folder = _run_folder(tmp_path, run_id, rewards_P)
        for step in (0, 4):  # an older eval at 0, the newest at 4 (compared by default)
            body = json.loads((folder / "evals" / "0" / "summary.json").read_text())
            moto_dep.put_json(layout.eval_summary_key(run_id, step), body)
            moto_dep.put_json(layout.eval_results_key(run_id, step),
                              json.loads((folder / "evals" / "0" / "results.json").read_text()))
    assert main(["compare", "base-run", "trained-run", "--json", *moto_dep.flags]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["a"]["step"] == data["b"]["step"] == 4
    assert data["sets"][0]["metrics"]["accuracy"] == [0.25, 1.0] and data["sets"][0]["wins"] == 2
    assert main(["compare", "base-run", "no-such-run", *moto_dep.flags]) == 1
    assert "no-such-run: no eval recorded" in capsys.readouterr().err
