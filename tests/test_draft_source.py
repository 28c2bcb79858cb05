"""Where a free draft came from (issue 52, ui/draft_source.py): a round drafted from a suffix tree is
marked in the pane and the time chart, its source travels in escaped data-src-* attributes for the
pane's hover card, and nothing in a source can become markup. No gradio, no models."""
import html as htmllib
import re

from specviz.engine.events import Outcome, RoundEvent, TokenEvent
from specviz.ui import draft_source, render
from specviz.ui.charts import time_split_chart
from specviz.ui.state import RunView


def tok(text, outcome=Outcome.ACCEPTED, position=1, r=0):
    return TokenEvent(token_id=7, text=text, outcome=outcome, t=0.5, round=r, position=position,
                      p=0.8, q=1.0, u=None)


def rnd(i, info, n_acc=2, gamma=3):
    toks = [tok(f"d{k}", Outcome.ACCEPTED, k + 1, i) for k in range(n_acc)]
    if n_acc < gamma:
        toks.append(tok("x", Outcome.REJECTED, n_acc + 1, i))
    toks.append(tok("a", Outcome.RESAMPLED if n_acc < gamma else Outcome.BONUS, 0, i))
    return RoundEvent(index=i, gamma=gamma, draft_ids=[1] * gamma, q=[1.0] * gamma, p=[0.8] * gamma,
                      u=[], overlap=[0.8] * gamma, n_accepted=n_acc, appended_id=3, resampled=n_acc < gamma,
                      t_start=i + 0.1, t_draft=0.001, t_verify=0.05, t_end=i + 0.2, draft_forwards=0,
                      tokens=toks, total_tokens=(i + 1) * (n_acc + 1), info=info)


def suffix_info(where="prompt", label="the prompt", text="    return a + b", span="a + b", **kw):
    src = {"where": where, "label": label, "start": 40, "end": 43, "line_no": 12, "text": text, "span": span}
    return {"drafter": "suffix", "source": {**src, **kw}, "match_len": 5, "score": 2.4, "lookup_ms": 0.05}


def attrs(html: str) -> dict:
    head = html.split(">", 1)[0]
    return {k: htmllib.unescape(v) for k, v in re.findall(r' data-src-(\w+)="([^"]*)"', head)}


def test_a_copied_round_is_marked_and_carries_its_source():
    html = render.round_html(rnd(0, suffix_info()), "suffix")
    assert html.startswith('<span class="sv-round sv-from-text" data-round="1"')
    assert attrs(html) == {"where": "prompt", "from": "the prompt, line 12", "text": "    return a + b",
                           "span": "a + b", "n": "3", "match": "5"}
    # the round's tooltip note stays the method's own (MethodSpec.round_note), on every token


def test_other_rounds_are_not_marked():
    for info in ({}, {"drafter": "model", "source": None, "match_len": 0, "score": 0.0, "lookup_ms": 0.02},
                 {"drafter": "none", "source": None}):
        html = render.round_html(rnd(0, info), "hybrid")
        assert html.startswith('<span class="sv-round" data-round="1">') and "data-src" not in html
    assert render.round_html(rnd(0, {}), "draft") == render.round_html(rnd(0, {}))


def test_output_memory_and_forgotten_sources():
    out = attrs(render.round_html(rnd(1, suffix_info("output", "this output", line_no=3)), "suffix"))
    assert out["where"] == "output" and out["from"] == "this output, line 3"
    mem = attrs(render.round_html(rnd(1, suffix_info("memory", "your earlier run 2", line_no=0)), "hybrid"))
    assert mem["where"] == "memory" and mem["from"] == "your earlier run 2"  # no line 0
    priced = {**suffix_info(), "rate_suffix": 2.345, "rate_model": 1.5, "cost_steps": 1.8}
    assert attrs(render.round_html(rnd(1, priced), "hybrid"))["why"].startswith(
        "chosen over the draft model: 2.35 vs 1.50 expected tokens")
    assert "why" not in attrs(render.round_html(rnd(1, {**priced, "rate_model": None}), "hybrid"))
    gone = render.round_html(rnd(1, {"drafter": "suffix", "source": None, "match_len": 4}), "suffix")
    assert "sv-from-text" in gone and attrs(gone)["from"] == "a source no longer remembered"
    assert draft_source.chart_hover({"drafter": "model"}) == "draft model"


def test_source_text_cannot_become_markup():
    evil = '"><img src=x onerror=alert(1)><script>alert(2)</script>\ud800'
    html = render.round_html(rnd(0, suffix_info(text=evil, span=evil, label=evil)), "suffix")
    assert "<img" not in html and "<script" not in html and "\ud800" not in html
    html.encode("utf-8")
    a = attrs(html)
    assert a["text"] == evil.replace("\ud800", "\ufffd") and a["from"].startswith('"><img')
    # the card is built with textContent only: the pane's script never parses a source as HTML
    assert "innerHTML" not in draft_source.SOURCE_JS and "textContent" in draft_source.SOURCE_JS


def test_prompt_lines_are_hover_targets_with_the_same_text():
    html = render.prompt_span("def f(a, b):\n    return a + b\n<b>", chat=True)
    lines = re.findall(r'<span class="sv-pl">(.*?)</span>', html, re.S)
    assert [htmllib.unescape(x) for x in lines] == ["def f(a, b):\n", "    return a + b\n", "<b>"]
    assert "<b>" not in html and html.endswith("\n\n</span>")


def test_legend_css_and_script_are_on_the_page():
    assert "copied" in render.legend_html() and "sv-from-text" in render.legend_html()
    css = render.page_css()
    assert ".sv-from-text::before" in css and ".dark .sv-from-text" in css and ".dark .sv-src-hit" in css
    from specviz.ui.inspector import PANE_JS
    assert draft_source.SOURCE_JS in PANE_JS and "mouseover" in PANE_JS


def test_time_chart_marks_copied_rounds():
    view = RunView(gamma=3, temperature=0.0, mode="fair")
    view.add("speculative", rnd(0, {"drafter": "model", "source": None}))
    view.add("speculative", rnd(1, suffix_info()))
    fig = time_split_chart(view)
    marks = [d for d in fig.data if d.name and d.name.startswith("❝")]
    assert len(marks) == 1 and list(marks[0].x) == [2]
    assert marks[0].customdata[0] == "copied from the prompt, line 12"
    plain = RunView(gamma=3, temperature=0.0, mode="fair")
    plain.add("speculative", rnd(0, {}))
    assert not [d for d in time_split_chart(plain).data if d.name and d.name.startswith("❝")]


def test_a_trace_keeps_the_drafter_and_its_source():
    import json

    from specviz.run.trace import event_from_dict, event_to_dict
    r = rnd(2, suffix_info("memory", "preset output", text="x = 1\ny = 2", span="y = 2", line_no=2))
    back = event_from_dict(json.loads(json.dumps(event_to_dict(r))))
    assert back.info == r.info
    assert render.round_html(back, "suffix") == render.round_html(r, "suffix")  # a replay shows the same
