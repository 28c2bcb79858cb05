"""Issue 51, the newcomer's half, in a real headless Chromium on the tiny pair built in this
process (see test_browser.py for the setup): Run on the first screen and the next Tab stop after
the prompt, focus to Stop and back, arrow keys on the method selector, the keys and a glossary for
every visitor, one queue counter, run headers that name a method's setup, the race button while
it races, toasts that do not pile up, a clamped value in its box, the baseline title's weight, and
an upload nested too deeply. Screenshots: test-artifacts/ (or SPECVIZ_SHOTS)."""
import os
import time
from pathlib import Path

import pytest
from browser.pages import Pages, press, run_ended, settled, shows, still
from browser.server import InProcessApp
from test_browser import ARTIFACTS, TIMEOUT  # noqa: F401

SHOTS = Path(os.environ.get("SPECVIZ_SHOTS") or ARTIFACTS)


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    a = InProcessApp(tmp_path_factory.mktemp("newcomer-app"))
    yield a
    a.close()


PAGES = Pages(TIMEOUT)


@pytest.fixture(autouse=True)
def _close_pages():
    yield
    PAGES.close_all()


@pytest.fixture
def quiet(monkeypatch):
    """No busy banner: the page as a quiet machine paints it (other tests' jobs share the cores)."""
    from specviz.ui import busy
    monkeypatch.setattr(busy.METER, "sample", lambda: 0.0)
    monkeypatch.setattr(busy.METER, "others", 0.0)


def _open(browser, app, size=(1440, 900), scheme="light"):  # noqa: F811
    # once the first status poll is in and a phone's explainer folded
    return PAGES.open(browser, app.url, size=size, scheme=scheme)


def _shot(page, name, full=False):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.mouse.move(0, 0)
    page.screenshot(path=str(SHOTS / name), full_page=full)


def _set(page, elem_id, value):
    box = page.locator(f"#{elem_id} input[type=number]")
    box.fill(str(value))
    box.press("Enter")


def _active(page) -> str:
    return page.evaluate("(() => { const a = document.activeElement; return (a && (a.id || "
                         "(a.closest('[id]') || {}).id)) || ''; })()")


@pytest.mark.parametrize("size, load", [((1440, 900), 0.0), ((400, 800), 0.0), ((400, 800), 1.6)],
                         ids=["1440", "400", "400-busy"])
def test_run_on_the_first_screen(browser, app, monkeypatch, size, load):  # noqa: F811
    """Run on the first screen, on a phone too, and with the busy banner (issue 59: just below)."""
    from specviz.ui import busy
    monkeypatch.setattr(busy.METER, "sample", lambda: load)  # other tests' jobs share the cores
    monkeypatch.setattr(busy.METER, "others", load)
    monkeypatch.setattr(busy.METER, "cores", 2)
    page, errors = _open(browser, app, size)
    if load:
        page.wait_for_selector("#sv-busy-banner", timeout=TIMEOUT)
    still(page, "#sv-run")  # the layout done moving (folds, fonts)
    bottom = page.evaluate("document.querySelector('#sv-run').getBoundingClientRect().bottom")
    assert bottom <= size[1], f"Run ends at y {bottom:.0f}, below the {size[1]} px screen"
    assert page.evaluate("document.documentElement.scrollWidth") <= size[0] + 1
    # the model-pair line in plain words; the precision and timings behind a disclosure
    status = shows(page, "#sv-status", "weights")
    assert "weights" in status and page.locator("#sv-status details.sv-pair-detail").count() == 1
    _shot(page, f"newcomer-first-paint-{size[0]}x{size[1]}{'-busy' if load else ''}.png")
    assert not errors, errors


def test_keys_and_glossary_for_every_visitor(browser, app):  # noqa: F811
    page, errors = _open(browser, app)
    assert page.locator("#sv-keys").is_visible()  # not only in stage mode
    keys = page.inner_text("#sv-keys")
    for k in ("R", "S / Esc", "P", "N", "Tab"):
        assert k in keys, keys
    page.click("#sv-glossary summary")
    gloss = page.inner_text("#sv-glossary")
    for term in ("w4a8", "g32", "α̂", "τ", "γ", "accepted ÷ drafted", "7-bit per-token activations"):
        assert term in gloss, term
    terms = page.evaluate("[...document.querySelectorAll('#sv-glossary dt')].map(e => e.innerText.trim())")
    assert {"c", "v"} <= set(terms), terms
    _shot(page, "newcomer-keys-glossary.png")
    # the one-key shortcuts can be turned off (WCAG 2.1.4: speech input types letters), and stay off
    page.click("#sv-keys-off")
    assert page.get_attribute("#sv-keys-off", "aria-pressed") == "true"
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("r")
    page.wait_for_timeout(800)
    assert not page.evaluate("() => document.querySelector('#sv-run').disabled")  # no run started
    page.reload()
    page.wait_for_selector("#sv-keys-off[aria-pressed='true']", timeout=TIMEOUT)
    page.click("#sv-keys-off")
    assert page.get_attribute("#sv-keys-off", "aria-pressed") == "false"
    assert not errors, errors


