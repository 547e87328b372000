"""stepwise.views.steps: a step's groups as ComputeAdvantages decided them, each marked trained, filtered,
surplus, untrained or eval, and the groups a report samples."""

from __future__ import annotations

import pytest

from stepwise.core.advantages import compute_advantages
from stepwise.records import RolloutRecord
from stepwise.views.steps import pick_groups, sample_groups, step_view
from tests.support.planning import cfg


def rollout(i, input_id, member, reward, *, gen=0, status="ok", reason=None, error=None, tokens=3, turn_rewards=None,
            kind="train"):
    uid = 1000 + 100 * gen + i
    return RolloutRecord(sid=f"sid-{gen}-{i}", i=i, input_id=input_id, row=0, member=member, kind=kind, step=5,
                         generation_batch=gen, reward=reward, reward_reason=reason, status=status, error=error,
                         num_turns=2, tool_calls=1, sampled_tokens=tokens, duration_s=1.5, policy_version=5,
                         records=[{"token_ids": [uid, 7, 8], "loss_mask": [1], "logprobs": [-0.5]}],
                         turn_rewards=turn_rewards, turn_spans=[[[0, 0, 1]]] if turn_rewards else None)


STEP = [rollout(0, "p0", 0, 1.0), rollout(1, "p0", 1, 0.0), rollout(2, "p0", 2, 0.0, reason="no reward"),
        rollout(3, "p1", 0, 1.0), rollout(4, "p1", 1, 1.0), rollout(5, "p1", 2, 1.0),
        rollout(6, "p2", 0, 0.0, status="timeout", error={"error": "States.Timeout", "cause": "late"}),
        rollout(7, "p2", 1, 0.0), rollout(8, "p2", 2, 0.5)]


def test_grpo_trains_every_group_and_shows_each_members_reward_advantage_status_and_cause():
    view = step_view(reversed(STEP), cfg(batch_size=3, responses_per_prompt=3), decision="train")
    assert [g.input_id for g in view.groups] == ["p0", "p1", "p2"]
    assert [g.selection for g in view.groups] == ["trained"] * 3 and view.counts() == {"trained": 3}
    expected = compute_advantages("grpo", [g.rewards_G for g in view.groups])
    assert [[r.advantage for r in g.rollouts] for g in view.groups] == expected
    p0, p1, p2 = view.groups
    assert p0.rollouts[2].cause == "no reward" and p1.informative is False
    assert (p2.rollouts[0].status, p2.rollouts[0].cause) == ("timeout", "States.Timeout: late")
    assert p0.rollouts[0].record.records  # the whole typed record, TraceRecords included


