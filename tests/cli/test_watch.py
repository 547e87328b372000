"""`stepwise watch` against moto: per-step lines, eval lines, end status, the plot and metrics.jsonl."""

from __future__ import annotations

import json

from tests.support.cli import run_state
from PIL import Image

from stepwise_cli.main import main
from stepwise_cli.commands.watch import HEADER, step_line
from stepwise_cli.plot import CURVES_KEY
from stepwise.layout import config_key, eval_summary_key, state_key, summary_key

SUMMARIES = {
    0: {"sampler/mean_reward": 0.125, "sampler/num_rollouts": 8.0, "sampler/zeroed_rollouts": 1.0,
        "sampler/num_datums": 8, "time/rollout": 3.0, "time/train": 1.5, "decision": "train",
        "behaviour/turns_per_rollout": 1.0, "rollouts/num_error": 1.0, "rollouts/num_timeout": 0.0},
    1: {"sampler/mean_reward": 0.25, "sampler/num_rollouts": 8.0, "sampler/zeroed_rollouts": 0.0,
        "sampler/num_datums": 6, "time/rollout": 2.0, "decision": "train",
        "behaviour/turns_per_rollout": 2.0, "rollouts/num_error": 1.0, "rollouts/num_timeout": 1.0,
        "cost/step_usd": 0.0123, "cost/total_usd": 1.5, "cost/session_hours": 0.25},
    2: {"sampler/mean_reward": 0.0, "sampler/num_rollouts": 8.0, "sampler/zeroed_rollouts": 8.0,
        "sampler/num_datums": 0, "decision": "skip"},
}
EVALS = {2: {"eval/accuracy": 0.5, "eval/n": 4, "eval/failed_rollouts": 1, "final": True}}


def _seed(moto_dep, run_id, execution_arn, **state):
    moto_dep.put_json(config_key(run_id), {"batch_size": 2, "responses_per_prompt": 4})
    moto_dep.put_json(state_key(run_id), run_state(run_id, execution_arn, **state))
    for step, s in SUMMARIES.items():
        moto_dep.put_json(summary_key(run_id, step), {"step": step, **s})
    for step, s in EVALS.items():
        moto_dep.put_json(eval_summary_key(run_id, step), {"step": step, **s})


