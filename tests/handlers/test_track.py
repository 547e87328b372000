"""The Track function: a summary's S3 notification -> the step's sample table, MLflow, and the report page.

Against moto's S3 with a run written as the pipeline writes it (`tests.support.runs`) and a real MLflow
file store. The training loop only writes the summary (`handlers._common.write_summary`): nothing of
this runs on its path.
"""

from __future__ import annotations

import json
import re
import urllib.parse

import boto3
import pytest
from moto import mock_aws

from stepwise import layout, settings
from stepwise.aws import tracking
from stepwise.events import S3Notification
from stepwise.handlers import _common, session, track
from tests.support.runs import write_to_s3

BUCKET = "stepwise-track-test"
RUN = "run-7"


def notification(*keys: str) -> dict:
    """An S3 ObjectCreated event as S3 delivers it (keys URL-encoded)."""
    return {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": BUCKET},
                                                                   "object": {"key": urllib.parse.quote_plus(k)}}}
                        for k in keys]}


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.setenv("STEPWISE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    tracking._RUNS.clear()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        write_to_s3(s3, BUCKET, RUN, mlflow_tracking_uri=f"file:{tmp_path / 'mlruns'}")
        with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
            yield s3
    tracking._RUNS.clear()


def publish(event: dict) -> dict:
    """What the Lambda entrypoint does with the event (`track.handler` = entrypoint(S3Notification, track))."""
    return track.track(S3Notification.model_validate(event))


def _get(s3, key):
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _mlflow(s3):
    from mlflow.tracking import MlflowClient

    from stepwise.config import RunConfig

    cfg = RunConfig.model_validate(json.loads(_get(s3, layout.config_key(RUN))))
    client = MlflowClient(tracking_uri=cfg.mlflow_tracking_uri)
    return client, tracking.mlflow_run_id(cfg, RUN, client=client)


def test_a_step_summary_becomes_a_sample_table_mlflow_metrics_and_the_page(run):
    s3 = run
    out = publish(notification(layout.summary_key(RUN, 0), layout.eval_summary_key(RUN, 1)))
    assert [(p["kind"], p["step"], p["warnings"]) for p in out["published"]] == [("train", 0, 0), ("eval", 1, 0)]
    table = json.loads(_get(s3, layout.report_table_key(RUN, "train", 0)))
    assert [g["label"] for g in table["groups"]] == ["best", "worst"]
    best = table["groups"][0]["rollouts"][0]
    assert best["advantage"] == pytest.approx(1.0) and best["messages"][0]["role"] == "system"
    assert any(s["trained"] and "42" in s["text"] for s in best["records"][0])  # decoded with the run's tokenizer
    assert sorted((f["status"], f["count"]) for f in table["failures"]) == [("ok", 1), ("timeout", 1)]

    client, mlflow_id = _mlflow(s3)
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_id, "sampler/mean_reward")] == [(0, 0.25)]
    assert [(m.step, m.value) for m in client.get_metric_history(mlflow_id, "eval/accuracy")] == [(1, 0.5)]

    page = _get(s3, layout.report_key(RUN)).decode()
    assert 'id="train-0"' in page and 'id="eval-1"' in page and 'id="train-1"' not in page
    assert 'id="curve-sampler/mean_reward"' in page
    # self-contained: no script, no stylesheet or image fetched from anywhere
    assert "<script" not in page and "<link" not in page and not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", page)

    # a repeated notification (S3 delivers at least once) logs nothing twice
    again = publish(notification(layout.summary_key(RUN, 0)))["published"][0]
    assert again["duplicate"] is True
    assert len(client.get_metric_history(mlflow_id, "sampler/mean_reward")) == 1


