"""`stepwise rollouts RUN`: a step's rollouts as a person reads them; ``--show SID`` one rollout's conversation.

``RUN`` is a run id on the deployed stack or a local run folder (``runs-local/RUN_ID``;
`stepwise_cli.sources`). Without ``--show`` it prints the step's groups (the responses to one
prompt), each rollout on a line::

    group s19g0p3 (gen 0): mean 0.625, std 0.484, informative
      member  sid       reward   adv     status   policy  dur_s  turns  tools  tokens  reason / cause
           0  1a2b3c4d   1.000  +0.775   ok           19    0.8      1      0       3

In the group engine (``admission: group``) a step's groups are those it consumed, read from their own
folders (``runs/RUN/groups/{g}/a{n}/``); each group's heading names its group id and attempt instead of
its generation batch (``group 0 s1p1 (group 3, attempt 0): trained, ...``), and each trained rollout its
staleness (``stale``: the policy versions between its first turn and the update that trained it).

Each group says whether the step trained it (``trained``), DAPO filtered it (``filtered``: its rewards
carry no signal) or cut it (``surplus``: beyond ``batch_size``), or the step trained nothing
(``untrained``). ``reward`` is the shaped reward the estimator saw, ``adv`` the advantage the rollout's
datums carried (``-`` for a group that was not trained, and for eval rollouts): both from the core
function ComputeAdvantages trains with (`stepwise.views.steps`), never recomputed here. ``policy`` is
the policy version the rollout sampled with, ``reason / cause`` why a reward was zeroed or a rollout
failed. With a group judge (a run config's ``judge``), ``reward`` is what the estimator read of the judge's
combination, ``judge`` the judge's score, ``agent`` the agent's own reward, and the judge's one-line reason
(or its group's fallback) is printed under the rollout's line::

      member  sid       reward   judge   agent      adv  status   policy  dur_s  turns  tools  tokens
           0  1a2b3c4d   1.000   10.00   0.000   +1.000  ok            3    0.6      1      0       2
                        judge's reason: names the right digit, 7

The columns are `stepwise.views.columns.ROLLOUT_COLUMNS`; one no rollout of the step has a value for (the
judge's in a run without one) is left out. ``--show SID`` (a unique prefix is enough) prints that
rollout's conversation as the model saw it (system, user, assistant with its tool calls, tool
results; each assistant turn marked trained or not) and then each of its TraceRecords token by
token: the prompt, the trained span (loss mask 1, between ``⟪`` and ``⟫``, green on a terminal)
and the masked spans, decoded with the run's tokenizer. ``--json`` prints the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from typing import Any

from stepwise.views import columns as cols
from stepwise.views import store as views
from stepwise.views.run import read_step
from stepwise.views.steps import PICKS, GroupView, StepView, pick_groups
from stepwise_cli.commands._runs import EXIT_OK, CommandError, add_stack_arguments, fmt
from stepwise_cli.sources import open_run

TRAINED_OPEN, TRAINED_CLOSE = "⟪", "⟫"
_GREEN, _DIM, _BOLD, _RESET = "\x1b[32;1m", "\x1b[2m", "\x1b[1m", "\x1b[0m"


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (deployed stack) or a local run folder (runs-local/RUN_ID)")
    parser.add_argument("--step", type=int, help="the step (or eval step with --eval); default: the newest")
    parser.add_argument("--eval", action="store_true", help="an eval batch instead of a training step")
    parser.add_argument("--group", help="only this group: its input_id, or its index in the step (0, 1, ...)")
    order = parser.add_mutually_exclusive_group()
    for pick in PICKS[:3]:
        order.add_argument(f"--{pick}", dest="pick", action="store_const", const=pick,
                           help=f"the {pick} groups first ({'highest' if pick == 'best' else 'lowest' if pick == 'worst' else 'largest reward spread'})")
    parser.add_argument("-n", "--groups", type=int, help="show at most this many groups")
    parser.add_argument("--show", metavar="SID", help="one rollout's conversation and trained span (a unique sid prefix)")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                        help="colour the trained span (default: when printing to a terminal)")
    add_stack_arguments(parser)


# ------------------------------------------------------------------------------ pure formatting

#: C0 controls but newline and tab, DEL and C1 controls: a model's or a tool's text holding them (ESC
#: sequences retitle, clear or recolour a terminal) is printed with them spelled out (\\x1b), never sent.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def safe(text: Any) -> str:
    """``str(text)`` with terminal control characters shown as ``\\xNN`` (newlines and tabs kept)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(text).replace("\r\n", "\n"))


HEADER = cols.line(cols.header())


