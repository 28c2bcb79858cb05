"""HTML rendering of tokens, legend, numbers and status (no gradio, no models)."""
import json
import re

import pytest

from specviz.engine.events import OUTCOME_COLOURS, Outcome, RoundEvent, RunSummary, TokenEvent
from specviz.ui import render
from specviz.ui.state import RunView


def tok(text, outcome=Outcome.ACCEPTED, **kw):
    base = dict(token_id=7, text=text, outcome=outcome, t=0.5, round=2, position=1, p=0.8, q=0.4, u=0.25)
    base.update(kw)
    return TokenEvent(**base)


@pytest.mark.parametrize("text", [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "a & b &amp; c",
    "\"quoted\" 'single'",
])
def test_token_text_is_escaped(text):
    html = render.token_span(tok(text))
    assert "<script" not in html and "<img" not in html
    inner = re.search(r">(.*)</span>$", html, re.S).group(1)
    assert inner == render.html.escape(text, quote=True)
    # the tooltip (an attribute) holds the text too, escaped with quotes
    title = re.search(r'title="([^"]*)"', html).group(1)
    assert "<" not in title and '"' not in title


def test_amp_entity_is_not_unescaped():
    html = render.token_span(tok("&amp;"))
    assert ">&amp;amp;</span>" in html


def test_lone_surrogate_does_not_crash_and_serialises():
    html = render.token_span(tok("x\ud800y"))
    assert "\ufffd" in html
    html.encode("utf-8")  # would raise on a lone surrogate
    json.dumps(html, ensure_ascii=False).encode("utf-8")
    # a valid surrogate pair (as some decoders produce) becomes the real character
    assert "😀" in render.esc("\ud83d\ude00")


def test_newlines_kept_and_marked():
    html = render.token_span(tok("\n", Outcome.TARGET, round=-1, position=0, q=None, u=None))
    assert "sv-nl" in html and ">\n</span>" in html
    assert "white-space: pre-wrap" in render.page_css()


@pytest.mark.parametrize("outcome", list(Outcome))
def test_css_class_per_outcome(outcome):
    html = render.token_span(tok("x", outcome))
    assert f"sv-{outcome.value}" in html
    css = render.page_css()
    assert f".sv-{outcome.value}" in css
    # each outcome's colour (Okabe-Ito) is used, also in dark mode rules
    r, g, b = (int(OUTCOME_COLOURS[outcome][i:i + 2], 16) for i in (1, 3, 5))
    assert f"rgba({r}, {g}, {b}" in css


def test_non_colour_cues():
    css = render.page_css()
    assert re.search(r"\.sv-rejected \{[^}]*line-through", css)
    assert re.search(r"\.sv-resampled \{[^}]*underline", css)
    assert re.search(r"\.sv-bonus \{[^}]*font-weight: 700[^}]*overline", css)
    assert ".dark .sv-accepted" in css  # dark mode variant


def test_tooltip_has_p_q_u_and_acceptance():
    t = render.tooltip(tok("x", Outcome.REJECTED, p=0.1, q=0.4, u=0.9))
    assert "p(x) = 0.1000" in t and "q(x) = 0.4000" in t and "u = 0.9000" in t
    assert "min(1, p/q) = 0.2500" in t
    assert "round 3" in t and "position 1" in t
    acc = render.tooltip(tok("x", Outcome.ACCEPTED, p=0.9, q=0.3, u=0.5))
    assert "min(1, p/q) = 1.0000" in acc
    res = render.tooltip(tok("x", Outcome.RESAMPLED, position=0, q=None, u=None, p=0.3))
    assert "p(x) = 0.3000" in res and "max(0, p − q)" in res
    bonus = render.tooltip(tok("x", Outcome.BONUS, position=0, q=None, u=None))
    assert "all drafts were accepted" in bonus
    # q = 0 must not divide by zero
    assert "n/a" in render.tooltip(tok("x", Outcome.REJECTED, q=0.0))


def test_legend_lists_all_outcomes():
    legend = render.legend_html()
    for o in Outcome:
        assert f'data-outcome="{o.value}"' in legend
        assert f"sv-{o.value}" in legend
    assert "p(x), q(x), u" in legend


def _round(i, tokens, n_acc, gamma=2, t=1.0):
    return RoundEvent(index=i, gamma=gamma, draft_ids=[1] * gamma, q=[0.5] * gamma, p=[0.5] * gamma,
                      u=[0.1] * min(n_acc + 1, gamma), overlap=[0.6] * gamma, n_accepted=n_acc,
                      appended_id=3, resampled=n_acc < gamma, t_start=t - 0.3, t_draft=0.2, t_verify=0.1,
                      t_end=t, draft_forwards=gamma, tokens=tokens,
                      total_tokens=(i + 1) * 2, total_drafted=(i + 1) * gamma, total_accepted=(i + 1) * n_acc,
                      target_forwards=i + 2)


