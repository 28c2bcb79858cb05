"""Issue 21 without a browser: the page is usable at once (untimed default, then
the calibration in the background with a budget), the busy meter, the Run
button's queue labels, nothing stale (failed runs, tree predictions, the empty
tree chart, the theory text, Medusa heads offered only when trained)."""
import threading
import time

import pytest
from helpers import fake_pair

from specviz import machine
from specviz.calibration import calibrate as cal
from specviz.engine.events import RoundEvent
from specviz.ui import busy, render
from specviz.ui.loader import ModelManager
from specviz.ui.runqueue import RunQueue


@pytest.fixture
def quiet(monkeypatch):
    monkeypatch.setattr(cal, "busy", lambda *a: False)


def _models(tok):
    from specviz.models.tiny import tiny_model
    return tiny_model(len(tok), seed=0, layers=2), tiny_model(len(tok), seed=1, layers=1)


def test_cached_mode_times_nothing_and_says_so(monkeypatch, tok, tmp_path, quiet):
    monkeypatch.setattr(cal, "time_forwards", lambda *a, **k: pytest.fail("timed in cached mode"))
    t, d, choice = cal.calibrate(*_models(tok), quantize="auto", native_bf16=True, min_params=0,
                                 cache_file=tmp_path / "c.json", mode="cached")
    # the class default, untimed: w4a8 where the kernel runs row-exact, else bf16 where native; a
    # w4a8 draft where it runs, else int8 (lossless: the target verifies)
    w4a8 = "w4a8" in cal.lowbit.available()
    assert choice.target == ("w4a8" if "w4a8" in cal.lowbit.row_exact() else "bf16")
    assert choice.draft == ("w4a8" if w4a8 else "int8")
    _, _, avx2 = cal.calibrate(*_models(tok), quantize="auto", native_bf16=False, min_params=0,
                               cache_file=tmp_path / "c.json", mode="cached")
    assert avx2.target == cal.class_default(["fp32", *cal.lowbit.row_exact()], False)
    assert choice.untimed and choice.costs is None and "not timed yet" in choice.note
    assert not (tmp_path / "c.json").exists()


def test_noisy_measurement_is_cached_and_a_quiet_one_replaces_it(monkeypatch, tok, tmp_path):
    path = tmp_path / "c.json"
    kw = dict(quantize="none", native_bf16=False, min_params=0, cache_file=path)
    monkeypatch.setattr(cal, "busy", lambda *a: True)
    _, _, noisy = cal.calibrate(*_models(tok), **kw)
    assert noisy.noisy and "noisy" in noisy.note and "load" in noisy.timings
    assert cal.load_cached(path).noisy  # under load beats nothing
    _, _, again = cal.calibrate(*_models(tok), mode="cached", **kw)
    assert again.cached and again.noisy  # a start uses it at once
    monkeypatch.setattr(cal, "busy", lambda *a: False)
    _, _, fresh = cal.calibrate(*_models(tok), mode="fresh", **kw)
    assert not fresh.noisy and not cal.load_cached(path).noisy  # the quiet one replaced it
    monkeypatch.setattr(cal, "busy", lambda *a: True)
    cal.calibrate(*_models(tok), mode="fresh", **kw)
    assert not cal.load_cached(path).noisy  # and a later noisy one never replaces a quiet one


def test_check_hook_stops_a_calibration(tok, quiet):
    class Stop(Exception):
        pass

    def check():
        raise Stop

    def run():
        machine.PAUSE.set(check)
        with pytest.raises(Stop):
            cal.calibrate(*_models(tok), quantize="none", native_bf16=False, min_params=0)
    th = threading.Thread(target=run)
    th.start()
    th.join(60)
    assert machine.PAUSE.get() is None  # the hook lives in that thread's context only


def FakePair(calibration, note):  # noqa: N802 - stands for a class
    return fake_pair(calibration=calibration, precision_note=note, device="cpu")


def test_ready_at_once_then_calibrated_in_the_background():
    release, calls = threading.Event(), []

    def loader(spec, device=None, progress=None, calibration="auto", **kw):
        calls.append(calibration)
        if calibration == "cached":
            return FakePair("untimed", "target float32 (not timed yet)")
        progress("timing the target in bfloat16", 0.9)
        release.wait(30)
        return FakePair("", "target bfloat16 (measured)")

    from specviz.models import PairSpec
    m = ModelManager(loader=loader)
    first = time.monotonic()
    m.start(PairSpec("t", "a", "b", "test", True))
    assert m.wait(10) and time.monotonic() - first < 5
    st = m.status()
    assert st["ready"] and st["calibration"] == "untimed"
    deadline = time.monotonic() + 10
    while m.status()["calib"].get("step") != "timing the target in bfloat16" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m.status()["calib"]["state"] == "running"
    assert "Calibrating timings in the background" in busy.calib_html(m.status())
    release.set()
    while m.status()["calib"].get("state") == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert m.status()["calib"]["state"] == "done" and m.pair.precision_note == "target bfloat16 (measured)"
    assert calls == ["cached", "fresh"]


