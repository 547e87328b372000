"""`stepwise watch RUN [--plot out.png] [--metrics out.jsonl] [--once]`: follow a run until it ends.

Every ``--interval`` seconds (default 10) it reads the run's newest execution (the first one
or a continuation), the state it is in, ``state.json`` (step, epoch, phase) and the step and
eval summaries (``runs/{run_id}/steps/{step}/summary.json``, ``evals/{step}/summary.json``),
and prints one line per completed step:

    step  reward  kept  datums  zeroed  step_s
       3   0.412   8/8      56    0/64    12.3

``reward`` = ``sampler/mean_reward``; ``kept`` = groups trained on (DAPO ``sampling/kept_groups``;
GRPO: every group) of ``batch_size``; ``zeroed`` = rollouts whose reward was forced to 0.0
(failed, timed out, or no reward) of all rollouts (``sampler/zeroed_rollouts`` /
``sampler/num_rollouts``); ``step_s`` = ``time/rollout`` + ``time/train`` when reported, else the
time between two step summaries. Then the behaviour columns (`BEHAVIOUR_COLUMNS`): turns, tool
calls and sampled tokens per rollout, rollout duration p50 / p95 (s), the fractions of truncated
and ill-formed turns, the fraction of zero-advantage groups, and ``err/to`` = rollouts with
status ``error`` / ``timeout``; then the cost ledger's ``step_usd`` (``cost/step_usd``), ``total_usd``
(``cost/total_usd``) and ``sess_h`` (the run's session-hours). Eval results print as their own lines,
and a budget limit's warning (``ledger.warned`` in ``state.json``) as a line of its own. The status line
changes when the execution, its current state or the run's phase changes. When the run ends it
prints every checkpoint (step, kind, reason, model package ARN), the final weights' model package
ARN and how to sample or deploy them, and what the run cost (the ledger against its estimate).

``--plot`` writes a PNG (matplotlib, Agg) of mean training reward per step and eval accuracy,
with a second panel of the behaviour metrics per step, refreshed as summaries arrive: the plot of
`stepwise_cli.plot`, the one `stepwise run-local` draws as ``reward.png``; the plotted series are
also stored in the PNG's text chunk ``stepwise-curves`` (JSON), read back from the drawn lines.
``--metrics`` writes the summaries as JSON lines in `stepwise run-local`'s ``metrics.jsonl`` form
(``kind``, ``step``, then the summary's fields). Exit code: 0 when the run succeeded (or, with ``--once``, is running), 1 when it
failed, timed out or was stopped, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from stepwise import layout
from stepwise.aws import tracking
from stepwise.executions import ABNORMAL_END_STATUSES
from stepwise_cli.commands._runs import (
    BEHAVIOUR_METRICS,
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CommandError,
    Deployment,
    add_stack_arguments,
    console_url,
    current_state_name,
    deployment,
    eval_accuracy,
    failure_message,
    fmt,
    mean_reward,
    metric,
    run_config,
    run_state,
    step_seconds,
    weights_lines,
)
from stepwise_cli.follow import RunFollower, SummaryCache
from stepwise_cli.plot import curves, plot_run


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", help="run id (the execution name)")
    parser.add_argument("--plot", type=Path, help="write reward and eval-accuracy curves to this PNG")
    parser.add_argument("--metrics", type=Path, help="write the summaries as JSON lines (metrics.jsonl form)")
    parser.add_argument("--once", action="store_true", help="print the current view once and exit")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between polls (default 10)")
    from stepwise_cli.grammar import add_json, add_timeout

    add_timeout(parser)
    add_json(parser, "one JSON object a line instead of the table: each step's and eval's summary as it appears "
                     "({kind: train|eval, step, ...}, metrics.jsonl's form), each status change "
                     "({kind: status, line}) and warning ({kind: warning, line})")
    add_stack_arguments(parser)


# ------------------------------------------------------------------------------ pure formatting


_BEHAVIOUR_WIDTH = 8
#: The behaviour columns after ``step_s``: the `BEHAVIOUR_METRICS` that have a column title.
BEHAVIOUR_COLUMNS = tuple(m for m in BEHAVIOUR_METRICS if m.title)
HEADER = (f"{'step':>5}  {'reward':>7}  {'kept':>7}  {'datums':>6}  {'zeroed':>9}  {'step_s':>7}"
          + "".join(f"  {m.title:>{_BEHAVIOUR_WIDTH}}" for m in BEHAVIOUR_COLUMNS) + f"  {'err/to':>7}"
          + f"  {'step_usd':>9}  {'total_usd':>9}  {'sess_h':>7}")


def usd_cell(value: float | None) -> str:
    """A dollar figure of the cost ledger (``-`` when the summary has none)."""
    from stepwise.core.ledger import usd

    return "-" if value is None else usd(value)


def kept_groups(summary: dict[str, Any], cfg: dict[str, Any] | None) -> float | None:
    """Groups trained on: DAPO's ``sampling/kept_groups``; GRPO trains on every group rolled out."""
    kept = metric(summary, "sampling/kept_groups")
    if kept is not None:
        return kept
    n = metric(summary, "sampler/num_rollouts")
    k = (cfg or {}).get("responses_per_prompt")
    return n / k if n is not None and k else None