def group_lines(index: int, group: GroupView, columns: list[cols.Column] | None = None) -> list[str]:
    """A group's heading (its mark: trained, filtered, surplus, untrained, eval) and one line per rollout
    (`stepwise.views.columns.ROLLOUT_COLUMNS`, those ``columns`` shows: default, those with something to say
    for this group), a ``below`` column's text (the judge's reason) on a line under it."""
    columns = cols.shown(group.rollouts) if columns is None else columns
    tag = "informative" if group.informative else "all equal"
    place = f"gen {group.generation_batch}" if group.group is None else f"group {group.group}, attempt {group.attempt}"
    lines = [f"group {index} {safe(group.input_id)} ({place}): {group.selection}, mean "
             f"{group.mean_reward:.3f}, std {group.reward_std:.3f}, {tag}", cols.line(cols.header(columns), columns)]
    for r in group.rollouts:
        texts = [safe(t) for t in cols.cells(cols.row(r, columns), columns)]
        lines.append(cols.line(texts, columns))
        lines.extend(cols.below(texts, columns))
    return lines


def message_lines(messages: list[dict[str, Any]], *, color: bool = False) -> list[str]:
    """The conversation, one block per message: ``[role ...] content`` (tool calls and tool results named)."""
    lines: list[str] = []
    for m in messages:
        role = m["role"]
        if role == "branch":
            lines.append(f"--- {safe(m['content'])} ---")
            continue
        tags = [role]
        if role == "assistant" and "turn" in m:
            tags.append(f"turn {m['turn']}")
            tags.append({True: "trained", False: "not trained", None: "training unknown"}[m.get("trained")])
            tags.append(f"{m.get('output_tokens', 0)} tokens, {m.get('finish_reason') or '-'}")
            if m.get("ill_formed"):
                tags.append("ill-formed")
        if m.get("tool_call_id"):
            tags.append(f"result of {m['tool_call_id']}")
        if m.get("name"):
            tags.append(m["name"])
        head = safe(f"[{' · '.join(map(str, tags))}]")
        lines.append(f"{_BOLD}{head}{_RESET}" if color else head)
        if m.get("content"):
            lines.extend(f"  {line}" for line in safe(m["content"]).splitlines() or [""])
        for call in m.get("tool_calls", []):
            lines.append(safe(f"  -> tool call {call['name']}({call['arguments']}) id={call['id']}"))
    return lines


def span_text(spans: list[dict[str, Any]], *, color: bool = False) -> str:
    """A TraceRecord's spans as one text: the prompt dimmed (or as it is), trained spans between
    ``⟪ ⟫`` (green), masked response spans as they are; counts where no text was decoded."""
    out = []
    for s in spans:
        text = safe(s["text"]) if s["text"] is not None else f"<{s['tokens']} tokens>"
        if s["trained"]:
            out.append(f"{_GREEN}{TRAINED_OPEN}{text}{TRAINED_CLOSE}{_RESET}" if color else f"{TRAINED_OPEN}{text}{TRAINED_CLOSE}")
        elif s["region"] == "prompt" and color:
            out.append(f"{_DIM}{text}{_RESET}")
        else:
            out.append(text)
    return "".join(out)


def span_summary(spans: list[dict[str, Any]]) -> str:
    prompt = sum(s["tokens"] for s in spans if s["region"] == "prompt")
    trained = sum(s["tokens"] for s in spans if s["trained"])
    masked = sum(s["tokens"] for s in spans if s["region"] == "response" and not s["trained"])
    return f"{prompt} prompt tokens, {trained} trained, {masked} masked in the response"


# ------------------------------------------------------------------------------ the command


def _select(groups: list[GroupView], args: argparse.Namespace) -> list[tuple[int, GroupView]]:
    indexed = list(enumerate(groups))
    if args.group is not None:
        chosen = [(k, g) for k, g in indexed if g.input_id == args.group or str(k) == args.group]
        if not chosen:
            raise CommandError(f"no group {args.group!r} in this step: groups are "
                               f"{', '.join(f'{k}={g.input_id}' for k, g in indexed)}")
        return chosen
    order = pick_groups(groups, args.pick or "all", args.groups)
    return [(groups.index(g), g) for g in order]


