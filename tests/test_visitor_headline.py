"""Issue 59's visitor findings, without a browser: the headline counts the tokens copied from earlier
runs' memory (and a run with fresh memory reads none), and the prediction box agrees with the method
that ran, naming the α̂, γ, c and v it used (one v), its curves starting once α̂ rests on some rounds.
The browser tests of the same findings: tests/test_browser_visitor59.py."""
import re
from types import SimpleNamespace

import pytest
from test_suffix import _gen, _suffix

from specviz.engine.costs import CostModel
from specviz.engine.events import Outcome, RoundEvent, RunSummary, TokenEvent
from specviz.engine.proposers import make_proposer
from specviz.engine.suffix_tree import Memory
from specviz.run.request import make_request
from specviz.ui import render
from specviz.ui.charts import speedup_chart, speedup_top
from specviz.ui.draft_source import memory_tokens
from specviz.ui.speedup_box import _v_chip
from specviz.ui.state import PREDICT_FROM, RunView


def _src(where, label):
    return {"where": where, "label": label, "start": 0, "end": 3, "line_no": 1, "text": "x", "span": "x"}


def _round(i, n_acc, gamma=3, info=None, t=None, draft_forwards=0, bonus=True, prompt=0, verify=0.02):
    t = 0.1 * (i + 1) if t is None else t
    toks = [TokenEvent(7, "a", Outcome.ACCEPTED, t, i, k + 1) for k in range(n_acc)]
    if n_acc < gamma:
        toks.append(TokenEvent(8, "b", Outcome.REJECTED, t, i, n_acc + 1))
    toks.append(TokenEvent(9, "c", Outcome.BONUS if bonus and n_acc == gamma else Outcome.RESAMPLED, t, i, 0))
    return RoundEvent(index=i, gamma=gamma, draft_ids=[7] * gamma, q=[1.0] * gamma, p=[0.9] * gamma,
                      u=[0.1] * min(n_acc + 1, gamma), overlap=[0.9] * gamma, n_accepted=n_acc, appended_id=9,
                      resampled=n_acc < gamma, t_start=t - 0.05, t_draft=0.01 * draft_forwards,
                      t_verify=verify, t_end=t, draft_forwards=draft_forwards, tokens=toks,
                      prompt_tokens=prompt, info=info or {})


def test_only_accepted_drafts_from_earlier_runs_count():
    mem = {"drafter": "suffix", "source": _src("memory", "your earlier run 2")}
    rounds = [
        _round(0, 3, info=mem),  # 3 accepted (the bonus is the target's): 3
        _round(1, 1, info=mem),  # 1 accepted, 1 rejected, 1 resampled: 1
        _round(2, 3, info={"drafter": "suffix", "source": _src("prompt", "the prompt")}),  # this run's text
        _round(3, 3, info={"drafter": "suffix", "source": _src("output", "this output")}),
        _round(4, 2, info={"drafter": "model", "source": None}),  # the draft model's
        _round(5, 2, info={"drafter": "suffix", "source": None}),  # evicted since: an earlier output's
        _round(6, 0, gamma=0, info={"drafter": "none", "source": None}),
    ]
    assert memory_tokens(rounds) == 3 + 1 + 2


def _suffix_view(method="hybrid", fresh=False, copied=True) -> RunView:
    view = RunView(gamma=4, temperature=0.0, mode="fair")
    view.method, view.fresh_memory, view.reads_memory = method, fresh, not fresh
    view.costs = CostModel(plain_step_s=0.01, verify_s=tuple(0.01 + 0.001 * (n - 1) for n in range(1, 18)),
                           draft_step_s=0.002)
    src = _src("memory", "a preset's earlier output") if copied else _src("prompt", "the prompt")
    n = 0
    for i in range(8):
        model = i % 2 == 1 and method == "hybrid"
        info = {"drafter": "model", "source": None} if model else {"drafter": "suffix", "source": src}
        r = _round(i, 3, info=info, draft_forwards=3 if model else 0, prompt=5 if i == 0 else 0)
        n += 4
        r.total_tokens, r.total_drafted, r.total_accepted, r.target_forwards = n, 3 * (i + 1), 3 * (i + 1), i + 1
        view.add("speculative", r)
    for k in range(n):
        view.add("baseline", TokenEvent(1, "x", Outcome.TARGET, 0.05 + 0.04 * k, -1, 0))
    return view