def step_line(step: int, summary: dict[str, Any], cfg: dict[str, Any] | None, wall_seconds: float | None) -> str:
    """One table row of a step summary (columns of `HEADER`)."""
    kept = kept_groups(summary, cfg)
    bs = (cfg or {}).get("batch_size")
    kept_s = "-" if kept is None else (f"{kept:g}/{bs}" if bs else f"{kept:g}")
    zeroed, n = metric(summary, "sampler/zeroed_rollouts"), metric(summary, "sampler/num_rollouts")
    zeroed_s = "-" if zeroed is None else (f"{zeroed:g}/{n:g}" if n is not None else f"{zeroed:g}")
    secs = step_seconds(summary)
    secs = wall_seconds if secs is None else secs
    datums = metric(summary, "sampler/num_datums")
    line = f"{step:>5}  {fmt(mean_reward(summary)):>7}  {kept_s:>7}  {fmt(datums, 'g'):>6}  {zeroed_s:>9}  {fmt(secs, '.1f'):>7}"
    line += "".join(f"  {fmt(metric(summary, m.key), m.spec):>{_BEHAVIOUR_WIDTH}}" for m in BEHAVIOUR_COLUMNS)
    errors, timeouts = metric(summary, "rollouts/num_error"), metric(summary, "rollouts/num_timeout")
    line += f"  {'-' if errors is None or timeouts is None else f'{errors:g}/{timeouts:g}':>7}"
    line += (f"  {usd_cell(metric(summary, 'cost/step_usd')):>9}  {usd_cell(metric(summary, 'cost/total_usd')):>9}"
             f"  {fmt(metric(summary, 'cost/session_hours'), '.3f'):>7}")
    decision = summary.get("decision")
    if decision and decision != "train":
        line += f"  ({decision})"
    return line


def async_line(summary: dict[str, Any]) -> str | None:
    """Under a step of the group engine (``admission: group``), its asynchrony: the session's busy fraction
    (what the session bills for, it is busy only while it trains), the trained rollouts by staleness
    (``staleness/hist/0..k``, and any past k), the trainer's wait for data and for stale groups, the buffer,
    the groups in flight and the rollouts discarded (must stay 0). None for another step."""
    hist = sorted((int(k.rsplit("/", 1)[-1]), v) for k, v in summary.items() if k.startswith("staleness/hist/"))
    if not hist:
        return None
    busy = metric(summary, "session/busy_fraction")
    past = metric(summary, "staleness/past_k") or 0
    parts = [f"busy {fmt(busy and 100 * busy, '.0f')}%",
             "staleness " + "/".join(f"{v:g}" for _, v in hist) + f" (0..{hist[-1][0]})" + (f", {past:g} past k" if past else ""),
             f"wait data {fmt(metric(summary, 'time/trainer_wait_data'), '.1f')} s, stale "
             f"{fmt(metric(summary, 'time/trainer_wait_stale'), '.1f')} s",
             f"buffer {fmt(metric(summary, 'groups/buffer_depth'), 'g')}, in flight {fmt(metric(summary, 'groups/in_flight'), 'g')}",
             f"discarded {fmt(metric(summary, 'rollouts/discarded'), 'g')}"]
    return "       async: " + "; ".join(parts)