def test_background_calibration_stops_at_its_budget():
    def loader(spec, device=None, progress=None, calibration="auto", **kw):
        if calibration == "cached":
            return FakePair("noisy", "noisy")
        while True:  # a calibration that would never end: the check before each timed forward stops it
            machine.PAUSE.get()()
            time.sleep(0.02)

    from specviz.models import PairSpec
    m = ModelManager(loader=loader, budget=0.3)
    m.start(PairSpec("t", "a", "b", "test", True))
    assert m.wait(10)
    deadline = time.monotonic() + 10
    while m.status()["calib"].get("state") in (None, "running") and time.monotonic() < deadline:
        time.sleep(0.05)
    st = m.status()
    assert st["calib"]["state"] == "stopped" and "budget" in st["calib"]["step"]
    assert st["ready"] and "stopped" in busy.calib_html(st)


def test_no_calibrate_never_measures():
    calls = []

    def loader(spec, device=None, progress=None, calibration="auto", **kw):
        calls.append(calibration)
        return FakePair("untimed", "x")

    from specviz.models import PairSpec
    m = ModelManager(loader=loader, calibration="off")
    m.start(PairSpec("t", "a", "b", "test", True))
    assert m.wait(10)
    time.sleep(0.3)
    assert calls == ["cached"] and "--no-calibrate" in busy.calib_html(m.status())


def test_cpu_meter_counts_other_processes_only():
    reads = iter([(100.0, 10.0), (103.0, 11.0)])  # 3 CPU-s used in 2 s, 1 of them ours
    clock = iter([0.0, 2.0])
    meter = busy.CpuMeter(read=lambda: next(reads), cores=2, clock=lambda: next(clock))
    meter.sample()
    assert meter.sample() == pytest.approx(1.0) and meter.busy()
    status = {"ready": True, "calibration": ""}
    assert "1.0 of this machine's 2 cores" in busy.busy_reason(status, meter)
    offer = {"hardware": "AMD EPYC (2 cores)", "recorded": "2026-11-23T23:51:09+00:00", "precision": "w8a8"}
    html = busy.busy_html(busy.busy_reason(status, meter), offer)
    assert "unreliable" in html and "Replay" in html and "AMD EPYC (2 cores)" in html  # issue 71: named
    assert "Replay" not in busy.busy_html(busy.busy_reason(status, meter))  # no recording: no offer
    quiet_meter = busy.CpuMeter(read=lambda: None, cores=64)
    quiet_meter.sample()
    assert not quiet_meter.busy()
    assert "calibration was measured while" in busy.busy_reason({"calibration": "noisy"}, quiet_meter)


def test_run_button_labels_follow_the_queue():
    q = RunQueue()
    assert q.label("a") is None
    q.press("a")
    assert q.label("a") == "Running…"
    q.start("a")
    q.press("b")
    q.press("c")
    assert q.label("b") == "⏳ queue 2 of 3" and q.label("c") == "⏳ queue 3 of 3"
    q.end("a")
    q.start("b")
    assert q.label("c") == "⏳ queue 2 of 2" and not q.busy("a")
    btn = q.button("c", True)
    assert btn.interactive is False
    assert q.button("a", True).interactive is True


def _round(i, tree=None):
    r = RoundEvent(index=i, gamma=2, draft_ids=[1, 2], q=[0.5, 0.5], p=[0.4, 0.4], u=[0.1, 0.9],
                   overlap=[0.5, 0.5], n_accepted=1, appended_id=3, resampled=True, t_start=0.1 * i,
                   t_draft=0.01, t_verify=0.02, t_end=0.1 * i + 0.05, draft_forwards=2,
                   total_tokens=2 * (i + 1), total_drafted=2 * (i + 1), total_accepted=i + 1,
                   target_forwards=i + 1)
    if tree:
        r.tree = tree
    return r


def _view(method="draft", rounds=1, tree=None):
    from specviz.ui.state import RunView
    v = RunView(2, 0.0, "fair")
    v.method = method
    for i in range(rounds):
        v.add("speculative", _round(i, tree))
    return v


def test_speedup_held_until_two_rounds():
    one = render.stats_html(_view(rounds=1).snapshot())
    assert "shown after 2 rounds" in one
    assert "shown after 2 rounds" not in render.stats_html(_view(rounds=2).snapshot())


def test_tree_runs_show_no_chain_prediction():
    snap = _view("tree", rounds=3).snapshot()
    assert snap["stats"].get("predicted") is None and snap["stats"].get("predicted_v") is None
    html = render.stats_html(snap)
    assert "does not describe a token tree" in html and "c unknown" not in html


