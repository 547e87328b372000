"""The run report page, and each step's sample table as a page of its own: HTML, self-contained.

Pure: `render_page(PageInputs) -> str` and `render_step_page(run_id, table) -> str`, from typed inputs
(`stepwise.config.RunConfig`, `stepwise.records.RunState`, the run's end record, the
`stepwise.records.ReportIndex` and the newest sample tables of `stepwise.views.tables`). No network is
needed to view a page: the styles are inline, the curves are SVG drawn by matplotlib (no script), and a
rollout expands to its turns with the HTML ``<details>`` element.

- Header: run id, status and how it ended, algorithm and model, the training session and its final
  state (``Stopped`` once the run stopped it), the best model (the eval that scored best and its model
  package), what the run cost (the ledger's final line, or the total so far), policy version,
  checkpoints with their model package ARNs, every config field (collapsed), tracking warnings.
- Curves (`CURVE_PANELS`) from the index's points (bounded: `stepwise.views.index`). Each line is an
  SVG group ``id="curve-{summary key}"``; adding a curve is one line in `CURVE_PANELS`.
- The run's failed and zeroed rollouts by cause (from every published step, and the step the run
  failed at).
- The newest `stepwise.views.index.RECENT` sample tables inline, newest first; older ones are pages of
  their own beside this one (``steps/{step}.html``, ``evals/{step}.html``), the newest
  `stepwise.views.index.LINKED` of them linked. Each group is marked trained, filtered, surplus,
  untrained or eval (`stepwise.views.steps.Selection`); only a trained group's rollouts show an
  advantage and trained tokens (``<mark class="trained">``).

The page's size is bounded whatever the run's length: inline tables, links, curve points, failure
causes and warnings are all capped.
"""

from __future__ import annotations

import html
import json
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from stepwise import layout
from stepwise.records import ReportIndex, RunState
from stepwise.views import columns as cols
from stepwise.views import index as ix
from stepwise.views import summary

if TYPE_CHECKING:
    from stepwise.config import RunConfig

__all__ = ["CURVE_PANELS", "PageInputs", "curve_keys", "render_page", "render_step_page", "render_table",
           "svg_chart"]

#: ``(title, [(summary key, label, style)], y-axis)``: style ``line``, ``dashed`` or ``points``; ``eval/...``
#: keys come from the eval summaries; ``rollouts/failed_fraction`` is derived. A new curve is one line here
#: (it is indexed from the next step on: `stepwise.views.index.add_step`).
CURVE_PANELS: tuple[tuple[str, tuple[tuple[str, str, str], ...], str], ...] = (
    ("Reward", (("sampler/mean_reward", "mean training reward", "line"),
                ("sampler/reward_min", "min", "dashed"), ("sampler/reward_max", "max", "dashed"),
                ("eval/accuracy", "eval accuracy", "points")), "reward / accuracy"),
    ("Behaviour per rollout", (("behaviour/turns_per_rollout", "turns", "line"),
                               ("behaviour/tool_calls_per_rollout", "tool calls", "line"),
                               ("behaviour/sampled_tokens_per_rollout", "sampled tokens", "line"),
                               ("time/rollout_duration_p50", "duration p50 (s)", "dashed"),
                               ("time/rollout_duration_p95", "duration p95 (s)", "dashed")), "per rollout (symlog)"),
    ("Fractions", (("behaviour/truncated_turns_fraction", "truncated turns", "line"),
                   ("behaviour/ill_formed_turns_fraction", "ill-formed turns", "line"),
                   ("advantages/zero_groups_fraction", "zero-advantage groups", "line"),
                   ("sampling/filtered_fraction", "groups filtered (DAPO)", "dashed"),
                   ("rollouts/failed_fraction", "failed rollouts", "dashed")), "fraction"),
    ("Staleness", (("staleness/mean", "mean", "line"), ("staleness/max", "max", "dashed"),
                   ("staleness/in_flight_mean", "in flight", "points"), ("staleness/in_queue_mean", "in queue", "points")),
     "policy versions"),
    ("Asynchrony", (("session/busy_fraction", "session busy", "line"), ("staleness/past_k", "past k", "points"),
                    ("train/kl_staleness_0", "KL at staleness 0", "dashed"), ("train/kl_staleness_2", "KL at 2", "dashed"),
                    ("train/clipfrac_staleness_2", "clip fraction at 2", "dashed")), "fraction / KL"),
    ("Trainer wait", (("time/trainer_wait_data", "for data", "line"), ("time/trainer_wait_stale", "for stale groups", "line"),
                      ("groups/buffer_depth", "buffer depth (groups)", "dashed")), "seconds / groups"),
    ("Failures", (("rollouts/num_error", "error", "line"), ("rollouts/num_timeout", "timeout", "line"),
                  ("sampler/zeroed_rollouts", "zeroed rewards", "dashed")), "rollouts per step"),
    ("Step time", (("time/rollout", "rollout", "line"), ("time/train", "train", "line"),
                   ("time/step_wall", "step wall", "dashed")), "seconds"),
    ("Cost", (("cost/total_usd", "run so far", "line"), ("cost/step_usd", "this step", "dashed")), "USD"),
    ("Judge", (("judge/agreement_spearman", "agreement with the agent's reward (rho)", "line"),
               ("judge/length_spearman", "length-score rho", "dashed"),
               ("judge/length_bias_alarm", "length-bias alarm", "points"),
               ("judge/fallback_groups", "fallback groups", "line")), "rho / groups (symlog)"),
)