def test_the_headline_counts_the_tokens_copied_from_earlier_runs():
    snap = _suffix_view().snapshot()
    assert snap["memory"] == {"copied": 12, "tokens": 32, "fresh": False, "reads": True,  # 4 rounds × 3
                              "shared": False}
    box = render.stats_html(snap)
    assert "<b>12 of 32 tokens</b> copied from earlier runs (this session's own)" in box and "fresh memory" in box
    # the headline itself names it (issue 71): the big number, then the share copied
    num = re.search(r"<span class='sv-speedup-num'>(.*?)</span></span>", box).group(1)
    assert re.sub(r"<[^>]+>", "", num) == f"{snap['stats']['speedup']:.2f}× · 12 of 32 tokens copied from earlier runs"
    # a fresh-memory run says so; a run that copied nothing from memory says 0; a draft run says nothing
    assert "fresh memory: copied from this run's prompt and output only" in render.stats_html(
        _suffix_view(fresh=True, copied=False).snapshot())
    nothing = render.stats_html(_suffix_view(copied=False).snapshot())
    assert "<b>0 of 32 tokens</b> copied from earlier runs" in nothing and "sv-speedup-copied" not in nothing
    shared = _suffix_view()
    shared.shares_memory = True  # "share memory" ticked: the box says whose runs those were
    assert "other visitors' runs of the presets" in render.stats_html(shared.snapshot())
    view = _suffix_view(copied=False)  # a run with no session memory to read (a race, the CLI): no word
    view.reads_memory = False
    assert "sv-speedup-mem" not in render.stats_html(view.snapshot())
    view.method = "draft"
    assert view.snapshot()["memory"] is None and "sv-speedup-mem" not in render.stats_html(view.snapshot())


def test_a_fresh_memory_run_reads_no_earlier_output(tok, target):
    """The engine side of "fresh memory": the same text again copies from the first run's output,
    unless the run is fresh; a fresh run's output is still remembered for later runs."""
    mem, V = Memory(), target.config.vocab_size
    text = "zq xv zq xv"
    _gen(target, tok, _suffix(V, memory=mem, scope="a", write_scope="a"), text)
    again, _ = _gen(target, tok, _suffix(V, memory=mem, scope="a", write_scope="a"), text)
    fresh, _ = _gen(target, tok, _suffix(V, memory=mem, scope="a", write_scope="a", read_memory=False), text)
    assert memory_tokens(again) > 0 and memory_tokens(fresh) == 0
    assert len(mem.tree("a").docs) == 3


def test_fresh_memory_goes_from_the_request_to_the_proposer(tiny_pair):
    assert make_request("x", method="suffix", fresh_memory=True).fresh_memory
    assert not make_request("x", method="suffix", fresh_memory="yes").fresh_memory  # a checkbox's True only
    req = SimpleNamespace(scope="s", prompt="not a preset", options={}, fresh_memory=True)
    assert make_proposer(tiny_pair, "suffix", req).read_memory is False
    assert make_proposer(tiny_pair, "hybrid", req).suffix.read_memory is False
    req.fresh_memory = False
    assert make_proposer(tiny_pair, "suffix", req).read_memory is True
    # share memory: off unless the visitor ticks it (issue 71), a checkbox's True only
    assert not make_request("x", method="suffix").share_memory
    assert make_request("x", method="suffix", share_memory=True).share_memory
    assert not make_request("x", method="suffix", share_memory="yes").share_memory
    assert make_proposer(tiny_pair, "suffix", req).read_shared is False
    req.share_memory = True
    assert make_proposer(tiny_pair, "suffix", req).read_shared is True


def test_a_hybrid_run_predicts_nothing_in_its_box_nor_on_its_chart():
    """Issue 59: its box said drafts copied from text cost no draft steps while its draft model ran
    (c 0.90), and the chart drew prediction curves."""
    view = _suffix_view()
    snap = view.snapshot()
    line = re.search(r"sv-speedup-sub'>([^<]*)<", render.stats_html(snap)).group(1)
    c = snap["stats"]["c"]
    assert line == (f"no prediction: 4 rounds copied text (no draft step) and 4 ran the draft model "
                    f"(c {c:.3f}); the chain formula prices one drafter every round")
    assert f"<b>c</b> {c:.3f}" in render.stats_html(snap)
    assert all(p[2] is None and p[3] is None for p in view.speedup_series)
    fig = speedup_chart(view)
    assert [t.name for t in fig.data] == ["measured"] and "no prediction" in fig.layout.title.text
    # the engine's summary at the end says the same (decoding.speculative: chain_formula False)
    assert "no prediction: drafts copied from text" in render.stats_html(_suffix_view("suffix").snapshot())


