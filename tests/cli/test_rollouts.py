"""`stepwise rollouts`: a step's groups with rewards and advantages, and one rollout's conversation
with its trained span, read the same way from the deployed stack's bucket (moto) and from a local run
folder (the copy `stepwise run-local` keeps)."""

from __future__ import annotations

import json

from local.report import mirror_run_objects
from stepwise.core.advantages import compute_grpo_advantages
from stepwise_cli.main import main
from tests.support.runs import sid_of, write_to_s3

RUN = "inspect-me"


def _json(capsys, *argv):
    assert main(["rollouts", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_step_shows_its_groups_with_rewards_advantages_and_causes(moto_dep, capsys):
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    assert main(["rollouts", RUN, "--step", "0", *moto_dep.flags]) == 0
    text = capsys.readouterr().out
    assert "run inspect-me, train step 0: 4 rollouts in 2 groups (2 trained)" in text
    assert "group 0 s0p0 (gen 0): trained, mean 0.500, std 0.500, informative" in text
    assert "+1.000" in text and "-1.000" in text
    assert "States.Timeout: no result in 120 s" in text and "no reward in the result" in text

    out = _json(capsys, RUN, "--step", "0", *moto_dep.flags)
    g0 = out["groups"][0]
    assert [r["reward"] for r in g0["rollouts"]] == [1.0, 0.0]
    assert [r["advantage"] for r in g0["rollouts"]] == compute_grpo_advantages([1.0, 0.0])
    assert g0["rollouts"][1]["status"] == "timeout" and g0["rollouts"][0]["policy_version"] == 0
    assert g0["selection"] == "trained" and out["decision"] == "train" and out["selection"] == {"trained": 2}
    assert [g["input_id"] for g in _json(capsys, RUN, "--step", "1", "--worst", "-n", "1", *moto_dep.flags)["groups"]] == ["s1p1"]
    assert _json(capsys, RUN, *moto_dep.flags)["step"] == 1  # the newest step by default
    evals = _json(capsys, RUN, "--eval", *moto_dep.flags)
    assert evals["kind"] == "eval" and all(r["advantage"] is None for g in evals["groups"] for r in g["rollouts"])


def test_show_prints_the_conversation_and_marks_the_trained_span(moto_dep, capsys):
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    sid = sid_of(1, "train", 0)
    assert main(["rollouts", RUN, "--step", "1", "--show", sid[:6], "--color", "never", *moto_dep.flags]) == 0
    text = capsys.readouterr().out
    for line in ("[system]", "  You are a calculator agent.", "[user]", "[assistant · turn 1 · trained",
                 '  -> tool call calculator({"expression": "6*7"}) id=call_1', "[tool · result of call_1]",
                 "[assistant · turn 2 · trained"):
        assert line in text, line
    # decoded with the run's tokenizer: the tool result is in the record but masked, the answer trained
    assert "⟪42<|im_end|>⟫" in text and "⟪<tool_call>" in text
    assert "\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n⟪" in text
    shown = _json(capsys, RUN, "--step", "1", "--show", sid, *moto_dep.flags)
    assert shown["tokenizer"] is True and shown["rollout"]["advantage"] == compute_grpo_advantages([1.0, 1.0])[0]
    spans = shown["records"][0]
    assert [s["trained"] for s in spans if s["region"] == "response"] == [True, False, True]
    assert main(["rollouts", RUN, "--step", "1", "--show", "nope", *moto_dep.flags]) == 1
    assert "no rollout whose sid starts with 'nope' at train step 1 (4 rollouts" in capsys.readouterr().err
    # an ambiguous prefix names what it matches; an empty one is refused (it listed the groups)
    assert main(["rollouts", RUN, "--step", "1", "--show", sid[:1], *moto_dep.flags]) == 1
    err = capsys.readouterr().err
    assert f"sid prefix {sid[:1]!r} matches 4 rollouts at train step 1 (" in err and sid in err, err
    assert main(["rollouts", RUN, "--step", "1", "--show", "", *moto_dep.flags]) == 1
    assert "--show needs a sid" in capsys.readouterr().err


def test_a_local_run_folder_reads_the_same_as_the_bucket(moto_dep, capsys, tmp_path):
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    folder = tmp_path / RUN
    mirror_run_objects(moto_dep.s3, moto_dep.bucket, RUN, folder / "s3", results=False)
    for argv in (["--step", "0"], ["--step", "1", "--show", sid_of(1, "train", 3)], ["--eval"]):
        deployed = _json(capsys, RUN, *argv, *moto_dep.flags)
        local = _json(capsys, str(folder), *argv)
        assert deployed.pop("source").startswith("s3://") and local.pop("source") == str(folder)
        assert local == deployed
    assert main(["rollouts", str(tmp_path)]) == 1  # a folder that is not a run folder


def test_report_to_a_path_it_cannot_write_is_one_error_line(moto_dep, capsys, tmp_path):
    """``stepwise report RUN --out`` a folder or a path under a file: exit 1 naming the path (an
    IsADirectoryError / NotADirectoryError traceback before); the page itself is built and written."""
    write_to_s3(moto_dep.s3, moto_dep.bucket, RUN)
    folder = tmp_path / RUN
    mirror_run_objects(moto_dep.s3, moto_dep.bucket, RUN, folder / "s3", results=False)
    (tmp_path / "a-file").write_text("x")
    for out in (tmp_path, tmp_path / "a-file" / "page.html"):
        assert main(["report", str(folder), "--out", str(out)]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and f"cannot write --out {out}" in err[0], err
    assert main(["report", str(folder), "--out", str(tmp_path / "page.html")]) == 0
    assert (tmp_path / "page.html").read_text().startswith("<!DOCTYPE html>")


def test_a_missing_folder_or_an_empty_name_is_one_clear_line(tmp_path, capsys):
    """A folder path that does not exist is named as a missing folder (it was 'run id ... is not usable
    as an execution name'), an empty name asks for a run (it was read as the current folder)."""
    for argv, fragment in (([str(tmp_path / "runs-local" / "nope")], f"no folder {tmp_path}/runs-local/nope"),
                           (["runs-local/typo"], "no folder runs-local/typo"), ([""], "name a run"), (["  "], "name a run")):
        assert main(["rollouts", *argv]) == 1
        err = capsys.readouterr().err.strip()
        assert fragment in err and "\n" not in err, err
    assert main(["report", str(tmp_path / "nope")]) != 0 and "no folder" in capsys.readouterr().err
    for n in ("0", "-3"):  # printed a step heading and no group
        assert main(["rollouts", str(tmp_path), "-n", n]) == 1
        assert f"-n/--groups must be at least 1, got {n}" in capsys.readouterr().err


from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from stepwise_cli.commands.rollouts import _GREEN, _RESET, group_lines, message_lines, span_text  # noqa: E402
from stepwise.records import RolloutRecord  # noqa: E402
from stepwise.views.steps import GroupView, RolloutView  # noqa: E402

_TEXT = st.one_of(st.text(max_size=30), st.sampled_from(["\x1b]0;owned\x07", "\x1b[2J\x1b[H", "a\rb", "\x9b31m", "\x00"]))


@settings(max_examples=100, deadline=None)
@given(text=_TEXT)
def test_a_rollouts_text_never_sends_terminal_control_characters(text):
    """What a model, a tool or an agent wrote (``\\x1b]0;...\\x07`` retitles a terminal, ``\\x1b[2J`` clears it)
    is printed with its control characters spelled out; only newlines, tabs and our own colour codes are sent."""
    import re

    messages = [{"role": text, "content": text, "tool_call_id": text, "name": text,
                 "tool_calls": [{"id": text, "name": text, "arguments": text}]},
                {"role": "assistant", "content": text, "turn": 1, "trained": True, "finish_reason": text},
                {"role": "branch", "content": text}]
    spans = [{"region": "prompt", "trained": False, "tokens": 1, "text": text},
             {"region": "response", "trained": True, "tokens": 1, "text": text}]
    record = RolloutRecord(sid=text, i=0, input_id=text, row=0, step=0, reward=0.0, reward_reason=text, status="error",
                           error={"error": text, "cause": text})
    view = RolloutView(record, 0.0, None, "untrained", text)
    out = "\n".join([*message_lines(messages), span_text(spans),
                      *group_lines(0, GroupView(text, 0, "untrained", [view], [0.0]))])
    assert re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", out) is None, repr(out)
    colored = span_text(spans, color=True).replace(_GREEN, "").replace(_RESET, "").replace("\x1b[2m", "")
    assert "\x1b" not in colored, repr(colored)


JUDGE = {"model_id": "us.amazon.nova-micro-v1:0", "rubric": "A better attempt names the right digit."}


def test_a_group_engine_step_shows_the_groups_it_consumed_with_their_judge_and_trained_advantages(
        moto_dep, capsys, tmp_path):
    """``admission: group`` keeps each group's rollouts in its own folder (``groups/{g}/a{n}/``, its judge's record
    beside them): `stepwise rollouts` shows a step's groups through the ones it consumed, in the order it chose
    them, with the judge's scores, the advantages it trained (the judge's rewards: step 1's group 2 has agent
    rewards 1, 1 and trained with +1, -1) and each rollout's staleness; the bucket and the local folder alike.
    Fails on the code before: "run grun has no train rollout records yet"."""
    from tests.support.runs import GROUPS, sid_of, write_to_s3 as write

    write(moto_dep.s3, moto_dep.bucket, "grun", admission="group", max_staleness=1, judge=JUDGE)
    assert main(["rollouts", "grun", "--step", "1", *moto_dep.flags]) == 0
    text = capsys.readouterr().out
    assert "run grun, train step 1: 4 rollouts in 2 groups (2 trained), policy version(s) 0, 1" in text
    assert "group 0 s1p1 (group 3, attempt 0): trained, mean 0.500" in text
    assert "group 1 s1p0 (group 2, attempt 0): trained, mean 0.500" in text
    assert "judge's reason: the better answer" in text and " stale " in text
    out = _json(capsys, "grun", "--step", "1", *moto_dep.flags)
    assert [(g["group"], g["attempt"]) for g in out["groups"]] == GROUPS[1]
    g2 = out["groups"][1]
    assert [r["agent_reward"] for r in g2["rollouts"]] == [1.0, 1.0] and [r["judge_score"] for r in g2["rollouts"]] \
        == [10.0, 0.0]
    assert [r["advantage"] for r in g2["rollouts"]] == compute_grpo_advantages([1.0, 0.0])
    assert [r["staleness"] for g in out["groups"] for r in g["rollouts"]] == [1, 1, 0, 0]
    step0 = _json(capsys, "grun", "--step", "0", *moto_dep.flags)
    assert [(g["group"], g["attempt"]) for g in step0["groups"]] == GROUPS[0]  # a second attempt's folder
    assert _json(capsys, "grun", *moto_dep.flags)["step"] == 1  # the newest step by default
    _wait_in_the_buffer(moto_dep, "grun", 3, 4)  # the run (at step 2) has group 4 complete, not consumed
    waiting = _json(capsys, "grun", *moto_dep.flags)
    assert waiting["step"] == 2 and [(g["group"], g["selection"]) for g in waiting["groups"]] == [(4, "untrained")]
    assert "no step has consumed these groups yet" in waiting["note"]
    assert all(r["advantage"] is None and r["judge_score"] is not None for r in waiting["groups"][0]["rollouts"])
    sid = sid_of(1, "train", 2)
    assert main(["rollouts", "grun", "--step", "1", "--show", sid[:6], "--color", "never", *moto_dep.flags]) == 0
    shown = capsys.readouterr().out
    assert "[assistant · turn 1 · trained" in shown and "⟪42<|im_end|>⟫" in shown
    assert "policy version of each turn: 0, 1  staleness 1" in shown
    folder = tmp_path / "grun"
    mirror_run_objects(moto_dep.s3, moto_dep.bucket, "grun", folder / "s3", results=False)
    for argv in (["--step", "1"], ["--step", "0", "--show", sid_of(0, "train", 3)]):
        deployed, local = _json(capsys, "grun", *argv, *moto_dep.flags), _json(capsys, str(folder), *argv)
        assert deployed.pop("source").startswith("s3://") and local.pop("source") == str(folder)
        assert local == deployed
    # the report page rebuilt from the folder (`stepwise report`) and one step's page show the same groups
    assert main(["report", str(folder), "--out", str(tmp_path / "page.html")]) == 0
    assert main(["report", str(folder), "--step", "0", "--out", str(tmp_path / "step0.html")]) == 0
    capsys.readouterr()
    assert "(group 3, attempt 0)" in (tmp_path / "page.html").read_text()
    assert "(group 1, attempt 1)" in (tmp_path / "step0.html").read_text()


def _wait_in_the_buffer(dep, run_id: str, source: int, group: int) -> None:
    """Group ``group`` (a copy of group ``source``'s folder, attempt 0) complete in the run's buffer, no step's."""
    from stepwise import layout
    from stepwise.records import GroupBuffer, GroupEntry

    old, new = layout.group_prefix(run_id, source), layout.group_prefix(run_id, group)
    for o in dep.s3.list_objects_v2(Bucket=dep.bucket, Prefix=old)["Contents"]:
        body = json.loads(dep.s3.get_object(Bucket=dep.bucket, Key=o["Key"])["Body"].read())
        body.update({"group": group} if "/rollouts/" in o["Key"] else {})
        dep.s3.put_object(Bucket=dep.bucket, Key=o["Key"].replace(old, new), Body=json.dumps(body).encode())
    entry = GroupEntry(id=group, status="complete", members=2)
    buffer = GroupBuffer(run_id=run_id, next_group=group + 1, groups=[entry])
    dep.s3.put_object(Bucket=dep.bucket, Key=layout.buffer_key(run_id), Body=buffer.model_dump_json().encode())

