"""compute_step: rollout records -> the step's datums. GRPO's datums are the reference loop's, byte for
byte, on replayed turns (trees with sub-agents and rewinds); with per-turn rewards each LLM turn's
tokens carry their own turn's advantage, so the two-turn task's deciding turn gets the credit."""

from __future__ import annotations

import copy

import pytest
from agentcore_rl_toolkit.backends.experimental.sagemaker.datum import trace_record_to_datum as ref_datum
from agentcore_rl_toolkit.backends.experimental.sagemaker.train_grpo import compute_grpo_advantages as ref_grpo
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.support.planning import cfg

from stepwise.core.replay import record_to_json, replay_session, replay_turns
from stepwise.core.steps import compute_step
from stepwise.records import RolloutRecord

SYS = {"role": "system", "content": "You are a math agent."}
USER = {"role": "user", "content": "2+2?"}
SUB = [{"role": "system", "content": "checker"}, {"role": "user", "content": "check"}]


def body(prompt_ids, output_ids, messages, response):
    return {"turn": {"prompt_ids": prompt_ids, "output_ids": output_ids, "finish_reason": "stop",
                     "output_log_probs": [-0.5] * len(output_ids)},
            "prompt_messages": messages, "response_message": {"role": "assistant", "content": response},
            "metadata": {}}


def tree_turns(a: int) -> list[dict]:
    """4 LLM turns of one rollout (``a`` varies the sampled tokens): a multi-turn chain (turns 0, 1:
    one leaf), a sub-agent (turn 2: its own leaf) and a rewind to the first prompt (turn 3: a sibling
    leaf of turn 0)."""
    asst = {"role": "assistant", "content": f"calc{a}"}
    return [
        body([1, 2, 3], [40 + a, 5], [SYS, USER], f"calc{a}"),
        body([1, 2, 3, 40 + a, 5, 6], [7, 8 + a], [SYS, USER, asst, {"role": "tool", "content": "4"}], "4"),
        body([9, 9], [10 + a], SUB, "ok"),
        body([1, 2, 3], [60 + a], [SYS, USER], f"again{a}"),
    ]


def rollout(i: int, reward: float, turns: list[dict], turn_rewards=None) -> RolloutRecord:
    replay = replay_session(f"sid-{i}", turns, reward)
    return RolloutRecord(sid=f"sid-{i}", i=i, input_id="p0", row=0, member=i, step=0, reward=reward, status="ok",
                         num_turns=len(turns), policy_version=0, records=[record_to_json(r) for r in replay.records],
                         turn_rewards=turn_rewards, turn_spans=replay.turn_spans if turn_rewards is not None else None)


@settings(max_examples=30, deadline=None)
@given(rewards=st.lists(st.sampled_from([0.0, 0.25, 1.0, -3.5, 1e9]), min_size=2, max_size=5))
def test_grpo_datums_are_the_reference_loops(rewards):
    """The reference loop (train_grpo.py): advantages = compute_grpo_advantages(group rewards), then
    trace_record_to_datum(record, advantage) for every record of every member, None dropped."""
    rollouts = [rollout(i, r, tree_turns(i)) for i, r in enumerate(rewards)]
    outcome = compute_step([rollouts], cfg(), policy_version=0)
    expected = []
    for r, adv in zip(rollouts, ref_grpo(rewards), strict=True):
        for rec in replay_turns(r.sid, tree_turns(r.i), r.reward):
            d = ref_datum(rec, adv)
            if d is not None:
                expected.append(d)
    if len(set(rewards)) < 2:  # the all-equal rule: zeros where the reference keeps the mean's residue
        assert all(not any(d["lossFnInputs"]["advantages"]["data"]) for d in outcome.datums)
        expected = [ref_datum(rec, 0.0) for r in rollouts for rec in replay_turns(r.sid, tree_turns(r.i), r.reward)]
    assert outcome.status == "ready" and outcome.datums == expected
    assert len(outcome.datums) == 3 * len(rewards)  # three leaves per rollout: chain, sub-agent, rewind


def turn_advantages(datum: dict, record) -> dict[int, set[float]]:
    """The advantages a datum gives each trained token, keyed by token id."""
    pad = len(record.token_ids) - len(record.loss_mask) - 1
    adv = datum["lossFnInputs"]["advantages"]["data"][pad:]
    out: dict[int, set[float]] = {}
    for tok, m, a in zip(record.token_ids[-len(record.loss_mask):], record.loss_mask, adv, strict=True):
        if m:
            out.setdefault(tok, set()).add(a)
    return out