def budget_warnings(state: dict[str, Any]) -> list[str]:
    """One line per budget limit the run has warned about (``state.json``'s ``ledger.warned``), with the
    figures of its last check (``ledger.checks``, `stepwise.core.stopping.budget_checks`)."""
    from stepwise.core.stopping import BUDGETS

    led = state.get("ledger") or {}
    out = []
    for name in led.get("warned") or []:
        check = (led.get("checks") or {}).get(name)
        if not check or not check.get("limit"):
            out.append(f"{name}: its projection reached the warning fraction")
            continue
        unit = BUDGETS.get(name, "")
        share = check["projected"] / check["limit"]
        out.append(f"{name}: {check['spent']:.4g} {unit} spent, {check['projected']:.4g} projected after the next "
                   f"step, {share:.0%} of the limit {check['limit']:g}")
    return out


def eval_when(step: int) -> str:
    """How an eval at ``step`` completed steps is named: step 0 is the baseline (``eval_before_train``)."""
    return "eval before training (step 0)" if step == 0 else f"eval after step {step}"


def eval_line(step: int, summary: dict[str, Any]) -> str:
    """One line per eval: accuracy on N prompts (x the group size), pass@k when the eval has groups, the
    named eval sets' accuracy, failed rollouts."""
    failed = metric(summary, "eval/failed_rollouts")
    extra = f", {failed:g} failed rollouts" if failed else ""
    final = " (final)" if summary.get("final") else ""
    prompts = metric(summary, "eval/prompts", "eval/n")
    group = metric(summary, "eval/group_size")
    shape = f"{fmt(prompts, 'g')} prompts" + (f" x {group:g}" if group and group > 1 else "")
    ks = sorted((k for k in summary if k.startswith("eval/pass@") and k.count("/") == 1),
                key=lambda k: int(k.rsplit("@", 1)[1]) if k.rsplit("@", 1)[1].isdigit() else 0)
    passes = ", ".join(f"{k.removeprefix('eval/')} {fmt(metric(summary, k))}" for k in ks) if group and group > 1 else ""
    named = [s for s in summary.get("eval_sets") or [] if s]
    sets = "; ".join(f"{s}: accuracy {fmt(metric(summary, f'eval/{s}/accuracy'))}" for s in named)
    return (f"  {eval_when(step)}{final}: accuracy {fmt(eval_accuracy(summary))} on {shape}"
            + (f" ({passes})" if passes else "") + (f"; {sets}" if sets else "") + extra)


def metrics_lines(cache: SummaryCache) -> list[dict[str, Any]]:
    """The summaries as `stepwise run-local` ``metrics.jsonl`` lines, in step order (eval after train)."""
    rows = [({"kind": "train", "step": s, **cache.steps[s]}, (s, 0)) for s in cache.steps]
    rows += [({"kind": "eval", "step": s, **cache.evals[s]}, (s, 1)) for s in cache.evals]
    return [r for r, _ in sorted(rows, key=lambda x: x[1])]


# ------------------------------------------------------------------------------ the loop


