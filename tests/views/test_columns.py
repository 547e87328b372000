"""One list of rollout columns (`stepwise.views.columns.ROLLOUT_COLUMNS`) for every place a person reads
rollouts: `stepwise rollouts`' lines, the report page's rollout rows and the W&B sample table. A column
added there (a judge's score, a turn's policy version) shows in all three; an optional one (the judge's)
only where it has a value."""

from __future__ import annotations

import html

from stepwise.aws.wandb_tracking import TABLE_COLUMNS, table_rows
from stepwise.records import JudgeRecord, RolloutRecord
from stepwise.views.columns import ROLLOUT_COLUMNS, Column, below, cells, line, row, shown
from stepwise.views.page import render_table
from stepwise.views.steps import step_view
from stepwise.views.tables import sample_table
from stepwise_cli.commands.rollouts import HEADER, group_lines
from tests.support.planning import cfg

RECORDS = [RolloutRecord(sid=f"sid-{m}", i=m, input_id="p0", row=0, member=m, step=2, reward=float(m), status="ok",
                         reward_reason=None if m else "no reward in the result",
                         policy_version=2, num_turns=1, duration_s=1.25, sampled_tokens=5,
                         records=[{"token_ids": [100 + m, 7, 8], "loss_mask": [1], "logprobs": [-0.5]}]) for m in range(2)]
JUDGE = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "A better attempt names the right digit."}
#: The judge's record of the group: member 0 named the right digit, member 1 did not.
JUDGED = {0: {"p0": JudgeRecord(input_id="p0", step=2, sids_G=["sid-0", "sid-1"], members_G=[0, 1],
                                judged_G=[True, True], scores_G=[10.0, 0.0], judged_chars_G=[20, 20],
                                reasons_G=["names the right digit, 7", "names 4, not 7"])}}


def test_every_column_is_in_the_terminal_the_page_and_the_wandb_table():
    """A judged step, so every column (the judge's too) has a value (the group engine's staleness set as
    `stepwise.views.steps.group_step_view` sets it)."""
    view = step_view(RECORDS, cfg(batch_size=1, responses_per_prompt=2, judge=JUDGE), decision="train",
                     judgements=JUDGED)
    for r in view.rollouts:
        r.staleness = 1
    table = sample_table(view, lambda sid: [])
    page = render_table(table)
    lines = group_lines(0, view.groups[0])
    assert shown(view.rollouts) == list(ROLLOUT_COLUMNS)
    for c in ROLLOUT_COLUMNS:
        assert (f"{c.header}: " in "\n".join(lines)) if c.below else c.header in HEADER, c
        assert f"{html.escape(c.header)} " in page or c.key == "status", c
        assert c.key in TABLE_COLUMNS
    member = table["groups"][0]["rollouts"][0]
    assert list(member["row"]) == [c.key for c in ROLLOUT_COLUMNS]
    (wandb_row, _) = table_rows(table)
    assert dict(zip(TABLE_COLUMNS, wandb_row))["advantage"] == member["row"]["advantage"] == member["advantage"] > 0
    assert dict(zip(TABLE_COLUMNS, wandb_row))["judge_reason"] == "names the right digit, 7"
    texts = cells(row(view.groups[0].rollouts[0]))
    assert lines[2:4] == [line(texts), *below(texts)]


def test_a_run_without_a_judge_shows_none_of_the_judge_s_columns():
    view = step_view(RECORDS, cfg(batch_size=1, responses_per_prompt=2), decision="train")
    table = sample_table(view, lambda sid: [])
    page, lines = render_table(table), group_lines(0, view.groups[0])
    for key in ("judge_score", "agent_reward", "judge_reason"):
        c = next(c for c in ROLLOUT_COLUMNS if c.key == key)
        assert c.optional and c not in shown(view.rollouts)
        assert f"{html.escape(c.header)} " not in page and c.header not in lines[1]
        assert table["groups"][0]["rollouts"][0]["row"][key] is None  # the W&B table keeps its one schema
    assert len(lines) == 2 + len(RECORDS)  # no line under a rollout
    assert "reason / cause no reward in the result" in page and "reason / cause" in lines[1]


def test_a_column_reads_anything_of_the_typed_record():
    """What adding a column takes: a `Column` whose value reads the view (here the record's ``late`` flag)."""
    late = Column("late", "late", lambda v: v.record.late)
    view = step_view(RECORDS, cfg(batch_size=1, responses_per_prompt=2), decision="train")
    assert row(view.rollouts[0], [*ROLLOUT_COLUMNS, late])["late"] is False
