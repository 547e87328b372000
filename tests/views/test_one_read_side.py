"""One read side: what a person reads of a trained rollout is what it was trained with.

A property test over random steps: every estimator, both reward granularities, both algorithms (DAPO's
generation batches, all-equal groups it filters, surplus groups it cuts, overlong shaping), failed
rollouts and rollouts without a trainable record. The step's datums come from
`stepwise.core.steps.compute_step`, as ComputeAdvantages makes them; the rollouts come from the read
side as `stepwise rollouts` and the report page read them (the records written into a run folder, read
back through its store). For every datum, its rollout is shown as trained and the advantage shown is the
one every trained token of the datum carries (per turn under a per-turn estimator); every rollout shown
as trained with a trainable record has a datum.

On the code before `stepwise.views` (``runview.step_groups`` over ``core.rollouts.group_views``) it
fails: ``algorithm: dapo`` with ``reinforce_pp_baseline`` whitened over every group of every generation
batch, kept or not (a step with one all-equal group and one ``[1, 0, 0, 1]``: trained with +-0.866,
shown +-1.323), and nothing said which groups were trained.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepwise import layout
from stepwise.core.advantages import ESTIMATORS, PER_TURN_ESTIMATORS
from stepwise.core.steps import compute_step
from stepwise.records import RolloutRecord
from stepwise.views.run import read_step
from stepwise_cli.sources import DirStore
from tests.support.planning import cfg as make_cfg

RUN = "prop-run"
STEP = 4
MAX_TOKENS = 40


@st.composite
def configs(draw):
    algorithm = draw(st.sampled_from(["grpo", "dapo"]))
    estimator = draw(st.sampled_from(ESTIMATORS))
    granularity = "per_turn" if estimator in PER_TURN_ESTIMATORS else draw(st.sampled_from(["trajectory", "per_turn"]))
    kw = {"algorithm": algorithm, "advantage_estimator": estimator, "reward_granularity": granularity,
          "batch_size": draw(st.integers(1, 3)), "responses_per_prompt": draw(st.integers(2, 4)),
          "max_tokens_per_rollout": MAX_TOKENS}
    if algorithm == "dapo":
        kw["max_num_gen_batches"] = draw(st.integers(1, 3))
        kw["overlong_buffer_len"] = draw(st.sampled_from([0, 10]))
    return make_cfg(**kw)


@st.composite
def steps(draw):
    """``(cfg, records)``: a step's rollout records, every generation batch, as FinishRollout writes them."""
    cfg = draw(configs())
    gens = draw(st.integers(1, cfg.max_num_gen_batches)) if cfg.algorithm == "dapo" else 1
    per_turn = cfg.reward_granularity == "per_turn"
    records, uid = [], 1000
    for gen in range(gens):
        for p in range(cfg.batch_size):
            # a group's rewards come from a small set, so all-equal (filtered) groups are common
            pool = draw(st.sampled_from([[0.0], [1.0], [0.0, 1.0], [0.0, 0.5, 1.0]]))
            for m in range(cfg.responses_per_prompt):
                i = p * cfg.responses_per_prompt + m
                failed = draw(st.integers(0, 9)) == 0
                turn_rewards = [draw(st.sampled_from(pool)) for _ in range(draw(st.integers(1, 3)))] if per_turn else None
                reward = 0.0 if failed else (sum(turn_rewards) if turn_rewards else draw(st.sampled_from(pool)))
                traces, spans = [], []
                for _ in range(0 if failed else draw(st.integers(0, 2))):
                    uid += 1
                    n = draw(st.integers(1, 5))
                    mask = draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n, max_size=n))
                    traces.append({"token_ids": [uid, 7, *range(20, 20 + n)], "loss_mask": mask, "logprobs": [-0.5] * n,
                                   "rollout_id": f"sid-{gen}-{i}", "reward": reward, "response_length": n,
                                   "response": "", "metadata": {}, "status": "completed"})
                    # per-turn: positions 0..n split among the rollout's turns, in order
                    turns = len(turn_rewards or [0])
                    cuts = sorted(draw(st.lists(st.integers(0, n), min_size=turns - 1, max_size=turns - 1)))
                    bounds = [0, *cuts, n]
                    spans.append([[t, bounds[t], bounds[t + 1]] for t in range(turns) if bounds[t] < bounds[t + 1]])
                records.append(RolloutRecord(
                    sid=f"sid-{gen}-{i}", i=i, input_id=f"g{gen}p{p}", row=p, member=m, step=STEP, generation_batch=gen,
                    reward=reward, status="error" if failed else "ok",
                    error={"error": "AgentError", "cause": "boom"} if failed else None,
                    reward_reason="error: AgentError" if failed else None, num_turns=len(turn_rewards or [1]),
                    sampled_tokens=draw(st.integers(0, MAX_TOKENS + 5)), policy_version=STEP, records=traces,
                    turn_rewards=None if failed else turn_rewards, turn_spans=spans if per_turn and not failed else None))
    return cfg, records