def test_failed_run_clears_panes_and_says_it_once():
    """Issue 71: a failed run's message was said five times (a toast, the run info line, both panes,
    the speedup box). Now the run info line alone says it; the rest is cleared, and says no "failed"."""
    from specviz.ui.panes import IDLE_BASE, IDLE_SPEC, failed_outputs, page_error
    out = failed_outputs("The prompt is empty")
    assert (out[0], out[1]) == (IDLE_BASE, IDLE_SPEC)  # as before any run
    assert "failed" not in out[2] and "waiting" not in out[2]
    assert "The prompt is empty" in out[3]
    texts = [o for o in out if isinstance(o, str)] + [a.text for f in out[4:] for a in f.layout.annotations]
    assert sum(t.count("The prompt is empty") for t in texts) == 1
    assert not any("waiting" in a.text for f in out[4:8] for a in f.layout.annotations)  # "no rounds"
    err = page_error("The prompt is empty: <b>")
    # the API caller's error keeps the message; the page shows no toast
    assert err.visible is False and err.message == "The prompt is empty: &lt;b&gt;"
    import pickle
    assert pickle.loads(pickle.dumps(err)).visible is False  # a ZeroGPU fork's error crosses back pickled


def test_empty_tree_chart_has_one_caption():
    from specviz.ui.tree_view import latest_tree_figure
    fig = latest_tree_figure(_view(rounds=0))
    assert len(fig.layout.annotations) == 1


def test_tree_labels_are_legible():
    """Issue 71: the token tree's labels were 11 px grey, above their node, on the sibling one row up
    (8 siblings 21 px apart). Now 14 px beside their node (the path's bold), escaped, one row each."""
    from specviz.ui.tree_view import rounds_figure
    parents = [-1] * 8 + [0, 0]  # 8 children of the root, 2 under the first: 9 leaves
    tree = dict(parents=parents, depth=[1] * 8 + [2, 2], tokens=list(range(10)), path=[0, 8], tested=[0, 1, 8],
                texts=["<b>", " x", "\n"] + [f"t{i}" for i in range(7)], q=[0.1] * 10, p=[0.1] * 10,
                appended=42, appended_text="end")
    fig = rounds_figure([_round(0, tree)])
    nodes = next(t for t in fig.data if t.mode == "markers+text" and len(t.x) == 10)
    assert nodes.textfont.size >= 14 and nodes.textposition == "middle right"
    assert list(nodes.text[:3]) == ["<b>&lt;b&gt;</b>", "·x", "⏎"]  # the path bold; markup shown as text
    star = next(t for t in fig.data if t.marker.symbol == "star")
    assert star.textfont.size >= 14 and star.textposition == "middle right"
    rows = 10  # 9 leaves and the appended token
    plot = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert plot / rows >= 1.5 * nodes.textfont.size, (fig.layout.height, plot)


def test_theory_text_follows_the_v_mode():
    from specviz.ui import theory
    m = theory.Measured(alpha_hat=0.7, c=0.2, gamma=4, speedup=1.2, predicted=1.8, tau=2.5,
                        verify_cost=1.6, source="run")
    assert "theory assumes 1" in theory.measured_html(m, theory.V_MODES[0])
    text = theory.measured_html(m, theory.V_MODES[1])
    assert "theory assumes 1" not in text and "measured v curve" in text


def test_medusa_heads_offered_only_when_trained():
    from specviz.ui.method_options import method_choices
    assert not {"heads", "eagle"} & {v for _, v in method_choices()}
    assert "heads" in [v for _, v in method_choices({"heads"})]
    assert "eagle" not in [v for _, v in method_choices({"heads"})]


def test_whitespace_tokens_carry_no_underline():
    from specviz.engine.events import Outcome, TokenEvent
    span = render.token_span(TokenEvent(5, "    ", Outcome.TARGET, 0.1, -1, 0))
    assert "sv-ws" in span
    assert ".sv-target.sv-ws { box-shadow: none; }" in render.page_css()



def test_greedy_inspector_shows_raw_softmax_and_no_u(target, draft, tok):
    from specviz.engine.decoding import speculative
    from specviz.engine.proposers import DraftModelProposer
    from specviz.engine.sampling import SamplingParams
    from specviz.ui import inspector
    rounds = [e for e in speculative(target, DraftModelProposer(draft), tok, tok.encode("abc"), 24, 3,
                                     SamplingParams(temperature=0.0), seed=0) if isinstance(e, RoundEvent)]
    row = rounds[0].dists[0]
    assert row.get("raw") and 0 < max(row["p"]) < 1 and 0 < max(row["q"]) < 1  # not one-hot
    html = inspector.panel_html(rounds[0], 0, None)
    assert "no random u" in html and "u = " not in html and "sv-insp-gauge" not in html
    # the appended token is the target's top one, not a draw (a visitor read "drawn from the residual")
    ends = [inspector.panel_html(r, r.n_accepted, None) for r in rounds if r.appended_id >= 0]
    assert ends and all("the target's top token" in h and "drawn" not in h for h in ends)
    tips = [render.tooltip(t) for r in rounds for t in r.tokens if t.outcome.value in ("accepted", "rejected")]
    assert tips and all("u = " not in t and "greedy" in t for t in tips)


def test_draft_size_tab_shows_no_machine_path():
    from specviz.ui import draft_size
    assert draft_size.public("python -m x --out /work/benchruns/ds.json --n 2") == "python -m x --out ds.json --n 2"
    data = draft_size.load_result()
    if data:
        assert "/work/" not in draft_size.intro_html(data)
        assert data["prompts"] >= 5 and data["max_new_tokens"] >= 64  # issue 21: not 1 prompt × 16 tokens
