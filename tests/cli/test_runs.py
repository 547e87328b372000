"""`stepwise runs`: one row per run (continuations folded in) with status, steps and last metrics."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.support.cli import run_state, wait_status

from stepwise_cli.main import main
from stepwise.layout import eval_summary_key, items_key, state_key, summary_key

REPO = Path(__file__).resolve().parents[2]


def test_runs_lists_runs_with_last_metrics(moto_dep, capsys):
    sfn, sm = moto_dep.sfn, moto_dep.state_machine_arn
    a = sfn.start_execution(stateMachineArn=sm, name="alpha", input=json.dumps({"fail": True}))["executionArn"]
    wait_status(sfn, a, ("FAILED",))
    a2 = sfn.start_execution(stateMachineArn=sm, name="alpha--1", input="{}")["executionArn"]
    b = sfn.start_execution(stateMachineArn=sm, name="beta", input="{}")["executionArn"]
    moto_dep.put_json(state_key("alpha"), run_state("alpha", a2, step=12, epoch=1))
    for step, reward in ((10, 0.25), (11, 0.5)):
        moto_dep.put_json(summary_key("alpha", step), {"sampler/mean_reward": reward})
        moto_dep.put_json(items_key("alpha", step, 0), [])  # rollout objects are not read
    moto_dep.put_json(items_key("alpha", 12, 0), [])  # step 12 in progress: no summary yet
    moto_dep.put_json(eval_summary_key("alpha", 10), {"eval/accuracy": 0.75})
    weights = "arn:aws:sagemaker:us-east-1:123456789012:model-package/g/7"
    moto_dep.put_json(state_key("beta"), run_state(
        "beta", b, stop_reason="dataset exhausted", step=4, checkpoints=[
            {"step": 2, "kind": "state", "reason": "save_every", "model_package_arn": "arn:aws:sagemaker:us-east-1:1:model-package/g/3"},
            {"step": 4, "kind": "weights", "reason": "weights_at_end", "model_package_arn": weights}],
        best={"step": 2, "value": 0.8, "model_package_arn": "arn:aws:sagemaker:us-east-1:1:model-package/g/2"}))

    assert main(["runs", "--json", *moto_dep.flags]) == 0
    rows = {r["run_id"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(rows) == {"alpha", "beta"}
    alpha = rows["alpha"]
    assert alpha["executions"] == 2 and alpha["status"] == "RUNNING" and alpha["execution"] == "alpha--1"
    assert (alpha["steps_done"], alpha["last_step"], alpha["last_reward"]) == (12, 11, 0.5)
    assert (alpha["last_eval_step"], alpha["last_eval_accuracy"]) == (10, 0.75)
    assert rows["beta"]["last_reward"] is None and rows["beta"]["stop_reason"] == "dataset exhausted"
    assert rows["beta"]["final_weights"] == {"step": 4, "kind": "weights", "reason": "weights_at_end",
                                             "model_package_arn": weights}
    assert [c["step"] for c in rows["beta"]["checkpoints"]] == [2, 4] and alpha["final_weights"] is None
    assert rows["beta"]["best_model"]["model_package_arn"].endswith("/g/2") and alpha["best_model"] is None

    assert main(["runs", *moto_dep.flags]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "status", "started"]
    line = next(x for x in table if x.startswith("alpha"))
    assert "0.500" in line and "0.750" in line and "2 executions" in line
    # below the table: each run's checkpoints, ending with the final weights' ARN and how to use them
    assert "  checkpoint: step 2 state (save_every): arn:aws:sagemaker:us-east-1:1:model-package/g/3" in table
    assert f"  final weights: step 4 weights (weights_at_end): {weights}" in table
    # the best model package beside the last (stepwise.core.selection)
    assert "  best model: eval after step 2 (0.8): arn:aws:sagemaker:us-east-1:1:model-package/g/2" in table
    assert f"final weights of beta: {weights}" in table
    assert table[-2].startswith("  sample it: ") and weights in table[-2] and table[-1].startswith("  deploy it: ")


def test_runs_and_watch_mark_the_checkpoints_retention_deleted(moto_dep, capsys):
    """A checkpoint whose model package retention (best_and_last) deleted is listed as deleted, in
    ``--json`` and in the text `stepwise runs` and `stepwise watch` print (before: listed as if it existed,
    so a user copied an ARN that was gone). A state written before the mark lists them in
    ``deleted_packages``; that marks them too."""
    from stepwise_cli.commands._runs import weights_lines

    sfn, sm = moto_dep.sfn, moto_dep.state_machine_arn
    g = sfn.start_execution(stateMachineArn=sm, name="gamma", input="{}")["executionArn"]
    gone, older, kept = (f"arn:aws:sagemaker:us-east-1:1:model-package/g/{n}" for n in (3, 5, 9))
    moto_dep.put_json(state_key("gamma"), run_state("gamma", g, step=9, deleted_packages=[gone, older], checkpoints=[
        {"step": 3, "kind": "state", "reason": "save_every", "model_package_arn": gone, "deleted": True},
        {"step": 5, "kind": "state", "reason": "save_every", "model_package_arn": older},
        {"step": 9, "kind": "state", "reason": "final", "model_package_arn": kept}]))
    assert main(["runs", "--json", *moto_dep.flags]) == 0
    row = next(r for r in json.loads(capsys.readouterr().out) if r["run_id"] == "gamma")
    assert [c["deleted"] for c in row["checkpoints"]] == [True, True, False]
    assert main(["runs", *moto_dep.flags]) == 0
    table = capsys.readouterr().out.splitlines()
    mark = " [deleted by keep_model_packages best_and_last: it no longer exists]"
    assert f"  checkpoint: step 3 state (save_every): {gone}{mark}" in table
    assert f"  checkpoint: step 5 state (save_every): {older}{mark}" in table
    assert f"  checkpoint: step 9 state (final): {kept}" in table
    state = json.loads(moto_dep.s3.get_object(Bucket=moto_dep.bucket, Key=state_key("gamma"))["Body"].read())
    assert f"  checkpoint: step 3 state (save_every): {gone}{mark}" in weights_lines(state, "us-east-1")  # watch


def test_runs_limit_and_empty(moto_dep, capsys):
    assert main(["runs", *moto_dep.flags]) == 0
    assert "no runs yet" in capsys.readouterr().out
    for name in ("r1", "r2", "r3"):
        moto_dep.sfn.start_execution(stateMachineArn=moto_dep.state_machine_arn, name=name, input="{}")
    assert main(["runs", "--limit", "2", "--json", *moto_dep.flags]) == 0
    assert len(json.loads(capsys.readouterr().out)) == 2


def test_cli_help_and_runs_do_not_import_torch():
    code = (
        "import sys\nfrom stepwise_cli import main as cli\n"
        "for argv in (['--help'], ['runs', '--help'], ['watch', '--help'], ['start', '--help']):\n"
        "    try:\n"
        "        cli.main(argv)\n"
        "    except SystemExit:\n"
        "        pass\n"
        "from stepwise_cli.commands import runs, watch, stop, resume, start\n"
        "heavy = [m for m in ('torch', 'mlflow', 'transformers', 'sagemaker.train') if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "HEAVY []" in out.stdout, out.stdout + out.stderr