def datums_of(cfg, records):
    batches = [[r for r in records if r.generation_batch == g] for g in range(max(r.generation_batch for r in records) + 1)]
    return compute_step(batches, cfg, policy_version=STEP)


def write_run(root: Path, cfg, records, decision: str | None) -> DirStore:
    store = DirStore(root)

    def put(key, obj):
        store.put_bytes(key, json.dumps(obj).encode())

    put(layout.config_key(RUN), cfg.model_dump(mode="json"))
    for r in records:
        put(layout.rollout_key(RUN, STEP, r.generation_batch, r.sid, "train"), r.model_dump(mode="json"))
    if decision is not None:
        put(layout.summary_key(RUN, STEP), {"step": STEP, "decision": decision})
    return store


def shown_rollouts(store):
    """What `stepwise rollouts` and the page read: ``{sid: (selection, advantage, turn advantages)}``."""
    view = read_step(store, RUN, STEP)
    return {r.sid: (r.selection, r.advantage, r.turn_advantages) for g in view.groups for r in g.rollouts}


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps())
def test_the_advantage_shown_for_every_trained_rollout_is_the_one_in_its_datum(step):
    cfg, records = step
    outcome = datums_of(cfg, records)
    decision = ("train" if outcome.datums else "skip") if outcome.status == "ready" else outcome.status
    with tempfile.TemporaryDirectory() as tmp:
        shown = shown_rollouts(write_run(Path(tmp), cfg, records, decision))
    by_uid = {t["token_ids"][0]: (r, t) for r in records for t in r.records}
    per_turn = cfg.advantage_estimator in PER_TURN_ESTIMATORS
    trained_sids = set()
    for datum in outcome.datums:
        rollout, trace = by_uid[datum["modelInput"]["chunks"][0]["tokens"][0]]
        trained_sids.add(rollout.sid)
        selection, advantage, turn_advantages = shown[rollout.sid]
        assert selection == "trained", (rollout.sid, selection)
        response = datum["lossFnInputs"]["advantages"]["data"][-len(trace["loss_mask"]):]
        if per_turn:
            k = rollout.records.index(trace)
            turn_of = {pos: t for t, a, b in rollout.turn_spans[k] for pos in range(a, b)}
            expected = [m * turn_advantages[turn_of[pos]] if pos in turn_of else 0.0
                        for pos, m in enumerate(trace["loss_mask"])]
        else:
            expected = [m * advantage for m in trace["loss_mask"]]
        assert response == expected, (rollout.sid, response, expected)
    for sid, (selection, advantage, _) in shown.items():
        rollout = next(r for r in records if r.sid == sid)
        trainable = any(any(t["loss_mask"]) for t in rollout.records)
        if selection == "trained" and trainable:
            assert sid in trained_sids
        if selection != "trained":
            assert advantage is None and sid not in trained_sids


