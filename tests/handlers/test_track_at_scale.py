"""Track at scale: one writer per tracking run, logging once under retries, and a constant cost per step.

Against moto's S3 with a run written as the pipeline writes it (`tests.support.runs`). The trackers are the
real MLflow client on a file store, or, where the question is who calls a tracker when, a probe tracker
that records its calls (the lease and the outbox in the report index are what is under test).
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse
from collections import Counter

import boto3
import pytest
from botocore.exceptions import ClientError
from moto import mock_aws

from stepwise import layout, settings
from stepwise.aws import tracking
from stepwise.events import S3Notification
from stepwise.handlers import _common, track
from stepwise.views.publish import Tracker
from tests.support.runs import write_to_s3

BUCKET = "stepwise-track-scale"
RUN = "run-s"


def notification(*keys: str) -> dict:
    return {"Records": [{"eventName": "ObjectCreated:Put", "s3": {"bucket": {"name": BUCKET},
                                                                   "object": {"key": urllib.parse.quote_plus(k)}}}
                        for k in keys]}


def publish(key: str) -> dict:
    return track.track(S3Notification.model_validate(notification(key)))


@pytest.fixture
def run(tmp_path, monkeypatch, request):
    """The run in moto's S3; parametrized indirectly, config fields over the fixture run's (its objects written as
    that config's pipeline writes them, e.g. the group engine's ``admission="group"``)."""
    from stepwise.views import page

    monkeypatch.setattr(page, "charts", lambda index: [])  # matplotlib's seconds; no question here is a curve
    monkeypatch.setenv("STEPWISE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    tracking._RUNS.clear()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        write_to_s3(s3, BUCKET, RUN, mlflow_tracking_uri=f"file:{tmp_path / 'mlruns'}",
                    **getattr(request, "param", {}))
        with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
            yield s3
    tracking._RUNS.clear()


def _get(s3, key):
    return s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def _index(s3) -> dict:
    return json.loads(_get(s3, layout.report_index_key(RUN)))


def _add_steps(s3, steps: range) -> None:
    """Steps beyond the fixture's two: copies of step 1's records and summary under new step numbers."""
    prefix = layout.summaries_prefix(RUN, "steps") + "1/"
    keys = [o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    for step in steps:
        for key in keys:
            body = json.loads(_get(s3, key))
            body["step"] = step
            s3.put_object(Bucket=BUCKET, Key=key.replace("/steps/1/", f"/steps/{step}/"), Body=json.dumps(body).encode())


def test_concurrent_invocations_call_a_runs_trackers_one_at_a_time_and_each_summary_once(run, monkeypatch):
    """Track invocations of one run at once (S3 notifies steps, evals and retries concurrently; two
    invocations wrote one W&B run at once): only the holder of the index's lease calls the trackers, it
    logs what the others left in the outbox, and every summary is logged exactly once."""
    s3 = run
    _add_steps(s3, range(2, 8))
    calls: Counter = Counter()
    active = [0]
    most = [0]
    lock = threading.Lock()

    def log(cfg, run_id, kind, step, summary, table):
        with lock:
            active[0] += 1
            most[0] = max(most[0], active[0])
        time.sleep(0.2)
        with lock:
            active[0] -= 1
            calls[(kind, step)] += 1

    probe = Tracker("probe", lambda cfg: True, log, lambda *a: None, 5.0)
    monkeypatch.setattr(track, "TRACKERS", (probe,))
    keys = [layout.summary_key(RUN, s) for s in range(8)] + [layout.eval_summary_key(RUN, 1)]
    threads = [threading.Thread(target=publish, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == 1
    assert calls == Counter({**{("train", s): 1 for s in range(8)}, ("eval", 1): 1})
    index = _index(s3)
    assert index["pending"] == [] and index["lease"] is None
    assert sorted(tuple(e) for e in index["published"]) == sorted([("train", s) for s in range(8)] + [("eval", 1)])


@pytest.mark.parametrize("failing", ["table", "index"])
def test_a_retried_invocation_logs_a_summary_once(run, failing):
    """An invocation that failed after MLflow logged the summary but before the write that marked it
    published (the table) was retried by Lambda: the metric was logged twice. The table and the index are
    now written before any tracker, and each tracker's outcome as soon as it returns; an invocation that
    ended between the table and the index is completed by its retry (the step reaches the page and MLflow)."""
    from mlflow.tracking import MlflowClient

    from stepwise.config import RunConfig

    s3 = run
    failing_key = layout.report_table_key(RUN, "train", 0) if failing == "table" else layout.report_index_key(RUN)
    failed = []

    def fail_once(params, **_):
        if params.get("Key") == failing_key and not failed:
            failed.append(1)
            raise ClientError({"Error": {"Code": "InternalError", "Message": "We encountered an internal error"}},
                              "PutObject")

    s3.meta.events.register("provide-client-params.s3.PutObject", fail_once)
    with pytest.raises(ClientError):
        publish(layout.summary_key(RUN, 0))
    publish(layout.summary_key(RUN, 0))  # Lambda's retry of the asynchronous invocation
    publish(layout.summary_key(RUN, 0))  # and a repeated notification
    cfg = RunConfig.model_validate(json.loads(_get(s3, layout.config_key(RUN))))
    client = MlflowClient(tracking_uri=cfg.mlflow_tracking_uri)
    history = client.get_metric_history(tracking.mlflow_run_id(cfg, RUN, client=client), "sampler/mean_reward")
    assert [(m.step, m.value) for m in history] == [(0, 0.25)]
    assert _get(s3, layout.report_table_key(RUN, "train", 0))
    assert _index(s3)["published"] == [["train", 0]] and 'id="train-0"' in _get(s3, layout.report_key(RUN)).decode()


def _requests_to_publish(s3, step: int) -> Counter:
    calls: Counter = Counter()

    def count(model, **_):
        calls[model.name] += 1

    s3.meta.events.register("before-call.s3", count)
    try:
        publish(layout.summary_key(RUN, step))
    finally:
        s3.meta.events.unregister("before-call.s3", count)
    return calls


def test_publishing_a_step_costs_the_same_requests_at_step_6_and_at_step_13(run, monkeypatch):
    """Publishing one step read every earlier step's summary and table (79 GETs and 9 LISTs at step 20);
    now its own objects and the report index: the same requests whatever the step once the page holds its
    5 newest tables (benchmarks/report_cost.py measures it at step 1,000), and a page whose inline tables
    are bounded."""
    s3 = run
    monkeypatch.setattr(track, "TRACKERS", ())
    _add_steps(s3, range(2, 14))
    for step in range(6):
        publish(layout.summary_key(RUN, step))
    early = _requests_to_publish(s3, 6)
    for step in range(7, 13):
        publish(layout.summary_key(RUN, step))
    late = _requests_to_publish(s3, 13)
    assert early == late, (early, late)
    page = _get(s3, layout.report_key(RUN)).decode()
    assert page.count('<section class="step"') == 5 and 'href="steps/3.html"' in page
    assert _get(s3, layout.report_step_page_key(RUN, "train", 3)).decode().count('<section class="step"') == 1


def _add_group_steps(s3, steps: range) -> None:
    """`_add_steps` for the group engine: step ``s`` consumes copies of step 1's groups (3 and 2) as groups
    ``2s + 1`` and ``2s``, each in its own folder, its summary naming them."""
    from tests.support.runs import GROUPS

    summary = json.loads(_get(s3, layout.summary_key(RUN, 1)))
    for step in steps:
        refs = []
        for g, attempt in GROUPS[1]:
            new = 2 * step + g - 2
            old_prefix, new_prefix = layout.group_prefix(RUN, g, attempt), layout.group_prefix(RUN, new, attempt)
            for o in s3.list_objects_v2(Bucket=BUCKET, Prefix=old_prefix)["Contents"]:
                body = json.loads(_get(s3, o["Key"]))
                body.update({"group": new} if "/rollouts/" in o["Key"] else {})
                s3.put_object(Bucket=BUCKET, Key=o["Key"].replace(old_prefix, new_prefix), Body=json.dumps(body).encode())
            refs.append([new, attempt])
        s3.put_object(Bucket=BUCKET, Key=layout.summary_key(RUN, step),
                      Body=json.dumps(summary | {"step": step, "consumed_groups": refs}).encode())


@pytest.mark.parametrize("run", [{"admission": "group", "max_staleness": 1}], indirect=True)
def test_a_group_engine_step_is_published_with_its_groups_at_the_same_cost_at_step_6_and_at_step_13(run, monkeypatch):
    """The group engine keeps a step's rollouts in the folders of the groups it consumed: its sample table shows
    them (it showed no rollout before), read through the groups the summary names (one LIST per group), never
    a LIST of every group of the run: the same requests at step 6 and at step 13."""
    s3 = run
    monkeypatch.setattr(track, "TRACKERS", ())
    _add_group_steps(s3, range(2, 14))
    for step in range(6):
        publish(layout.summary_key(RUN, step))
    early = _requests_to_publish(s3, 6)
    for step in range(7, 13):
        publish(layout.summary_key(RUN, step))
    late = _requests_to_publish(s3, 13)
    assert early == late, (early, late)
    table = json.loads(_get(s3, layout.report_table_key(RUN, "train", 13)))
    assert [g["selection"] for g in table["groups"]] == ["trained", "trained"], table["groups"]
    rows = [r["row"] for g in table["groups"] for r in g["rollouts"]]
    # groups 27 (rewards 1, 0) and 26 (1, 1): the advantages their datums carried
    assert sorted(r["advantage"] for r in rows) == pytest.approx([-1.0, 0.0, 0.0, 1.0], abs=1e-6)
    assert sorted(r["staleness"] for r in rows) == [0, 0, 1, 1]
    page = _get(s3, layout.report_key(RUN)).decode()
    assert 'id="train-13"' in page and "stale" in page and "(group 27, attempt 0)" in page


def test_the_trackers_deadlines_fit_in_tracks_timeout():
    """Track's timeout holds the publishing itself (seconds: benchmarks/report_cost.py), a margin and one
    call of every tracker at its deadline; MLflow's own worst case (request timeout x attempts + backoff)
    is inside its deadline."""
    from stepwise.views.publish import MARGIN_SECONDS

    assert MARGIN_SECONDS + sum(t.seconds for t in track.TRACKERS) + 30 <= track.TRACK_SPEC.timeout_s
    timeout, retries, factor = (int(tracking.HTTP_TIMEOUTS[k]) for k in (
        "MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"))
    worst_http_call = (retries + 1) * timeout + sum(factor * 2 ** k + 1 for k in range(retries))
    assert worst_http_call < tracking.CALL_SECONDS
