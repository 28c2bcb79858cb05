"""Issue 12: honest numbers from the first round on (c unknown until measured,
the γ actually drafted, a measured plain step, the verify-cost-aware theory)."""
import pytest

from specviz.engine.costs import CostModel
from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import RoundEvent, RunSummary
from specviz.engine.metrics import cpu_speedup, disturbed_note, run_stats
from specviz.engine.proposers import DraftModelProposer, PromptLookupProposer
from specviz.engine.sampling import SamplingParams
from specviz.engine.theory import best_gamma, v_at, verify_curve
from specviz.engine.theory import speedup as predicted_speedup
from specviz.ui import render
from specviz.ui.state import RunView

GREEDY = SamplingParams()


def _run(gen):
    evs = list(gen)
    return evs[:-1], evs[-1]


def _one_round(target, tok):
    ids = tok.encode("ab")
    _, base = _run(baseline(target, tok, ids, 3, GREEDY))
    rounds, spec = _run(speculative(target, DraftModelProposer(target), tok, ids, 3, 4, GREEDY))
    return rounds, spec, base


def test_one_round_run_reports_c_unknown(target, tok):
    # draft = target, 3 new tokens: one round, which also read the prompt (prefill)
    rounds, spec, base = _one_round(target, tok)
    assert spec.rounds == 1 and spec.draft_forwards == 0 and spec.drafted == 2
    st = run_stats(spec, base)
    assert st.c is None and st.predicted is None and st.predicted_v is None and st.best_gamma is None
    assert st.alpha_hat == pytest.approx(1.0)  # α̂ is known: it needs no timing
    html = render.stats_html(_view(rounds, spec, base).snapshot())
    assert "<b>c</b> –" in html and "<b>c</b> 0.000" not in html and "c unknown" in html


def test_one_round_with_calibration_still_has_no_c(target, tok):
    _, spec, base = _one_round(target, tok)
    st = run_stats(spec, None, _costs())
    assert st.c is None and st.t_target_step == pytest.approx(0.01)


def _view(rounds, spec, base):
    view = RunView(gamma=4, temperature=0.0, mode="fair")
    for r in rounds:
        view.add("speculative", r)
    view.add("speculative", spec)
    view.add("baseline", base)
    return view


def _costs(draft=0.002):
    # verify of n tokens: 10 ms + 2 ms per extra token
    return CostModel(plain_step_s=0.01, verify_s=tuple(0.01 + 0.002 * (n - 1) for n in range(1, 18)),
                     draft_step_s=draft)


def _summary(**kw):
    d = dict(side="speculative", method="draft", token_ids=[], text="", n_tokens=30, elapsed=1.0, prefill=0.1,
             target_forwards=10, stop_reason="max_new_tokens", rounds=10, drafted=25, accepted=20,
             draft_time=0.05, verify_time=0.15, draft_forwards=25, overlap_sum=20.0, gamma=8, prompt_rounds=1)
    d.update(kw)
    return RunSummary(**d)


def test_prediction_uses_mean_drafted_gamma_and_calibrated_step():
    st = run_stats(_summary(), None, _costs())
    assert st.gamma_mean == pytest.approx(2.5)  # requested γ 8, drafted 2.5 per round
    assert st.c_basis == "calibration" and st.c == pytest.approx((0.05 / 25) / 0.01)
    assert st.predicted == pytest.approx(predicted_speedup(0.8, 2.5, 0.2))
    v = v_at(verify_curve(_costs()), 2.5)
    assert v == pytest.approx(1 + 0.2 * 2.5) == st.verify_cost_calibrated  # 3.5 tokens per verify
    assert st.verify_cost == pytest.approx((0.15 / 9) / 0.01)  # the run's own verify pass, in plain steps
    # issue 51: the prediction prices a round with the verify cost the page shows beside it
    assert st.predicted_v == pytest.approx(predicted_speedup(0.8, 2.5, 0.2, st.verify_cost))
    assert st.predicted_v_basis == "this run"


