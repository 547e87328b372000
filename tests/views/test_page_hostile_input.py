"""The run report page (`stepwise.views.page`) on hostile rollouts: whatever text an agent, a model or a
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

from stepwise.config import RunConfig
from stepwise.records import ReportIndex, RolloutRecord
from stepwise.views import index as ix
from stepwise.views import page as report
from stepwise.views.page import PageInputs, render_page, render_step_page
from stepwise.views.steps import step_view
from stepwise.views.tables import MAX_TEXT, sample_table
from tests.support.planning import cfg, state

#: Every tag the page itself writes (charts are matplotlib's SVG, left out here: no data text reaches them).
PAGE_TAGS = {"html", "head", "meta", "title", "style", "body", "h1", "h2", "h3", "p", "span", "table", "tr", "th",
             "td", "code", "details", "summary", "div", "section", "mark", "ul", "li", "a"}
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
    records = [RolloutRecord(sid=text, i=0, input_id=text, row=0, member=0, step=1, reward=1.0, reward_reason=text,
                             status="error", error={"error": text, "cause": big}, policy_version=1,
                             records=[{"token_ids": [1, 2, 3, 4], "loss_mask": [1, 0, 1], "logprobs": [0.0] * 3}]),
               RolloutRecord(sid=text + "2", i=1, input_id=text, row=0, member=1, step=1, reward=0.0, status="ok",
                             policy_version=1)]
    view = step_view(records, cfg(batch_size=1, responses_per_prompt=2), decision="train")
    call = {"id": big, "type": "function", "function": {"name": big, "arguments": big}}
    turns = [{"prompt_messages": [{"role": text, "content": big}, {"role": "user", "content": text}],
              "response_message": {"role": "assistant", "content": big, "tool_calls": [call] * 3},
              "turn": {"finish_reason": text, "output_ids": [1, 2, 3]}},
             {"prompt_messages": [{"role": "tool", "tool_call_id": big, "name": big, "content": big}],
              "response_message": {"role": "assistant", "content": text}, "turn": {"output_ids": [4]}}]
    table = sample_table(view, lambda sid: turns, decode=lambda ids: big + text,
                         summary={"sampler/mean_reward": 1.0, "decision": text})
    return json.loads(json.dumps(table))  # as Track stores it


def _inputs(text: str, table) -> PageInputs:
    index = ReportIndex(warnings=[["train", 1, text]], recent=[["train", 1]], counts={"train": 1})
    ix.add_failures(index, table["failures"])
    config = RunConfig.model_construct(**{**cfg().model_dump(), "exp_id": text, "base_model_arn": text})
    st = state(stop_reason=text)
    st.training_session_name = text
    return PageInputs(run_id=text, config=config, state=st,
                      index=index, tables=[table], ended={"status": text, "reason": text})


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
    for page in (render_page(_inputs(text, table)), render_step_page(text, table)):
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
    assert len(render_page(_inputs("r", table))) < 200_000


def test_curves_of_metrics_near_the_float_limit_still_draw():
    """A step metric of +-1.7e308 (a diverging loss, still finite) made matplotlib's axis range overflow
    (``ValueError: arange: cannot compute length``) and the whole page failed; an int too large for a
    float raised OverflowError. Such points are drawn at +-`PLOT_LIMIT`; the int is left out."""
    index = ReportIndex()
    for step, value in enumerate([1.7e308, -1.7e308, 10**400, 0.5]):
        ix.add_step(index, "train", step, {"sampler/mean_reward": value}, None, curve_keys=["sampler/mean_reward"],
                    track=False)
    points = report.series(index, "sampler/mean_reward")
    assert points == [(0, ix.PLOT_LIMIT), (1, -ix.PLOT_LIMIT), (3, 0.5)]
    for ylabel in ("reward", "reward (symlog)"):
        assert 'id="curve-m"' in report.svg_chart("t", [("m", "mean", "line", points)], ylabel)
