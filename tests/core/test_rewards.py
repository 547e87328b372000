"""extract_reward: the toolkit's ``rewards`` convention, the reference's ``reward`` fallback, and 0.0 + reason."""

from __future__ import annotations

import math

import pytest
from agentcore_rl_toolkit.backends.experimental.sagemaker.rollout import _extract_reward as reference_extract
from agentcore_rl_toolkit.rollout_session.agentcore_s3_session import extract_agent_reward, status_error

from stepwise.core.rewards import extract_reward, reward_metrics

GOOD = [
    ({"rewards": 1.0, "status_code": 200}, 1.0),
    ({"rewards": [0.0, 0.5, 0.25]}, 0.25),
    ({"rewards": 3}, 3.0),
    ({"rewards": "0.5"}, 0.5),
    ({"rewards": True}, 1.0),
]


@pytest.mark.parametrize(("result", "reward"), GOOD)
def test_rewards_key_matches_the_toolkit(result, reward):
    assert extract_reward(result) == (reward, None)
    assert status_error(result) is None and extract_agent_reward(result) == reward


@pytest.mark.parametrize(("result", "reward"), [({"reward": 0.75}, 0.75), ({"reward": "1"}, 1.0), ({"reward": 0}, 0.0)])
def test_reward_key_falls_back_like_the_reference_loop(result, reward):
    assert extract_reward(result) == (reward, None) == (reference_extract(result), None)


def test_rewards_wins_over_reward_and_empty_list_falls_back():
    assert extract_reward({"rewards": [1.0], "reward": 0.0}) == (1.0, None)
    assert extract_reward({"rewards": [], "reward": 0.5}) == (0.5, None)


ZEROED = [
    (None, "no result"),
    ([1.0], "not an object (got list)"),
    ({}, "no 'rewards' or 'reward'"),
    ({"status_code": 200, "stop_reason": "end_turn"}, "no 'rewards' or 'reward'"),
    ({"rewards": []}, "empty 'rewards' list"),
    ({"rewards": "high"}, "non-numeric rewards: 'high'"),
    ({"rewards": [1.0, None]}, "non-numeric rewards"),
    ({"rewards": {"a": 1}}, "non-numeric rewards"),
    ({"reward": None}, "non-numeric reward"),
    ({"reward": "nan"}, "non-finite reward: nan"),
    ({"rewards": float("inf")}, "non-finite rewards: inf"),
    ({"rewards": 1.0, "status_code": 500, "stop_reason": "boom"}, "agent returned status_code=500: boom"),
    ({"reward": 1.0, "status_code": 429}, "agent returned status_code=429: unknown"),
]


@pytest.mark.parametrize(("result", "fragment"), ZEROED)
def test_failures_score_zero_with_a_reason_and_never_raise(result, fragment):
    reward, reason = extract_reward(result)
    assert reward == 0.0 and math.copysign(1, reward) == 1
    assert reason is not None and fragment in reason
    if isinstance(result, dict) and "status_code" in result and result["status_code"] != 200:
        assert status_error(result) == reason  # same wording as the toolkit


def test_reward_metrics():
    results = [{"rewards": 1.0}, {"rewards": [0.0, 1.0]}, None, {"status_code": 500}]
    pairs = [extract_reward(r) for r in results]
    m = reward_metrics([r for r, _ in pairs], [why for _, why in pairs])
    assert m == {"sampler/mean_reward": 0.5, "sampler/reward_std": 0.5, "sampler/reward_min": 0.0,
                 "sampler/reward_max": 1.0, "sampler/num_rollouts": 4.0, "sampler/zeroed_rollouts": 2.0}
    assert reward_metrics([]) == {"sampler/mean_reward": 0.0, "sampler/reward_std": 0.0, "sampler/reward_min": 0.0,
                                  "sampler/reward_max": 0.0, "sampler/num_rollouts": 0.0}
    assert (reward_metrics([-0.5, 2.0])["sampler/reward_min"], reward_metrics([-0.5, 2.0])["sampler/reward_max"]) == (-0.5, 2.0)


@pytest.mark.parametrize("value", [1.7e308, -1.7e308, 1e200, 10 ** 200])
def test_a_reward_too_large_for_group_statistics_scores_zero_with_a_reason(value):
    # Finite, but the mean or the squares of a group overflow: GRPO advantages of [1.7e308, 1.7e308, 0, 0]
    # were NaN (sent to forward_backward), of [1e200, 0] silently 0, and the step summary's mean inf.
    reward, reason = extract_reward({"rewards": value})
    assert reward == 0.0 and reason is not None and "beyond" in reason, reason