def test_a_tracking_failure_is_a_warning_on_the_page_never_a_failed_invocation(run, tmp_path):
    s3 = run
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("MLflow cannot make its store under a file")
    cfg = json.loads(_get(s3, layout.config_key(RUN)))
    cfg["mlflow_tracking_uri"] = f"file:{blocker / 'mlruns'}"
    s3.put_object(Bucket=BUCKET, Key=layout.config_key(RUN), Body=json.dumps(cfg).encode())

    out = publish(notification(layout.summary_key(RUN, 1)))["published"][0]  # does not raise
    assert out["warnings"] == 1
    assert json.loads(_get(s3, layout.report_table_key(RUN, "train", 1)))["groups"]  # the table is there
    ((kind, step, warning),) = json.loads(_get(s3, layout.report_index_key(RUN)))["warnings"]
    assert (kind, step) == ("train", 1)
    assert warning.startswith(f"MLflow tracking to {cfg['mlflow_tracking_uri']} failed at train step 1: ")
    assert json.loads(_get(s3, layout.report_table_key(RUN, "train", 1)))["warnings"] == [warning]  # watch reads it
    page = _get(s3, layout.report_key(RUN)).decode()
    assert 'id="warnings"' in page and "MLflow tracking to" in page
    summary = json.loads(_get(s3, layout.summary_key(RUN, 1)))
    assert tracking.WARNING_KEY not in summary  # the loop's summary is written once, by the loop


def test_the_runs_end_ends_the_mlflow_run_and_shows_how_it_ended(run, monkeypatch):
    s3 = run
    publish(notification(layout.summary_key(RUN, 1)))
    s3.put_object(Bucket=BUCKET, Key=layout.run_summary_key(RUN), Body=json.dumps({
        "status": "KILLED", "reason": "execution ABORTED", "execution_arn": "arn:exec",
        "final_weights": {"step": 2, "kind": "state", "reason": "final", "model_package_arn": "arn:final"}}).encode())
    out = publish(notification(layout.run_summary_key(RUN)))["published"][0]
    assert out["status"] == "KILLED"
    client, mlflow_id = _mlflow(s3)
    assert client.get_run(mlflow_id).info.status == "KILLED"
    page = _get(s3, layout.report_key(RUN)).decode()
    assert 'id="run-status">KILLED<' in page and "execution ABORTED" in page and "arn:final" in page


def test_each_track_invocation_is_in_the_runs_cost_ledger_even_a_failed_one(run, monkeypatch):
    """Track writes no record of the loop, so it writes its own measurement into state.json: the ledger
    counts every invocation the run is billed for, a failed one too (Lambda bills and retries it)."""
    from stepwise import metering

    s3 = run

    def track_requests() -> int:
        state = json.loads(_get(s3, layout.state_key(RUN)))
        return ((state.get("ledger") or {}).get("usage") or {}).get("lambda_requests", {}).get("Track", 0)

    def invoke(event: dict) -> None:  # what the entrypoint does around the handler: one meter per invocation
        token = metering.begin("Track", 2048)
        try:
            publish(event)
        finally:
            metering.end(token)

    metering.CARRY.clear()
    before = track_requests()
    invoke(notification(layout.summary_key(RUN, 0)))
    invoke(notification(layout.summary_key(RUN, 0)))  # a repeated notification is billed too
    assert track_requests() == before + 2

    monkeypatch.setattr(track, "publish_step", lambda *a, **kw: (_ for _ in ()).throw(RuntimeError("S3 said no")))
    with pytest.raises(RuntimeError):
        invoke(notification(layout.summary_key(RUN, 1)))
    assert track_requests() == before + 3
    metering.CARRY.clear()


