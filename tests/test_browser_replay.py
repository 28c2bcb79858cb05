"""The theory explorer and a replay in a real headless Chromium (see
test_browser.py for the setup). Screenshots go to test-artifacts/."""
import re

from browser.pages import charts_drawn, run, settled, shows
from test_browser import ARTIFACTS, TIMEOUT, open_page, open_replay, server  # noqa: F401 - fixtures

from specviz.ui import replay as rp  # noqa: E402


def shot(page, name):
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), full_page=True)


def shots(page, name):
    """Screenshots in light and dark mode (gradio's dark theme is the `dark` class on body)."""
    page.mouse.move(0, 0)  # no hover tooltips in the pictures
    shot(page, f"{name}-light.png")
    page.evaluate("document.body.classList.add('dark')")
    page.wait_for_timeout(300)  # a picture only: the dark theme's repaint
    shot(page, f"{name}-dark.png")
    page.evaluate("document.body.classList.remove('dark')")


def pick_replay(page, name, tr, speed: str) -> None:
    """Open the replay section, pick the shipped trace `name` and the speed labelled `speed`."""
    open_replay(page)
    page.locator("#sv-replay-pick input").click()
    page.get_by_role("option", name=rp.choice_label(name, tr)).click()
    page.locator("#sv-replay-speed label", has_text=speed).first.click()


def test_replay_then_theory_tab(browser, server):  # noqa: F811
    traces = rp.shipped()
    name = min(traces, key=lambda n: traces[n].summaries()["baseline"].elapsed)
    page, errors = open_page(browser, server, "light")
    # pick the shortest shipped trace and play it fast
    pick_replay(page, name, traces[name], "20×")
    page.click("#sv-replay-play")
    page.wait_for_function("document.querySelector('#sv-stats').innerText.includes('done')", timeout=TIMEOUT)
    page.wait_for_selector("#sv-dl-trace:not([disabled])", timeout=TIMEOUT)
    settled(page, "#sv-runinfo, #sv-speculative, #sv-baseline", TIMEOUT)
    charts_drawn(page, "#sv-chart-alpha", timeout=TIMEOUT)
    banner = page.inner_text("#sv-runinfo")
    assert "Replay" in banner and "not live" in banner and traces[name].meta["hardware"] in banner
    assert page.locator("#sv-speculative .sv-round").count() >= 1
    assert page.locator("#sv-baseline .sv-target").count() >= 1
    classes = set()
    for c in page.locator("#sv-speculative .sv-tok").evaluate_all("els => els.map(e => e.className)"):
        classes.update(re.findall(r"sv-(accepted|rejected|resampled|bonus)", c))
    assert classes
    # the charts keep plotly's own "download as png" button
    page.locator("#sv-chart-alpha .js-plotly-plot").hover()
    assert page.locator("#sv-chart-alpha .modebar-btn[data-title='Download plot as a PNG']").count() == 1
    shots(page, "replay")

    # the theory tab shows the replayed run as a measured point
    page.get_by_role("tab", name="Theory explorer").click()
    page.wait_for_selector("#sv-th-gamma-chart .main-svg", timeout=TIMEOUT)
    shows(page, "#sv-th-measured", "replay:", TIMEOUT)
    page.click("#sv-th-use-run")
    tr = traces[name]
    gamma = tr.meta["settings"]["gamma"]
    page.wait_for_function("g => document.querySelector('#sv-th-gamma input[type=number]').value === g",
                           arg=str(gamma), timeout=TIMEOUT)
    shows(page, "#sv-th-numbers", f"γ {gamma}", TIMEOUT)
    charts_drawn(page, "#sv-th-alpha-chart", timeout=TIMEOUT)
    assert page.locator("#sv-th-gamma-chart .js-plotly-plot").count() == 1
    assert page.locator("#sv-th-alpha-chart .js-plotly-plot").count() == 1
    # a chart drawn when its tab opened is named too, and the numbers are a live region (ui/access.py)
    page.wait_for_function("(document.querySelector('#sv-th-gamma-chart').getAttribute('aria-label') || '')"
                           ".length > 10", timeout=TIMEOUT)
    assert page.get_attribute("#sv-th-gamma-chart", "role") == "figure"
    assert page.get_attribute("#sv-th-numbers", "aria-live") == "polite"
    # the live tab's keys stay there: R on this tab starts no run unseen (an accessibility pass found
    # it did), P plays no replay
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("r")
    page.keyboard.press("p")
    page.wait_for_timeout(800)
    assert page.evaluate("() => document.querySelector('#sv-run').textContent.trim()").startswith("▶")
    assert not page.evaluate("() => document.querySelector('#sv-run').disabled")
    shots(page, "theory")
    assert not errors, errors
    page.close()