def test_before_a_verify_pass_is_timed_the_prediction_uses_the_calibrated_v():
    st = run_stats(_summary(rounds=1, verify_time=0.0, draft_time=0.0, draft_forwards=0, drafted=2,
                            overlap_sum=1.6), None, _costs())
    assert st.verify_cost is None and st.c is None  # c unknown yet: no prediction at all
    # prompt lookup after round 1 (it read the prompt: prefill), its α̂ known, no model: c = 0
    st = run_stats(_summary(method="lookup", rounds=1, drafted=3, overlap_sum=2.4, draft_time=0.0,
                            draft_forwards=0), None, _costs())
    assert st.verify_cost is None and st.predicted_v_basis == "calibration"
    assert st.predicted_v == pytest.approx(predicted_speedup(0.8, 3, 0.0, 1 + 0.2 * 3))


def test_lookahead_is_priced_with_the_rows_it_verified():
    """Issue 51: a lookahead run's forward verified its n-gram guesses and Jacobi window (rows), not
    its 1.36 drafted tokens; the calibration's v is read at those rows, or not at all beyond them."""
    spec = _summary(method="lookahead", drafted=14, draft_forwards=0, draft_time=0.0, overlap_sum=12.0)
    st = run_stats(spec, None, _costs(), rows=9.0)
    assert st.verify_rows == 9.0 and st.verify_cost_calibrated == pytest.approx(1 + 0.2 * 8)
    assert st.predicted_v == pytest.approx(predicted_speedup(12 / 14, 1.4, 0.0, st.verify_cost))
    assert run_stats(spec, None, _costs(), rows=24.0).verify_cost_calibrated is None  # beyond 17 tokens


def test_without_baseline_or_calibration_c_is_labelled_verify_pass():
    st = run_stats(_summary())
    assert st.c_basis == "verify pass" and st.c == pytest.approx((0.05 / 25) / (0.15 / 9))
    assert st.verify_cost is None


def test_draft_free_method_has_c_zero_even_in_round_one():
    st = run_stats(_summary(method="lookup", draft_forwards=0, draft_time=0.0, rounds=1, prompt_rounds=1))
    assert st.c == 0.0 and st.c_basis == "no draft model"


def test_verify_aware_best_gamma_is_shorter():
    curve = verify_curve(_costs())
    # at α̂ 0.8, c 0.05 Leviathan's best γ is long; a verify cost growing by 0.2 steps per draft shortens it
    lev, aware = best_gamma(0.8, 0.05), best_gamma(0.8, 0.05, curve)
    assert aware < lev
    assert max(range(1, 17), key=lambda g: predicted_speedup(0.8, g, 0.05, curve[g])) == aware


def test_one_point_verify_curve_is_a_line_through_one():
    curve = verify_curve(None, v_measured=1.8, gamma=4)
    assert curve[0] == 1.0 and curve[4] == pytest.approx(1.8) and curve[8] == pytest.approx(2.6)
    assert verify_curve(None, v_measured=0.9, gamma=4) == [0.9] * 17


def test_lookup_run_stats(target, tok):
    ids = tok.encode("abcabcabcabc")
    _, spec = _run(speculative(target, PromptLookupProposer(len(tok)), tok, ids, 8, 4, GREEDY))
    st = run_stats(spec)
    assert spec.draft_forwards == 0
    if spec.drafted:
        assert st.c == 0.0


# ---------------------------------------------------------------- disturbed timings (issue 41)

def test_disturbed_note_when_measured_is_far_from_predicted():
    # issue 41's first start: the baseline ran 35 % slow after a calibration in the same process
    assert disturbed_note(1.94, 1.45, 25, 0.29) == "timings look disturbed: measured 1.94× vs 1.45× predicted"
    assert disturbed_note(0.6, 1.45, 25, 0.29) == "timings look disturbed: measured 0.60× vs 1.45× predicted"


def test_no_disturbed_note_on_a_quiet_run_a_short_one_or_a_model_free_one():
    assert disturbed_note(1.55, 1.44, 25, 0.29) == ""  # the same app restarted: the quiet CLI's 1.08
    assert disturbed_note(1.84, 1.58, 12, 0.2) == ""  # staged in the shipped quiet race: 1.17
    assert disturbed_note(1.86, 2.2, 20, 0.2) == ""  # the prompt read pulls a quiet run under the prediction
    assert disturbed_note(1.94, 1.45, 4, 0.29) == ""  # 1-4 rounds: quiet ratios spread 0.47-1.28
    assert disturbed_note(1.24, 0.99, 50, 0.0) == ""  # REST, quiet: its varying drafts miss the formula
    assert disturbed_note(0.41, 0.89, 42, 0.0) == ""  # lookahead, quiet: guess rows, not a chain
    assert disturbed_note(None, 1.45, 25, 0.29) == disturbed_note(1.9, None, 25, 0.29) == ""  # held, tree
    assert disturbed_note(1.94, 1.45, 25, None) == ""  # no draft forward timed yet


