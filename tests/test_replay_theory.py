"""Theory explorer figures, record & replay through the page's rendering path,
shipped traces. In process, tiny random pair, no server."""
import json
import threading

import pytest

from specviz.engine.events import Outcome, RoundEvent
from specviz.engine.theory import best_gamma
from specviz.engine.theory import expected_tokens as expected_tokens_per_round
from specviz.engine.theory import speedup as predicted_speedup
from specviz.run.race import race
from specviz.run.request import encode_prompt, make_request
from specviz.run.trace import record, trace_for
from specviz.ui import render, theory
from specviz.ui import replay as rp
from specviz.ui.panes import PaneStream
from specviz.ui.state import RunView


def no_sleep(_):
    pass


# ---------------------------------------------------------------- theory


def _trace(fig, name_start):
    return next(t for t in fig.data if (t.name or "").startswith(name_start))


@pytest.mark.parametrize("alpha, gamma, c", [(0.8, 4, 0.2), (0.5, 1, 0.0), (0.95, 16, 0.05), (0.0, 3, 1.0)])
def test_gamma_figure_follows_metrics(alpha, gamma, c):
    fig = theory.gamma_figure(alpha, gamma, c)
    speed = _trace(fig, "predicted speedup")
    assert list(speed.x) == list(range(1, 17))
    assert list(speed.y) == pytest.approx([predicted_speedup(alpha, g, c) for g in range(1, 17)])
    tokens = _trace(fig, "E[tokens")
    assert list(tokens.y) == pytest.approx([expected_tokens_per_round(alpha, g) for g in range(1, 17)])
    assert tokens.yaxis == "y2"
    best = _trace(fig, "optimal γ")
    assert best.x[0] == best_gamma(alpha, c) and best.marker.symbol == "star"
    assert best.y[0] == pytest.approx(max(speed.y))
    chosen = _trace(fig, "chosen γ")
    assert chosen.x[0] == gamma
    assert not any("measured" in (t.name or "") for t in fig.data)


def test_alpha_figure_follows_metrics():
    fig = theory.alpha_figure(0.6, 5, 0.3)
    speed = _trace(fig, "predicted speedup")
    assert speed.x[0] == 0 and speed.x[-1] == pytest.approx(0.99)
    assert list(speed.y) == pytest.approx([predicted_speedup(a, 5, 0.3) for a in speed.x])
    assert _trace(fig, "chosen α").x[0] == pytest.approx(0.6)
    even = theory.break_even_alpha(5, 0.3)
    assert predicted_speedup(even, 5, 0.3) >= 1 > predicted_speedup(even - 0.001, 5, 0.3)
    assert theory.break_even_alpha(4, 0.0) == 0.0


@pytest.mark.parametrize("c", [0.2, 0.0])
def test_expected_tokens_line_is_seen(c):
    """Issue 71: on an axis of its own, autoscaled from zero, the dashed E[tokens] line lay exactly under
    the speedup line over α (the two are proportional there). One scale now: E sits above the speedup
    by the round's cost (γc + 1), and where they are equal (c = 0) it is drawn over it, and said."""
    for fig in (theory.gamma_figure(0.7, 4, c), theory.alpha_figure(0.7, 4, c)):
        assert fig.layout.yaxis2.matches == "y"
        tokens, speed = _trace(fig, "E[tokens"), _trace(fig, "predicted speedup")
        assert list(fig.data).index(tokens) > list(fig.data).index(speed)  # dashed, over the solid line
        assert tokens.line.dash == "dash" and tokens.line.color != speed.line.color
        gaps = [e / s for e, s in zip(tokens.y, speed.y, strict=True)]
        notes = [a.text for a in fig.layout.annotations if "one line" in (a.text or "")]
        if c:
            assert min(gaps) >= 1 + 0.2 - 1e-9 and not notes  # the least cost: γ = 1, 1 + c
        else:
            assert gaps == pytest.approx([1.0] * len(gaps)) and notes