def test_keyboard_run_stop_and_method(browser, app):  # noqa: F811
    page, errors = _open(browser, app)
    _set(page, "sv-max-new", 24)
    page.click("#sv-prompt textarea")
    seen = []
    for _ in range(5):  # Run within 5 Tab stops of the prompt (it was the 22nd)
        page.keyboard.press("Tab")
        seen.append(_active(page))
        if seen[-1] == "sv-run":
            break
    assert seen[-1] == "sv-run", f"not Run within 5 Tab stops: {seen}"
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('#sv-run').disabled", timeout=10_000)
    assert _active(page) == "sv-stop"  # not <body>: the next Tab skipped Stop
    page.wait_for_selector("#sv-runinfo .sv-badge", timeout=TIMEOUT)
    page.wait_for_function("document.activeElement && document.activeElement.id === 'sv-run'", timeout=TIMEOUT)
    # "← → method" from anywhere outside a text field, More settings folded (issue 59: only once a
    # radio inside it had the focus); it opens, the picked radio takes the focus
    checked = "i => !!(document.querySelectorAll('#sv-method input[type=radio]')[i] || {}).checked"
    assert not page.locator("#sv-method input[type=radio]").first.is_visible()
    page.locator("body").click(position={"x": 5, "y": 5})
    page.keyboard.press("ArrowRight")
    page.wait_for_function(checked, arg=1, timeout=10_000)
    assert page.locator("#sv-method input[type=radio]").nth(1).is_visible()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(checked, arg=0, timeout=10_000)
    # and on the radios themselves, up and down too
    radios = page.locator("#sv-method input[type=radio]")
    radios.first.focus()
    page.keyboard.press("ArrowDown")
    page.wait_for_function(checked, arg=1, timeout=10_000)
    page.keyboard.press("ArrowUp")
    page.wait_for_function(checked, arg=0, timeout=10_000)
    assert not errors, errors


def test_one_queue_counter(browser, app, monkeypatch):  # noqa: F811
    """Two visitors: the second one's page shows the Run button's "⏳ queue 2 of 2" and no second
    counter (gradio's own tracker said "queue: 1/1" beside it)."""
    from specviz.ui import handlers
    real = handlers.race

    def slow(*a, **k):
        for item in real(*a, **k):
            time.sleep(0.05)
            yield item
    monkeypatch.setattr(handlers, "race", slow)
    first, _ = _open(browser, app)
    second, errors = _open(browser, app)
    _set(first, "sv-max-new", 120)
    _set(second, "sv-max-new", 8)
    first.click("#sv-run")
    first.wait_for_selector("#sv-runinfo .sv-live-banner", timeout=TIMEOUT)  # running (its replay may come late)
    second.click("#sv-run")
    shows(second, "#sv-run", "queue 2 of 2")
    # gradio keeps its trackers in the page at opacity 0 when hidden: a shown one is what counts
    shown = second.evaluate("""[...document.querySelectorAll('[data-testid=status-tracker]')]
        .filter(t => t.innerText.includes('queue') && getComputedStyle(t).opacity !== '0'
                && t.getBoundingClientRect().height > 0).map(t => t.innerText)""")
    assert not shown, f"a second queue counter (gradio's tracker): {shown}"
    # the first page is behind the second: front again, or its frames (Playwright's "stable" check)
    # may wait (a 30 s timeout on this click in 1 of 8 runs beside a CPU hog, 2026-11-28)
    first.bring_to_front()
    first.click("#sv-stop")
    second.wait_for_selector("#sv-runinfo .sv-badge", timeout=TIMEOUT)
    assert not errors, errors


@pytest.mark.parametrize("method, words", [("early-exit", ("L ", "untrained")), ("lookup", ("n-grams",)),
                                           ("lookahead", ("W ", "G "))])
def test_run_header_names_the_setup(browser, app, method, words):  # noqa: F811
    page, errors = _open(browser, app)
    _set(page, "sv-max-new", 12)
    page.locator("#sv-more .label-wrap").first.click()
    page.locator(f"#sv-method input[value='{method}']").check()
    settled(page, "#sv-more")  # the method's own settings shown
    press(page)
    run_ended(page)
    info = shows(page, "#sv-runinfo", "guesses from")
    for w in words:
        assert w in info, info
    if method == "early-exit":  # the layer calibration chose, not "calibrated"
        assert "L calibrated" not in info, info
    assert not errors, errors


