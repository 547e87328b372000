"""Sampler seeds: derived from (seed, kind, step, generation batch, rollout, turn), never from the
run id or the time; the gateway hands each turn its seed (scripted sampler; the simulator-backed
path is in tests/gateway/test_simulator.py, whole runs in tests/e2e/test_seeded_runs.py)."""

from __future__ import annotations

import itertools

import openai
import pytest

from tests.support.gateway import api_key, open_session, scripted_gateway
from stepwise.core.seeding import SEED_BITS, rollout_seed, turn_seed

RUN = "run-seeds"


def test_seeds_are_a_pure_function_of_the_place_in_the_run():
    where = dict(kind="train", step=3, generation_batch=1, index=5)
    assert rollout_seed(7, **where) == rollout_seed(7, **where)
    places = [dict(kind=k, step=s, generation_batch=g, index=i)
              for k, s, g, i in itertools.product(("train", "eval"), range(3), range(2), range(4))]
    seeds = [rollout_seed(7, **p) for p in places] + [rollout_seed(8, **p) for p in places]
    assert len(set(seeds)) == len(seeds)  # every rollout of two seeds' runs gets its own seed
    turns = [turn_seed(seeds[0], t) for t in range(50)]
    assert len(set(turns)) == 50
    assert all(0 <= s < 2**SEED_BITS for s in seeds + turns)  # the service's seed is a 32-bit Integer
    # pinned: a change of derivation changes every seeded run's curve, and must be deliberate
    assert rollout_seed(0, kind="train", step=0, generation_batch=0, index=0) == 1906004738


@pytest.fixture(scope="module")
def gateway():
    yield from scripted_gateway(RUN)


def _ask(gw, sid: str, messages: list[dict]) -> str:
    client = openai.OpenAI(base_url=gw.base_url, api_key=api_key(sid), max_retries=0)
    return client.chat.completions.create(model="m", messages=messages, max_tokens=16).choices[0].message.content


def test_each_turn_samples_with_the_seed_of_its_index_in_the_rollout(gateway):
    s3, sampler, gw = gateway
    sid, _ = open_session(s3.client, RUN, sampling_seed=1234, max_turns=0, max_total_tokens=0)
    history = [{"role": "user", "content": "hi"}]
    for _ in range(3):  # a linear conversation
        history += [{"role": "assistant", "content": _ask(gw, sid, history)}, {"role": "user", "content": "more"}]
    fresh = _ask(gw, sid, [{"role": "user", "content": "again"}])  # a fresh context: the 4th turn all the same
    assert fresh
    assert [p["seed"] for p in sampler.params[-4:]] == [turn_seed(1234, t) for t in range(4)]
    # a request that already holds two assistant turns is turn 2, whatever S3 has persisted yet
    sid2, _ = open_session(s3.client, RUN, sampling_seed=1234)
    _ask(gw, sid2, history[:5])
    assert sampler.params[-1]["seed"] == turn_seed(1234, 2)
    # a session without a seed samples unseeded, as before
    sid3, _ = open_session(s3.client, RUN)
    _ask(gw, sid3, [{"role": "user", "content": "hi"}])
    assert "seed" not in sampler.params[-1]
