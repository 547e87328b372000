"""`stepwise compare RUN_A RUN_B [--eval-a STEP] [--eval-b STEP]`: two runs' evals side by side.

Each run is a run id on the deployed stack or a local run folder (``runs-local/RUN_ID``), as
`stepwise watch` names runs; by default its newest eval (a training run's final eval, an eval-only
run's only one). For every eval set the two evals have (the unnamed set prints as ``(default)``):

- per metric: A, B and B - A (accuracy, mean@n, pass@k, all_pass@k, all_fail@k, mixed@k, counts);
- per prompt: B's wins, losses and ties against A on each prompt's mean reward, prompts matched by
  their payload (`stepwise.core.evals.compare_prompts`; rows repeating a prompt are pooled), and the
  prompts only one eval holds; ``--prompts N`` lists the N prompts that changed most.

So base versus trained is ``stepwise eval CONFIG --base`` and ``stepwise compare BASE_RUN TRAINED_RUN``.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from stepwise.core.evals import compare_prompts
from stepwise_cli.commands._evals import RunEvals, eval_sets_of, evaluated_text, metric_order, open_run, set_label, \
    set_metrics_of
from stepwise_cli.commands._runs import EXIT_OK, CommandError, Deployment, add_stack_arguments


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_a", help="run id or local run folder (runs-local/RUN_ID): the baseline, A")
    parser.add_argument("run_b", help="run id or local run folder: compared against A, B")
    parser.add_argument("--eval-a", type=int, metavar="STEP", help="A's eval at this step (default: its newest)")
    parser.add_argument("--eval-b", type=int, metavar="STEP", help="B's eval at this step (default: its newest)")
    parser.add_argument("--prompts", type=int, default=5, metavar="N", help="list the N most changed prompts per set")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    add_stack_arguments(parser)


def comparison(a: RunEvals, b: RunEvals, step_a: int | None = None, step_b: int | None = None,
               top: int = 5) -> dict[str, Any]:
    """The comparison as data: ``{"a", "b": {run, step, evaluated}, "sets": [{set, metrics: {name: [A, B]},
    wins, losses, ties, only_a, only_b, changed: [[fingerprint, preview, A, B], ...]}]}``.

    Raises:
        CommandError: a run without the eval asked for, or without per-prompt results.
    """
    sa = a.last_eval() if step_a is None else step_a
    sb = b.last_eval() if step_b is None else step_b
    summary_a, summary_b = a.summary(sa), b.summary(sb)
    if summary_a is None or summary_b is None:
        missing = a.label if summary_a is None else b.label
        raise CommandError(f"{missing}: no eval at that step")
    results_a, results_b = a.results(sa), b.results(sb)
    sets = [s for s in eval_sets_of(summary_a) if s in eval_sets_of(summary_b)]
    if not sets:
        raise CommandError(f"the two evals share no eval set ({eval_sets_of(summary_a)} vs {eval_sets_of(summary_b)})")
    out: dict[str, Any] = {
        "a": {"run": a.label, "step": sa, "evaluated": evaluated_text(summary_a)},
        "b": {"run": b.label, "step": sb, "evaluated": evaluated_text(summary_b)},
        "sets": [],
    }
    for s in sets:
        ma, mb = set_metrics_of(summary_a, s), set_metrics_of(summary_b, s)
        c = compare_prompts(results_a.prompts, results_b.prompts, s)
        out["sets"].append({
            "set": s, "metrics": {m: [ma.get(m), mb.get(m)] for m in metric_order(set(ma) | set(mb))},
            "wins": c.wins, "losses": c.losses, "ties": c.ties, "only_a": c.only_a, "only_b": c.only_b,
            "changed": [list(d) for d in (c.deltas or [])[:top] if d[2] != d[3]],
        })
    return out


def format_comparison(data: dict[str, Any]) -> str:
    a, b = data["a"], data["b"]
    lines = [f"A: {a['run']} (eval at step {a['step']}, {a['evaluated']})",
             f"B: {b['run']} (eval at step {b['step']}, {b['evaluated']})"]
    for s in data["sets"]:
        lines.append(f"eval set {set_label(s['set'])}:")
        lines.append(f"  {'metric':<14} {'A':>9} {'B':>9} {'B - A':>9}")
        for name, (va, vb) in s["metrics"].items():
            delta = "-" if va is None or vb is None else f"{vb - va:+.3f}"
            lines.append(f"  {name:<14} {_cell(name, va):>9} {_cell(name, vb):>9} {delta:>9}")
        matched = s["wins"] + s["losses"] + s["ties"]
        lines.append(f"  per prompt (mean reward, {matched} matched): B wins {s['wins']}, loses {s['losses']}, "
                     f"ties {s['ties']}" + (f"; only in A {s['only_a']}" if s["only_a"] else "")
                     + (f"; only in B {s['only_b']}" if s["only_b"] else ""))
        for fingerprint, preview, va, vb in s["changed"]:
            lines.append(f"    {va:.3f} -> {vb:.3f}  {preview or fingerprint}")
    return "\n".join(lines)


def _cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:g}" if name in ("prompts", "rollouts", "failed_rollouts") else f"{value:.3f}"


def run(args: argparse.Namespace) -> int:
    if args.prompts < 0:  # a negative N sliced the list from its end: all but the last N prompts
        raise CommandError(f"--prompts must be 0 or more, got {args.prompts}")
    dep: Deployment | None = None
    a = open_run(args.run_a, args)
    dep = getattr(a, "dep", None)
    b = open_run(args.run_b, args, dep)
    data = comparison(a, b, args.eval_a, args.eval_b, args.prompts)
    print(json.dumps(data, indent=2) if args.json else format_comparison(data))
    return EXIT_OK
