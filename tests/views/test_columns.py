"""One list of rollout columns (`stepwise.views.columns.ROLLOUT_COLUMNS`) for every place a person reads
rollouts: `stepwise rollouts`' lines, the report page's rollout rows and the W&B sample table. A column
added there (a judge's score, a turn's policy version) shows in all three."""

from __future__ import annotations

from stepwise.aws.wandb_tracking import TABLE_COLUMNS, table_rows
from stepwise.records import RolloutRecord
from stepwise.views.columns import ROLLOUT_COLUMNS, Column, cells, line, row
from stepwise.views.page import render_table
from stepwise.views.steps import step_view
from stepwise.views.tables import sample_table
from stepwise_cli.commands.rollouts import HEADER, group_lines
from tests.support.planning import cfg

RECORDS = [RolloutRecord(sid=f"sid-{m}", i=m, input_id="p0", row=0, member=m, step=2, reward=float(m), status="ok",
                         reward_reason=None if m else "no reward in the result",
                         policy_version=2, num_turns=1, duration_s=1.25, sampled_tokens=5,
                         records=[{"token_ids": [100 + m, 7, 8], "loss_mask": [1], "logprobs": [-0.5]}]) for m in range(2)]


def test_every_column_is_in_the_terminal_the_page_and_the_wandb_table():
    view = step_view(RECORDS, cfg(batch_size=1, responses_per_prompt=2), decision="train")
    table = sample_table(view, lambda sid: [])
    page = render_table(table)
    lines = group_lines(0, view.groups[0])
    for c in ROLLOUT_COLUMNS:
        assert c.header in HEADER and (f"{c.header} " in page or c.key == "status"), c
        assert c.key in TABLE_COLUMNS
    member = table["groups"][0]["rollouts"][0]
    assert list(member["row"]) == [c.key for c in ROLLOUT_COLUMNS]
    (wandb_row, _) = table_rows(table)
    assert dict(zip(TABLE_COLUMNS, wandb_row))["advantage"] == member["row"]["advantage"] == member["advantage"] < 0
    assert lines[2] == line(cells(row(view.groups[0].rollouts[0])))


def test_a_column_reads_anything_of_the_typed_record():
    """What adding a column takes: a `Column` whose value reads the view (here the record's ``late`` flag)."""
    late = Column("late", "late", lambda v: v.record.late)
    view = step_view(RECORDS, cfg(batch_size=1, responses_per_prompt=2), decision="train")
    assert row(view.rollouts[0], [*ROLLOUT_COLUMNS, late])["late"] is False
