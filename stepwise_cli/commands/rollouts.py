"""`stepwise rollouts RUN`: a step's rollouts as a person reads them; ``--show SID`` one rollout's conversation.

``RUN`` is a run id on the deployed stack or a local run folder (``runs-local/RUN_ID``;
`stepwise_cli.sources`). Without ``--show`` it prints the step's groups (the responses to one
prompt), each rollout on a line::

    group s19g0p3 (gen 0): mean 0.625, std 0.484, informative
      member  sid       reward   adv     status   policy  dur_s  turns  tools  tokens  reason / cause
           0  1a2b3c4d   1.000  +0.775   ok           19    0.8      1      0       3

``adv`` is the advantage ComputeAdvantages' estimator gives (GRPO on the shaped rewards; none for
eval rollouts), ``policy`` the policy version the rollout sampled with, ``reason / cause`` why a
reward was zeroed or a rollout failed. ``--show SID`` (a unique prefix is enough) prints that
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

from stepwise import runview
from stepwise.core.rollouts import PICKS, GroupView, pick_groups
from stepwise_cli.commands._runs import EXIT_OK, CommandError, add_stack_arguments, fail, fmt
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


HEADER = (f"  {'member':>6}  {'sid':<8}  {'reward':>6}  {'adv':>7}  {'status':<7}  {'policy':>6}  {'dur_s':>5}  "
          f"{'turns':>5}  {'tools':>5}  {'tokens':>6}  reason / cause")


def group_lines(index: int, group: GroupView) -> list[str]:
    """A group's heading and one line per rollout."""
    tag = "informative" if group.informative else "all equal"
    lines = [f"group {index} {safe(group.input_id)} (gen {group.generation_batch}): mean {group.mean_reward:.3f}, "
             f"std {group.reward_std:.3f}, {tag}", HEADER]
    for r in group.rollouts:
        adv = "-" if r.advantage is None else f"{r.advantage:+.3f}"
        lines.append(
            f"  {r.member:>6}  {safe(r.sid or '-')[:8]:<8}  {r.reward:>6.3f}  {adv:>7}  {r.status:<7}  "
            f"{'-' if r.policy_version is None else r.policy_version:>6}  {fmt(r.duration_s, '.1f'):>5}  "
            f"{r.num_turns:>5}  {r.tool_calls:>5}  {r.sampled_tokens:>6}  {safe(r.cause or '')}")
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
    try:
        return _run(args)
    except CommandError as e:
        return fail(str(e))


def _run(args: argparse.Namespace) -> int:
    if args.groups is not None and args.groups < 1:  # -n 0 or -3 printed a step heading and no group
        raise CommandError(f"-n/--groups must be at least 1, got {args.groups}")
    source = open_run(args.run, args)
    store, run_id = source.store, source.run_id
    kind = "eval" if args.eval else "train"
    steps = runview.steps_with_rollouts(store, run_id, kind)
    if not steps:
        raise CommandError(f"run {run_id} has no {kind} rollout records yet ({source.where})")
    step = steps[-1] if args.step is None else args.step
    if step not in steps:
        raise CommandError(f"run {run_id} has no {kind} rollouts at step {step}; steps with rollouts: "
                           f"{steps[0]}..{steps[-1]} ({len(steps)})")
    cfg = runview.run_config(store, run_id)
    rollouts = runview.step_rollouts(store, run_id, step, kind)
    groups = runview.step_groups(store, run_id, step, kind, cfg, rollouts)
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not args.json)
    if args.show is not None:
        if not args.show.strip():
            raise CommandError("--show needs a sid (or a unique prefix of one)")
        return _show(source, rollouts, groups, args, step, kind, color)
    chosen = _select(groups, args)
    if args.json:
        print(json.dumps({"run_id": run_id, "kind": kind, "step": step, "source": source.where,
                          "groups": [dict(g.to_json(), index=k) for k, g in chosen]}, indent=2))
        return EXIT_OK
    versions = sorted({r.policy_version for g in groups for r in g.rollouts if r.policy_version is not None})
    print(f"run {run_id}, {kind} step {step}: {len(rollouts)} rollouts in {len(groups)} groups, policy version(s) "
          f"{', '.join(map(str, versions)) or '-'}  ({source.where})")
    for k, g in chosen:
        print()
        print("\n".join(group_lines(k, g)))
    print(f"\nshow one: stepwise rollouts {args.run} --step {step}{' --eval' if args.eval else ''} --show SID")
    return EXIT_OK


def _show(source: Any, rollouts: list[dict[str, Any]], groups: list[GroupView], args: argparse.Namespace,
          step: int, kind: str, color: bool) -> int:
    record = runview.find_rollout(rollouts, args.show)
    if record is None:
        matches = sorted(r["sid"] for r in rollouts if isinstance(r.get("sid"), str) and r["sid"].startswith(args.show))
        if matches:
            shown = ", ".join(safe(m) for m in matches[:5]) + (", ..." if len(matches) > 5 else "")
            raise CommandError(f"sid prefix {safe(args.show)!r} matches {len(matches)} rollouts at {kind} step {step} "
                               f"({shown}): give more of the sid")
        raise CommandError(f"no rollout whose sid starts with {safe(args.show)!r} at {kind} step {step} "
                           f"({len(rollouts)} rollouts; `stepwise rollouts {args.run} --step {step}` lists them)")
    view = next(r for g in groups for r in g.rollouts if r.sid == record.get("sid"))
    tokenizer = runview.load_tokenizer(source.store, source.run_id)
    detail = runview.rollout_detail(source.store, source.run_id, record, tokenizer=tokenizer)
    if args.json:
        print(json.dumps({"run_id": source.run_id, "kind": kind, "step": step, "source": source.where,
                          "rollout": view.to_json(),
                          "tokenizer": tokenizer is not None, **detail}, indent=2))
        return EXIT_OK
    adv = "-" if view.advantage is None else f"{view.advantage:+.3f}"
    print(f"rollout {safe(view.sid)} of run {source.run_id}, {kind} step {step}, group {safe(view.input_id)} "
          f"member {view.member}")
    print(f"  reward {view.reward:.3f}  advantage {adv}  status {view.status}  policy version "
          f"{view.policy_version if view.policy_version is not None else '-'}  duration {fmt(view.duration_s, '.1f')} s  "
          f"turns {view.num_turns}  tool calls {view.tool_calls}  sampled tokens {view.sampled_tokens}")
    if view.cause:
        print(f"  reason / cause: {safe(view.cause)}")
    print("\nconversation:")
    print("\n".join(message_lines(detail["messages"], color=color)) or "  (no captured turn)")
    for n, spans in enumerate(detail["records"], 1):
        print(f"\ntokens of record {n} of {len(detail['records'])} ({span_summary(spans)}; trained span between "
              f"{TRAINED_OPEN} {TRAINED_CLOSE}{'' if tokenizer else '; no tokenizer: counts only'}):")
        print(span_text(spans, color=color))
    if not detail["records"]:
        print("\nno TraceRecord: nothing of this rollout was trained")
    return EXIT_OK
