"""`stepwise.core.prices`: the session price table is dated, names where each figure comes from, and gives every
model a figure (a deliberately high, unconfirmed default where AWS publishes none)."""

from __future__ import annotations

from datetime import date

from stepwise.core import prices


def test_every_model_has_a_session_price_and_an_unpublished_one_is_an_unconfirmed_high_default():
    date.fromisoformat(prices.SESSION_PRICES_AS_OF)
    gpt = prices.session_price("openai-reasoning-gpt-oss-20b")
    assert (gpt.usd_per_hour, gpt.confirmed) == (prices.SESSION_DEFAULT_USD_PER_HOUR, False)
    assert prices.SESSION_PRICES_AS_OF in gpt.source
    arn = "arn:aws:sagemaker:us-west-2:aws:hub-content/SageMakerPublicHub/Model/openai-reasoning-gpt-oss-20b/1.0.0"
    assert prices.session_price(arn) == gpt == prices.session_price("openai/gpt-oss-20b")
    assert prices.session_price("some-model-no-table-names") == gpt
    tiny = prices.session_price("stepwise-tiny")
    assert (tiny.usd_per_hour, tiny.confirmed) == (0.0, True)
    # high: above the one stored AWS figure for 8 H100s the default's comment cites
    assert prices.SESSION_DEFAULT_USD_PER_HOUR > 39.33
    assert prices.is_unconfirmed_default(prices.SESSION_DEFAULT_USD_PER_HOUR) and not prices.is_unconfirmed_default(None)
    assert "Cost Explorer" in prices.SESSION_PRICE_HOWTO
