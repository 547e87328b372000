"""The run report page: one self-contained HTML page per run, rebuilt as the run goes.

Pure: `render_page(ReportInputs) -> str` from what the run stores (config, state, the step and eval
summaries, the run's end, and one *sample table* per step made by `sample_table`). No network is
needed to view it: the styles are inline, the curves are SVG drawn by matplotlib (no script), and a
rollout expands to its turns with the HTML ``<details>`` element.

- Header: run id, status and how it ended (the stop reason), algorithm and model, the training
  session, policy version, checkpoints with their model package ARNs and the final weights, every
  config field (collapsed), and tracking warnings (MLflow / W&B failures: never a failed step).
- Curves (`CURVE_PANELS`): reward (mean, min and max) with eval accuracy; behaviour per rollout
  (turns, tool calls, sampled tokens, duration p50/p95); fractions (truncated and ill-formed turns,
  zero-advantage groups, failed rollouts); staleness; failures (error, timeout, zeroed rollouts);
  step time. Each line is an SVG group ``id="curve-{summary key}"``.
- A sample table per step (newest first), kept for every step: the step's best, worst and a mixed
  group (`stepwise.core.rollouts.sample_groups`), each rollout a row (reward, advantage, status,
  reason) that expands to its conversation, the trained tokens highlighted (``<mark class="trained">``).
- The run's failed and zeroed rollouts grouped by cause (`stepwise.core.rollouts.failure_groups`).

Sizes are bounded so a long run's page stays readable: every text is cut to `MAX_TEXT` characters
and a step table holds at most `MAX_GROUPS` groups.
"""

from __future__ import annotations

import html
import json
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from stepwise.core.rollouts import GroupView, conversation, failure_groups, sample_groups, token_spans

__all__ = ["CURVE_PANELS", "MAX_GROUPS", "MAX_TEXT", "ReportInputs", "render_page", "sample_table", "svg_chart"]

#: Characters of one message or token span kept in a sample table.
MAX_TEXT = 2000
#: Groups per step in a sample table (best, worst, mixed).
MAX_GROUPS = 3

#: ``(title, [(summary key, label, style)], y-axis)``: style ``line``, ``dashed`` or ``points``;
#: ``eval/accuracy`` comes from the eval summaries; ``rollouts/failed_fraction`` is derived.
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
                   ("rollouts/failed_fraction", "failed rollouts", "dashed")), "fraction"),
    ("Staleness", (("staleness/mean", "mean", "line"), ("staleness/max", "max", "dashed")), "policy versions"),
    ("Failures", (("rollouts/num_error", "error", "line"), ("rollouts/num_timeout", "timeout", "line"),
                  ("sampler/zeroed_rollouts", "zeroed rewards", "dashed")), "rollouts per step"),
    ("Step time", (("time/rollout", "rollout", "line"), ("time/train", "train", "line"),
                   ("time/step_wall", "step wall", "dashed")), "seconds"),
)


@dataclass
class ReportInputs:
    """What the page is made of.

    Attributes:
        run_id: the run.
        config: ``config.json`` (RunConfig JSON).
        state: ``state.json`` (RunState JSON), {} before Init wrote it.
        steps / evals: ``{step: summary}`` of the train steps and evals.
        tables: ``{(kind, step): sample table}`` (`sample_table`), kind ``train`` | ``eval``.
        ended: the run's end record (``runs/{run_id}/summary.json``), None while it runs.
        updated_at: ISO time of this rendering.
    """

    run_id: str
    config: Mapping[str, Any] = field(default_factory=dict)
    state: Mapping[str, Any] = field(default_factory=dict)
    steps: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    evals: Mapping[int, Mapping[str, Any]] = field(default_factory=dict)
    tables: Mapping[tuple[str, int], Mapping[str, Any]] = field(default_factory=dict)
    ended: Mapping[str, Any] | None = None
    updated_at: str = ""


# ---------------------------------------------------------------------------- sample tables