def test_measured_point_is_overlaid():
    m = theory.Measured(alpha_hat=0.72, c=0.31, gamma=4, speedup=1.21, predicted=1.6, tau=3.1, verify_cost=1.8)
    g, a = theory.figures(0.5, 8, 0.1, m.to_dict())
    pg, pa = _trace(g, "measured"), _trace(a, "measured")
    assert (pg.x[0], pg.y[0]) == (4, 1.21) and pg.marker.symbol == "diamond"
    assert (pa.x[0], pa.y[0]) == (pytest.approx(0.72), 1.21)
    # the theory curve at the run's own α̂ and c goes through its prediction
    assert _trace(g, "theory at the run").y[3] == pytest.approx(predicted_speedup(0.72, 4, 0.31))
    html = theory.measured_html(m)
    assert "1.21×" in html and "1.80" in html  # verify cost explains the gap
    assert "appears on both charts" in theory.measured_html(None)
    # no measured speedup (no baseline): the theory curve, no point
    g2, _ = theory.figures(0.5, 8, 0.1, theory.Measured(0.7, 0.3, 4, None, 1.5))
    assert not any((t.name or "").startswith("measured") for t in g2.data)


def test_a_token_tree_run_is_not_placed_on_the_chain_formula():
    """The live page says the chain formula does not describe a token tree; the theory tab had
    still put the tree's point and "theory at the run" curve on its charts."""
    m = theory.Measured(alpha_hat=0.9, c=0.4, gamma=4, speedup=1.52, predicted=None, method="tree")
    for fig in theory.figures(0.5, 8, 0.1, m.to_dict()):
        assert not any((t.name or "").startswith(("measured", "theory at the run")) for t in fig.data)
    html = theory.measured_html(m)
    assert "token tree" in html and "1.52×" in html and "not placed" in html
    assert theory.measured_updates(m, 0.5, 8, 0.1)[-1].interactive is False  # no "set the sliders"


def test_numbers_and_clamping():
    html = theory.numbers_html(0.8, 4, 0.2)
    assert f"{predicted_speedup(0.8, 4, 0.2):.2f}×" in html and f"{expected_tokens_per_round(0.8, 4):.2f}" in html
    assert f"best γ here is <b>{best_gamma(0.8, 0.2)}</b>" in html
    fig = theory.gamma_figure(1.5, 99, -1)  # out-of-range API input is clamped, not an error
    assert _trace(fig, "chosen γ").x[0] == 16
    assert "α = 0.99" in fig.layout.title.text and "c = 0.00" in fig.layout.title.text


# ---------------------------------------------------------------- live vs replay


@pytest.fixture(scope="module")
def pair(tiny_pair):
    return tiny_pair  # loaded once per session (conftest.py)


def live(pair, req, mode="fair", stop=None):
    """What blocks.run does with a race: record it and render it through PaneStream."""
    ids = encode_prompt(pair.tokenizer, req)
    view = RunView(req.gamma, req.temperature, mode, req.prompt, req.chat_template)
    view.method = req.method
    head = render.prompt_span(req.prompt, req.chat_template and pair.has_chat_template)
    kept = []
    tr = trace_for(req, pair, mode, "test run")
    panes = PaneStream(view, head)
    updates = list(panes.follow(record(race(pair, req, ids, mode, stop=stop), tr, on_end=kept.append)))
    return panes, updates, kept


@pytest.mark.parametrize("method, temperature", [("draft", 0.0), ("lookup", 0.0), ("adaptive", 0.8)])
def test_replay_renders_like_the_live_run(pair, tmp_path, method, temperature):
    req = make_request("abcabc def f(x): abcabc", method=method, gamma=3, max_new_tokens=20, temperature=temperature,
                       top_p=1.0, top_k=0, seed=5, chat_template=False)
    panes, _, kept = live(pair, req)
    assert len(kept) == 1
    tr = kept[0]
    assert tr.meta["settings"]["method"] == method and tr.meta["pair_label"]
    path = tr.save(tmp_path / "run.json")
    back = rp.load_for_replay(path)  # through JSON and back
    outs = list(rp.play(back, speed=1e6, sleep=no_sleep))
    final, want = outs[-1], panes.outputs(charts=True)
    assert final[0] == want[0], "baseline pane differs"
    assert final[1] == want[1], "speculative pane differs"
    assert final[2] == want[2], "numbers differ"
    banner = rp.banner_html(back.meta, 1e6)
    assert final[3] == banner + want[3]
    assert "not live" in banner and back.meta["hardware"] in banner
    for f, w in zip(final[4:], want[4:], strict=False):
        assert f.to_json() == w.to_json()
    if temperature == 0 and method != "adaptive":
        assert "identical outputs" in final[3]
    # the measured point for the theory tab comes from the same numbers
    m = rp.measured_from(back)
    st = panes.view.stats()
    assert m.alpha_hat == pytest.approx(st["alpha_hat"]) and m.speedup == pytest.approx(st["speedup"])