def test_a_render_started_after_an_invocation_asked_serves_it(monkeypatch):
    """Concurrent Track invocations in one process (the local stack's workers): a render that started
    after an invocation asked for one, so read its table, serves it; one that started before does not."""
    import threading
    import time

    calls = []

    def slow_render(run_id):
        calls.append(run_id)
        time.sleep(0.3)
        return len(calls)

    from stepwise.views import publish as views_publish

    monkeypatch.setattr(views_publish, "_render", lambda store, run_id, cfg, prefix: slow_render(run_id))
    monkeypatch.setattr(views_publish, "_LAST_RENDER", {})
    first = threading.Thread(target=views_publish.render, args=(None, "r", None))
    first.start()
    time.sleep(0.1)  # the first render is under way: the next two asked after it started
    later = [threading.Thread(target=views_publish.render, args=(None, "r", None)) for _ in range(2)]
    for t in later:
        t.start()
    for t in (first, *later):
        t.join()
    assert calls == ["r", "r"]  # the first, then one for both later callers (it started after they asked)
    assert views_publish.render(None, "r", None) == 3  # asked after every render started: renders again


def test_write_summary_only_writes_the_summary(run):
    s3 = run
    _common.write_summary(RUN, 5, {"step": 5, "sampler/mean_reward": 0.5})
    assert json.loads(_get(s3, layout.summary_key(RUN, 5))) == {"step": 5, "sampler/mean_reward": 0.5}
    client, mlflow_id = _mlflow(s3)
    assert client.get_metric_history(mlflow_id, "sampler/mean_reward") == []  # Track logs it, not the loop


def test_keys_that_are_not_summaries_are_ignored(run):
    assert publish(notification("runs/run-7/steps/0/gen0/items.json", "runs/x/report/index.html")) == {
        "published": []}


@pytest.mark.parametrize(("reason", "status"), [
    ("finished", "FINISHED"),
    ("execution ABORTED", "KILLED"),
    ("execution TIMED_OUT", "FAILED"),
    ("failed: States.TaskFailed", "FAILED"),
])
def test_stop_reason_maps_to_the_run_end_status(reason, status):
    assert session._tracking_status(reason) == status


def test_the_page_of_a_run_that_failed_at_a_step_shows_that_steps_failed_rollouts(run):
    """A run whose every rollout of a step failed ends at ComputeAdvantages (RolloutsFailed): that step has
    rollout records but no summary, so no notification published its table, and the page Track wrote at the
    run's end said "no failed or zeroed rollout" (`stepwise report` rebuilt it right). The run's end now
    publishes the table of the batch the run ended at."""
    from stepwise.records import PlannedBatch, RunState

    s3 = run
    for i in range(4):
        sid = f"f2{i:02d}0000-0000-4000-8000-000000000000"
        s3.put_object(Bucket=BUCKET, Key=layout.rollout_key(RUN, 2, 0, sid, "train"), Body=json.dumps({
            "sid": sid, "i": i, "input_id": f"s2p{i // 2}", "row": i // 2, "member": i % 2, "kind": "train", "step": 2,
            "reward": 0.0, "status": "error", "error": {"error": "AgentError", "cause": "the agent crashed"},
            "reward_reason": "error: AgentError"}).encode())
    state = RunState.model_validate(json.loads(_get(s3, layout.state_key(RUN))))
    state.step, state.current_batch = 2, PlannedBatch(kind="train", step=2, rows=[0, 1], responses_per_prompt=2)
    state.stop_reason = "failed: RolloutsFailed"
    s3.put_object(Bucket=BUCKET, Key=layout.state_key(RUN), Body=state.model_dump_json().encode())
    s3.put_object(Bucket=BUCKET, Key=layout.run_summary_key(RUN), Body=json.dumps({
        "status": "FAILED", "reason": "failed: RolloutsFailed", "execution_arn": "arn:exec"}).encode())

    publish(notification(layout.run_summary_key(RUN)))
    page = _get(s3, layout.report_key(RUN)).decode()
    assert "no failed or zeroed rollout" not in page
    failures = page[page.index('id="failures"'):page.index("</table>", page.index('id="failures"'))]
    assert "AgentError: the agent crashed" in failures and ">4<" in failures
    assert 'id="train-2"' in page and "the run ended at it" in page
