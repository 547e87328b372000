"""The operator commands against the local stack: start -> watch --plot -> runs -> stop, on a real (tiny) run.

The same handlers, ASL, simulator, gateway and toy agent as `stepwise run-local`; the commands
reach moto through the endpoints the local stack exports, exactly as they reach AWS. Also
checks the cost model's transition counts against the real execution history.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import boto3
import pytest
from PIL import Image

from stepwise_cli.main import main
from stepwise_cli import cost
from stepwise_cli.plot import CURVES_KEY
from stepwise.layout import step_summary_key

REPO = Path(__file__).resolve().parents[2]
RUN_ID = "cli-e2e"


@pytest.fixture(scope="module")
def stack():
    from local.stack import LocalStack

    s = LocalStack(bucket=f"stepwise-cli-{uuid.uuid4().hex[:10]}")
    try:
        s.start(tps_limit=64)
        yield s
    finally:
        s.stop()


def _config(tmp_path: Path, bucket: str) -> Path:
    from prepare_datasets.prepare_toy import write_rows

    cfg = json.loads((REPO / "examples" / "toy.json").read_text())
    write_rows(tmp_path / "train.jsonl", 4, 0)
    write_rows(tmp_path / "eval.jsonl", 2, 1)
    cfg.update(dataset_path=str(tmp_path / "train.jsonl"), eval_dataset_path=str(tmp_path / "eval.jsonl"),
               batch_size=2, responses_per_prompt=2, max_prompts=0, eval_every=1, eval_max_prompts=2, save_every=0,
               max_rollout_time=60,
               # as run-local does: the SDK's default output path asks STS on a hard-wired endpoint
               s3_output_path=f"s3://{bucket}/checkpoints/{RUN_ID}/")
    path = tmp_path / "toy-cli.json"
    path.write_text(json.dumps(cfg))
    return path


@pytest.mark.e2e
def test_start_watch_plot_runs_stop_on_the_local_stack(stack, tmp_path, capsys):
    flags = ["--bucket", stack.bucket, "--state-machine-arn", stack.resources.state_machine_arn]
    assert main(["start", str(_config(tmp_path, stack.bucket)), "--run-id", RUN_ID, *flags]) == 0
    assert f"started run {RUN_ID}" in capsys.readouterr().out

    png, jsonl = tmp_path / "curves.png", tmp_path / "metrics.jsonl"
    code = main(["watch", RUN_ID, "--interval", "0.5", "--timeout", "300", "--plot", str(png), "--metrics", str(jsonl),
                 *flags])
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"run {RUN_ID} SUCCEEDED: 2 step(s)" in out

    # the plot's curves are exactly the run's summaries, as read straight from S3 and as metrics.jsonl has them
    s3 = boto3.client("s3")
    def summary(kind, step):
        return json.loads(s3.get_object(Bucket=stack.bucket, Key=step_summary_key(RUN_ID, kind, step))["Body"].read())
    metrics = [json.loads(x) for x in jsonl.read_text().splitlines()]
    drawn = json.loads(Image.open(png).text[CURVES_KEY])
    train = [m for m in metrics if m["kind"] == "train"]
    evals = [m for m in metrics if m["kind"] == "eval"]
    assert [s for s, _ in drawn["reward"]] == [0, 1] == [m["step"] for m in train]
    assert drawn["reward"] == [[m["step"], m["sampler/mean_reward"]] for m in train]
    assert drawn["reward"] == [[s, summary("steps", s)["sampler/mean_reward"]] for s in (0, 1)]
    assert drawn["eval_accuracy"] == [[m["step"], m["eval/accuracy"]] for m in evals]
    assert [s for s, _ in drawn["eval_accuracy"]] == [0, 1, 2]  # baseline; eval_every 1 after step 1; final after step 2

    assert main(["runs", "--json", *flags]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert (row["run_id"], row["status"], row["steps_done"]) == (RUN_ID, "SUCCEEDED", 2)

    # the run ended with its session stopped by the pipeline: stop has nothing to do and says so
    assert main(["stop", RUN_ID, "--wait", "0", *flags]) == 0
    out = capsys.readouterr().out
    assert "no running execution" in out and "stopped it here" not in out

    # a started run id cannot be started again
    assert main(["start", str(tmp_path / "toy-cli.json"), "--run-id", RUN_ID, *flags]) == 1
    capsys.readouterr()

    # the cost model's transition counts match the real history, step by step
    sfn = boto3.client("stepfunctions")
    arn = sfn.list_executions(stateMachineArn=stack.resources.state_machine_arn)["executions"][0]["executionArn"]
    events = sfn.get_execution_history(executionArn=arn, maxResults=1000)["events"]
    entered = [e["stateEnteredEventDetails"]["name"] for e in events if e["type"].endswith("StateEntered")]
    counts = cost.asl_step_counts()
    segments, current = [], []
    for name in entered:
        if name == cost.STEP_START and current:
            segments.append(current)
            current = []
        current.append(name)
    trained = [s for s in segments if "Submit training step" in s]
    assert trained, segments
    for seg in trained:
        polls = seg.count("Wait for training step")
        rebinds = seg.count("Wait for sampler")
        assert len(seg) == counts["train_step"] + counts["train_poll"] * polls + counts["rebind_poll"] * rebinds, seg
    for seg in segments:
        if "Record eval accuracy" in seg:
            assert len(seg) == counts["eval_batch"], seg
