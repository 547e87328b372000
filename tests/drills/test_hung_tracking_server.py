"""Drill: a tracking server that accepts connections and never answers costs a warning, never the page.

Track ran MLflow with the client's defaults (a 120 s request timeout, 7 retries: one call could hold for
about 20 minutes) inside its 300 s, before writing the step's table and the report page: against such a
server the run trained, its Track invocations timed out one after another, and 370 s after the run ended
there was no sample table and no page. Now the table and the page are written before any tracker is
called, each tracker call runs under a deadline inside Track's timeout (MLflow's own requests time out
first), and the failure is a warning on the page.

The server is a real socket that accepts and then says nothing; the client is the real MLflow client.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.parse

import boto3
import pytest
from moto import mock_aws

from stepwise import layout, settings
from stepwise.aws import tracking
from stepwise.events import S3Notification
from stepwise.handlers import _common, track
from tests.support.hung_server import HungServer
from tests.support.runs import write_to_s3

BUCKET = "stepwise-hung-tracker"
RUN = "run-h"


@pytest.fixture
def hung_run(monkeypatch):
    server = HungServer()
    monkeypatch.setenv("STEPWISE_BUCKET", BUCKET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    tracking._RUNS.clear()
    with mock_aws():
        s3 = boto3.client("s3", region_name="us-east-1")
        s3.create_bucket(Bucket=BUCKET)
        write_to_s3(s3, BUCKET, RUN, mlflow_tracking_uri=f"http://127.0.0.1:{server.port}")
        with _common.use_dependencies(_common.Dependencies.of(settings.current(), s3=s3)):
            yield s3, server
    server.close()
    tracking._RUNS.clear()


def _exists(s3, key: str) -> bool:
    try:
        s3.head_object(Bucket=BUCKET, Key=key)
        return True
    except Exception:
        return False


def _publish_in_background(key: str) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        t0 = time.monotonic()
        event = {"Records": [{"s3": {"bucket": {"name": BUCKET}, "object": {"key": urllib.parse.quote_plus(key)}}}]}
        try:
            out["result"] = track.track(S3Notification.model_validate(event))
        finally:
            out["seconds"] = time.monotonic() - t0

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def _wait_for(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return condition()


def test_the_table_and_the_page_exist_while_mlflow_hangs_and_its_failure_is_a_warning(hung_run, monkeypatch):
    s3, server = hung_run
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")  # the drill's clock; Track's own: 10 s, 2 retries
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    thread, out = _publish_in_background(layout.summary_key(RUN, 0))
    assert _wait_for(lambda: server.accepted > 0, 30), "MLflow was never called"
    # the moment MLflow connects, the step's table and the page are already written
    assert _exists(s3, layout.report_table_key(RUN, "train", 0)) and _exists(s3, layout.report_key(RUN))
    thread.join(60)
    assert not thread.is_alive() and out["result"]["published"][0]["warnings"] == 1
    (warning,) = [w for _, _, w in json.loads(s3.get_object(Bucket=BUCKET, Key=layout.report_index_key(RUN))[
        "Body"].read())["warnings"]]
    assert warning.startswith(f"MLflow tracking to http://127.0.0.1:{server.port} failed at train step 0: ")
    page = s3.get_object(Bucket=BUCKET, Key=layout.report_key(RUN))["Body"].read().decode()
    assert 'id="warnings"' in page and 'id="train-0"' in page


def test_a_tracker_call_still_running_at_its_deadline_is_left_behind(hung_run, monkeypatch):
    """MLflow's requests set to wait longer than the call's deadline: Track does not wait for them."""
    s3, server = hung_run
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "120")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "7")
    mlflow = track.TRACKERS[0]
    monkeypatch.setattr(track, "TRACKERS", (mlflow.__class__(**{**mlflow.__dict__, "seconds": 3.0}),))
    thread, out = _publish_in_background(layout.summary_key(RUN, 1))
    thread.join(60)
    assert not thread.is_alive() and out["seconds"] < 30, out
    (warning,) = [w for _, _, w in json.loads(s3.get_object(Bucket=BUCKET, Key=layout.report_index_key(RUN))[
        "Body"].read())["warnings"]]
    assert "no answer within 3 s" in warning
    index = json.loads(s3.get_object(Bucket=BUCKET, Key=layout.report_index_key(RUN))["Body"].read())
    assert index["pending"] == [] and index["lease"] is None  # the next invocation is not blocked
