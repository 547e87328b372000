"""The run report page (`stepwise.core.report`) on hostile rollouts: whatever text an agent, a model or a
tool puts in a conversation (markup, ``<script>``, ``</details>``, quotes, huge strings), the page holds it
as text, never as markup, and every text of a sample table is cut to `MAX_TEXT` characters.

The page is parsed with the standard library's `html.parser` (not ours): the tags it finds are the page's
own, and no element or attribute comes from the data."""

from __future__ import annotations

import json
from html.parser import HTMLParser

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepwise.core import report
from stepwise.core.report import MAX_TEXT, ReportInputs, render_page, sample_table
from stepwise.core.rollouts import GroupView, RolloutView

#: Every tag the page itself writes (charts are matplotlib's SVG, left out here: no data text reaches them).
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "span", "table", "tr", "th",
             "td", "code", "details", "summary", "div", "section", "mark"}
HOSTILE = ['<script>alert(1)</script>', '</details></div><script>x()</script>', '"><img src=x onerror=alert(1)>',
           "'><svg onload=alert(1)>", "</textarea></style><b>", "&lt;script&gt;", "\u202e\u0000 é"]


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attrs: set[str] = set()

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.attrs.update(name for name, _ in attrs)


def _table(text: str, big: str):
    view = RolloutView(sid=text, i=0, member=0, input_id=text, row=0, generation_batch=0, reward=1.0,
                       reward_reason=text, advantage=0.5, status=text, cause=text, policy_version=1, duration_s=1.0,
                       num_turns=1, tool_calls=1, sampled_tokens=3, truncated_turns=0, ill_formed_turns=0)
    group = GroupView(input_id=text, generation_batch=0, rollouts=[view], rewards_G=[1.0], advantages_G=[0.5],
                      signal_G=[1.0])
    call = {"id": big, "type": "function", "function": {"name": big, "arguments": big}}
    turns = [{"prompt_messages": [{"role": text, "content": big}, {"role": "user", "content": text}],
              "response_message": {"role": "assistant", "content": big, "tool_calls": [call] * 3},
              "turn": {"finish_reason": text, "output_ids": [1, 2, 3]}},
             {"prompt_messages": [{"role": "tool", "tool_call_id": big, "name": big, "content": big}],
              "response_message": {"role": "assistant", "content": text}, "turn": {"output_ids": [4]}}]
    rollouts = [{"sid": text, "status": text, "error": {"error": text, "cause": big}, "step": 1, "kind": "train",
                 "input_id": text, "records": [{"token_ids": [1, 2, 3, 4], "loss_mask": [1, 0, 1]}]}]
    table = sample_table("train", 1, [group], rollouts, lambda sid: turns, decode=lambda ids: big + text,
                         summary={"sampler/mean_reward": 1.0, "decision": text})
    return json.loads(json.dumps(table))  # as Track stores it


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for k, v in value.items():
            yield from _strings(k)
            yield from _strings(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings(v)


@pytest.fixture(autouse=True)
def _no_charts(monkeypatch):
    monkeypatch.setattr(report, "charts", lambda inputs: [])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.one_of(st.sampled_from(HOSTILE), st.text(alphabet=st.characters(codec="utf-8"), max_size=40)))
def test_any_rollout_text_is_text_on_the_page_never_markup(text):
    table = _table(text, "<b>" + "x" * (3 * MAX_TEXT))
    inputs = ReportInputs(run_id=text, config={"exp_id": text}, state={"stop_reason": text},
                          tables={("train", 1): {**table, "warnings": [text]}})
    page = render_page(inputs)
    parser = _Tags()
    parser.feed(page)
    assert set(parser.tags) <= PAGE_TAGS, set(parser.tags) - PAGE_TAGS
    assert not any(a.startswith("on") for a in parser.attrs), parser.attrs
    assert "<script" not in page.lower() and "<b>" not in page


def test_every_text_of_a_sample_table_is_cut():
    """Message contents, tool calls' names, ids and arguments, decoded spans and causes: each at most
    `MAX_TEXT` characters plus the note of what was left out (a 1 MB tool-call argument reached the page whole)."""
    table = _table("t", "A" * 1_000_000)
    longest = max(len(s) for s in _strings(table))
    assert longest <= MAX_TEXT + 40, longest
    assert len(render_page(ReportInputs(run_id="r", tables={("train", 1): table}))) < 200_000


def test_curves_of_metrics_near_the_float_limit_still_draw():
    """A step metric of +-1.7e308 (a diverging loss, still finite) made matplotlib's axis range overflow
    (``ValueError: arange: cannot compute length``) and the whole page failed; an int too large for a
    float raised OverflowError. Such points are drawn at +-`PLOT_LIMIT`; the int is left out."""
    inputs = ReportInputs(run_id="r", steps={0: {"sampler/mean_reward": 1.7e308}, 1: {"sampler/mean_reward": -1.7e308},
                                             2: {"sampler/mean_reward": 10**400}, 3: {"sampler/mean_reward": 0.5}})
    points = report.series(inputs, "sampler/mean_reward")
    assert points == [(0, report.PLOT_LIMIT), (1, -report.PLOT_LIMIT), (3, 0.5)]
    for ylabel in ("reward", "reward (symlog)"):
        assert 'id="curve-m"' in report.svg_chart("t", [("m", "mean", "line", points)], ylabel)