def test_speculative_html_rounds_in_display_order():
    r = _round(0, [tok("a", Outcome.ACCEPTED), tok("b", Outcome.REJECTED, position=2),
                   tok("c", Outcome.RESAMPLED, position=0, q=None, u=None)], 1)
    html = render.speculative_html([r, _round(1, [tok("d", Outcome.BONUS, position=0, q=None, u=None)], 2)])
    assert html.count('class="sv-round"') == 2
    order = [m for m in re.findall(r"sv-(accepted|rejected|resampled|bonus)\b", html)]
    assert order == ["accepted", "rejected", "resampled", "bonus"]
    # append-only: a longer run starts with the shorter run's HTML (gradio then sends only the tail)
    assert html.startswith(render.speculative_html([r]))


def test_run_view_stats_badge_and_panels():
    view = RunView(gamma=2, temperature=0.0, mode="fair", prompt="p")
    for i in range(3):
        view.add("baseline", tok(str(i), Outcome.TARGET, t=0.5 * (i + 1), round=-1, position=0, q=None, u=None))
    view.add("speculative", _round(0, [tok("0", t=0.6), tok("1", Outcome.BONUS, t=0.6)], 2, t=0.6))
    snap = view.snapshot()
    assert snap["stats"]["alpha"] == 1.0 and snap["stats"]["rounds"] == 1
    assert snap["identical"] is None  # not finished yet
    base = RunSummary("baseline", "plain", [1, 2, 3], "", 3, 1.5, 0.5, 3, "max_new_tokens")
    spec = RunSummary("speculative", "draft", [1, 2, 3], "", 3, 0.9, 0.3, 2, "max_new_tokens",
                      rounds=2, drafted=4, accepted=3, draft_time=0.4, verify_time=0.2, draft_forwards=4,
                      overlap_sum=3.0, gamma=2)
    view.add("baseline", base)
    view.add("speculative", spec)
    snap = view.snapshot()
    assert snap["identical"] == {"identical": True, "first_diff": None}
    assert abs(snap["stats"]["speedup"] - (3 / 0.9) / (3 / 1.5)) < 1e-9
    info = render.run_info_html(snap)
    assert "identical outputs" in info and "fair" in info
    stats = render.stats_html(snap)
    assert "1.67×" in stats and "tokens/s" in stats and "target forward passes" in stats
    spec.token_ids = [1, 2, 4]
    badge = view.identical()  # no logit gaps in these events: cannot be called a near-tie
    assert badge["identical"] is False and badge["first_diff"] == 2 and badge["verdict"] == "mismatch"
    assert "differ from token 3" in render.run_info_html(view.snapshot())


def test_status_and_messages_escape():
    assert "sv-status-loading" in render.status_html({"loading": True, "message": "<b>x</b>", "frac": 0.5})
    assert "&lt;b&gt;" in render.status_html({"loading": True, "message": "<b>x</b>", "frac": 0.5})
    err = render.status_html({"loading": False, "ready": False, "error": "could not load '<x>'"})
    assert "could not load &#x27;&lt;x&gt;&#x27;" in err
    ok = render.status_html({"loading": False, "ready": True, "label": "A + B", "device": "cpu"})
    assert "A + B" in ok and "sv-status-ready" in ok
    assert "&lt;script&gt;" in render.message_html("<script>")