def test_dapo_with_reinforce_pp_shows_what_it_trained_not_a_batch_wide_whitening():
    """The finding, exactly: one all-equal group and one [1, 0, 0, 1] trains with +-0.866."""
    cfg = make_cfg(algorithm="dapo", advantage_estimator="reinforce_pp_baseline", batch_size=1, responses_per_prompt=4,
                   max_num_gen_batches=2)
    rows = [("a", [1.0, 1.0, 1.0, 1.0]), ("b", [1.0, 0.0, 0.0, 1.0])]
    records = []
    for p, (input_id, rewards) in enumerate(rows):
        for m, reward in enumerate(rewards):
            records.append(RolloutRecord(
                sid=f"{input_id}{m}", i=m, input_id=input_id, row=p, member=m, step=STEP, generation_batch=p,
                reward=reward, status="ok", policy_version=STEP,
                records=[{"token_ids": [1000 + 10 * p + m, 7, 20], "loss_mask": [1], "logprobs": [-0.5]}]))
    assert datums_of(cfg, records).status == "ready"
    with tempfile.TemporaryDirectory() as tmp:
        shown = shown_rollouts(write_run(Path(tmp), cfg, records, "train"))
    assert [shown[f"a{m}"][0] for m in range(4)] == ["filtered"] * 4
    assert [round(shown[f"b{m}"][1], 3) for m in range(4)] == [0.866, -0.866, -0.866, 0.866]


# ---------------------------------------------------------------------------- the group engine (admission: group)

UPDATE_VERSION = 7  # the policy version the group-engine step's update applied to


@st.composite
def group_steps(draw):
    """``(cfg, trained, filtered)``: a group-engine step's consumed groups, each ``((group, attempt), records)``
    as FinishRollout writes them into the group's folder; the trained ones in the order chosen (not id order),
    the filtered ones (DAPO) all-equal; members sampled up to ``max_staleness`` versions before the update."""
    cfg = draw(configs()).model_copy(update={"admission": "group", "max_staleness": 2})
    bs, size = cfg.batch_size, cfg.responses_per_prompt
    per_turn = cfg.reward_granularity == "per_turn"
    ids = draw(st.lists(st.integers(0, 30), min_size=bs, max_size=bs + 3, unique=True))
    trained_ids, filtered_ids = ids[:bs], (ids[bs:] if cfg.algorithm == "dapo" else [])
    uid = [5000]

    def group(g: int, pool: list[float]) -> tuple[tuple[int, int], list[RolloutRecord]]:
        attempt = draw(st.integers(0, 1))
        step, position = divmod(g, bs)
        records = []
        for m in range(size):
            i = position * size + m
            failed = draw(st.integers(0, 9)) == 0 and len(pool) > 1
            turn_rewards = [draw(st.sampled_from(pool)) for _ in range(draw(st.integers(1, 3)))] if per_turn else None
            reward = 0.0 if failed else (sum(turn_rewards) if turn_rewards else draw(st.sampled_from(pool)))
            if len(pool) == 1:  # a filtered group: every member the same
                turn_rewards = [pool[0]] if per_turn else None
                reward = pool[0]
            traces, spans = [], []
            for _ in range(0 if failed else draw(st.integers(0, 2))):
                uid[0] += 1
                n = draw(st.integers(1, 5))
                mask = draw(st.lists(st.sampled_from([0, 1, 1]), min_size=n, max_size=n))
                traces.append({"token_ids": [uid[0], 7, *range(20, 20 + n)], "loss_mask": mask, "logprobs": [-0.5] * n,
                               "rollout_id": f"sid-g{g}-{m}", "reward": reward, "response_length": n, "response": "",
                               "metadata": {}, "status": "completed"})
                turns = len(turn_rewards or [0])
                cuts = sorted(draw(st.lists(st.integers(0, n), min_size=turns - 1, max_size=turns - 1)))
                bounds = [0, *cuts, n]
                spans.append([[t, bounds[t], bounds[t + 1]] for t in range(turns) if bounds[t] < bounds[t + 1]])
            first = UPDATE_VERSION - draw(st.integers(0, cfg.max_staleness))
            records.append(RolloutRecord(
                sid=f"sid-g{g}-{m}", i=i, input_id=f"s{step}g0p{position}", row=g, member=m, step=step,
                generation_batch=0, group=g, reward=reward, status="error" if failed else "ok",
                error={"error": "AgentError", "cause": "boom"} if failed else None,
                reward_reason="error: AgentError" if failed else None, num_turns=len(turn_rewards or [1]),
                sampled_tokens=draw(st.integers(0, MAX_TOKENS + 5)), policy_version=first, first_turn_version=first,
                last_turn_version=UPDATE_VERSION, records=traces,
                turn_rewards=None if failed else turn_rewards, turn_spans=spans if per_turn and not failed else None))
        return (g, attempt), records

    trained = [group(g, draw(st.sampled_from([[0.0], [1.0], [0.0, 1.0], [0.0, 0.5, 1.0]]))) for g in trained_ids]
    filtered = [group(g, draw(st.sampled_from([[0.0], [1.0]]))) for g in filtered_ids]
    return cfg, trained, filtered