def test_live_lookup_run_downloads_and_theory(browser, server, tmp_path):  # noqa: F811
    """A live run with prompt lookup (chosen in More settings): its trace downloads
    and replays, and it sits on the theory charts with c = 0."""
    page, errors = open_page(browser, server, "light")
    page.get_by_text("More settings: sampling, draft method").click()
    page.locator("#sv-method label", has_text=re.compile(r"^\s*prompt lookup")).click()
    page.fill("#sv-prompt textarea", "x = 1\ny = 2\nx = 1\ny = 2\nx = 1\ny =")  # n-grams to copy
    box = page.locator("#sv-max-new input[type=number]")
    box.fill("24")
    box.press("Enter")
    run(page, timeout=TIMEOUT)
    page.wait_for_selector("#sv-runinfo .sv-badge", timeout=TIMEOUT)
    assert "prompt lookup" in page.inner_text("#sv-runinfo")
    open_replay(page)
    page.wait_for_selector("#sv-dl-trace:not([disabled])", timeout=TIMEOUT)
    with page.expect_download() as dl:
        page.click("#sv-dl-trace")
    path = tmp_path / "trace.json"
    dl.value.save_as(path)
    tr = rp.load_for_replay(path)
    assert tr.meta["settings"]["method"] == "lookup" and tr.meta["label"].startswith("live run")
    with page.expect_download() as dl:
        page.click("#sv-dl-csv")
    dl.value.save_as(tmp_path / "rounds.csv")
    assert (tmp_path / "rounds.csv").read_text().startswith("round,gamma,accepted,appended")
    page.get_by_role("tab", name="Theory explorer").click()
    shows(page, "#sv-th-measured", "your last run", TIMEOUT)
    shows(page, "#sv-th-measured", "c 0.000", TIMEOUT)
    # the replay picker now holds this run, and Replay plays it (a visitor's played a 2026-11-23 recording)
    page.get_by_role("tab", name="Live demo").click()
    assert page.locator("#sv-replay-pick input").input_value() == rp.YOURS_LABEL
    shows(page, "#sv-replay-info", "Your last run", TIMEOUT)
    page.locator("#sv-replay-speed label", has_text="20×").first.click()
    page.click("#sv-replay-play")
    page.wait_for_function("document.querySelector('#sv-runinfo').innerText.includes('not live') && "
                           "document.querySelector('#sv-stats').innerText.includes('done')", timeout=TIMEOUT)
    assert "prompt lookup" in page.inner_text("#sv-runinfo")
    assert not errors, errors
    page.close()


def test_your_last_run_follows_the_latest_run(browser, server):  # noqa: F811
    """Issue 71: the line under the picker, "Your last run: …", still named a run four runs old: set to
    the value it already held after each run, the picker fired no change, so the line kept the first."""
    page, errors = open_page(browser, server, "light")
    open_replay(page)
    box = page.locator("#sv-max-new input[type=number]")
    box.fill("8")
    box.press("Enter")
    for prompt in ("def first(x):", "def second(x):", "def third(x):"):
        page.fill("#sv-prompt textarea", prompt)
        run(page, timeout=TIMEOUT)
        shows(page, "#sv-replay-info", f"live run · {prompt}", TIMEOUT)
        assert page.locator("#sv-replay-pick input").input_value() == rp.YOURS_LABEL
    assert "first" not in page.inner_text("#sv-replay-info")
    page.locator("#sv-replay-info").scroll_into_view_if_needed()
    page.screenshot(path=str(ARTIFACTS / "replay-your-last-run.png"))
    assert not errors, errors
    page.close()


def test_a_replay_pressed_during_a_live_run_plays_to_its_end(browser, server):  # noqa: F811
    """The replay stops the live run and takes the panes. A cancel wired to Run's click reached the
    server only once the run had ended, and then cancelled the replay on its first frame (a browser
    pass on 2026-11-28: 6 times of 6)."""
    from browser.pages import click_on_first_round, press
    from test_browser import set_number
    traces = rp.shipped()
    # at its recorded pace (a few seconds): the late cancel came some 0.3 s after the run had ended
    name = max(traces, key=lambda n: traces[n].summaries()["baseline"].elapsed)
    page, errors = open_page(browser, server, "light")
    pick_replay(page, name, traces[name], "1×")
    set_number(page, "sv-max-new", 512)
    set_number(page, "sv-gamma", 2)
    click_on_first_round(page, "#sv-replay-play")
    press(page)
    page.wait_for_function("document.querySelector('#sv-runinfo').innerText.includes('Replay') && "
                           "document.querySelector('#sv-stats').innerText.includes('done')", timeout=TIMEOUT)
    page.wait_for_timeout(2000)  # a late cancel would land here
    assert "Replay" in page.inner_text("#sv-runinfo") and "done" in page.inner_text("#sv-stats")
    tr = traces[name]
    assert page.locator("#sv-speculative .sv-round").count() == \
        len([e for s, e in tr.events if s == "speculative"]) - 1
    assert not errors, errors
    page.close()