def clip(text: Any, limit: int = MAX_TEXT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were left out."""
    text = "" if text is None else str(text)
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def _clipped(message: Mapping[str, Any]) -> dict[str, Any]:
    """A `conversation` message with its texts cut: content, tool call id / name / arguments, tool_call_id, name."""
    out = {**message, "content": clip(message.get("content"))}
    for key in ("tool_call_id", "name"):
        if key in out:
            out[key] = clip(out[key], 200)
    if message.get("tool_calls"):
        out["tool_calls"] = [{k: clip(v, 200 if k != "arguments" else MAX_TEXT) for k, v in call.items()}
                             for call in message["tool_calls"]]
    return out


def sample_table(kind: str, step: int, groups: Sequence[GroupView], rollouts: Sequence[Mapping[str, Any]],
                 turns_of: Any, decode: Any = None, summary: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One step's sample table: its best, worst and a mixed group, every member with its
    conversation and trained spans, and the step's failures by cause.

    Args:
        kind, step: the batch (``train`` | ``eval``).
        groups: the step's groups (`stepwise.core.rollouts.group_views`).
        rollouts: the step's rollout records (their ``records`` hold the TraceRecords).
        turns_of: ``sid -> captured turns`` (called for the sampled groups' rollouts only).
        decode: ``token ids -> text`` (the run's tokenizer), None for counts only.
        summary: the step's summary (a few of its metrics head the table).

    Returns:
        ``{"kind", "step", "metrics", "groups": [{"label", ...GroupView.to_json(), "rollouts":
        [{...RolloutView, "messages", "records"}]}], "failures"}``: JSON, texts cut to `MAX_TEXT`.
    """
    by_sid = {r.get("sid"): r for r in rollouts}
    out_groups = []
    for label, g in sample_groups(groups)[:MAX_GROUPS]:
        members = []
        for view in g.rollouts:
            record = by_sid.get(view.sid) or {}
            traces = [t for t in record.get("records") or [] if isinstance(t, Mapping)]
            turns = turns_of(view.sid) if view.sid else []
            messages = [_clipped(m) for m in conversation(turns, traces)]
            spans = [[{**s.to_json(), "text": None if s.text is None else clip(s.text)}
                      for s in token_spans(t, decode)] for t in traces]
            members.append({**view.to_json(), "messages": messages, "records": spans})
        out_groups.append({"label": label, **{k: v for k, v in g.to_json().items() if k != "rollouts"},
                           "rollouts": members})
    keep = ("sampler/mean_reward", "eval/accuracy", "advantages/zero_groups_fraction", "policy_version", "decision")
    return {"kind": kind, "step": step, "groups": out_groups, "failures": failure_groups(rollouts),
            "metrics": {k: v for k, v in (summary or {}).items() if k in keep}}


# ---------------------------------------------------------------------------- curves


def _number(v: Any) -> float | None:
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except OverflowError:  # an int beyond float's range
        return None
    return f if math.isfinite(f) else None


#: The largest magnitude a curve draws (larger finite values are drawn at it): matplotlib's axis range of
#: values near the float limit (+-1.7e308) overflows (``ValueError: arange: cannot compute length``).
PLOT_LIMIT = 1e300


def series(inputs: ReportInputs, key: str) -> list[tuple[int, float]]:
    """``[(step, value)]`` of a summary key over the run (``eval/accuracy`` from the evals;
    ``rollouts/failed_fraction`` = (error + timeout) / rollouts)."""
    source = inputs.evals if key.startswith("eval/") else inputs.steps
    out = []
    for step in sorted(source):
        s = source[step]
        if key == "rollouts/failed_fraction":
            n, e, t = (_number(s.get(k)) for k in ("sampler/num_rollouts", "rollouts/num_error", "rollouts/num_timeout"))
            value = (e + t) / n if n and e is not None and t is not None else None
        else:
            value = _number(s.get(key))
        if value is not None:
            out.append((int(step), max(-PLOT_LIMIT, min(PLOT_LIMIT, value))))
    return out


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


def charts(inputs: ReportInputs) -> list[str]:
    """Every `CURVE_PANELS` panel's SVG."""
    return [svg_chart(title, [(k, label, style, series(inputs, k)) for k, label, style in lines], ylabel)
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
.group{margin:6px 0 10px}.label{font-weight:600;text-transform:uppercase;font-size:11px;color:#57606a;margin-right:6px}.legend{font-size:12px;color:#57606a}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt(value: Any, spec: str = ".3f") -> str:
    v = _number(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return "-" if v is None else format(v, spec)


def _status(inputs: ReportInputs) -> tuple[str, str]:
    """``(status, how it ended)``: RUNNING until the run's end record; then its status and reason."""
    ended = inputs.ended
    if ended and not (inputs.state.get("owner_execution_arn") and ended.get("execution_arn")
                      and inputs.state["owner_execution_arn"] != ended["execution_arn"]):  # else resumed since
        return str(ended.get("status", "ENDED")), str(ended.get("reason") or "")
    reason = inputs.state.get("stop_reason")
    return ("STOPPING" if reason else "RUNNING"), str(reason or "")


def _header(inputs: ReportInputs) -> str:
    cfg, st = inputs.config, inputs.state
    status, how = _status(inputs)
    rows = [("algorithm", f"{cfg.get('algorithm', '-')} ({cfg.get('loss', '-')} loss)"),
            ("model", cfg.get("base_model_arn", "-")), ("agent runtime", cfg.get("agent_runtime_arn", "-")),
            ("batch", f"{cfg.get('batch_size', '-')} prompts x {cfg.get('responses_per_prompt', '-')} responses"),
            ("training session", f"{st.get('training_session_name', '-')} ({st.get('session_status', '-')})"),
            ("steps done", st.get("step", len(inputs.steps))), ("policy version", st.get("policy_version", "-")),
            ("sampler", st.get("sampler_model_package_arn") or "base model"),
            ("how it ended", how or ("-" if status == "RUNNING" else "finished"))]
    out = [f'<h1>Run {_e(inputs.run_id)}</h1><p><span class="badge {_e(status)}" id="run-status">{_e(status)}</span>'
           f'<span class="legend">updated {_e(inputs.updated_at)}</span></p><table id="run-header">']
    out += [f"<tr><th>{_e(k)}</th><td>{_e(v)}</td></tr>" for k, v in rows]
    out.append("</table>")
    checkpoints = list(st.get("checkpoints") or [])
    final = (inputs.ended or {}).get("final_weights")
    out.append("<h3>Checkpoints</h3>")
    if checkpoints or final:
        out.append('<table id="checkpoints"><tr><th>step</th><th>kind</th><th>reason</th><th>model package ARN</th></tr>')
        for c in checkpoints:
            out.append(f"<tr><td class=num>{_e(c.get('step'))}</td><td>{_e(c.get('kind'))}</td><td>{_e(c.get('reason'))}</td>"
                       f"<td><code>{_e(c.get('model_package_arn'))}</code></td></tr>")
        if final:
            out.append(f"<tr><td class=num>{_e(final.get('step'))}</td><td>final weights</td><td>{_e(final.get('reason'))}</td>"
                       f"<td><code>{_e(final.get('model_package_arn'))}</code></td></tr>")
        out.append("</table>")
    else:
        out.append("<p>none yet</p>")
    warnings = [(kind, step, w) for (kind, step), t in sorted(inputs.tables.items()) for w in t.get("warnings") or []]
    if warnings:
        out.append('<h3>Tracking warnings</h3><div id="warnings">')
        out += [f'<div class="warning">{_e(kind)} step {_e(step)}: {_e(w)}</div>' for kind, step, w in warnings[-20:]]
        out.append("</div>")
    out.append('<details id="config"><summary>config</summary><table>')
    out += [f"<tr><th>{_e(k)}</th><td><code>{_e(json.dumps(v) if not isinstance(v, str) else v)}</code></td></tr>"
            for k, v in sorted(cfg.items())]
    out.append("</table></details>")
    return "".join(out)


def _role_class(role: str) -> str:
    return re.sub(r"[^a-z]", "", role.lower()) or "other"


def _rollout(member: Mapping[str, Any], kind: str) -> str:
    adv = "-" if member.get("advantage") is None else f"{member['advantage']:+.3f}"
    ok = member.get("status") == "ok"
    summary = (f"member {_e(member.get('member'))} · reward {_fmt(member.get('reward'))} · adv {_e(adv)} · "
               f"<span class='{'status-ok' if ok else 'status-bad'}'>{_e(member.get('status'))}</span> · "
               f"policy {_e(member.get('policy_version'))} · {_e(member.get('num_turns'))} turns · "
               f"{_e(member.get('tool_calls'))} tool calls · {_fmt(member.get('duration_s'), '.1f')} s"
               + (f" · {_e(member.get('cause'))}" if member.get("cause") else ""))
    out = [f'<details class="rollout" data-sid="{_e(member.get("sid"))}"><summary>{summary}</summary>']
    for m in member.get("messages") or []:
        role = str(m.get("role", "?"))
        tags = [role]
        if "turn" in m:
            tags += [f"turn {m['turn']}", {True: "trained", False: "not trained"}.get(m.get("trained"), "training unknown"),
                     f"{m.get('output_tokens', 0)} tokens, {m.get('finish_reason') or '-'}"]
        if m.get("tool_call_id"):
            tags.append(f"result of {m['tool_call_id']}")
        calls = "".join(f"\n→ tool call {_e(c.get('name'))}({_e(c.get('arguments'))})" for c in m.get("tool_calls") or [])
        out.append(f'<div class="msg {_role_class(role)}"><span class="role">{_e(" · ".join(tags))}</span>\n'
                   f"{_e(m.get('content'))}{calls}</div>")
    for n, spans in enumerate(member.get("records") or [], 1):
        parts = []
        for s in spans:
            text = s.get("text") if s.get("text") is not None else f"<{s.get('tokens')} tokens>"
            if s.get("trained"):
                parts.append(f'<mark class="trained">{_e(text)}</mark>')
            else:
                parts.append(f'<span class="{"prompt" if s.get("region") == "prompt" else "masked"}">{_e(text)}</span>')
        out.append(f'<div class="legend">record {n}: tokens as trained (highlighted = loss mask 1)</div>'
                   f'<div class="tokens">{"".join(parts)}</div>')
    if kind == "train" and not member.get("records"):
        out.append('<div class="legend">no TraceRecord: nothing of this rollout was trained</div>')
    out.append("</details>")
    return "".join(out)


def _table(table: Mapping[str, Any]) -> str:
    kind, step = table.get("kind", "train"), table.get("step")
    metrics = table.get("metrics") or {}
    head = ", ".join(f"{k} {_fmt(v) if _number(v) is not None else _e(v)}" for k, v in metrics.items())
    out = [f'<section class="step" id="{_e(kind)}-{_e(step)}" data-kind="{_e(kind)}" data-step="{_e(step)}">'
           f"<h3>{'Eval' if kind == 'eval' else 'Step'} {_e(step)}</h3><div class='legend'>{head}</div>"]
    for g in table.get("groups") or []:
        rewards = ", ".join(_fmt(r, ".2f") for r in g.get("rewards_G") or [])
        out.append(f'<div class="group"><span class="label">{_e(g.get("label"))}</span>group <code>{_e(g.get("input_id"))}</code>'
                   f" (gen {_e(g.get('generation_batch'))}): mean {_fmt(g.get('mean_reward'))}, rewards [{rewards}]")
        out += [_rollout(m, kind) for m in g.get("rollouts") or []]
        out.append("</div>")
    out.append("</section>")
    return "".join(out)


def _failures(inputs: ReportInputs) -> str:
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for _, table in sorted(inputs.tables.items()):
        for f in table.get("failures") or []:
            entry = merged.setdefault((f["status"], f["cause"]), {**f, "count": 0, "examples": []})
            entry["count"] += f["count"]
            entry["examples"] = (entry["examples"] + list(f.get("examples") or []))[:3]
    if not merged:
        return '<p id="failures">no failed or zeroed rollout</p>'
    out = ['<table id="failures"><tr><th>count</th><th>status</th><th>cause</th><th>examples (step, sid)</th></tr>']
    for f in sorted(merged.values(), key=lambda f: -f["count"]):
        ex = "; ".join(f"{e.get('kind')} {e.get('step')} {str(e.get('sid'))[:8]}" for e in f["examples"])
        out.append(f"<tr><td class=num>{f['count']}</td><td>{_e(f['status'])}</td><td>{_e(f['cause'])}</td><td>{_e(ex)}</td></tr>")
    out.append("</table>")
    return "".join(out)


def render_page(inputs: ReportInputs) -> str:
    """The whole page (UTF-8 HTML, no external reference)."""
    tables = sorted(inputs.tables.values(), key=lambda t: (int(t.get("step", 0)), t.get("kind") == "train"), reverse=True)
    body = [_header(inputs), '<h2>Curves</h2><div class="charts" id="charts">', *charts(inputs), "</div>",
            "<h2>Failed and zeroed rollouts by cause</h2>", _failures(inputs),
            f'<h2>Sample rollouts per step</h2><p class="legend">{len(tables)} tables, newest first: each step\'s best, '
            "worst and a mixed group; click a rollout to read its turns, trained tokens highlighted.</p>",
            *(_table(t) for t in tables)]
    return ("<!DOCTYPE html><html lang=en><head><meta charset=utf-8>"
            f"<meta name=viewport content='width=device-width, initial-scale=1'><title>Stepwise run {_e(inputs.run_id)}</title>"
            f"<style>{_STYLE}</style></head><body>{''.join(body)}</body></html>")