def test_any_accepted_rewards_give_finite_advantages_and_metrics():
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from stepwise.core.advantages import compute_grpo_advantages

    @settings(max_examples=300, deadline=None)
    @given(st.lists(st.one_of(st.floats(), st.integers(), st.sampled_from([1.7e308, -1.7e308, 1e154, 1e200])),
                    min_size=1, max_size=64))
    def check(values):
        rewards = [extract_reward({"rewards": v})[0] for v in values]
        assert all(math.isfinite(a) for a in compute_grpo_advantages(rewards))
        assert all(math.isfinite(m) for m in reward_metrics(rewards).values())

    check()


# ---------------------------------------------------------------------------- per-turn rewards

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stepwise.core.rewards import MAX_ABS_REWARD, extract_turn_rewards  # noqa: E402


@pytest.mark.parametrize(("result", "turns", "expected"), [
    ({"rewards": [1, 0, 0.5]}, 3, [1.0, 0.0, 0.5]),             # one per turn
    ({"rewards": {"0": 1, "-1": 2}}, 3, [1.0, 0.0, 2.0]),       # a mapping; -1 = the last turn
    ({"rewards": {"1": 0.5}}, 2, [0.0, 0.5]),
    ({"rewards": 0.7}, 2, [0.0, 0.7]),                          # one number: the last turn's
    ({"reward": 0.7}, 1, [0.7]),
    ({"rewards": []}, 0, []),
])
def test_per_turn_rewards_align_with_the_turns(result, turns, expected):
    assert extract_turn_rewards(result, turns) == (expected, None)


@pytest.mark.parametrize(("result", "turns", "fragment"), [
    ({"rewards": [1, 0]}, 3, "returned 2 rewards for 3 LLM turn(s)"),
    ({"rewards": [1, 0, 0, 0]}, 3, "returned 4 rewards for 3 LLM turn(s)"),
    ({"rewards": {"3": 1}}, 3, "key '3' is not a turn index in [-3, 3)"),
    ({"rewards": {"first": 1}}, 3, "key 'first' is not a turn index"),
    ({"rewards": {"0": 1, "-2": 1}}, 2, "keys '0' and '-2' both name turn 0"),
    ({"rewards": [1, "x"]}, 2, "non-numeric rewards[1]"),
    ({"rewards": {"0": float("nan")}}, 1, "non-finite"),
    ({"rewards": 1.0}, 0, "no captured LLM turn to carry it"),
    ({"rewards": [MAX_ABS_REWARD, MAX_ABS_REWARD]}, 2, "absolute sum beyond"),
    ({"status_code": 500, "rewards": [1.0]}, 1, "status_code=500"),
    (None, 2, "no result"),
])
def test_a_mismatch_zeroes_the_rollout_with_a_reason(result, turns, fragment):
    rewards, why = extract_turn_rewards(result, turns)
    assert rewards == [0.0] * turns and why is not None and fragment in why, why


json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
                           lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=3), inner,
                                                                                       max_size=4), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(rewards=json_values, turns=st.integers(0, 6))
def test_per_turn_extraction_never_raises_and_always_aligns(rewards, turns):
    out, why = extract_turn_rewards({"rewards": rewards}, turns)
    assert len(out) == turns and all(math.isfinite(r) for r in out)
    assert why is None or out == [0.0] * turns


@settings(max_examples=300, deadline=None)
@example(key="1_0", turns=11)
@example(key=" 1 ", turns=2)
@example(key="\u0663", turns=4)
@example(key="+1", turns=2)
@example(key="-0", turns=1)
@given(key=st.one_of(st.text(max_size=6), st.from_regex(r"-?[0-9]{1,2}", fullmatch=True)), turns=st.integers(1, 12))
def test_a_turn_key_is_a_plain_decimal_index_or_refused(key, turns):
    """A ``{turn: reward}`` key names a turn only as ASCII decimal digits with an optional minus (the contract's
    ``{"0": 1.0, "-1": 0.5}``): ``int()`` alone also read ``"1_0"`` as turn 10, ``" 1 "`` as turn 1 and
    ``"٣"`` (an Arabic-Indic digit) as turn 3."""
    import re

    out, why = extract_turn_rewards({"rewards": {key: 1.0}}, turns)
    plain = re.fullmatch(r"-?[0-9]+", key) is not None and -turns <= int(key) < turns
    assert (why is None) is plain, (key, why)
    if plain:
        assert out[int(key) % turns] == 1.0 and sum(out) == 1.0