def test_race_button_while_racing(browser, app, monkeypatch):  # noqa: F811
    page, errors = _open(browser, app)
    page.get_by_role("tab", name="Race all methods").click()
    page.wait_for_selector("#sv-lb-run", timeout=TIMEOUT)
    for box in page.locator("#sv-lb-methods label").all():
        if box.locator("input").is_checked() != (box.inner_text().strip() == "prompt lookup"):
            box.click()
    _set(page, "sv-lb-max-new", 12)
    page.evaluate("""() => { window.svSeen = []; new MutationObserver(() => {
        const b = document.querySelector('#sv-lb-run');
        if (b) window.svSeen.push([b.innerText.trim(), b.disabled]); })
        .observe(document.body, {subtree: true, childList: true, attributes: true, characterData: true}); }""")
    # the press shows at once: disabled in the same turn of the page's event loop (issue 59: registered
    # after the race's own click, its script ran only once the race's first updates were drawn, ~3.5 s)
    assert page.evaluate("""async () => { const b = document.querySelector('#sv-lb-run'); b.click();
        await new Promise(r => setTimeout(r, 0)); return b.disabled; }""")
    page.wait_for_selector("#sv-lb-state:has-text('race finished')", timeout=4 * TIMEOUT)
    page.wait_for_function("!document.querySelector('#sv-lb-run').disabled", timeout=TIMEOUT)
    seen = page.evaluate("window.svSeen")
    assert ["Racing…", True] in seen, seen[:20]
    assert shows(page, "#sv-lb-run", "▶ Run race").strip() == "▶ Run race"
    assert not errors, errors


def test_panes_follow_the_output_of_a_long_prompt(browser, app):  # noqa: F811
    """An edit preset's long prompt fills the panes; the output that follows it is scrolled into
    view, not left below the panes' fold (issue 59: both panes stayed at the top)."""
    page, errors = _open(browser, app)
    page.locator("#sv-preset input").click()
    page.get_by_role("option", name="Edit · rename a parameter").click()
    page.wait_for_function("document.querySelector('#sv-prompt textarea').value.length > 500", timeout=TIMEOUT)
    _set(page, "sv-max-new", 400)  # the tiny pair writes a character a token: many lines
    press(page)
    run_ended(page)
    for pane in ("#sv-baseline", "#sv-speculative"):
        geo = page.evaluate("""s => { const e = document.querySelector(s + ' .prose');
            const last = [...e.querySelectorAll('.sv-tok')].pop().getBoundingClientRect();
            const box = e.getBoundingClientRect();
            return [e.scrollHeight > e.clientHeight, last.bottom <= box.bottom + 1 && last.top >= box.top]; }""",
                            pane)
        assert geo == [True, True], (pane, geo)  # overflowing, and its newest token in view
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#sv-speculative").screenshot(path=str(SHOTS / "newcomer-edit-preset-pane.png"))
    assert not errors, errors


def test_toasts_do_not_pile_up(browser, app):  # noqa: F811
    page, errors = _open(browser, app)
    # a failed run has no toast (its message is in the run info line: issue 71); a refused pair does
    page.get_by_text("Model pair", exact=True).click()
    page.get_by_label("Target + draft").click()
    page.get_by_role("option", name="Custom: type a target and a draft below").click()
    page.get_by_label("Target model").fill("/etc")
    page.get_by_label("Draft model").fill("/tmp")
    for i in range(3):  # a local path on a server without --allow-local-paths: a warning each press
        page.get_by_role("button", name="Load pair").click()
        page.wait_for_function("n => document.querySelectorAll(\"[data-testid='toast-body']\").length >= 1",
                               arg=i, timeout=TIMEOUT)
        settled(page, "#sv-status")  # the press's result in, its toast with it
    # the older toasts close on the next press; a closing one may fade out for a moment
    page.wait_for_function("document.querySelectorAll(\"[data-testid='toast-body']\").length === 1",
                           timeout=10_000)
    toasts = page.locator("[data-testid='toast-body']")
    assert toasts.count() == 1 and "(2)" not in toasts.first.inner_text() \
        and "(3)" not in toasts.first.inner_text(), toasts.all_inner_texts()
    assert not errors, errors


def test_clamped_top_k_shows_in_its_box(browser, app):  # noqa: F811
    page, errors = _open(browser, app)
    page.locator("#sv-more .label-wrap").first.click()
    _set(page, "sv-top-k", -5)  # back to the value it had: no change event (the note came 3 times in 6)
    shows(page, "#sv-top-k .sv-clamp", "-5 was set to 0", 10_000)
    settled(page, "#sv-more")
    assert page.input_value("#sv-top-k input[type=number]") == "0"
    box = page.locator("#sv-top-p input[type=number]")  # typed, then the visitor clicks elsewhere
    box.fill("7")
    page.locator("#sv-prompt textarea").click()
    shows(page, "#sv-top-p .sv-clamp", "top-p must be 0.01–1: 7 was set to 1", 10_000)
    assert page.input_value("#sv-top-p input[type=number]") == "1"
    assert not errors, errors


