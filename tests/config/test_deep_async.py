"""The group engine's knobs (``admission: group``): defaults, the loss from max_staleness 2 on, and the
refusals before billing (a config is validated before Init creates a session)."""

from __future__ import annotations

import pytest

from stepwise.config import ConfigError, load_run_config
from tests.config.test_validation import VALID

GROUP = {**VALID, "admission": "group", "batch_size": 4, "responses_per_prompt": 4}


def _errors(**overrides) -> list[str]:
    with pytest.raises(ConfigError) as exc:
        load_run_config({**GROUP, **overrides})
    return exc.value.errors


def test_batch_admission_is_the_default_and_today_s_loop():
    cfg = load_run_config(VALID)
    assert (cfg.admission, cfg.max_staleness, cfg.loss) == ("batch", 0, "ppo")
    assert cfg.steps_ahead == 0  # min(1, max_staleness)


def test_deep_staleness_defaults_to_truncated_importance_sampling():
    cfg = load_run_config({**GROUP, "max_staleness": 3, "sampling_steps_ahead": 2})
    assert (cfg.loss, cfg.clip_low_threshold, cfg.clip_high_threshold) == ("cispo", 0.0, 2.0)
    assert cfg.loss_fn_config == {"clip_low_threshold": 0.0, "clip_high_threshold": 2.0}
    assert cfg.steps_ahead == 2
    # a loss named by the config is kept (ppo is allowed: it clips)
    ppo = load_run_config({**GROUP, "max_staleness": 3, "loss": "ppo"})
    assert (ppo.loss, ppo.clip_low_threshold, ppo.clip_high_threshold) == ("ppo", None, None)
    # up to max_staleness 1 nothing changes
    assert load_run_config({**GROUP, "max_staleness": 1}).loss == "ppo"


def test_untruncated_importance_sampling_is_refused_from_max_staleness_2_with_the_reason():
    (err,) = _errors(max_staleness=2, loss="importance_sampling")
    assert err.startswith("max_staleness:") and "not bounded" in err and "'cispo'" in err
    assert load_run_config({**GROUP, "max_staleness": 1, "loss": "importance_sampling"}).loss == "importance_sampling"


def test_steps_ahead_is_at_most_max_staleness():
    (err,) = _errors(max_staleness=1, sampling_steps_ahead=2)
    assert err.startswith("sampling_steps_ahead:") and "<= max_staleness (1)" in err
    assert load_run_config({**GROUP, "max_staleness": 0, "sampling_steps_ahead": 0}).steps_ahead == 0


@pytest.mark.parametrize(("overrides", "fragment"), [
    ({"max_rollouts_in_flight": 3}, "must be >= responses_per_prompt (4)"),
    ({"max_rollouts_in_flight": 600}, "must be <= acr_max_active_sessions (500)"),
    ({"max_rollouts_in_flight": 100, "acr_tps_limit": 1, "max_rollout_time": 60}, "acr_tps_limit x max_rollout_time"),
    ({"acr_max_active_sessions": 2}, "none could start"),
])
def test_the_in_flight_cap_is_refused_when_the_quotas_cannot_hold_it(overrides, fragment):
    errs = _errors(**overrides)
    assert len(errs) == 1 and fragment in errs[0], errs


def test_the_in_flight_cap_defaults_to_what_the_quotas_allow():
    assert load_run_config(GROUP).rollouts_in_flight_cap == 40  # acr_tps_limit 5 x 8 per unit
    assert load_run_config({**GROUP, "acr_tps_limit": 100}).rollouts_in_flight_cap == 500  # the session quota
    assert load_run_config({**GROUP, "max_rollouts_in_flight": 12}).rollouts_in_flight_cap == 12


def test_a_cap_above_the_gateway_s_reserved_concurrency_is_refused_before_billing():
    """On a stack deployed with -c gatewayReservedConcurrency=N (STEPWISE_GATEWAY_CONCURRENCY), more rollouts
    in flight than N would have their LLM calls throttled: Init (and validate --check-aws) refuse the run."""
    from stepwise.core.preflight import StackScope, concurrency_errors

    scope = StackScope.from_env({"AWS_REGION": "us-west-2", "STEPWISE_BUCKET": "b", "STEPWISE_GATEWAY_CONCURRENCY": "30"})
    assert scope.gateway_concurrency == 30
    (err,) = concurrency_errors(load_run_config(GROUP), scope)  # the default cap: 40
    assert err.startswith("max_rollouts_in_flight (its default): 40") and "reserved concurrency is 30" in err
    assert concurrency_errors(load_run_config({**GROUP, "max_rollouts_in_flight": 28}), scope) == []
    assert concurrency_errors(load_run_config(VALID), scope) == []  # the batch engine: its Map bound applies
    assert StackScope.from_env({"AWS_REGION": "us-west-2"}).gateway_concurrency is None


def test_a_judge_with_the_group_engine_validates_and_its_groups_are_judged():
    """The group engine judges each group in its rollout group's state machine ("Judge the group"), so a judge with
    ``admission: group`` is a valid config, deep or not, with the judge's own checks still applied."""
    judge = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "Prefer the right digit.", "combine": "add",
             "weight": 0.5}
    cfg = load_run_config({**GROUP, "judge": judge, "max_staleness": 3, "sampling_steps_ahead": 2})
    assert cfg.admission == "group" and cfg.judge is not None and (cfg.judge.combine, cfg.judge.weight) == ("add", 0.5)
    assert load_run_config({**GROUP, "judge": judge, "algorithm": "dapo"}).judge is not None
    # the judge's own refusals hold in the group engine too
    (err,) = _errors(judge={**judge, "rubric": "  "})
    assert err.startswith("judge") and "rubric" in err
