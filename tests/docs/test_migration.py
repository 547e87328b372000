"""docs/migration.md maps every field of the reference loop's config (and the DAPO proposal's) to ours."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from agentcore_rl_toolkit.backends.experimental.sagemaker.config import Config as ReferenceConfig

from stepwise.config import DROPPED_FIELDS, RunConfig

PAGE = Path(__file__).resolve().parents[2] / "docs" / "migration.md"
#: DapoConfig(Config) of the toolkit's DAPO proposal (`train_dapo.py`): its three fields.
DAPO_FIELDS = ("max_num_gen_batches", "clip_low_threshold", "clip_high_threshold")


def rows() -> dict[str, list[str]]:
    out = {}
    for line in PAGE.read_text().splitlines():
        if line.startswith("| `"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            out[cells[0].split("`")[1]] = cells
    return out


def test_every_reference_field_has_one_row_naming_our_field_or_why_it_was_dropped():
    table = rows()
    reference = [f.name for f in dataclasses.fields(ReferenceConfig)] + list(DAPO_FIELDS)
    assert [n for n in reference if n not in table] == []
    assert set(table) == set(reference)  # one row each, nothing else
    for name in reference:
        ours = table[name][1]
        if name in DROPPED_FIELDS:
            assert ours == "dropped", name
        else:
            assert ours.strip("`") in RunConfig.model_fields, (name, ours)