@pytest.fixture(scope="module")
def recorded(pair):
    req = make_request("def f(x):", method="draft", gamma=4, max_new_tokens=24, temperature=0.0)
    panes, _, (tr,) = live(pair, req)
    return panes, tr


def test_rounds_csv_and_export(recorded, tmp_path):
    panes, tr = recorded
    text = rp.rounds_csv(tr)
    rows = [r.split(",") for r in text.strip().splitlines()]
    head, body = rows[0], rows[1:]
    assert head[:5] == ["round", "gamma", "accepted", "appended", "new_tokens"]
    assert len(body) == len(panes.view.spec.rounds)
    last = dict(zip(head, body[-1], strict=False))
    spec = tr.summaries()["speculative"]
    assert float(last["alpha_so_far"]) == pytest.approx(spec.accepted / spec.drafted, abs=1e-4)
    assert int(last["total_tokens"]) == spec.n_tokens
    assert {r[3] for r in body} <= {"bonus", "resampled", "none"}
    js, cs = rp.export(tr, tmp_path / "out")
    assert rp.load_for_replay(js).events == tr.events and cs.read_text() == text


def test_stopped_live_run_is_recorded(pair):
    stop = threading.Event()
    req = make_request("def f(x):", method="draft", gamma=2, max_new_tokens=400, temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)
    kept = []
    gen = record(race(pair, req, ids, "fair", stop=stop), trace_for(req, pair, "fair"), on_end=kept.append)
    for i, _ in enumerate(gen):
        if i == 5:
            stop.set()
    (tr,) = kept
    assert {s.stop_reason for s in tr.summaries().values()} == {"stopped"}


def test_replay_can_be_stopped(recorded):
    _, tr = recorded
    stop = threading.Event()
    outs = []
    for out in rp.play(tr, speed=1e-3, stop=stop, ui_interval=0.0):  # far too slow to finish
        outs.append(out)
        stop.set()
    assert len(outs) == 2  # the first frame, then the stopped final state
    assert "replay stopped by you" in outs[-1][3] and "not live" in outs[-1][3]


@pytest.mark.parametrize("content, message", [
    ("{not json", "not a SpecViz trace"),
    ("[1, 2, 3]", "not a SpecViz trace"),
    ('{"version": 99, "meta": {}, "events": []}', "unsupported trace version"),
    ('{"version": 1, "meta": {}, "events": []}', "no events"),
    ('{"version": 1, "meta": {}, "events": [{"side": "baseline", "type": "nope"}]}', "not a SpecViz trace"),
    ('{"version": 1, "meta": {}, "events": [{"side": "baseline", "type": "token", "token_id": 1, "text": "a", '
     '"outcome": "purple", "t": 0.1}]}', "not a SpecViz trace"),
    ('{"version": 1, "meta": {}, "events": [{"side": "x", "type": "token", "token_id": 1, "text": "a", '
     '"outcome": "target", "t": 0.1}]}', "unknown side"),
    ('{"version": 1, "meta": {}, "events": [{"side": "baseline", "type": "token", "token_id": 1, "text": "a", '
     '"outcome": "target", "t": "soon"}]}', "event time"),
    ('{"version": 1, "meta": {"settings": {"gamma": "many"}}, "events": [{"side": "baseline", "type": "token", '
     '"token_id": 1, "text": "a", "outcome": "target", "t": 0.1}]}', "wrong type"),
])
def test_bad_uploads_are_clear_errors(tmp_path, content, message):
    p = tmp_path / "bad.json"
    p.write_text(content)
    with pytest.raises(ValueError, match=message):
        rp.load_for_replay(p)


