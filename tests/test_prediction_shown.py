"""Issue 51: every predicted speedup the page shows is the page's own formula applied to the costs
shown beside it, and the label says where they come from; otherwise the page says "no prediction".
Read back from the rendered HTML of every shipped recording (each method), as a visitor reads it."""
import re

import pytest

from specviz.engine.costs import CostModel
from specviz.engine.events import RoundEvent, RunSummary
from specviz.engine.theory import speedup as formula
from specviz.ui import render
from specviz.ui.state import RunView


def _chip(html: str, name: str) -> float | None:
    m = re.search(rf"<b>{re.escape(name)}</b> ([0-9.]+|–)", html)
    assert m, f"no chip {name!r}"
    return None if m.group(1) == "–" else float(m.group(1))


def _shown(html: str) -> tuple[float | None, str]:
    """(the predicted speedup in the box's line, that line)."""
    line = re.search(r"<span class=['\"]sv-speedup-sub['\"]>([^<]*)</span>", html).group(1)  # DOM: "
    m = re.match(r"predicted ([0-9.]+)×", line)
    return (float(m.group(1)) if m else None), line


def check_prediction(html: str) -> str:
    """Assert the box's prediction against its chips; return its line. The line names the α̂, γ, c and
    v it used as values, each the chip's; one v chip, saying whose v it is (issue 59)."""
    assert html.count("<b>verify cost v</b>") == 1 and "v at calibration" not in html
    pred, line = _shown(html)
    if pred is None:
        assert line.startswith(("no prediction", "predicted –", "shown after")), line
        return line
    m = re.search(r"at α̂ ([0-9.]+), γ ([0-9.]+), c ([0-9.]+)(?:, v ([0-9.]+))?", line)
    assert m, line
    a, g, c = (float(x) for x in m.group(1, 2, 3))
    assert (a, g, c) == (_chip(html, "α̂ expected acceptance"), _chip(html, "γ drafted"), _chip(html, "c")), line
    if m.group(4):
        v = float(m.group(4))
        chip = re.search(r"<b>verify cost v</b> ([0-9.]+) steps · (this run|calibration)", html)
        assert chip and float(chip.group(1)) == v, (line, chip)
        assert ("measured in this run" in line) == (chip.group(2) == "this run"), (line, chip.group(2))
    else:
        assert line.startswith("predicted ") and "by Leviathan (v = 1) at" in line, line
        v = 1.0
    # chips are rounded (α̂, c to 3 places, γ and v to 2), the prediction to 2
    assert pred == pytest.approx(formula(a, g, c, v), abs=0.02), (line, a, g, c, v)
    lev = re.search(r"([0-9.]+)× by Leviathan \(v = 1\)", line)
    if lev:
        assert float(lev.group(1)) == pytest.approx(formula(a, g, c, 1.0), abs=0.02)
    return line


def test_every_shipped_method_predicts_from_the_costs_it_shows():
    from specviz.run.race_bundle import load_bundle
    from specviz.ui.replay import final_view, shipped
    board = load_bundle("assets/races/01-code-quicksort.json")
    traces = [*shipped().values(), *(board.trace(k) for k in board.runs)]
    methods = {}
    for tr in traces:
        view = final_view(tr)
        methods[view.method] = check_prediction(render.stats_html(view.snapshot()))
    assert {"draft", "tree", "lookup", "lookahead", "rest", "staged"} <= set(methods)
    assert methods["tree"].startswith("no prediction")
    assert "measured in this run" in methods["lookahead"]  # priced with the rows it verified


def _lookahead_view(rounds: int = 10, verify: float = 0.04, rows: int = 12) -> RunView:
    """Issue 51's lookahead case in small: 1-2 tokens a round from a forward of `rows` tokens."""
    view = RunView(gamma=3, temperature=0.0, mode="fair")
    view.method = "lookahead"
    view.costs = CostModel(plain_step_s=0.01, verify_s=tuple(0.01 + 0.001 * (n - 1) for n in range(1, 18)))
    n = acc = 0
    for i in range(rounds):
        n += 2 if i % 3 == 0 else 1
        acc += 1 if i % 3 == 0 else 0
        view.add("speculative", RoundEvent(
            index=i, gamma=1, draft_ids=[5], q=[1.0], p=[1.0], u=[], overlap=[1.0 if i % 3 == 0 else 0.0],
            n_accepted=1 if i % 3 == 0 else 0, appended_id=3, resampled=False, t_start=0.05 * i,
            t_draft=0.0, t_verify=verify, t_end=0.05 * (i + 1), draft_forwards=0, total_tokens=n,
            total_drafted=i + 1, total_accepted=acc,
            prompt_tokens=5 if i == 0 else 0, info={"input_tokens": rows}))
    spec = view.spec.partial_summary()  # the ledger's totals, as the engine's summary carries them
    spec.method, spec.token_ids, spec.stop_reason = "lookahead", list(range(n)), "max_new_tokens"
    view.add("speculative", spec)
    view.add("baseline", RunSummary("baseline", "plain", list(range(n)), "", n, 0.05 + 0.01 * (n - 1), 0.05,
                                    n, "max_new_tokens"))
    return view


def test_a_lookahead_run_is_priced_with_its_verify_rows_not_its_drafts():
    snap = _lookahead_view().snapshot()
    st = snap["stats"]
    assert st["verify_rows"] == 12 and st["verify_cost"] == pytest.approx(4.0)
    assert st["verify_cost_calibrated"] == pytest.approx(2.1)  # 12 tokens at calibration
    html = render.stats_html(snap)
    assert "measured in this run" in check_prediction(html)
    assert "12.0 tokens: its n-gram guesses and Jacobi window" in html
    # v 4.0 against 2.1 calibrated: a busy machine, said for a method with no draft model too
    assert snap["disturbed"].startswith("timings look disturbed: a verify pass (12.0 tokens) cost 4.00")
    assert "disturbed" not in _lookahead_view(verify=0.011).snapshot()["disturbed"]
