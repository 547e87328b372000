"""`stepwise models`: the SDK's listing of the region's base models (the simulator's hub here: the tiny model and
its gated copy), each with the hub's gated flag and the chat template the gateway would recognise."""

from __future__ import annotations

import json

import pytest

from stepwise_cli.main import main


@pytest.fixture(scope="module")
def hub():
    from local.simulator import start_simulator

    handle = start_simulator(port=0, region="eu-central-1")
    mp = pytest.MonkeyPatch()
    for key, value in handle.env.items():
        mp.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_DEFAULT_REGION"):
        mp.delenv(key, raising=False)
    mp.setenv("AWS_REGION", "eu-central-1")  # the region comes from AWS_REGION alone, as a user sets it
    yield handle
    mp.undo()
    handle.stop()


def test_models_lists_the_hubs_models_gated_or_not_with_their_chat_template(hub, capsys):
    from local.simulator.service import BASE_MODEL_NAME, GATED_MODEL_NAME

    assert main(["models", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["region"] == "eu-central-1"
    rows = {r["hub_content_name"]: r for r in out["models"]}
    assert set(rows) == {BASE_MODEL_NAME, GATED_MODEL_NAME}
    assert (rows[BASE_MODEL_NAME]["gated"], rows[GATED_MODEL_NAME]["gated"]) == (False, True)
    for row in rows.values():  # the tiny tokenizer carries TRL's qwen3 template: the toolkit parses its tool calls
        assert (row["chat_template"], row["tool_calls"], row["template_problem"]) == ("qwen3", True, "")
        assert row["base_model_arn"].startswith("arn:aws:sagemaker:eu-central-1:aws:hub-content/SageMakerPublicHub/Model/")
        # the price table's figure: the simulator's models cost nothing
        assert (row["session_usd_per_hour"], row["session_price_confirmed"]) == (0.0, True)
    assert main(["models", "--no-templates"]) == 0
    text = capsys.readouterr().out
    assert "base models training sessions offer in eu-central-1" in text and "yes: accept_eula" in text
    assert "session $/h" in text
    assert f"\n{GATED_MODEL_NAME}  " in text  # the hub content name leads each row: what base_model_arn takes
    assert "chat template" not in text


def test_an_unrecognised_template_is_reported_not_parsed(hub, monkeypatch):
    """A tokenizer whose template the toolkit's registry does not hold: listed, tool calls not parsed, said why."""
    from stepwise_cli.commands import models

    monkeypatch.setattr("agentcore_rl_toolkit.rollout_gateway.response_schemas._TEMPLATE_HASHES", {})
    (row, *_) = models.describe_models("eu-central-1")
    assert (row["chat_template"], row["tool_calls"]) == (None, False)
    assert "not in the toolkit's registry" in row["template_problem"]