def test_dapo_marks_filtered_and_surplus_groups_and_only_trained_ones_show_advantages():
    rows = [("a", [1.0, 1.0]), ("b", [1.0, 0.0]), ("c", [0.0, 1.0]), ("d", [0.0, 0.0]), ("e", [0.0, 1.0])]
    records = [rollout(2 * p + m, input_id, m, r, gen=p // 3) for p, (input_id, rs) in enumerate(rows)
               for m, r in enumerate(rs)]
    view = step_view(records, cfg(algorithm="dapo", batch_size=2, responses_per_prompt=2, max_num_gen_batches=3),
                     decision="train")
    assert [(g.input_id, g.generation_batch, g.selection) for g in view.groups] == [
        ("a", 0, "filtered"), ("b", 0, "trained"), ("c", 0, "trained"), ("d", 1, "filtered"), ("e", 1, "surplus")]
    assert all(r.advantage is None for g in view.groups if g.selection != "trained" for r in g.rollouts)
    assert [r.advantage for r in view.groups[1].rollouts] == pytest.approx([1.0, -1.0])
    assert view.counts() == {"trained": 2, "filtered": 2, "surplus": 1}


def test_a_step_that_trained_nothing_says_why():
    c = cfg(algorithm="dapo", batch_size=2, responses_per_prompt=2, max_num_gen_batches=1)
    capped = step_view([rollout(0, "a", 0, 1.0), rollout(1, "a", 1, 0.0), rollout(2, "b", 0, 1.0),
                        rollout(3, "b", 1, 1.0)], c, decision="cap_reached")
    assert [g.selection for g in capped.groups] == ["untrained", "filtered"] and "max_num_gen_batches" in capped.note
    skipped = step_view(STEP, cfg(batch_size=3, responses_per_prompt=3), decision="skip")
    assert {g.selection for g in skipped.groups} == {"untrained"} and "skipped" in skipped.note
    assert all(r.advantage is None for r in skipped.rollouts)


def test_overlong_shaping_reaches_the_shown_reward_and_the_agents_reward_is_kept():
    c = cfg(algorithm="dapo", batch_size=1, responses_per_prompt=2, max_tokens_per_rollout=20, overlong_buffer_len=10)
    view = step_view([rollout(0, "p", 0, 1.0, tokens=15), rollout(1, "p", 1, 1.0, tokens=5)], c, decision="train")
    (g,) = view.groups
    assert g.rewards_G == [0.5, 1.0] and g.selection == "trained"  # the penalty made the group informative
    assert [r.record.reward for r in g.rollouts] == [1.0, 1.0] and g.rollouts[0].to_json()["agent_reward"] == 1.0


def test_a_per_turn_estimator_shows_each_turns_advantage():
    turns = {0: [1.0, 0.0], 1: [0.0, 1.0], 2: [0.0, 0.0]}
    records = [rollout(m, "p", m, sum(t), turn_rewards=t) for m, t in turns.items()]
    c = cfg(batch_size=1, responses_per_prompt=3, advantage_estimator="per_turn_rloo", reward_granularity="per_turn")
    (g,) = step_view(records, c, decision="train").groups
    expected = compute_advantages("per_turn_rloo", [[turns[m] for m in range(3)]])[0]
    assert [r.turn_advantages for r in g.rollouts] == expected
    assert [r.advantage for r in g.rollouts] == [a[0] for a in expected]


def test_eval_rollouts_are_never_trained():
    view = step_view([rollout(i, f"e{i}", 0, float(i % 2), kind="eval") for i in range(4)], cfg(), kind="eval")
    assert {g.selection for g in view.groups} == {"eval"} and all(r.advantage is None for r in view.rollouts)
    assert not any(r.trained for r in view.rollouts)


def test_picks_order_groups_by_mean_or_spread():
    groups = step_view(STEP, cfg(batch_size=3, responses_per_prompt=3), decision="train").groups
    assert [g.input_id for g in pick_groups(groups, "best")] == ["p1", "p0", "p2"]
    assert [g.input_id for g in pick_groups(groups, "worst", 1)] == ["p2"]
    assert pick_groups(groups, "informative")[0].input_id == "p0"  # [1, 0, 0] spreads most
    assert [label for label, _ in sample_groups(groups)] == ["best", "worst", "mixed"]
    assert len({id(g) for _, g in sample_groups(groups)}) == 3


def test_groups_with_the_same_mean_are_not_labelled_best_and_worst():
    """Two identical groups were the page's BEST and WORST: neither is better, so one is shown as a sample."""
    same = [rollout(0, "p0", 0, 1.0), rollout(1, "p0", 1, 0.0), rollout(2, "p1", 0, 1.0), rollout(3, "p1", 1, 0.0)]
    groups = step_view(same, cfg(batch_size=2, responses_per_prompt=2), decision="train").groups
    labels = [label for label, _ in sample_groups(groups)]
    assert "best" not in labels and "worst" not in labels
    assert labels == ["sample", "mixed"]
    alike = [rollout(i, f"p{i // 2}", i % 2, 1.0) for i in range(4)]
    assert [label for label, _ in sample_groups(step_view(alike, cfg(batch_size=2, responses_per_prompt=2)).groups)] \
        == ["sample"]


def test_records_the_core_cannot_read_are_shown_and_nothing_is_claimed_about_them():
    """A TraceRecord with a field the replay does not know: ComputeAdvantages could not have read it either.
    The step is still shown (its rollouts, rewards, causes), marked ``unknown``, with no advantage."""
    bad = [r.model_copy(update={"records": [{"token_ids": [1, 2], "loss_mask": [1], "nonsense": 1}]}) for r in STEP[:3]]
    view = step_view(bad, cfg(batch_size=1, responses_per_prompt=3), decision="train")
    assert {g.selection for g in view.groups} == {"unknown"} and "could not be read" in view.note
    assert all(r.advantage is None for r in view.rollouts) and len(view.rollouts) == 3