def curve_keys(kind: str) -> list[str]:
    """The summary keys `CURVE_PANELS` draws from a ``train`` or ``eval`` summary (what the index keeps)."""
    keys = [k for _, lines, _ in CURVE_PANELS for k, _, _ in lines]
    return [k for k in keys if k.startswith("eval/") == (kind == "eval")]


@dataclass
class PageInputs:
    """What the page is made of.

    Attributes:
        run_id: the run.
        config: the run's config (None when ``config.json`` is not there yet).
        state: ``state.json`` (None before Init wrote it).
        index: the report index (curves, failures, warnings, the newest steps).
        tables: the sample tables shown inline (`stepwise.views.tables.sample_table`), any order.
        ended: the run's end record (``runs/{run_id}/summary.json``), None while it runs.
        updated_at: when this rendering was made (text).
        link_prefix: what the links to the step pages start with (``""``: they sit beside the page, as
            in the bucket; a local run folder's ``report.html`` links into ``s3/runs/{run_id}/report/``).
    """

    run_id: str
    config: RunConfig | None = None
    state: RunState | None = None
    index: ReportIndex = field(default_factory=ReportIndex)
    tables: Sequence[Mapping[str, Any]] = ()
    ended: Mapping[str, Any] | None = None
    updated_at: str = ""
    link_prefix: str = ""


# ---------------------------------------------------------------------------- curves


def series(index: ReportIndex, key: str) -> list[tuple[float, float]]:
    """``[(step, value)]`` of a summary key over the run, from the index (``eval/...`` from the evals;
    values within +-`stepwise.views.index.PLOT_LIMIT`)."""
    return ix.series(index, "eval" if key.startswith("eval/") else "train", key)


#: Serializes `svg_chart` within a process. Matplotlib is not thread-safe (its FAQ, "Working with threads":
#: "it is your responsibility to set up the proper locks to serialize access to Matplotlib artists"): its
#: mathtext parser (tick labels such as ``$\mathdefault{0}$`` on a symlog axis) is shared and fails under
#: concurrent use with a ``ValueError``, and ``rc_context`` swaps the process-wide rcParams. A Lambda
#: environment runs one invocation at a time; the local stack runs several Track invocations on threads
#: of one worker process.
_MATPLOTLIB = threading.Lock()


def svg_chart(title: str, lines: Sequence[tuple[str, str, str, list[tuple[int, float]]]], ylabel: str) -> str:
    """One panel as inline SVG (matplotlib's SVG backend, no pyplot state): each line an SVG group
    ``id="curve-{key}"``; text kept as text (``svg.fonttype: none``); ids salted so a page rebuilt
    from the same data is byte-identical. Thread-safe (`_MATPLOTLIB`)."""
    with _MATPLOTLIB:
        return _svg_chart(title, lines, ylabel)