class Watcher(RunFollower):
    """One run's view; ``poll()`` prints what changed and returns the newest execution's description."""

    def __init__(self, dep: Deployment, run_id: str, out: Any = None, *, json_lines: bool = False) -> None:
        super().__init__(dep, run_id)
        self.out = out or sys.stdout
        self.json_lines = json_lines  # --json: one object a line (`_emit`)
        self.cfg: dict[str, Any] | None = None
        self._status_line = ""
        self._printed_header = False
        self._seen: set[tuple[str, int]] = set()
        self._warned: set[tuple[str, int, str]] = set()
        self._budget_warned: set[str] = set()
        self._unpublished: list[tuple[str, int]] = []  # steps whose report table (Track) is not read yet

    def _print(self, text: str) -> None:
        if self.json_lines:  # a status or warning line: its object (`_emit` prints the summaries')
            kind = "status" if text.startswith("-- ") else "warning"
            text = json.dumps({"kind": kind, "line": text.removeprefix("-- ").strip()})
        print(text, file=self.out, flush=True)

    def _emit(self, kind: str, step: int) -> bool:
        """--json: the summary as its metrics.jsonl line; False when printing the table instead."""
        if not self.json_lines:
            return False
        summary = (self.cache.steps if kind == "steps" else self.cache.evals)[step]
        line = {"kind": "train" if kind == "steps" else "eval", "step": step, **summary}
        print(json.dumps(line, default=str), file=self.out, flush=True)
        return True

    def poll(self) -> dict[str, Any] | None:
        newest = self.newest_execution()
        if self.cfg is None:
            self.cfg = run_config(self.dep, self.run_id)
        changed = self.refresh()
        for kind, step in changed:
            if (kind, step) in self._seen:
                self._warn(kind, step)  # a summary extended later (Rebind) may bring its own
                continue
            if self._emit(kind, step):
                pass
            elif kind == "steps":
                if not self._printed_header:
                    self._print(HEADER)
                    self._printed_header = True
                prev = self.cache.written.get(("steps", step - 1))
                wall = (self.cache.written[(kind, step)] - prev).total_seconds() if prev else None
                self._print(step_line(step, self.cache.steps[step], self.cfg, wall))
                if (extra := async_line(self.cache.steps[step])) is not None:
                    self._print(extra)
            else:
                self._print(eval_line(step, self.cache.evals[step]))
            self._seen.add((kind, step))
            self._warn(kind, step)
            self._unpublished.append((kind, step))
        if newest is None:
            self._status(f"run {self.run_id}: no execution yet")
            return None
        desc = self.dep.sfn.describe_execution(executionArn=newest["executionArn"])
        state = run_state(self.dep, self.run_id) or {}
        where = current_state_name(self.dep.sfn, desc["executionArn"]) if desc["status"] == "RUNNING" else None
        parts = [f"{desc['name']} {desc['status']}"]
        if where:
            parts.append(f"in '{where}'")
        if state:
            parts.append(f"step {state.get('step')} epoch {state.get('epoch')} phase {state.get('phase')}")
            if state.get("stop_reason"):
                parts.append(f"stop reason: {state['stop_reason']}")
            for line in budget_warnings(state):
                if line not in self._budget_warned:
                    self._budget_warned.add(line)
                    self._print(f"  budget warning: {line}")
        self._status(" | ".join(parts))
        self._published_warnings()
        return desc

    def _warn(self, kind: str, step: int) -> None:
        """Print a summary's tracking failure (``tracking.WARNING_KEY``) once, under its line."""
        summary = (self.cache.steps if kind == "steps" else self.cache.evals).get(step, {})
        warning = summary.get(tracking.WARNING_KEY)
        if warning and (kind, step, warning) not in self._warned:
            self._warned.add((kind, step, warning))
            self._print(f"  warning: {warning}")

    def _published_warnings(self, newest: int = 4) -> None:
        """Print the tracking warnings (MLflow, W&B) the Track function kept with each step's report
        table, once it has published the step; reads the ``newest`` unpublished steps' tables only."""
        from stepwise_cli.commands._runs import get_json

        for kind, step in list(self._unpublished[-newest:]):
            table = get_json(self.dep.s3, self.dep.bucket,
                             layout.report_table_key(self.run_id, "train" if kind == "steps" else "eval", step))
            if table is None:
                continue
            self._unpublished.remove((kind, step))
            for warning in table.get("warnings") or []:
                if (kind, step, warning) not in self._warned:
                    self._warned.add((kind, step, warning))
                    self._print(f"  warning ({'eval' if kind == 'evals' else 'step'} {step}): {warning}")
        del self._unpublished[:-4 * newest]  # long gone: never published (no Track), stop asking

    def _status(self, line: str) -> None:
        if line != self._status_line:
            self._status_line = line
            self._print(f"-- {line}")

    def outputs(self, plot: Path | None, metrics_path: Path | None) -> None:
        if plot is not None:
            plot_run(plot, self.cache.steps, self.cache.evals, self.run_id)
        if metrics_path is not None:
            metrics_path.parent.mkdir(parents=True, exist_ok=True)
            metrics_path.write_text("".join(json.dumps(r, default=str) + "\n" for r in metrics_lines(self.cache)))