def test_no_disturbed_note_on_the_shipped_quiet_recordings():
    from specviz.run.race_bundle import load_bundle
    from specviz.ui.replay import final_view, shipped
    board = load_bundle("assets/races/01-code-quicksort.json")
    traces = [*shipped().values(), *(board.trace(k) for k in board.runs)]
    assert len(traces) >= 10
    assert [final_view(tr).snapshot()["disturbed"] for tr in traces] == [""] * len(traces)


def _finished_view(ratio: float, temperature: float = 0.0) -> RunView:
    """A finished run of 10 rounds whose measured speedup is `ratio` × its verify-cost-aware prediction."""
    base = RunSummary("baseline", "plain", list(range(31)), "", 31, 0.1 + 30 * 0.01, 0.1, 31, "max_new_tokens")
    spec = _summary(token_ids=list(range(31)), n_tokens=31)
    view = RunView(gamma=8, temperature=temperature, mode="fair")
    view.costs = _costs()
    for i in range(spec.rounds):
        view.add("speculative", RoundEvent(
            index=i, gamma=2, draft_ids=[1, 1], q=[0.5] * 2, p=[0.5] * 2, u=[0.1], overlap=[0.8] * 2,
            n_accepted=2, appended_id=3, resampled=False, t_start=0.1 * i, t_draft=0.005, t_verify=0.015,
            t_end=0.1 * (i + 1), draft_forwards=2, prompt_tokens=5 if i == 0 else 0))
    pv = run_stats(spec, base, view.costs).predicted_v
    spec.elapsed = spec.n_tokens / (ratio * pv * base.tokens_per_s)
    view.add("baseline", base)
    view.add("speculative", spec)
    assert view.stats()["speedup"] == pytest.approx(ratio * pv) and view.stats()["rounds"] == 10
    return view


def test_stats_say_when_timings_look_disturbed():
    snap = _finished_view(1.34).snapshot()
    st = snap["stats"]
    note = f"timings look disturbed: measured {st['speedup']:.2f}× vs {st['predicted_v']:.2f}× predicted"
    assert snap["disturbed"] == note and note in render.stats_html(snap)
    quiet = _finished_view(1.02).snapshot()  # a quiet machine: measured ≈ predicted
    assert not quiet["disturbed"] and "disturbed" not in render.stats_html(quiet)
    sampled = _finished_view(1.34, temperature=1.0).snapshot()  # the docs' error evidence is greedy
    assert not sampled["disturbed"] and "disturbed" not in render.stats_html(sampled)


def test_a_live_race_whose_wall_and_cpu_time_part_says_the_machine_was_disturbed():
    """The page's race flags what the race of all methods flags: × plain by wall time and by CPU time
    more than 15 % apart (issue 59: a loop on one core bent a clock-paced race's wall-time ratio to
    2.35-2.83× beside 1.71-2.01× by CPU time; quiet races sat 1.06-1.07 apart). On a CPU only."""
    view = _finished_view(1.02)
    base, spec = view.base.summary, view.spec.summary
    wall = view.stats()["speedup"]
    base.extra["cpu_s"] = base.elapsed
    spec.extra["cpu_s"] = spec.elapsed * 1.3  # by CPU time the method gained 1.3x less
    note = view.snapshot()["disturbed"]
    assert note.startswith(f"disturbed machine: {wall:.2f}× by wall time but {wall / 1.3:.2f}× by CPU time")
    spec.extra["cpu_s"] = spec.elapsed * 1.07  # a quiet race's gap
    assert view.snapshot()["disturbed"] == ""
    spec.extra["cpu_s"] = spec.elapsed * 1.3
    spec.device = base.device = "cuda:0"  # a GPU's work is not the host's CPU time
    assert view.snapshot()["disturbed"] == "" and cpu_speedup(spec, base) is None  # race-all's too