def _svg_chart(title: str, lines: Sequence[tuple[str, str, str, list[tuple[int, float]]]], ylabel: str) -> str:
    import matplotlib
    from matplotlib.backends.backend_svg import FigureCanvasSVG
    from matplotlib.figure import Figure

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "stepwise-report", "font.size": 9}):
        fig = Figure(figsize=(6.2, 2.7))
        FigureCanvasSVG(fig)
        ax = fig.add_subplot(1, 1, 1)
        drawn = 0
        for n, (key, label, style, points) in enumerate(lines):
            if not points:
                continue
            xs, ys = [p[0] for p in points], [p[1] for p in points]
            kw: dict[str, Any] = {"label": label, "color": f"C{n % 10}"}
            if style == "points":
                (line,) = ax.plot(xs, ys, "s", **kw)
            else:
                (line,) = ax.plot(xs, ys, "--" if style == "dashed" else "-", marker="." if len(xs) < 60 else None, **kw)
            line.set_gid(f"curve-{key}")
            drawn += 1
        if "symlog" in ylabel:
            ax.set_yscale("symlog", linthresh=1.0)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if drawn:
            ax.legend(fontsize="x-small", loc="best")
        else:
            ax.text(0.5, 0.5, "no data yet", ha="center", va="center", transform=ax.transAxes)
        fig.tight_layout()
        import io

        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, count=1, flags=re.S)  # RDF namespaces only


def charts(index: ReportIndex) -> list[str]:
    """Every `CURVE_PANELS` panel's SVG."""
    return [svg_chart(title, [(k, label, style, series(index, k)) for k, label, style in lines], ylabel)
            for title, lines, ylabel in CURVE_PANELS]


# ---------------------------------------------------------------------------- page