def test_watch_follows_to_the_end_and_writes_plot_and_metrics(moto_dep, tmp_path, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="w",
                                       input=json.dumps({"wait": 1}))["executionArn"]
    ckpt = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/1"
    sampler = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/4"
    ledger = {"warned": ["max_cost_usd"],
              "checks": {"max_cost_usd": {"limit": 2.0, "spent": 1.5, "next_step": 0.2, "steps": 1.0, "projected": 1.7}},
              "final": {"line": "this run cost $1.61: session $1.50 (0.250 h), agent $0.0100, stack $0.1000",
                        "estimate_line": "estimated $1.40 for 3 steps; the ledger says $1.61: +$0.2100 (+15%)"}}
    _seed(moto_dep, "w", arn, step=3, finished=True, sampler_model_package_arn=sampler, policy_version=2,
          checkpoints=[{"step": 3, "kind": "state", "reason": "final", "model_package_arn": ckpt}], ledger=ledger)
    png, jsonl = tmp_path / "curves.png", tmp_path / "metrics.jsonl"
    code = main(["watch", "w", "--interval", "0.2", "--timeout", "30", "--plot", str(png), "--metrics", str(jsonl),
                 *moto_dep.flags])
    out = capsys.readouterr().out
    assert code == 0, out
    lines = out.splitlines()
    assert HEADER in lines
    rows = [x for x in lines if x[:5].strip().isdigit()]
    assert [int(r.split()[0]) for r in rows] == [0, 1, 2]
    assert rows[0].split()[1:6] == ["0.125", "2/2", "8", "1/8", "4.5"]  # reward, kept, datums, zeroed, rollout+train s
    assert rows[2].endswith("(skip)")
    assert rows[1].split()[-3:] == ["$0.0123", "$1.50", "0.250"]  # the cost ledger: step, total, session-hours
    assert lines.count("  budget warning: max_cost_usd: 1.5 USD spent, 1.7 projected after the next step, 85% of "
                       "the limit 2") == 1
    assert "eval after step 2 (final): accuracy 0.500 on 4 prompts, 1 failed rollouts" in out
    assert any(x.startswith("-- w RUNNING") for x in lines)
    end = lines.index(next(x for x in lines if x.startswith("run w SUCCEEDED")))
    assert lines[end] == "run w SUCCEEDED: 3 step(s), last mean reward 0.000, last eval accuracy 0.500"
    # then every checkpoint, and it ends with the final weights' model package ARN and how to use it
    assert lines[end + 1:end + 3] == [f"  checkpoint: step 3 state (final): {ckpt}",
                                      f"  final weights: step 3 weights (sampler): {sampler}"]
    assert lines[end + 3].startswith("    sample it: ServiceClient(region='us-east-1'") and sampler in lines[end + 3]
    assert lines[end + 4].startswith("    deploy it: it is a model package version")
    assert lines[end + 5:] == ["  " + ledger["final"]["line"], "  " + ledger["final"]["estimate_line"]]

    metrics = [json.loads(x) for x in jsonl.read_text().splitlines()]
    assert [(m["kind"], m["step"]) for m in metrics] == [("train", 0), ("train", 1), ("train", 2), ("eval", 2)]
    drawn = json.loads(Image.open(png).text[CURVES_KEY])
    assert drawn["reward"] == [[m["step"], m["sampler/mean_reward"]] for m in metrics if m["kind"] == "train"]
    assert drawn["eval_accuracy"] == [[m["step"], m["eval/accuracy"]] for m in metrics if m["kind"] == "eval"]
    assert drawn["cost_total_usd"] == [[1, 1.5]]  # the cost ledger's total, on the right-hand axis
    # the second panel: behaviour per step, as reported (and the derived share of failed rollouts)
    assert drawn["behaviour"] == {"behaviour/turns_per_rollout": [[0, 1.0], [1, 2.0]],
                                  "rollouts/failed_fraction": [[0, 0.125], [1, 0.25]]}
    assert Image.open(png).size == (800, 850)  # two panels


def test_watch_failed_run_exits_1_with_the_cause(moto_dep, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="f",
                                       input=json.dumps({"fail": True}))["executionArn"]
    _seed(moto_dep, "f", arn, step=3, stop_reason="failed: Boom")
    assert main(["watch", "f", "--interval", "0.2", "--timeout", "30", *moto_dep.flags]) == 1
    out = capsys.readouterr().out
    assert "run f FAILED" in out and "Boom: failed on purpose" in out and "stepwise resume f" in out


def test_watch_once_prints_the_current_view(moto_dep, capsys):
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="o", input="{}")["executionArn"]
    _seed(moto_dep, "o", arn, step=3, epoch=1, phase="train")
    assert main(["watch", "o", "--once", *moto_dep.flags]) == 0
    out = capsys.readouterr().out
    assert out.count("\n    ") + out.count("\n  eval") >= 3
    assert "-- o RUNNING" in out and "step 3 epoch 1 phase train" in out
    assert main(["watch", "missing", "--once", *moto_dep.flags]) == 1
    assert main(["watch", "missing", "--interval", "0.1", *moto_dep.flags]) == 1  # a typo does not wait forever
    assert "see `stepwise runs`" in capsys.readouterr().err