def test_per_turn_rewards_reach_the_tokens_of_their_turn_in_every_leaf():
    config = cfg(advantage_estimator="per_turn_rloo", reward_granularity="per_turn")
    # member 0 earns on turn 1 (the chain's second turn) and turn 2 (the sub-agent); member 1 on nothing
    rollouts = [rollout(0, 3.0, tree_turns(0), [0.0, 1.0, 2.0, 0.0]),
                rollout(1, 0.0, tree_turns(1), [0.0, 0.0, 0.0, 0.0])]
    outcome = compute_step([rollouts], config, policy_version=0)
    datums = iter(outcome.datums)
    seen = []
    for ro in rollouts:
        by_token: dict[int, set[float]] = {}
        for rec in replay_turns(ro.sid, tree_turns(ro.i), ro.reward):
            for tok, advs in turn_advantages(next(datums), rec).items():
                by_token.setdefault(tok, set()).update(advs)
        seen.append(by_token)
    # reward-to-go: member 0 [3, 3, 2, 0], member 1 zeros; leave-one-out over two members
    assert seen[0] == {40: {3.0}, 5: {3.0}, 7: {3.0}, 8: {3.0}, 10: {2.0}, 60: {0.0}}
    assert seen[1] == {41: {-3.0}, 5: {-3.0}, 7: {-3.0}, 9: {-3.0}, 11: {-2.0}, 61: {0.0}}


def two_turn(i: int, outcome: float) -> RolloutRecord:
    """A rollout of the two-turn task: turn 0 answers (scored), turn 1 asks again in a fresh
    conversation (free): two leaves with the same prompt."""
    turns = [body([1, 2, 3], [20 + i, 99], [SYS, USER], f"a{i}"), body([1, 2, 3], [30 + i, 99], [SYS, USER], f"b{i}")]
    return rollout(i, outcome, turns, [outcome, 0.0])


def test_the_two_turn_tasks_deciding_turn_gets_the_credit_and_the_free_turn_none():
    outcomes = [1.0, 0.0, 0.0, 1.0]
    per_turn = compute_step([[two_turn(i, o) for i, o in enumerate(outcomes)]],
                            cfg(advantage_estimator="per_turn_rloo", reward_granularity="per_turn"), policy_version=0)
    first, free = per_turn.datums[0::2], per_turn.datums[1::2]
    rloo = [2 / 3, -2 / 3, -2 / 3, 2 / 3]
    for d, a in zip(first, rloo, strict=True):
        assert d["lossFnInputs"]["advantages"]["data"][-2:] == pytest.approx([a, a])
    assert all(not any(d["lossFnInputs"]["advantages"]["data"]) for d in free)
    # trajectory rewards (rloo): the free turn's datums get the same credit as the deciding turn's
    trajectory = compute_step([[two_turn(i, o).model_copy(update={"turn_rewards": None, "turn_spans": None})
                                for i, o in enumerate(outcomes)]], cfg(advantage_estimator="rloo"), policy_version=0)
    assert [d["lossFnInputs"]["advantages"]["data"][-1] for d in trajectory.datums[1::2]] == pytest.approx(rloo)
    assert per_turn.train_metrics["advantages/zero_groups_fraction"] == 0.0


def test_dapo_the_metric_and_the_estimator_read_the_same_per_turn_rewards():
    config = cfg(algorithm="dapo", batch_size=1, advantage_estimator="per_turn_rloo", reward_granularity="per_turn")
    # same returns (1.0 each) but credit on different turns: informative for the per-turn estimator
    different_turns = [two_turn(0, 1.0), two_turn(1, 1.0).model_copy(update={"turn_rewards": [0.0, 1.0]})]
    outcome = compute_step([different_turns], config, policy_version=0)
    assert outcome.status == "ready" and outcome.train_metrics["advantages/zero_groups_fraction"] == 0.0
    equal = [two_turn(0, 1.0), two_turn(1, 1.0)]
    assert compute_step([equal], config, policy_version=0).status == "need_more"  # dropped by the filter
    # with a trajectory estimator the returns are what counts: equal returns, no signal, dropped
    traj = cfg(algorithm="dapo", batch_size=1, advantage_estimator="grpo", reward_granularity="per_turn")
    assert compute_step([copy.deepcopy(different_turns)], traj, policy_version=0).status == "need_more"