def test_the_speedup_chart_ends_at_the_headline_when_the_baseline_ends_last(target, tok):
    """Fair mode: the speculative side often ends first on the shared clock. Its chart points had
    used the baseline's rate so far (a visitor saw 1.87× at the end of the curve under a 1.79×
    headline): each is now the same work's time ratio, and the last one the headline's."""
    ids = tok.encode("ab")
    base_evs = list(baseline(target, tok, ids, 12, GREEDY))
    spec_evs = list(speculative(target, DraftModelProposer(target), tok, ids, 12, 4, GREEDY))
    view = RunView(gamma=4, temperature=0.0, mode="fair")
    for ev in base_evs[:3]:  # the baseline part-way when the speculative side ends
        view.add("baseline", ev)
    for ev in spec_evs:
        view.add("speculative", ev)
    n = len(view.speedup_series)
    for ev in base_evs[3:]:
        view.add("baseline", ev)
    assert len(view.speedup_series) == n
    headline = run_stats(spec_evs[-1], base_evs[-1]).speedup
    assert view.speedup_series[-1][1] == pytest.approx(headline)
    # each round: the baseline's time for as many tokens over this side's (the same work), filled
    # in once the baseline wrote them; so the last round's point is the headline's ratio too
    base_t = [e.t for e in base_evs[:-1]]
    rounds = [e for e in spec_evs if isinstance(e, RoundEvent)]
    for r, (t, measured, *_) in zip(rounds, view.speedup_series, strict=False):
        assert t == r.t_end and measured == pytest.approx(base_t[r.total_tokens - 1] / r.t_end)


def test_cost_drift_note_covers_every_method():
    """Issue 51: a busy minute shows in the costs, whatever drafted: a plain step 1.6× the calibration's,
    or a verify pass 1.5× its calibrated v. Quiet recordings: 0.84-1.18× and 0.64-0.92×."""
    from specviz.engine.metrics import cost_drift_note
    costs = _costs()  # a plain step 10 ms
    assert cost_drift_note(0.0118, 1.1, 1.6, costs, 5.0) == ""  # the quiet extremes
    assert cost_drift_note(0.043, None, None, costs) == \
        "timings look disturbed: a plain step took 43 ms vs 10 ms at calibration"
    assert cost_drift_note(0.01, 3.46, 1.6, costs, 4.5) == \
        "timings look disturbed: a verify pass (4.5 tokens) cost 3.46 plain steps vs 1.60 at calibration"
    assert cost_drift_note(0.043, 3.46, 1.6, None, 4.5) == ""  # no calibration: nothing to compare


def _snap(rounds: int, base_state: str, spec_state: str) -> dict:
    side = dict(n_tokens=14, elapsed=0.96, tokens_per_s=14.6, target_forwards=14, state=base_state)
    return dict(baseline=side, speculative={**side, "n_tokens": 35, "state": spec_state},
                stats=dict(rounds=rounds, speedup=2.14), finished=True, method="draft")


def test_a_stopped_or_one_round_run_says_what_its_speedup_rests_on():
    """A visitor stopped a race and read "2.14× measured speedup" with nothing beside it saying so;
    another ran 1 token and read 0.81× under a box that had promised to wait 2 rounds."""
    from specviz.ui.speedup_box import _speedup_text
    spd, sub = _speedup_text(_snap(9, "stopped", "stopped"))
    assert spd == 2.14 and sub.startswith("stopped by you") and "baseline 14, speculative 35" in sub
    spd, sub = _speedup_text(_snap(1, "done (max tokens)", "done (max tokens)"))
    # no headline under 2 rounds, even at the end (issue 71): its numbers, with the reason
    assert spd is None and sub.startswith("1 round only, which also read the prompt: too short for a headline")
    assert "measured 2.14× (speculative 14.60 ÷ baseline 14.60 tokens/s), not a speedup" in sub
    _, sub = _speedup_text(_snap(9, "done (max tokens)", "done (max tokens)"))
    assert "stopped" not in sub and "only" not in sub
    _, sub = _speedup_text({**_snap(1, "running", "running"), "finished": False})
    assert sub.startswith("shown after 2 rounds")
