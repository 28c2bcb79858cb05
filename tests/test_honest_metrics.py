"""Issue 12: honest numbers from the first round on (c unknown until measured,
the γ actually drafted, a measured plain step, the verify-cost-aware theory)."""
import pytest

from specviz.engine.costs import CostModel
from specviz.engine.decoding import baseline, speculative
from specviz.engine.events import RunSummary
from specviz.engine.metrics import run_stats
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
    d = dict(mode="speculative", method="draft", token_ids=[], text="", n_tokens=30, elapsed=1.0, prefill=0.1,
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
    assert v == pytest.approx(1 + 0.2 * 2.5)
    assert st.predicted_v == pytest.approx(predicted_speedup(0.8, 2.5, 0.2, v))
    assert st.verify_cost == pytest.approx((0.15 / 9) / 0.01)  # the run's own verify pass, in plain steps


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