def run(args: argparse.Namespace) -> int:
    if args.groups is not None and args.groups < 1:  # -n 0 or -3 printed a step heading and no group
        raise CommandError(f"-n/--groups must be at least 1, got {args.groups}")
    source = open_run(args.run, args)
    store, run_id = source.store, source.run_id
    kind = "eval" if args.eval else "train"
    try:
        cfg = views.read_config(store, run_id)  # a damaged config.json is one line naming it, not a traceback
    except views.Unreadable as e:
        raise CommandError(str(e)) from None
    steps = views.steps_with_rollouts(store, run_id, kind, cfg)
    if not steps:
        raise CommandError(f"run {run_id} has no {kind} rollout records yet ({source.where})")
    step = steps[-1] if args.step is None else args.step
    if step not in steps:
        raise CommandError(f"run {run_id} has no {kind} rollouts at step {step}; steps with rollouts: "
                           f"{steps[0]}..{steps[-1]} ({len(steps)})")
    try:
        view = read_step(store, run_id, step, kind, cfg)
    except views.Unreadable as e:
        raise CommandError(str(e)) from None
    groups = view.groups
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not args.json)
    if args.show is not None:
        if not args.show.strip():
            raise CommandError("--show needs a sid (or a unique prefix of one)")
        return _show(source, view, args, step, kind, color)
    chosen = _select(groups, args)
    if args.json:
        print(json.dumps({"run_id": run_id, "kind": kind, "step": step, "source": source.where,
                          **{k: v for k, v in view.to_json().items() if k not in ("groups", "kind", "step")},
                          "groups": [dict(g.to_json(), index=k) for k, g in chosen]}, indent=2))
        return EXIT_OK
    versions = sorted({r.record.policy_version for r in view.rollouts if r.record.policy_version is not None})
    marks = ", ".join(f"{n} {k}" for k, n in view.counts().items())
    print(f"run {run_id}, {kind} step {step}: {len(view.rollouts)} rollouts in {len(groups)} groups ({marks}), "
          f"policy version(s) {', '.join(map(str, versions)) or '-'}  ({source.where})")
    if view.note:
        print(f"  {view.note}")
    columns = cols.shown(view.rollouts)  # one set of columns for the whole step, so its groups line up
    for k, g in chosen:
        print()
        print("\n".join(group_lines(k, g, columns)))
    print(f"\nshow one: stepwise rollouts {args.run} --step {step}{' --eval' if args.eval else ''} --show SID")
    return EXIT_OK


def _show(source: Any, step_view: StepView, args: argparse.Namespace, step: int, kind: str, color: bool) -> int:
    rollouts = [r.record for r in step_view.rollouts]
    record = views.find_rollout(rollouts, args.show)
    if record is None:
        matches = sorted(r.sid for r in rollouts if isinstance(r.sid, str) and r.sid.startswith(args.show))
        if matches:
            shown = ", ".join(safe(m) for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise CommandError(f"sid prefix {safe(args.show)!r} matches {len(matches)} rollouts at {kind} step {step} "
                               f"({shown}): give more of the sid")
        raise CommandError(f"no rollout whose sid starts with {safe(args.show)!r} at {kind} step {step} "
                           f"({len(rollouts)} rollouts; `stepwise rollouts {args.run} --step {step}` lists them)")
    view = next(r for r in step_view.rollouts if r.sid == record.sid)
    tokenizer = views.load_tokenizer(source.store, source.run_id)
    trained = None if view.selection == "eval" else view.selection == "trained"
    detail = views.rollout_detail(source.store, source.run_id, record, trained=trained, tokenizer=tokenizer)
    if args.json:
        print(json.dumps({"run_id": source.run_id, "kind": kind, "step": step, "source": source.where,
                          "rollout": view.to_json(),
                          "tokenizer": tokenizer is not None, **detail}, indent=2))
        return EXIT_OK
    adv = "-" if view.advantage is None else f"{view.advantage:+.3f}"
    r = view.record
    print(f"rollout {safe(view.sid)} of run {source.run_id}, {kind} step {step}, group {safe(r.input_id)} "
          f"member {view.member} ({view.selection})")
    print(f"  reward {view.reward:.3f}  advantage {adv}  status {view.status}  policy version "
          f"{r.policy_version if r.policy_version is not None else '-'}  duration {fmt(r.duration_s, '.1f')} s  "
          f"turns {r.num_turns}  tool calls {r.tool_calls}  sampled tokens {r.sampled_tokens}")
    if r.turn_versions or view.staleness is not None:  # the group engine: which policy sampled each turn
        turns = ", ".join(map(str, r.turn_versions or [])) or "-"
        stale = "" if view.staleness is None else f"  staleness {view.staleness} (versions behind the update)"
        print(f"  policy version of each turn: {turns}{stale}")
    if view.cause:
        print(f"  reason / cause: {safe(view.cause)}")
    if r.judge_reason is not None:  # the group judge: its score beside the reward the step read, and why
        print(f"  judge score {cols.text(r.judge_score, '.2f')}  the agent's reward {cols.text(r.agent_reward, '.3f')}"
              f"  judge's reason: {safe(r.judge_reason)}")
    print("\nconversation:")
    print("\n".join(message_lines(detail["messages"], color=color)) or "  (no captured turn)")
    for n, spans in enumerate(detail["records"], 1):
        print(f"\ntokens of record {n} of {len(detail['records'])} ({span_summary(spans)}; trained span between "
              f"{TRAINED_OPEN} {TRAINED_CLOSE}{'' if tokenizer else '; no tokenizer: counts only'}):")
        print(span_text(spans, color=color))
    if not detail["records"]:
        print("\nno TraceRecord: nothing of this rollout was trained")
    elif trained is False:
        print(f"\nnothing of this rollout was trained: its group was {view.selection}")
    return EXIT_OK