def test_binary_upload_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.json"
    p.write_bytes(b"\x89PNG\r\n\x1a\n\xff\xfe")
    with pytest.raises(ValueError, match="not a SpecViz trace"):
        rp.load_for_replay(p)


# ---------------------------------------------------------------- shipped traces


def test_shipped_traces_load_and_replay():
    files = sorted(rp.TRACES_DIR.glob("*.json"))
    assert 2 <= len(files) <= 6, files  # a handful, small: the repo stays small
    traces = rp.shipped()
    assert set(traces) == {f.name for f in files}, "a shipped trace does not load"
    methods = set()
    for f in files:
        assert f.stat().st_size < 300_000, f
        tr = traces[f.name]
        meta = tr.meta
        assert meta["label"] and meta["hardware"] and meta["recorded"] and meta["precision"]
        assert set(tr.summaries()) == {"baseline", "speculative"}
        methods.add(meta["settings"]["method"])
        final = list(rp.play(tr, speed=1e6, sleep=no_sleep))[-1]
        assert "sv-round" in final[1] and "sv-target" in final[0]
        assert "not live" in final[3] and "measured speedup" in final[2]
        assert rp.measured_from(tr) is not None
        assert json.loads(tr.to_json())["version"] == 1
        rounds = [e for _, e in tr.events if isinstance(e, RoundEvent)]
        # issue 21: the inspector can show every shipped trace (chain rounds keep top-k p/q rows,
        # tree rounds their node p/q), and a greedy trace shows rejections
        assert rounds and all(r.dists or r.tree for r in rounds), f
        if meta["settings"]["temperature"] == 0 and any(
                t.outcome is Outcome.REJECTED for r in rounds for t in r.tokens):
            methods.add("greedy-with-rejections")
    assert {"draft", "lookup", "tree", "greedy-with-rejections"} <= methods


def test_records_delete_a_forgotten_sessions_files(recorded):
    _, recorded = recorded
    records = rp.Records(keep=2)
    for key in "abc":
        records.put(key, recorded)
        rp.export(recorded, records.folder(key))
    assert not records.folder("a").exists()  # evicted with its session
    assert all(any(records.folder(k).glob("specviz-*.json")) for k in "bc")


def test_measured_v_curve_option():
    curve = [1.0 + 0.1 * k for k in range(17)]
    m = theory.Measured(alpha_hat=0.8, c=0.1, gamma=4, speedup=1.3, predicted=2.0, v_curve=curve)
    g1, _ = theory.figures(0.8, 4, 0.1, m, theory.V_MODES[0])
    g2, _ = theory.figures(0.8, 4, 0.1, m, theory.V_MODES[1])
    s1, s2 = _trace(g1, "predicted speedup"), _trace(g2, "predicted speedup")
    assert list(s1.y) == pytest.approx([predicted_speedup(0.8, g, 0.1) for g in range(1, 17)])
    assert list(s2.y) == pytest.approx([predicted_speedup(0.8, g, 0.1, curve[g]) for g in range(1, 17)])
    assert _trace(g2, "optimal").x[0] < _trace(g1, "optimal").x[0]  # verify cost shortens the best γ
    html = theory.numbers_html(0.8, 4, 0.1, curve)
    assert "v(γ) = <b>1.40</b>" in html
    # no run yet, or v = 1 picked: Leviathan's curve
    assert theory.run_curve(None, theory.V_MODES[1]) is None and theory.run_curve(m, theory.V_MODES[0]) is None


def test_a_recorded_runs_label_names_its_hardware_once():
    """The shipped traces' labels name the machine: the list showed it twice ("… (AMD EPYC, AVX2,
    2 cores, 2026-11-23) · AMD EPYC (2 cores)"); a label without it still gets it."""
    from specviz.run.trace import Trace
    from specviz.ui.replay import choice_label
    meta = {"hardware": "AMD EPYC (2 cores)"}  # as trace meta records it
    named = choice_label("x", Trace(dict(meta, label="Code · quicksort (AMD EPYC, AVX2, 2 cores)")))
    assert named.count("EPYC") == 1
    assert "EPYC" in choice_label("x", Trace(dict(meta, label="Code · quicksort")))
