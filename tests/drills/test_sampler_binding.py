"""Rollouts in flight while Rebind loads new weights, for every ``sampler_binding`` against every way a
service may serve (`stepwise.core.sampler_binding`), on the local stack's real parts: agents talk to our
gateway (aiohttp, the SDK sampler) over loopback, the gateway samples the simulator, Rebind (the
handler, called in the state machine's wait loop) loads the run's next model package, and every
object is in moto's S3.

A case is safe when every captured turn's logprobs are those of the model package it records (checked
afterwards with computeLogprobs on that package) and no turn failed. The drill asserts that the
outcome is what `stepwise.core.sampler_binding.is_safe` predicts: the gate is safe against all four
behaviours, the two other bindings fail against the misbehaving one (and against the ones their
assumption does not cover).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import openai
import pytest

from tests.support.gateway import api_key, open_session
from tests.support.pipeline import BUCKET, REGION, Stack, init_run, new_run_id, roll_out_batch, run_ref, wait_ready

from stepwise.core import sampler_binding as rules
from stepwise.events import BatchEvent, RunEvent
from stepwise.handlers import advantages, plan, train
from stepwise.layout import turns_prefix

SERVINGS = ("several", "latest", "switching", "disturbing")
AGENTS = 4
SAMPLE_S, LOAD_S = 0.3, 0.5
#: The state machine's Wait between two Rebind calls (production: STEPWISE_POLL_SECONDS, 10 s): the
#: load ends during it, and the run's sampler moves only at the next call.
WAIT_S = 1.5


@pytest.fixture(scope="module")
def stack():
    stack = Stack(bucket=BUCKET, sampling_workers=16)
    stack.mp.setenv("STEPWISE_INLINE_WAIT_SECONDS", "0")  # one look per Rebind call: the Wait does the waiting
    from tests.support.gateway import serve_ours

    gw = serve_ours(stack.s3, None, bucket=BUCKET)  # the production sampler path: SDK SamplingClient per package
    yield stack, gw
    gw.stop()
    stack.stop()


@dataclass
class Run:
    """A run whose next load is pending: Rebind of the step just trained is due."""

    run_id: str
    ev: RunEvent
    binding: str


def _train_to_rebind(stack: Stack, run: Run) -> None:
    """One step of the real pipeline (plan, rollouts as the agent leaves them, advantages, training) up to
    the pending load of its new weights."""
    p = plan.plan(run.ev)
    roll_out_batch(stack, run.run_id, p, [1.0, 0.0, 0.0, 1.0])
    assert advantages.compute(BatchEvent.model_validate({"run": run_ref(run.run_id), "batch": p["batch"]}))["decision"] == "train"
    r = train.submit(run.ev)
    while not r["done"]:
        r = train.poll(run.ev)
    assert r["rebind_in_branch"] is False and r["rebound"] is False  # max_staleness 0: no Parallel here


def _rebind(run: Run, wait_s: float = WAIT_S) -> dict:
    """Rebind as the state machine drives it: call, Wait, call again until done."""
    while not (r := train.rebind(run.ev))["done"]:
        time.sleep(min(wait_s, r["wait_seconds"]))
    return r


@pytest.fixture(scope="module")
def runs(stack):
    """One run per binding, each with a first load committed (the sampler is a trained package); made at once."""
    stack, _ = stack
    out: dict[str, Run | BaseException] = {}

    def make(binding: str) -> None:
        try:
            run_id = new_run_id(f"bind-{binding[:4]}")
            init_run(stack, run_id, stack.config(sampler_binding=binding, learning_rate=1e-2, epochs=4))
            assert wait_ready(run_id)["ready"]
            run = Run(run_id, RunEvent.model_validate({"run": run_ref(run_id)}), binding)
            _train_to_rebind(stack, run)
            _rebind(run, 0.05)
            out[binding] = run
        except BaseException as e:
            out[binding] = e

    threads = [threading.Thread(target=make, args=(b,)) for b in rules.BINDINGS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    for binding in rules.BINDINGS:
        if not isinstance(out.get(binding), Run):
            raise AssertionError(f"the {binding} run could not be prepared") from out.get(binding)
    return out


@dataclass
class Agent:
    """Calls its LLM turn after turn until told to stop, and after the load committed at least `after` turns
    and for as long as a gateway keeps the run's sampler it read (`CURRENT_SAMPLER_MAX_AGE_SECONDS`)."""

    gateway_url: str
    record: dict
    loaded: threading.Event
    stop: threading.Event
    linger: bool = False
    after: int = 2
    turns: int = 0
    failures: list[str] = field(default_factory=list)

    def run(self) -> None:
        client = openai.OpenAI(base_url=f"{self.gateway_url}/v1", api_key=api_key(self.record["sid"]), max_retries=0,
                               timeout=60)
        done_after, since = 0, None
        linger = rules.CURRENT_SAMPLER_MAX_AGE_SECONDS + 0.5 if self.linger else 0.0
        while not self.stop.is_set() and (done_after < self.after or time.monotonic() - since < linger):
            try:
                client.chat.completions.create(model="m", max_tokens=512, temperature=1.0,
                                               messages=[{"role": "user", "content": f"turn {self.turns}"}])
            except openai.APIError as e:
                self.failures.append(f"{type(e).__name__}: {str(e)[:160]}")
            self.turns += 1
            if self.loaded.is_set():
                since = since or time.monotonic()
                done_after += 1