def test_charts_build_from_events():
    from specviz.ui.charts import all_charts
    view = RunView(gamma=2, temperature=0.0, mode="fair")
    assert len(all_charts(view)) == 4  # empty charts are fine
    view.add("baseline", tok("a", Outcome.TARGET, t=0.2, round=-1, position=0))
    view.add("baseline", tok("b", Outcome.TARGET, t=0.4, round=-1, position=0))
    view.add("speculative", _round(0, [tok("a"), tok("b", Outcome.REJECTED, position=2),
                                       tok("c", Outcome.RESAMPLED, position=0)], 1, t=0.5))
    # the predictions start at round PREDICT_FROM (the first rounds' α̂ rests on a few tokens, issue 59)
    # round 1's speedup point is left out (it also reads the prompt; issue 71): no line after one round
    assert [len(f.data) for f in all_charts(view)] == [2, 0, 2, 2]
    pos = all_charts(view)[3].data[1].y  # accepted ÷ tested per position: 1/1 then 0/1
    assert list(pos) == [1.0, 0.0]
    from specviz.ui.state import PREDICT_FROM
    for i in range(1, PREDICT_FROM):
        view.add("speculative", _round(i, [tok("a"), tok("b", Outcome.BONUS, position=0)], 2, t=0.5 + 0.3 * i))
    figs = all_charts(view)
    # speedup chart: measured, Leviathan's and the verify-cost-aware prediction
    assert [len(f.data) for f in figs] == [2, 3, 2, 2]
    assert [p[2] is None for p in view.speedup_series] == [True] * (PREDICT_FROM - 1) + [False]
    # one name per measure (issue 59: "kept ÷ drafted", "kept ÷ tested", "rate"): the glossary's names
    from specviz.ui.glossary import MEANING
    names = {t.name for f in (figs[0], figs[3]) for t in f.data} - {"this round", "so far"}
    assert names <= set(MEANING), names
    assert "accepted ÷ drafted" in figs[3].layout.yaxis.title.text


def test_draft_size_cells_name_acceptance_as_the_page_does():
    """The Draft size tab wrote "α 0.80" (accepted ÷ drafted) beside an "α̂" column (issue 59)."""
    from specviz.ui import draft_size_plot as dsp
    size = dict(name="d", label="draft", measured_best=2, theory_best=2, alpha_hat=0.9, c=0.2,
                rows=[dict(gamma=2, speedup=1.5, alpha=0.8, theory=1.6, tps=3.0, tau=2.0, c=0.2)])
    data = dict(gammas=[2], sizes=[size])
    table = dsp.table_md(data)
    assert "α " not in table and "1.50× ★○ · 0.80" in table
    assert "accepted ÷ drafted" in dsp.heatmap(data).layout.title.text and "accepted ÷ drafted" in dsp.CELL
    assert "| accepted ÷ drafted |" in dsp.best_md(data, ref="d")


@pytest.mark.parametrize("text", ["\n", "\n\n", "x\ny", "\r\n"])
def test_rejected_newline_is_a_symbol_not_a_line_break(text):
    html = render.token_span(tok(text, Outcome.REJECTED))
    shown = html[html.index(">") + 1:]  # the text inside the span (the tooltip may hold line breaks)
    assert "\n" not in shown and "\r" not in shown and render.NL_SYMBOL in shown
    assert "sv-nl" not in html  # no second ↵ from the CSS
    # kept tokens keep their real line breaks (they are part of the output)
    kept = render.token_span(tok(text, Outcome.ACCEPTED))
    assert "\n" in kept[kept.index(">") + 1:]


def test_a_special_token_shows_as_a_marker_not_text():
    """A sampled chat run may end on <|im_end|>: the pane shows it as a marker (a visitor read
    the raw token as output text); ordinary text that merely contains "<|" stays text."""
    from specviz.engine.events import Outcome, TokenEvent
    from specviz.ui.render import token_span
    end = token_span(TokenEvent(token_id=151645, text="<|im_end|>", outcome=Outcome.TARGET, t=1.0, p=0.9))
    assert "sv-special" in end and "special token" in end and "&lt;|im_end|&gt;" in end
    plain = token_span(TokenEvent(token_id=5, text="a <| b", outcome=Outcome.TARGET, t=1.0, p=0.9))
    assert "sv-special" not in plain


def test_what_a_screen_reader_and_a_keyboard_get():
    """An axe-core audit (2026-11-28, ui/access.py): a rejected draft read as output, a legend list
    with no items, an empty table header, low-contrast cues in light mode."""
    rejected = render.token_span(tok("pi", Outcome.REJECTED), (0, 0))
    assert "<del>pi</del>" in rejected and 'data-o="rejected"' in rejected
    assert "<del>" not in render.token_span(tok("pi", Outcome.ACCEPTED), (0, 0))
    legend = render.legend_html()
    assert legend.count('class="sv-legend-item') == legend.count('role="listitem"') >= 7
    box = render.stats_html(RunView(4, 0.0, "fair").snapshot())
    assert "<th></th>" not in box and "sv-sr" in box
    css = render.page_css()
    for line in ("#a04000", "#8a6000", "#8a8a8a", ".sv-sr", "--body-text-color-subdued",
                 "--button-primary-background-fill: #c2410c", ".sv-tok[data-r]:focus-visible"):
        assert line in css, line
    assert ".sv-prompt { opacity: .7; }" in css
    from specviz.ui import access, inspector
    assert access.PANE_KEYS_JS in inspector.PANE_JS