def test_watch_prints_a_tracking_failure_of_a_step(moto_dep, capsys):
    from stepwise.aws import tracking

    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="t", input="{}")["executionArn"]
    _seed(moto_dep, "t", arn, step=3)
    text = "MLflow tracking to arn:aws:sagemaker:us-east-1:123456789012:mlflow-tracking-server/x failed at train step 1: " \
           "RestException: PERMISSION_DENIED"
    moto_dep.put_json(summary_key("t", 1), {"step": 1, **SUMMARIES[1], tracking.WARNING_KEY: text})
    assert main(["watch", "t", "--once", *moto_dep.flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(i for i, x in enumerate(lines) if x[:5].strip() == "1")
    assert lines[row + 1] == f"  warning: {text}"
    assert sum("warning:" in x for x in lines) == 1


def test_watch_prints_the_warnings_track_kept_with_a_steps_report_table(moto_dep, capsys):
    from stepwise.layout import report_table_key

    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="t", input="{}")["executionArn"]
    _seed(moto_dep, "t", arn, step=3)
    text = "W&B tracking to project p failed at train step 2: CommError: network"
    moto_dep.put_json(report_table_key("t", "train", 2), {"kind": "train", "step": 2, "warnings": [text]})
    moto_dep.put_json(report_table_key("t", "train", 1), {"kind": "train", "step": 1, "warnings": []})
    assert main(["watch", "t", "--once", *moto_dep.flags]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [x for x in lines if "warning" in x] == [f"  warning (step 2): {text}"]


def test_step_line_without_config_or_timings():
    line = step_line(7, {"sampler/mean_reward": 0.5, "sampling/kept_groups": 3.0}, None, 12.25)
    assert line.split() == ["7", "0.500", "3", "-", "-", "12.2"] + ["-"] * 13  # no behaviour or cost metrics: dashes


def test_step_line_shows_the_behaviour_columns_under_their_titles():
    summary = {"sampler/mean_reward": 0.5, "behaviour/turns_per_rollout": 2.5, "behaviour/sampled_tokens_per_rollout": 41.0,
               "behaviour/truncated_turns_fraction": 0.125, "behaviour/ill_formed_turns_fraction": 0.0,
               "behaviour/tool_calls_per_rollout": 1.25, "time/rollout_duration_p50": 3.0,
               "time/rollout_duration_p95": 7.5, "advantages/zero_groups_fraction": 0.25, "staleness/mean": 0.875,
               "rollouts/num_ok": 6.0, "rollouts/num_error": 1.0, "rollouts/num_timeout": 1.0}
    line = step_line(3, summary, None, 1.0)
    columns = dict(zip(HEADER.split(), line.split()))
    assert len(line.split()) == len(HEADER.split())
    assert {k: columns[k] for k in ("turns", "tokens", "trunc", "illf", "tools", "p50_s", "p95_s", "zero_adv", "stale",
                                    "err/to")} == {
        "turns": "2.50", "tokens": "41.0", "trunc": "0.12", "illf": "0.00", "tools": "1.25", "p50_s": "3.0",
        "p95_s": "7.5", "zero_adv": "0.25", "stale": "0.88", "err/to": "1/1"}


def test_a_lambda_errors_cause_prints_as_its_message():
    from stepwise_cli.commands._runs import failure_message

    cause = json.dumps({"errorType": "RolloutsFailed", "errorMessage": "all 4 rollouts ... 4 x AgentError: boom",
                        "stackTrace": ["  File ..."]})
    assert failure_message(cause) == "all 4 rollouts ... 4 x AgentError: boom"
    assert failure_message("failed on purpose") == "failed on purpose" and failure_message(None) == ""
    assert failure_message("[1]") == "[1]"


def test_watch_json_prints_one_object_a_line(moto_dep, capsys):
    """--json: every line of stdout is a JSON object (summaries, status changes, warnings, the end), for a script
    following a run (before: no --json on watch)."""
    arn = moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name="j",
                                       input=json.dumps({"wait": 1}))["executionArn"]
    _seed(moto_dep, "j", arn, step=3, finished=True)
    assert main(["watch", "j", "--json", "--interval", "0.2", "--timeout", "30", *moto_dep.flags]) == 0
    objects = [json.loads(x) for x in capsys.readouterr().out.splitlines()]
    summaries = {(o["kind"], o["step"]): o for o in objects if o["kind"] in ("train", "eval")}
    assert sorted(summaries) == [("eval", 2), ("train", 0), ("train", 1), ("train", 2)]  # each once, as it appeared
    assert summaries[("train", 0)]["sampler/mean_reward"] == 0.125 and summaries[("eval", 2)]["eval/accuracy"] == 0.5
    assert any(o["kind"] == "status" and o["line"].startswith("j RUNNING") for o in objects)
    assert objects[-1]["kind"] == "end" and objects[-1]["status"] == "SUCCEEDED" and objects[-1]["steps"] == 3
