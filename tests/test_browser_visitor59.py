"""Issue 59's misleading items, as the visitor met them, in a real headless Chromium on the tiny pair
(see test_browser.py for the setup): a preset run twice got faster with no word in the headline; a
hybrid run's prediction box said one thing and its chart drew another; a method picked under the race
table showed another ratio than its row. (The fourth, the status line during calibration:
test_browser_newcomer.py::test_run_enabled_while_calibrating_in_background.)
Screenshots: test-artifacts/visitor59-*.png (or SPECVIZ_SHOTS)."""
import re

import pytest
from browser.pages import charts_drawn, press, ready, run, run_ended, settled, shows
from test_browser import TIMEOUT, open_page, server  # noqa: F401 - fixtures (browser: conftest.py)
from test_browser_leaderboard import SHOTS, open_tab, race, shot

PRESET = "Edit · rename a parameter"
MAX_NEW = 48


def _hybrid(page, preset: str | None = PRESET, max_new: int = MAX_NEW):
    """Pick the preset, then the hybrid in More settings, and a short budget."""
    if preset:
        page.locator("#sv-preset input").click()
        page.get_by_role("option", name=preset).click()
        page.wait_for_function("() => document.querySelector('#sv-prompt textarea').value.length > 200",
                               timeout=TIMEOUT)
    page.get_by_text("More settings: sampling, draft method").click()
    page.locator("#sv-method label", has_text=re.compile(r"^\s*hybrid:")).click()
    box = page.locator("#sv-max-new input[type=number]")
    box.fill(str(max_new))
    box.press("Enter")


def _headline(page) -> str:
    """The speedup box's word on memory, once the run that was pressed has ended."""
    run_ended(page, timeout=TIMEOUT)
    settled(page, "#sv-stats", TIMEOUT)
    mem = page.locator("#sv-stats .sv-speedup-mem")
    assert mem.count() == 1, page.inner_text("#sv-stats")
    return mem.inner_text()


@pytest.mark.parametrize("size", [(1440, 900), (400, 800)], ids=["1440", "400"])
def test_a_repeated_preset_says_what_it_copied_and_fresh_memory_is_one_click(browser, server, size):  # noqa: F811
    """Run the edit preset with the hybrid twice: the second run copies from the first one's output,
    and its headline counts those tokens; "fresh memory", under Run, runs it again without them."""
    page = browser.new_page(viewport={"width": size[0], "height": size[1]}, color_scheme="light")
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"{server.url}?__theme=light")
    ready(page, TIMEOUT)
    _hybrid(page)
    press(page)
    _headline(page)
    press(page)  # the same preset again: its first output is in the memory now
    line = _headline(page)
    m = re.match(r"(\d+) of (\d+) tokens copied from earlier runs", line)
    assert m and 0 < int(m.group(1)) <= int(m.group(2)), line
    copied = page.locator("#sv-speculative .sv-from-text[data-src-where='memory']")
    assert copied.count() > 0  # the pane's copied rounds say the same
    _box_shot(page, f"visitor59-memory-{size[0]}x{size[1]}")
    # one click: the run reads no earlier output, and its headline says so
    fresh = page.locator("#sv-fresh-memory input")
    fresh.wait_for(state="visible", timeout=TIMEOUT)  # shown for the methods that copy from earlier runs
    fresh.check()
    press(page)
    line = _headline(page)
    assert line.startswith("fresh memory"), line
    assert page.locator("#sv-speculative .sv-from-text[data-src-where='memory']").count() == 0
    _box_shot(page, f"visitor59-fresh-{size[0]}x{size[1]}")
    assert not errors, errors
    page.close()


TRACES_JS = """() => { const p = document.querySelector('#sv-chart-speedup .js-plotly-plot');
  return p && p.data ? p.data.map(t => t.name || '') : null; }"""


def test_a_hybrid_runs_prediction_box_and_chart_agree(browser, server):  # noqa: F811
    """The box says "no prediction", in the terms of the rounds the hybrid ran (the draft model's
    with its c), and the speedup chart draws no prediction curve."""
    page, errors = open_page(browser, server, "light")
    page.set_viewport_size({"width": 1440, "height": 900})
    _hybrid(page, preset=None, max_new=64)
    page.fill("#sv-prompt textarea", "def area(w, h):\n    return w * h\n\ndef perimeter(w, h):\n")
    run(page, timeout=TIMEOUT)
    settled(page, "#sv-stats", TIMEOUT)
    sub = page.inner_text("#sv-stats .sv-speedup-sub")
    assert sub.startswith("no prediction"), sub
    stats = page.inner_text("#sv-stats")
    c = re.search(r"\bc (\d\.\d{3})", stats)
    if "ran the draft model" in sub:  # its c is the chip's
        assert c and f"(c {c.group(1)})" in sub, (sub, stats)
    else:
        assert "drafts copied from text" in sub, sub
    charts_drawn(page, "#sv-chart-speedup", timeout=TIMEOUT)
    page.wait_for_function(f"() => ({TRACES_JS})()?.includes('measured')", timeout=TIMEOUT)
    names = page.evaluate(TRACES_JS)
    assert not [n for n in names if "predict" in n.lower() or "verify cost" in n], names
    _box_shot(page, "visitor59-hybrid")
    page.locator("#sv-chart-speedup").screenshot(path=str(SHOTS / "visitor59-hybrid-chart.png"))
    assert not errors, errors
    page.close()


def _box_shot(page, name: str) -> None:
    """The numbers as a visitor reads them (the speedup box, the table, the chips), then the page."""
    stats = page.locator("#sv-stats")
    stats.scroll_into_view_if_needed()
    SHOTS.mkdir(parents=True, exist_ok=True)
    stats.screenshot(path=str(SHOTS / f"{name}-box.png"))
    shot(page, f"{name}.png")


def _ratio(text: str) -> float:
    return float(re.match(r"\s*([0-9.]+)×", text).group(1))


def test_a_picked_methods_box_shows_its_rows_ratio(browser, server):  # noqa: F811
    """Race two methods; pick each under the table: its speedup box shows the row's × plain."""
    page, errors = open_tab(browser, server, 1440, 900)
    race(page, ("draft model", "prompt lookup"), 16, prompt="x = [1, 2, 3]\ny = [1, 2, 3]\nx = [")
    rows = page.locator("#sv-lb-rows tbody tr")
    cells = {k: (label.strip(), spd) for k, label, spd in rows.evaluate_all(
        "els => els.map(e => [e.dataset.key, e.children[1].innerText, e.children[4].innerText])")}
    assert set(cells) == {"plain", "draft", "lookup"}, cells
    seen = {}
    for key in ("draft", "lookup"):
        label, spd = cells[key]
        if not page.locator("#sv-lb-pick input").input_value().startswith(label + " · "):
            before = page.inner_html("#sv-lb-stats")
            page.locator("#sv-lb-pick input").click()
            page.get_by_role("option", name=re.compile("^" + re.escape(label) + " · ")).click()
            page.wait_for_function("b => document.querySelector('#sv-lb-stats').innerHTML !== b", arg=before,
                                   timeout=TIMEOUT)
        settled(page, "#sv-lb-stats, #sv-lb-pick", TIMEOUT)
        shows(page, "#sv-lb-stats", "measured speedup", TIMEOUT)
        seen[key] = (_ratio(page.inner_text("#sv-lb-stats .sv-speedup-num")), _ratio(spd))
    assert all(box == row for box, row in seen.values()), seen
    shot(page, "visitor59-race-pick.png")
    assert not errors, errors
    page.close()