def test_the_box_names_every_round_of_a_hybrid_run():
    """A visitor read "8 rounds copied text (no draft step) and 1 ran the draft model" beside a rounds
    chip of 10 (2026-11-28): the round that drafted nothing was not named."""
    view = _suffix_view()
    r = _round(8, 0, gamma=0, info={"drafter": "none", "source": None}, t=0.95)
    r.total_tokens, r.total_drafted, r.total_accepted, r.target_forwards = 33, 24, 24, 9
    view.add("speculative", r)
    view.add("baseline", TokenEvent(1, "x", Outcome.TARGET, 1.5, -1, 0))
    line = re.search(r"sv-speedup-sub'>([^<]*)<", render.stats_html(view.snapshot())).group(1)
    assert "4 rounds copied text (no draft step), 4 ran the draft model (c " in line
    assert line.endswith(" and 1 drafted nothing (a plain step); the chain formula prices one drafter every round")
    # and that round's one token looks like a plain step's, not a bonus after accepted drafts
    html = render.round_html(r, "hybrid")
    assert "sv-target" in html and "sv-bonus" not in html and 'data-o="bonus"' in html
    assert "a plain step: nothing was drafted this round" in html and "all drafts were accepted" not in html
    assert "sv-bonus" in render.round_html(view.spec.rounds[0], "hybrid")  # a round that drafted keeps it


def _draft_view(drafted=(5, 5, 5, 5, 5, 2)) -> RunView:
    view = RunView(gamma=5, temperature=0.0, mode="fair")
    view.costs = CostModel(plain_step_s=0.01, verify_s=tuple(0.01 + 0.001 * (n - 1) for n in range(1, 18)))
    n = d = a = 0
    for i, g in enumerate(drafted):
        r = _round(i, g - 1, gamma=g, draft_forwards=g, prompt=5 if i == 0 else 0, verify=0.012)
        n, d, a = n + g, d + g, a + g - 1
        r.total_tokens, r.total_drafted, r.total_accepted, r.target_forwards = n, d, a, i + 1
        view.add("speculative", r)
    for k in range(n):
        view.add("baseline", TokenEvent(1, "x", Outcome.TARGET, 0.05 + 0.04 * k, -1, 0))
    return view


def test_a_draft_runs_box_names_the_values_it_used():
    """One v chip, its value in the line with α̂, γ and c; and which γ: the mean drafted, said so."""
    html = render.stats_html(_draft_view().snapshot())
    line = re.search(r"sv-speedup-sub'>([^<]*)<", html).group(1)
    assert re.match(r"predicted [0-9.]+× at α̂ 0\.900, γ 4\.50, c [0-9.]+, v [0-9.]+ measured in this run · "
                    r"[0-9.]+× by Leviathan \(v = 1\) · γ 4\.50 = the mean drafted per round \(you set 5; ",
                    line), line
    assert html.count("<b>verify cost v</b>") == 1 and "v at calibration" not in html
    v = re.search(r"v ([0-9.]+) measured in this run", line).group(1)
    assert f"<b>verify cost v</b> {v} steps · this run" in html
    assert "γ 5.00 =" not in render.stats_html(_draft_view((5, 5, 5, 5)).snapshot())  # as set: no word


def test_one_v_chip_says_whose_v_it_is():
    name, v, fmt, tip = _v_chip({"verify_cost": None, "verify_cost_calibrated": 1.18}, "γ+1 tokens")
    assert (name, v, fmt.format(v)) == ("verify cost v", 1.18, "1.18 steps · calibration")
    name, v, fmt, tip = _v_chip({"verify_cost": 1.0, "verify_cost_calibrated": 1.18}, "γ+1 tokens")
    assert fmt.format(v) == "1.00 steps · this run" and "At calibration the same pass cost 1.18" in tip


def test_predictions_start_after_a_few_rounds_and_never_stretch_the_axis():
    view = _draft_view((5,) * 8)
    held = [p[2] is None for p in view.speedup_series]
    assert held[:PREDICT_FROM - 1] == [True] * (PREDICT_FROM - 1) and not any(held[PREDICT_FROM - 1:])
    box = re.search(r"sv-speedup-sub'>([^<]*)<", render.stats_html(_draft_view((5, 5, 5)).snapshot())).group(1)
    assert box.startswith(f"predicted –: from round {PREDICT_FROM} on"), box
    # an early prediction of 6.5× beside a 1.5× run: the axis ends near the run and its final prediction
    pts = [(0.1, None, 6.5, 6.4), (0.2, 1.2, 3.0, 2.9), (0.3, 1.5, 1.7, 1.6)]
    assert speedup_top(pts) == pytest.approx(1.15 * 1.7)


