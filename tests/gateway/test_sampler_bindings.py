"""The gateway's per-turn sampler choice (`stepwise.gateway.binding`): what each ``sampler_binding``
samples, what it costs in S3 requests per turn, and the turn gate's leases (written before the gate
is read, renewed while the turn runs, gone after it), holds, 503s and stale gates. S3 is moto; the
sampler is scripted (each turn records the package it was asked for)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import openai
import pytest
from botocore.exceptions import ClientError

from stepwise.core import sampler_binding as rules
from stepwise.gateway import start_gateway
from stepwise.gateway.app import GATEWAY, GatewaySettings, build_app
from stepwise.layout import current_sampler_key, key_kind, leases_prefix
from stepwise.records import RunSampler, SamplerPolicy
from tests.support.gateway import BUCKET, MotoS3, ScriptedSampler, api_key, cache_tokenizer, load_tokenizer, open_session, turn_objects

RUN = "run-bindings"
SESSION = "ts-test"
OLD = "arn:aws:sagemaker:us-west-2:1:model-package/p/3"
NEW = "arn:aws:sagemaker:us-west-2:1:model-package/p/4"


class PackageSampler(ScriptedSampler):
    """Scripted outputs; records the package each turn sampled; refuses ``refused`` packages as the
    service refuses a package it does not serve."""

    def __init__(self, tokenizer, package: str, log: list, refused: set) -> None:
        super().__init__(tokenizer)
        self.package, self.log, self.refused = package, log, refused

    async def generate(self, **kwargs):
        if self.package in self.refused:
            raise ClientError({"Error": {"Code": "ValidationException", "Message": f"{self.package} is not loaded"}},
                              "ExecuteSamplingOperation")
        self.log.append(self.package)
        return await super().generate(**kwargs)


@pytest.fixture(scope="module")
def gw():
    s3 = MotoS3()
    cache_tokenizer(s3.client, RUN)
    tok = load_tokenizer()
    log: list[str] = []
    refused: set[str] = set()
    delay = {"s": 0.0}

    def factory(record):
        sampler = PackageSampler(tok, record.sampler_model_package_arn, log, refused)
        original = sampler.generate

        async def slow(**kw):
            import asyncio

            await asyncio.sleep(delay["s"])
            return await original(**kw)

        sampler.generate = slow
        return sampler

    client = s3.new_client()
    requests: Counter = Counter()
    client.meta.events.register("before-send.s3", lambda request, **_: requests.update(
        [(request.method, key_kind(request.url.split(f"/{BUCKET}/", 1)[-1].split("?", 1)[0]))]))
    app = build_app(GatewaySettings(bucket=BUCKET), s3=client, sampler_factory=factory)
    handle = start_gateway(app=app)
    try:
        yield s3, handle, app[GATEWAY]["bindings"], log, refused, requests, delay
    finally:
        handle.stop()
        s3.stop()


@pytest.fixture(autouse=True)
def _clean(gw):
    s3, handle, bindings, log, refused, requests, delay = gw
    s3.client.delete_object(Bucket=BUCKET, Key=current_sampler_key(RUN))
    bindings._cached.clear()
    log.clear(), refused.clear(), requests.clear()
    delay["s"] = 0.0
    yield


def _session(s3, binding: str) -> str:
    sid, _ = open_session(s3.client, RUN, training_session_name=SESSION, sampler_model_package_arn=OLD,
                          policy_version=3, sampler_binding=binding, max_turns=0, max_total_tokens=0)
    return sid


def _current(s3, **over) -> None:
    body = RunSampler(training_session_name=SESSION, sampler_model_package_arn=NEW, policy_version=4,
                      updated_at=time.time()).model_copy(update=over)
    s3.client.put_object(Bucket=BUCKET, Key=current_sampler_key(RUN), Body=body.model_dump_json().encode())


def _turn(handle, sid: str):
    client = openai.OpenAI(base_url=f"{handle.url}/v1", api_key=api_key(sid), max_retries=0, timeout=30)
    return client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=16)


def _leases(s3) -> list[str]:
    return [o["Key"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=leases_prefix(RUN)).get("Contents", [])]


def _binding_requests(requests: Counter) -> dict:
    return {k: v for k, v in requests.items() if k[1] in ("lease", "sampler")}


def test_per_rollout_samples_the_records_package_with_no_request(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    _current(s3)
    sid = _session(s3, "per_rollout")
    _turn(handle, sid)
    assert log == [OLD] and _binding_requests(requests) == {}
    (turn,) = turn_objects(s3.client, RUN, sid, expect=1).values()
    assert (turn["sampler_model_package_arn"], turn["policy_version"]) == (OLD, 3)


def test_next_turn_samples_the_newer_current_sampler_read_once_per_max_age(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    _current(s3)
    sid = _session(s3, "next_turn")
    _turn(handle, sid)
    _turn(handle, sid)
    assert log == [NEW, NEW]
    assert _binding_requests(requests) == {("GET", "sampler"): 1}  # the container keeps it for CURRENT_SAMPLER_MAX_AGE_SECONDS
    turns = turn_objects(s3.client, RUN, sid, expect=2)
    assert {(t["sampler_model_package_arn"], t["policy_version"]) for t in turns.values()} == {(NEW, 4)}


def test_next_turn_retries_a_refused_turn_on_the_package_being_loaded(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    _current(s3, sampler_model_package_arn=OLD, policy_version=3, loading_model_package_arn=NEW, loading_policy_version=4)
    refused.add(OLD)  # the load ended: the service serves only NEW; Rebind has not rewritten the sampler yet
    sid = _session(s3, "next_turn")
    _turn(handle, sid)
    assert log == [NEW] and bindings.stats.retried == 1
    (turn,) = turn_objects(s3.client, RUN, sid, expect=1).values()
    assert (turn["sampler_model_package_arn"], turn["policy_version"]) == (NEW, 4)  # recorded as what sampled it
    _current(s3, sampler_model_package_arn=OLD, policy_version=3)  # nothing newer to try: the refusal stands
    bindings._cached.clear()
    with pytest.raises(openai.BadRequestError):
        _turn(handle, _session(s3, "next_turn"))


def test_a_gated_turn_leases_reads_the_gate_and_leaves_no_lease(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    _current(s3)
    sid = _session(s3, "turn_gate")
    _turn(handle, sid)
    assert log == [NEW] and _leases(s3) == []
    assert _binding_requests(requests) == {("PUT", "lease"): 1, ("GET", "sampler"): 1, ("DELETE", "lease"): 1}
    # with no current sampler yet (Rebind never ran), the record's package
    s3.client.delete_object(Bucket=BUCKET, Key=current_sampler_key(RUN))
    _turn(handle, sid)
    assert log[-1] == OLD


def test_a_closed_gate_holds_new_turns_without_a_lease_until_rebind_opens_it(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    closed = rules.close_gate(None, SamplerPolicy(training_session_name=SESSION, sampler_model_package_arn=OLD,
                                                  policy_version=3),
                              SamplerPolicy(training_session_name=SESSION, sampler_model_package_arn=NEW, policy_version=4),
                              time.time())
    s3.client.put_object(Bucket=BUCKET, Key=current_sampler_key(RUN), Body=closed.model_dump_json().encode())
    sid = _session(s3, "turn_gate")
    done = threading.Event()
    t = threading.Thread(target=lambda: (_turn(handle, sid), done.set()), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while bindings.stats.held < 1:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    time.sleep(0.3)
    assert not done.is_set() and log == [] and _leases(s3) == []  # held, holding nothing Rebind waits for
    opened = rules.open_gate(SamplerPolicy(training_session_name=SESSION, sampler_model_package_arn=NEW, policy_version=4),
                             time.time(), closed)
    s3.client.put_object(Bucket=BUCKET, Key=current_sampler_key(RUN), Body=opened.model_dump_json().encode())
    t.join(10)
    assert done.is_set() and log == [NEW] and _leases(s3) == []


def test_a_turn_held_past_the_limit_is_a_503_and_a_gate_past_its_deadline_is_open(gw):
    s3, handle, bindings, log, refused, requests, _ = gw
    _current(s3, gate="closed", closed_at=time.time(), gate_deadline=time.time() + 60)
    sid = _session(s3, "turn_gate")
    limit = bindings.hold_limit_s
    bindings.hold_limit_s = 0.5
    try:
        with pytest.raises(openai.InternalServerError) as e:
            _turn(handle, sid)
        assert e.value.status_code == 503 and "loading" in str(e.value)
    finally:
        bindings.hold_limit_s = limit
    assert log == [] and _leases(s3) == []
    _current(s3, gate="closed", closed_at=time.time() - 300, gate_deadline=time.time() - 1)  # Rebind died
    _turn(handle, sid)
    assert log == [NEW]


def test_a_long_turn_renews_its_lease_and_one_lease_is_live_at_a_time(gw):
    s3, handle, bindings, log, refused, requests, delay = gw
    _current(s3)
    renew = bindings.renew_s
    bindings.renew_s, delay["s"] = 0.2, 0.9
    seen: list[list[str]] = []
    sid = _session(s3, "turn_gate")
    t = threading.Thread(target=_turn, args=(handle, sid), daemon=True)
    try:
        t.start()
        while t.is_alive():
            seen.append(_leases(s3))
            time.sleep(0.05)
    finally:
        bindings.renew_s = renew
    assert bindings.stats.renewals >= 2 and _leases(s3) == []
    assert max(len(x) for x in seen) <= 2  # a renewal writes the new lease before it deletes the old one
    firsts = [x[0] for x in seen if x]
    from stepwise.layout import lease_deadline

    assert lease_deadline(firsts[-1]) > lease_deadline(firsts[0])  # the deadline moved on
