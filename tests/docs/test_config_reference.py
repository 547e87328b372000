"""docs/config.md is generated from RunConfig; this fails when the two drift."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from stepwise.config import DROPPED_FIELDS, RunConfig, VpcConfig

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_config_reference", DOCS / "gen_config_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_config_md_is_up_to_date():
    gen = _generator()
    assert (DOCS / "config.md").read_text() == gen.render(), "run: python docs/gen_config_reference.py"


def test_every_field_is_documented_with_its_default_and_description():
    text = (DOCS / "config.md").read_text()
    rows = {line.split("|")[1].strip().strip("`"): line for line in text.splitlines() if line.startswith("| `")}
    for name, field in {**RunConfig.model_fields, **VpcConfig.model_fields}.items():
        assert name in rows, name
        if field.description:
            assert field.description.replace("|", "\\|") in rows[name], name
    for name in DROPPED_FIELDS:
        assert name in rows
    assert "| `batch_size` | int | `32` | >= 1 |" in text
    assert "| `role_arn` | str | **required** |" in text
    assert '"grpo" \\| "dapo"' in text


def test_check_mode_reports_a_stale_page(tmp_path, monkeypatch, capsys):
    gen = _generator()
    stale = tmp_path / "config.md"
    stale.write_text(gen.render().replace("| `batch_size` | int | `32`", "| `batch_size` | int | `16`"))
    monkeypatch.setattr(gen, "OUT", stale)
    assert gen.main(["--check"]) == 1
    assert "out of date" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