def run(args: argparse.Namespace) -> int:
    try:
        dep = deployment(args)
        watcher = Watcher(dep, args.run, json_lines=args.json)
        deadline = None if args.timeout is None else time.monotonic() + args.timeout
        last_steps = -1
        first = True
        while True:
            desc = watcher.poll()
            if first and desc is None and run_state(dep, args.run) is None:
                raise CommandError(f"no run {args.run!r} in this deployment (no execution of that name, no "
                                   f"{layout.state_key(args.run)} in s3://{dep.bucket}); see `stepwise runs`")
            first = False
            if len(watcher.cache.steps) + len(watcher.cache.evals) != last_steps:
                watcher.outputs(args.plot, args.metrics)
                last_steps = len(watcher.cache.steps) + len(watcher.cache.evals)
            if args.once:
                return EXIT_FAILED if desc and desc["status"] in ABNORMAL_END_STATUSES else EXIT_OK
            if watcher.ended(desc):
                watcher.poll()  # summaries written just before the end
                watcher.outputs(args.plot, args.metrics)
                return report_end(desc, watcher)
            if deadline is not None and time.monotonic() > deadline:
                print(f"still {desc['status'] if desc else 'not started'} after {args.timeout:g}s; stopped watching",
                      file=sys.stderr)
                return EXIT_FAILED
            time.sleep(args.interval)
    except KeyboardInterrupt:
        print("\nstopped watching (the run goes on; `stepwise stop` ends it)", file=sys.stderr)
        return EXIT_INTERRUPTED


def report_end(desc: dict[str, Any], watcher: Watcher) -> int:
    if watcher.json_lines:  # the end as one object: status, error, the run's state (weights, ledger)
        state = run_state(watcher.dep, watcher.run_id) or {}
        print(json.dumps({"kind": "end", "status": desc["status"], "error": desc.get("error"),
                          "cause": failure_message(desc.get("cause")) if desc.get("cause") else None,
                          "steps": len(watcher.cache.steps), "checkpoints": state.get("checkpoints") or [],
                          "ledger": (state.get("ledger") or {}).get("final") or {}}, default=str), flush=True)
        return EXIT_OK if desc["status"] == "SUCCEEDED" else EXIT_FAILED
    rewards, evals = curves(watcher.cache.steps, watcher.cache.evals)
    print(f"run {watcher.run_id} {desc['status']}: {len(watcher.cache.steps)} step(s)"
          + (f", last mean reward {rewards[-1][1]:.3f}" if rewards else "")
          + (f", last eval accuracy {evals[-1][1]:.3f}" if evals else ""))
    region = (watcher.cfg or {}).get("region") or watcher.dep.info.region
    lines = weights_lines(run_state(watcher.dep, watcher.run_id), region)
    if desc["status"] != "SUCCEEDED":
        if desc.get("error") or desc.get("cause"):
            print(f"  error: {desc.get('error')}: {failure_message(desc.get('cause'))[:2000]}")
        print(f"  console: {console_url(desc['executionArn'])}")
        print("\n".join(lines))
        print(f"  resume it: stepwise resume {watcher.run_id}")
        return EXIT_FAILED
    print("\n".join(lines))  # ends with the final weights' model package ARN and how to use it
    final = ((run_state(watcher.dep, watcher.run_id) or {}).get("ledger") or {}).get("final") or {}
    for key in ("line", "estimate_line"):
        if final.get(key):
            print(f"  {final[key]}")
    return EXIT_OK