_STYLE = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0 auto;max-width:1280px;padding:12px 20px;color:#1d2329}
h1{font-size:22px;margin:4px 0}h2{font-size:18px;margin:22px 0 8px;border-bottom:1px solid #d8dde3}h3{font-size:15px;margin:14px 0 4px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #d8dde3;padding:2px 6px;text-align:left;vertical-align:top;font-size:13px}
th{background:#f3f5f7}.num{text-align:right;font-variant-numeric:tabular-nums}.status-ok{color:#1a7f37}.status-bad{color:#cf222e;font-weight:600}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;background:#eef1f4;margin-right:6px}.SUCCEEDED,.FINISHED{background:#dafbe1}
.FAILED,.ABORTED,.TIMED_OUT,.KILLED{background:#ffebe9}.RUNNING{background:#ddf4ff}.warning{background:#fff8c5;padding:6px 10px;border-left:4px solid #d4a72c;margin:6px 0}
.charts{display:flex;flex-wrap:wrap;gap:8px}.charts svg{width:600px;height:auto;border:1px solid #eef1f4}
details.rollout{margin:2px 0 2px 8px}details.rollout>summary{cursor:pointer;font-family:ui-monospace,Menlo,monospace;font-size:12.5px}
.msg{margin:4px 0 4px 14px;padding:4px 8px;border-left:3px solid #d8dde3;white-space:pre-wrap;font-family:ui-monospace,Menlo,monospace;font-size:12.5px}
.role{font-weight:600;font-family:system-ui,sans-serif}.msg.system{border-color:#8250df}.msg.user{border-color:#0969da}.msg.assistant{border-color:#1a7f37}
.msg.tool{border-color:#bf8700}.msg.branch{border-color:#cf222e}.tokens{margin:4px 0 4px 14px;padding:6px 8px;background:#f6f8fa;white-space:pre-wrap;
font-family:ui-monospace,Menlo,monospace;font-size:12.5px}mark.trained{background:#aceebb;color:#0f3d1c}.prompt{color:#6e7781}.masked{color:#57606a;text-decoration:underline dotted}
.sel{display:inline-block;padding:0 6px;border-radius:8px;font-size:11px;margin-right:6px;background:#eef1f4}.sel-trained{background:#dafbe1}
.sel-filtered,.sel-surplus,.sel-untrained{background:#fff1e5}.group{margin:6px 0 10px}.label{font-weight:600;text-transform:uppercase;font-size:11px;color:#57606a;margin-right:6px}.legend{font-size:12px;color:#57606a}
"""




def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any, spec: str = ".3f") -> str:
    v = ix.number(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return "-" if v is None else format(v, spec)


def _status(inputs: PageInputs) -> tuple[str, str]:
    """``(status, how it ended)``: RUNNING until the run's end record; then its status and reason."""
    ended, st = inputs.ended, inputs.state
    if ended and not (st is not None and st.owner_execution_arn and ended.get("execution_arn")
                      and st.owner_execution_arn != ended["execution_arn"]):  # else resumed since
        return str(ended.get("status", "ENDED")), str(ended.get("reason") or "")
    reason = st.stop_reason if st is not None else None
    return ("STOPPING" if reason else "RUNNING"), str(reason or "")


def best_line(cfg: RunConfig | None, state: RunState | None) -> str:
    """The best model (`stepwise.views.summary.best_text`) with the metric it was chosen on, or why there
    is none."""
    if state is None or state.eval_only:
        return "-" if state is None else "none (an eval-only run trains no model)"
    best = summary.best_model(state.model_dump(mode="json"))
    if best is None:
        return "none yet (no eval recorded)"
    metric = "eval/accuracy"
    if cfg is not None:
        from stepwise.core.selection import criterion

        metric = criterion(cfg).metric
    gone = " (deleted)" if best["model_package_arn"] and best["model_package_arn"] in state.deleted_packages else ""
    return f"{summary.best_text(best)}{gone} · chosen on {metric}"


def _header(inputs: PageInputs) -> str:
    cfg, st = inputs.config, inputs.state
    c: dict[str, Any] = cfg.model_dump(mode="json") if cfg is not None else {}
    status, how = _status(inputs)
    rows = [("algorithm", f"{c.get('algorithm', '-')} ({c.get('loss', '-')} loss, {c.get('advantage_estimator', '-')} advantages)"),
            ("model", c.get("base_model_arn", "-")), ("agent runtime", c.get("agent_runtime_arn", "-")),
            ("batch", f"{c.get('batch_size', '-')} prompts x {c.get('responses_per_prompt', '-')} responses"),
            ("training session", summary.session_text(st.model_dump(mode="json") if st is not None else None)),
            ("steps done", st.step if st is not None else inputs.index.counts.get("train", 0)),
            ("policy version", st.policy_version if st is not None else "-"),
            ("sampler", (st.sampler_model_package_arn if st is not None else "") or "base model"),
            ("best model", best_line(cfg, st)),
            ("cost", summary.cost_line(st.model_dump(mode="json") if st is not None else None,
                                       inputs.index.latest.get("train"))),
            ("how it ended", how or ("-" if status == "RUNNING" else "finished"))]
    out = [f'<h1>Run {_e(inputs.run_id)}</h1><p><span class="badge {_e(status)}" id="run-status">{_e(status)}</span>'
           f'<span class="legend">updated {_e(inputs.updated_at)}</span></p><table id="run-header">']
    out += [f'<tr id="row-{_e(k.replace(" ", "-"))}"><th>{_e(k)}</th><td>{_e(v)}</td></tr>' for k, v in rows]
    out.append("</table>")
    checkpoints = list(st.checkpoints) if st is not None else []
    final = (inputs.ended or {}).get("final_weights")
    deleted = set(st.deleted_packages) if st is not None else set()
    out.append("<h3>Checkpoints</h3>")
    if checkpoints or final:
        out.append('<table id="checkpoints"><tr><th>step</th><th>kind</th><th>reason</th><th>model package ARN</th></tr>')
        for ck in checkpoints:
            gone = " (deleted)" if ck.model_package_arn in deleted else ""
            out.append(f"<tr><td class=num>{_e(ck.step)}</td><td>{_e(ck.kind)}</td><td>{_e(ck.reason)}</td>"
                       f"<td><code>{_e(ck.model_package_arn)}</code>{_e(gone)}</td></tr>")
        if isinstance(final, Mapping):
            out.append(f"<tr><td class=num>{_e(final.get('step'))}</td><td>final weights</td><td>{_e(final.get('reason'))}</td>"
                       f"<td><code>{_e(final.get('model_package_arn'))}</code></td></tr>")
        out.append("</table>")
    else:
        out.append("<p>none yet</p>")
    if inputs.index.warnings:
        out.append('<h3>Tracking warnings</h3><div id="warnings">')
        out += [f'<div class="warning">{_e(kind)} step {_e(step)}: {_e(w)}</div>' for kind, step, w in inputs.index.warnings]
        out.append("</div>")
    out.append('<details id="config"><summary>config</summary><table>')
    out += [f"<tr><th>{_e(k)}</th><td><code>{_e(json.dumps(v) if not isinstance(v, str) else v)}</code></td></tr>"
            for k, v in sorted(c.items())]
    out.append("</table></details>")
    return "".join(out)


def _role_class(role: str) -> str:
    return re.sub(r"[^a-z]", "", role.lower()) or "other"


#: What a turn's ``trained`` mark reads as (None: an eval's, never trained).
_TRAINED_TAG = {True: "trained", False: "not trained"}


def _rollout(member: Mapping[str, Any], columns: Sequence[Sequence[Any]], kind: str) -> str:
    values = member.get("row") if isinstance(member.get("row"), Mapping) else {}
    parts = []
    for key, head, fmt in columns:
        text = cols.text(values.get(key), fmt)
        if key == "sid":
            text = text[:8]  # as the terminal shows it; the whole sid is the row's data-sid
        if key == "status":
            ok = values.get(key) == "ok"
            parts.append(f"<span class='{'status-ok' if ok else 'status-bad'}'>{_e(text)}</span>")
        elif not cols.empty(text) or key not in cols.OPTIONAL_KEYS:  # a judge's columns only where it judged
            parts.append(f"{_e(head)} {_e(text)}")
    out = [f'<details class="rollout" data-sid="{_e(member.get("sid"))}"><summary>{" · ".join(parts)}</summary>']
    for m in member.get("messages") or []:
        role = str(m.get("role", "?"))
        tags = [role]
        if "turn" in m:
            tags.append(f"turn {m['turn']}")
            if m.get("trained") in _TRAINED_TAG:
                tags.append(_TRAINED_TAG[m["trained"]])
            tags.append(f"{m.get('output_tokens', 0)} tokens, {m.get('finish_reason') or '-'}")
        if m.get("tool_call_id"):
            tags.append(f"result of {m['tool_call_id']}")
        calls = "".join(f"\n→ tool call {_e(c.get('name'))}({_e(c.get('arguments'))})" for c in m.get("tool_calls") or [])
        out.append(f'<div class="msg {_role_class(role)}"><span class="role">{_e(" · ".join(tags))}</span>\n'
                   f"{_e(m.get('content'))}{calls}</div>")
    trained_group = member.get("selection") == "trained"
    for n, spans in enumerate(member.get("records") or [], 1):
        pieces = []
        for s in spans:
            text = s.get("text") if s.get("text") is not None else f"<{s.get('tokens')} tokens>"
            if s.get("trained"):
                pieces.append(f'<mark class="trained">{_e(text)}</mark>')
            else:
                pieces.append(f'<span class="{"prompt" if s.get("region") == "prompt" else "masked"}">{_e(text)}</span>')
        legend = ("tokens as trained (highlighted = loss mask 1)" if trained_group else
                  "tokens sampled (an eval rollout: never trained)" if kind == "eval" else
                  f"tokens sampled (not trained: its group was {member.get('selection')})")
        out.append(f'<div class="legend">record {n}: {legend}</div><div class="tokens">{"".join(pieces)}</div>')
    if kind == "train" and trained_group and not member.get("records"):
        out.append('<div class="legend">no TraceRecord: nothing of this rollout was trained</div>')
    out.append("</details>")
    return "".join(out)


_SELECTION_TEXT = {"trained": "trained", "filtered": "filtered (all rewards equal: no signal)",
                   "surplus": "surplus (cut by the truncation to batch_size)", "untrained": "not trained",
                   "eval": "eval (never trained)", "unknown": "not known (see the note)"}


def render_table(table: Mapping[str, Any]) -> str:
    """A sample table as an HTML section ``id="{kind}-{step}"``."""
    kind, step = table.get("kind", "train"), table.get("step")
    metrics = table.get("metrics") or {}
    head = ", ".join(f"{k} {_fmt(v) if ix.number(v) is not None else _e(v)}" for k, v in metrics.items())
    counts = table.get("selection") or {}
    if counts and kind == "train":
        head += (" · " if head else "") + "groups: " + ", ".join(f"{n} {k}" for k, n in counts.items())
    columns = table.get("columns") or [[c.key, c.header, c.fmt] for c in cols.ROLLOUT_COLUMNS]
    out = [f'<section class="step" id="{_e(kind)}-{_e(step)}" data-kind="{_e(kind)}" data-step="{_e(step)}">'
           f"<h3>{'Eval' if kind == 'eval' else 'Step'} {_e(step)}</h3><div class='legend'>{_e(head)}</div>"]
    if table.get("note"):
        out.append(f"<div class='legend note'>{_e(table['note'])}</div>")
    for g in table.get("groups") or []:
        rewards = ", ".join(_fmt(r, ".2f") for r in g.get("rewards_G") or [])
        sel = str(g.get("selection") or "")
        place = (f"gen {_e(g.get('generation_batch'))}" if g.get("group") is None  # the group engine's: its id
                 else f"group {_e(g.get('group'))}, attempt {_e(g.get('attempt'))}")
        out.append(f'<div class="group" data-selection="{_e(sel)}"><span class="label">{_e(g.get("label"))}</span>'
                   f'<span class="sel sel-{_e(sel)}">{_e(_SELECTION_TEXT.get(sel, sel))}</span>'
                   f"group <code>{_e(g.get('input_id'))}</code> ({place}): "
                   f"mean {_fmt(g.get('mean_reward'))}, rewards [{rewards}]")
        out += [_rollout(m, columns, str(kind)) for m in g.get("rollouts") or []]
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


def _failures(index: ReportIndex) -> str:
    if not index.failures:
        return '<p id="failures">no failed or zeroed rollout</p>'
    out = ['<table id="failures"><tr><th>count</th><th>status</th><th>cause</th><th>examples (step, sid)</th></tr>']
    for f in index.failures:
        ex = "; ".join(f"{e.get('kind')} {e.get('step')} {str(e.get('sid'))[:8]}" for e in f.get("examples") or [])
        out.append(f"<tr><td class=num>{_e(f.get('count'))}</td><td>{_e(f.get('status'))}</td><td>{_e(f.get('cause'))}</td>"
                   f"<td>{_e(ex)}</td></tr>")
    out.append("</table>")
    return "".join(out)


def _document(title: str, body: Sequence[str]) -> str:
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><title>{_e(title)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>")


def _key(t: Mapping[str, Any]) -> tuple[int, bool]:
    return (int(t.get("step", 0)), t.get("kind") == "train")


def render_page(inputs: PageInputs) -> str:
    """The whole page (UTF-8 HTML, no external reference)."""
    shown = [list(e) for e in inputs.index.recent[-ix.RECENT:]]
    tables = sorted((t for t in inputs.tables if [t.get("kind"), t.get("step")] in shown), key=_key, reverse=True)
    older = [e for e in inputs.index.recent[:-ix.RECENT]][::-1]
    links = "".join(f'<li><a href="{_e(inputs.link_prefix + layout.report_step_page_name(k, s))}">'
                    f"{'eval' if k == 'eval' else 'step'} {_e(s)}</a></li>" for k, s in older)
    counts = inputs.index.counts
    total = counts.get("train", 0) + counts.get("eval", 0)
    body = [_header(inputs), '<h2>Curves</h2><div class="charts" id="charts">', *charts(inputs.index), "</div>",
            "<h2>Failed and zeroed rollouts by cause</h2>", _failures(inputs.index),
            f'<h2>Sample rollouts per step</h2><p class="legend">{len(tables)} of {total} tables ('
            f"{counts.get('train', 0)} steps, {counts.get('eval', 0)} evals), newest first: each step's best, worst "
            "and a mixed group, marked trained, filtered or surplus; click a rollout to read its turns, trained "
            "tokens highlighted.</p>", *(render_table(t) for t in tables)]
    if older:
        body.append(f'<h3>Older steps</h3><ul id="older" class="legend">{links}</ul>')
    if total > len(tables) + len(older):
        body.append('<p class="legend">every step\'s table is a page of its own beside this one: '
                    f"<code>{_e(inputs.link_prefix)}steps/STEP.html</code>, <code>{_e(inputs.link_prefix)}evals/STEP.html"
                    f"</code> (<code>stepwise report {_e(inputs.run_id)} --step STEP</code>)</p>")
    return _document(f"Stepwise run {inputs.run_id}", body)


def render_step_page(run_id: str, table: Mapping[str, Any], *, updated_at: str = "") -> str:
    """A step's (or eval's) sample table as a page of its own, linking back to the run's page."""
    kind, step = table.get("kind", "train"), table.get("step")
    back = "../index.html"
    body = [f'<p class="legend"><a href="{back}">run {_e(run_id)}</a> · {"eval" if kind == "eval" else "step"} '
            f"{_e(step)} · {_e(updated_at)}</p>", render_table(table)]
    return _document(f"Stepwise run {run_id}, {'eval' if kind == 'eval' else 'step'} {step}", body)