# ------------------------------------------------------------ issue 71: short runs

def _short_view(rounds=1) -> RunView:
    """A finished run of `rounds` rounds (max new tokens 1: one target pass a side)."""
    view = RunView(gamma=4, temperature=0.0, mode="fair")
    for i in range(rounds):
        r = _round(i, 0, gamma=1, prompt=5 if i == 0 else 0, t=0.3 * (i + 1))
        r.total_tokens, r.total_drafted, r.total_accepted, r.target_forwards = i + 1, i + 1, 0, i + 1
        view.add("speculative", r)
    for k in range(rounds):
        view.add("baseline", TokenEvent(1, "x", Outcome.TARGET, 0.8 * (k + 1), -1, 0))
    view.add("speculative", RunSummary("speculative", "draft", [9] * rounds, "", rounds, 0.3 * rounds, 0.3,
                                       rounds, "max_new_tokens", rounds=rounds, drafted=rounds))
    view.add("baseline", RunSummary("baseline", "plain", [1] * rounds, "", rounds, 0.8 * rounds, 0.8, rounds,
                                    "max_new_tokens"))
    return view


def test_a_one_round_run_shows_its_numbers_with_the_reason_not_a_headline():
    """Issue 71: with max new tokens 1, three runs headlined 2.77×, 1.10× and 0.64×; the README promises
    no figure before two rounds."""
    snap = _short_view().snapshot()
    assert snap["finished"] and snap["stats"]["rounds"] == 1 and snap["stats"]["speedup"] == pytest.approx(8 / 3)
    html = render.stats_html(snap)
    assert "<span class='sv-speedup-num'>–</span>" in html and "sv-good" not in html.split("sv-table")[0]
    assert "<span class='sv-speedup-label'>no headline: fewer than 2 rounds</span>" in html
    line = re.search(r"sv-speedup-sub'>([^<]*)<", html).group(1)
    assert line == ("1 round only, which also read the prompt: too short for a headline (shown from 2 rounds) · "
                    "measured 2.67× (speculative 3.33 ÷ baseline 1.25 tokens/s), not a speedup · "
                    "predicted –: no draft step timed yet (c unknown)")
    # two rounds: the headline, as before
    two = render.stats_html(_short_view(2).snapshot())
    assert "<span class='sv-speedup-num'>2.67×</span>" in two and "measured speedup" in two


def test_the_speedup_chart_leaves_round_1_out():
    """Issue 71: the chart began at a round-1 spike (6.43×); that round also reads the prompt."""
    view = _draft_view((5,) * 6)
    fig = speedup_chart(view)
    measured = next(t for t in fig.data if t.name == "measured")
    assert list(measured.x) == [p[0] for p in view.speedup_series[1:]]  # every point but round 1's
    assert view.speedup_series[0][1] is not None  # it was measured: left out on purpose
    assert "round 1 left out" in fig.layout.xaxis.title.text
    short = speedup_chart(_short_view())  # one round: no line at all, and why
    assert not short.data and "too short: fewer than 2 rounds" in short.layout.annotations[0].text


def test_the_headline_says_the_prompt_read_is_in_it_and_shows_the_figure_without():
    """Issue 71: the box says whether the prompt read is counted, and shows the other figure."""
    from specviz.engine.events import RunSummary
    from specviz.engine.metrics import after_prompt_speedup
    base = RunSummary(side="baseline", method="plain", token_ids=[], text="", n_tokens=11, elapsed=2.0,
                      prefill=1.0, target_forwards=11, stop_reason="max_new_tokens")
    spec = RunSummary(side="speculative", method="draft", token_ids=[], text="", n_tokens=11, elapsed=1.0,
                      prefill=0.5, target_forwards=4, stop_reason="max_new_tokens")
    # plain: 1.0 s for 10 tokens after the first; speculative: 0.5 s for 8 tokens after round 1's 3
    assert after_prompt_speedup(base, spec, 3) == pytest.approx((1.0 / 10) / (0.5 / 8))
    assert after_prompt_speedup(base, spec, 11) is None  # nothing after the prompt read yet
    from specviz.ui.speedup_box import after_prompt_html
    html = after_prompt_html({"stats": {"after_prompt": 1.6}}, 2.0)
    assert "1.60× without the prompt read" in html
    assert after_prompt_html({"stats": {"after_prompt": 1.6}}, None) == ""  # no headline: no figure beside
    from specviz.ui.glossary import MEANING
    assert "prompt read included" in MEANING["speedup"]