def _captured(stack: Stack, run_id: str, sid: str) -> list[dict]:
    import json

    keys = [o["Key"] for page in stack.s3.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=turns_prefix(run_id, sid)) for o in page.get("Contents", [])]
    return [json.loads(stack.s3.get_object(Bucket=BUCKET, Key=k)["Body"].read()) for k in keys]


def _wrong_turns(stack: Stack, session: str, turns: list[dict]) -> list[str]:
    """Turns whose logprobs are not those of the model package they record (computeLogprobs on it, the
    session then serving every package it is asked for)."""
    from sagemaker.train.training_session import SamplingClient

    from tests.support.simulator import runtime_client

    stack.sim.set_serving("several", session=session)
    rt = runtime_client(stack.sim)
    clients: dict[str, SamplingClient] = {}
    wrong = []
    try:
        for body in turns:
            t, arn = body["turn"], body["sampler_model_package_arn"]
            sc = clients.setdefault(arn, SamplingClient(session, rt, model_package_arn=arn))
            scored = sc.compute_logprobs(t["prompt_ids"] + t["output_ids"]).result(timeout=30)[len(t["prompt_ids"]):]
            if max((abs(a - b) for a, b in zip(scored, t["output_log_probs"])), default=0.0) > 1e-4:
                wrong.append(f"v{body['policy_version']} {arn.rsplit('/', 1)[-1]}")
    finally:
        stack.sim.set_serving(None, session=session)
    return wrong


@dataclass
class Outcome:
    turns: int
    failures: list[str]
    wrong: list[str]
    versions: set[int]
    before: int
    after: int
    gate_closed: float | None

    @property
    def safe(self) -> bool:
        return not self.failures and not self.wrong


def _case(stack: Stack, gw, run: Run) -> Outcome:
    """Agents sample through the gateway; once samples are in flight, Rebind loads the run's next package."""
    import json

    from stepwise.aws.runstore import RunStore
    from stepwise.layout import summary_key

    rs = RunStore(BUCKET, stack.s3)
    _train_to_rebind(stack, run)  # this case's load: the step just trained
    before, _ = rs.read_state(run.run_id)
    loaded, stop = threading.Event(), threading.Event()
    agents = []
    for _ in range(AGENTS):
        _, record = open_session(stack.s3, run.run_id, bucket=BUCKET, region=REGION,
                                 training_session_name=before.training_session_name,
                                 sampler_model_package_arn=before.sampler_model_package_arn,
                                 policy_version=before.policy_version, sampler_binding=run.binding,
                                 sampling_defaults={"max_new_tokens": 512, "temperature": 1.0}, max_turns=0,
                                 max_total_tokens=0)
        agents.append(Agent(gw.url, record, loaded, stop, linger=run.binding == "next_turn"))
    threads = [threading.Thread(target=a.run, daemon=True) for a in agents]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 30
        while stack.sim.sampling_in_flight(before.training_session_name) < 2:  # the load starts with samples in flight
            assert time.monotonic() < deadline, "the agents never sampled"
            time.sleep(0.01)
        result = _rebind(run)
        loaded.set()
        for t in threads:
            t.join(timeout=60)
    finally:
        stop.set()
    after, _ = rs.read_state(run.run_id)
    assert result["done"] and after.policy_version == before.policy_version + 1
    turns = [body for a in agents for body in _captured(stack, run.run_id, a.record["sid"])]
    summary = json.loads(stack.s3.get_object(Bucket=BUCKET, Key=summary_key(run.run_id, before.step))["Body"].read())
    return Outcome(turns=len(turns), failures=[f for a in agents for f in a.failures],
                   wrong=_wrong_turns(stack, before.training_session_name, turns),
                   versions={t["policy_version"] for t in turns}, before=before.policy_version,
                   after=after.policy_version, gate_closed=summary.get("time/gate_closed"))


@pytest.mark.parametrize("serving", SERVINGS)
def test_a_load_during_rollouts_is_safe_exactly_where_the_rule_says(stack, runs, serving):
    """The three bindings at once (a run each, on its own session) against a service that behaves so."""
    stack, gw = stack
    stack.sim.set_serving(serving)
    stack.sim.set_latency("sample", SAMPLE_S)
    stack.sim.set_latency("load_weights_for_sampling", LOAD_S)
    outcomes: dict[str, Outcome | BaseException] = {}

    def case(binding: str) -> None:
        try:
            outcomes[binding] = _case(stack, gw, runs[binding])
        except BaseException as e:  # reported below, with the other bindings' outcomes
            outcomes[binding] = e

    threads = [threading.Thread(target=case, args=(b,)) for b in rules.BINDINGS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=180)
    finally:
        stack.sim.set_serving("several")
        stack.sim.clear_faults()
    for binding in rules.BINDINGS:
        o = outcomes.get(binding)
        if isinstance(o, BaseException) or o is None:
            raise AssertionError(f"{binding} against a {serving} service did not finish") from o
        assert o.versions <= {o.before, o.after}
        assert o.safe == rules.is_safe(binding, serving), (
            f"{binding} against a {serving} service: {o.turns} turns, failed {o.failures[:3]}, wrong logprobs {o.wrong[:5]}")
        if binding == "per_rollout":
            assert o.versions == {o.before}  # every turn names its rollout's package
        elif o.safe:
            assert o.after in o.versions  # the rollouts moved to the new package
        assert (o.gate_closed is not None) == (binding == "turn_gate")  # the step reports its gate