@pytest.mark.parametrize("scheme", ["light", "dark"])
def test_baseline_title_one_weight(browser, app, scheme):  # noqa: F811
    """gradio's Source Sans Pro 600 file holds a handful of glyphs: at 600 the title's "B" came from it,
    the rest from a fallback bold. The titles ask for 700, a face the page declares from the whole file."""
    page, errors = _open(browser, app, scheme=scheme)
    title = page.locator(".sv-pane-title", has_text="Baseline").first
    assert title.evaluate("e => getComputedStyle(e).fontWeight") == "700"
    page.evaluate("document.fonts.ready.then(() => true)")  # the faces in use have loaded (or failed)
    faces = page.evaluate("[...document.fonts].filter(f => f.family.includes('Source Sans Pro'))"
                          ".map(f => f.weight + ' ' + f.status)")
    assert "700 loaded" in faces, faces
    title.scroll_into_view_if_needed()
    _shot(page, f"newcomer-baseline-title-{scheme}.png")
    assert not errors, errors


def test_deep_trace_upload_gets_one_line(browser, app, tmp_path, capfd):  # noqa: F811
    deep = tmp_path / "deep.json"
    deep.write_bytes(b'{"version": 1, "meta": ' + b"[" * 200_000 + b"]" * 200_000 + b', "events": []}')
    page, errors = _open(browser, app)
    if not page.locator("#sv-replay-play").is_visible():
        page.locator("#sv-replay .label-wrap").first.click()
    page.locator("#sv-replay-upload input[type=file]").set_input_files(str(deep))
    page.wait_for_function("document.querySelector('#sv-replay-info').innerText.includes('nested too deeply')",
                           timeout=TIMEOUT)
    page.click("#sv-replay-play")
    page.wait_for_function("document.querySelector('#sv-runinfo').innerText.includes('nested too deeply')",
                           timeout=TIMEOUT)
    assert "RecursionError" not in capfd.readouterr().err
    assert not errors, errors


def test_a_bad_race_bundle_is_named_at_the_upload(browser, app, tmp_path):  # noqa: F811
    """Random bytes as a race bundle: the upload box itself says so in words, not Python's "'utf-8'
    codec can't decode…" in the state line above the table (issue 59)."""
    junk = tmp_path / "race.json"
    junk.write_bytes(bytes(range(256)) * 8)
    page, errors = _open(browser, app)
    page.get_by_role("tab", name="Race all methods").click()
    page.get_by_text("Recorded races · download yours").click()
    page.locator("#sv-lb-upload input[type=file]").set_input_files(str(junk))
    label = shows(page, "#sv-lb-upload", "Not a race bundle")
    assert "the file is not text" in label and "codec" not in label, label
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.locator("#sv-lb-recorded").screenshot(path=str(SHOTS / "newcomer-bad-bundle.png"))
    assert "codec" not in page.inner_text("#sv-lb-state-box")
    assert not errors, errors


def test_draft_size_intro_matches_its_rows(browser, app):  # noqa: F811
    from specviz.ui.draft_size import load_result
    data = load_result()
    if not data:
        pytest.skip("no committed draft-size result")
    page, errors = _open(browser, app)
    page.get_by_role("tab", name="Draft size").click()
    page.wait_for_selector("#sv-ds-intro .sv-ds-measured", timeout=TIMEOUT)
    settled(page, "#sv-ds-intro")
    intro = page.inner_text("#sv-ds-intro")
    methods = {s["method"] for s in data["sizes"]}
    for s in data["sizes"]:
        assert s["label"] in intro
    if "early-exit" not in methods:  # it promised early-exit and layer-skip rows it did not have
        assert "early exit" not in intro.lower() and "first L layers" not in intro
    assert data["precision"] in page.inner_text("#sv-ds-intro .sv-ds-measured")
    assert not errors, errors



def test_no_id_of_ours_is_on_the_page_twice(browser, app):  # noqa: F811
    """Every fold opened, each sv- id names one element (a visitor's test tool found
    #sv-method-settings twice: Gradio gives a Group's id to two nested divs)."""
    page, errors = _open(browser, app)
    for fold in page.locator(".label-wrap").all():
        if fold.is_visible():
            fold.click()
    page.wait_for_timeout(500)
    twice = page.evaluate("""() => { const n = {};
        document.querySelectorAll('[id^="sv-"]').forEach(e => n[e.id] = (n[e.id] || 0) + 1);
        return Object.entries(n).filter(([k, v]) => v > 1); }""")
    assert twice == [] and not errors, (twice, errors)