def write_group_run(root: Path, cfg, trained, filtered, decision: str) -> DirStore:
    """A group-engine run folder: each group's records in its own folder, the step's summary naming them."""
    store = DirStore(root)

    def put(key, obj):
        store.put_bytes(key, json.dumps(obj).encode())

    put(layout.config_key(RUN), cfg.model_dump(mode="json"))
    for (g, a), records in trained + filtered:
        for r in records:
            put(layout.rollout_key(RUN, r.step, 0, r.sid, group=g, attempt=a), r.model_dump(mode="json"))
    put(layout.summary_key(RUN, STEP), {"step": STEP, "decision": decision, "policy_version": UPDATE_VERSION + 1,
                                        "consumed_groups": [list(ref) for ref, _ in trained],
                                        "filtered_groups": [list(ref) for ref, _ in filtered]})
    return store


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(group_steps())
def test_a_group_engine_step_shows_the_groups_it_consumed_with_the_advantages_in_their_datums(step):
    """The group engine keeps each group's rollouts in its own folder (``groups/{g}/a{n}/``): the read side finds a
    step's through the groups it consumed, and shows each trained rollout with the advantage its datum carries
    (ComputeAdvantages' ``compute_step(..., chosen=True)``), its staleness, and DAPO's filtered groups as filtered.
    Fails on the code before: no rollout of a group-engine step was shown."""
    cfg, trained, filtered = step
    outcome = compute_step([records for _, records in trained], cfg, policy_version=UPDATE_VERSION, chosen=True)
    decision = "train" if outcome.datums else "skip"
    with tempfile.TemporaryDirectory() as tmp:
        store = write_group_run(Path(tmp), cfg, trained, filtered, decision)
        view = read_step(store, RUN, STEP)
        from stepwise.views.store import steps_with_rollouts

        assert steps_with_rollouts(store, RUN, "train") == [STEP]
    shown = {r.sid: (r.selection, r.advantage, r.turn_advantages, r.staleness) for g in view.groups for r in g.rollouts}
    records = {r.sid: r for _, rs in trained + filtered for r in rs}
    assert set(shown) == set(records)  # every rollout of every consumed group, nothing else
    assert [(g.group, g.attempt) for g in view.groups] == [ref for ref, _ in trained + filtered]
    by_uid = {t["token_ids"][0]: (r, t) for r in records.values() for t in r.records}
    per_turn = cfg.advantage_estimator in PER_TURN_ESTIMATORS
    trained_sids = set()
    for datum in outcome.datums:
        rollout, trace = by_uid[datum["modelInput"]["chunks"][0]["tokens"][0]]
        trained_sids.add(rollout.sid)
        selection, advantage, turn_advantages, staleness = shown[rollout.sid]
        assert selection == "trained" and staleness == UPDATE_VERSION - rollout.first_turn_version
        response = datum["lossFnInputs"]["advantages"]["data"][-len(trace["loss_mask"]):]
        if per_turn:
            k = rollout.records.index(trace)
            turn_of = {pos: t for t, a, b in rollout.turn_spans[k] for pos in range(a, b)}
            expected = [m * turn_advantages[turn_of[pos]] if pos in turn_of else 0.0
                        for pos, m in enumerate(trace["loss_mask"])]
        else:
            expected = [m * advantage for m in trace["loss_mask"]]
        assert response == expected, (rollout.sid, response, expected)
    filtered_sids = {r.sid for _, rs in filtered for r in rs}
    for sid, (selection, advantage, _, _) in shown.items():
        trainable = any(any(t["loss_mask"]) for t in records[sid].records)
        if sid in filtered_sids:
            assert selection == "filtered" and advantage is None
        elif decision == "train":
            assert selection == "trained" and (sid in trained_sids or not trainable)
        else:
            assert selection == "untrained" and advantage is None
