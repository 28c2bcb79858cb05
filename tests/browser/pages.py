"""Pages a browser test opens on the app, their closing after each test, and the waits every
browser test uses to read a state only once the page shows it (issue 59).

A failed test's page is closed too (which cancels its run): a run left going holds the one run
slot, and the next test's run waits behind it (issue 21: a failed test's 200-token run kept the
next test's badge away for 120 s).

Waits, never fixed sleeps: gradio writes an event's outputs when the event's result lands, which
on a loaded machine may be seconds after the press, and after a toast the same event sent first
(issue 59: test_xss read "#sv-status" while it still said "processing | 0.1s"). So a test waits for
the text it will read (`shows`), for no event to be pending on what it reads (`settled`: gradio's
tracker inside a component holds "processing | 0.1s" until the event ends, even with
show_progress="hidden"), or for the run its press started to end (`press` then `run_ended`: the
button went disabled and came back, which happens after the run's last output)."""
from __future__ import annotations

TIMEOUT = 120_000  # ms

# an event that writes into the element is under way: gradio's status tracker in it holds a
# progress text ("queue: 1/1 | 0.0s", "processing | 0.1s"); after a failed event it holds "Error"
# instead (a .error label), which is no longer pending
PENDING_JS = """sel => [...document.querySelectorAll(sel)].some(el =>
  el.querySelector('[data-testid=status-tracker] .progress-text'))"""
SHOWS_JS = f"""([sel, text]) => {{ const el = document.querySelector(sel);
  return !!el && el.innerText.includes(text) && !({PENDING_JS})(sel); }}"""
# the press's button went disabled (the page's own press script, or the server's "Running…")
WATCH_JS = """sel => { const seen = window.svPressed = window.svPressed || {};
  seen[sel] = false;
  const obs = new MutationObserver(() => { const b = document.querySelector(sel);
    if (b && b.disabled) { seen[sel] = true; obs.disconnect(); } });
  obs.observe(document.body, {subtree: true, attributes: true, attributeFilter: ['disabled']}); }"""
ENDED_JS = """sel => { const b = document.querySelector(sel);
  return !!(window.svPressed && window.svPressed[sel]) && !!b && !b.disabled; }"""
# the first status poll has landed: it folds the replay section once the models are ready; a
# phone's explainer is folded by the page's script
READY_JS = """narrow => { const open = (sel) => { const w = document.querySelector(sel + ' .label-wrap');
    return !!w && w.classList.contains('open'); };
  return !open('#sv-replay') && !(narrow && open('#sv-explainer')); }"""


def settled(page, selector: str, timeout: int = TIMEOUT) -> None:
    """No gradio event is pending on the element(s) `selector` matches."""
    page.wait_for_function(f"sel => !({PENDING_JS})(sel)", arg=selector, timeout=timeout)


def shows(page, selector: str, text: str, timeout: int = TIMEOUT) -> str:
    """Wait until `selector`'s text holds `text` with no event pending on it; its text then."""
    page.wait_for_function(SHOWS_JS, arg=[selector, text], timeout=timeout)
    return page.inner_text(selector)


def press(page, button: str = "#sv-run", how=None) -> None:
    """Press `button` (or do `how()`, e.g. a key), watching for the press to disable it."""
    page.evaluate(WATCH_JS, button)
    (how or (lambda: page.click(button)))()


def click_on_first_round(page, target: str) -> None:
    """Click `target` from inside the page as soon as the live run's first round shows: on a busy
    2-core machine playwright itself may notice the round only seconds later, after the (short,
    tiny-model) run has ended."""
    page.evaluate("""sel => new MutationObserver((_, obs) => {
        if (document.querySelector('#sv-speculative .sv-round')) {
            obs.disconnect(); document.querySelector(sel).click(); }
    }).observe(document.querySelector('#sv-speculative'), {childList: true, subtree: true})""", target)


def click_once_running(page, target: str) -> None:
    """Click `target` from inside the page as soon as the live run says it is timing (the banner of its
    first update) or shows a round. A fair run's panes replay what was timed and may show round 1 only
    once the engines are nearly done (ui/live.py): under load the tiny run ended before that click."""
    page.evaluate("""sel => new MutationObserver((_, obs) => {
        if (document.querySelector('#sv-runinfo .sv-live-banner, #sv-speculative .sv-round')) {
            obs.disconnect(); document.querySelector(sel).click(); }
    }).observe(document.body, {childList: true, subtree: true})""", target)


def run_ended(page, button: str = "#sv-run", timeout: int = TIMEOUT) -> None:
    """The run that `press` started has ended: its button went disabled and is enabled again
    (the release is chained after the run's event, so the run's outputs have all landed)."""
    page.wait_for_function(ENDED_JS, arg=button, timeout=timeout)


def run(page, button: str = "#sv-run", timeout: int = TIMEOUT) -> None:
    """Press Run and wait for that run to end, its panes and numbers final."""
    press(page, button)
    run_ended(page, button, timeout)


def charts_drawn(page, within: str = "", n: int = 1, timeout: int = TIMEOUT) -> None:
    """At least `n` plotly charts drawn (plotly draws after gradio writes the figure)."""
    page.wait_for_function("([sel, n]) => document.querySelectorAll(sel).length >= n",
                           arg=[f"{within} .js-plotly-plot .main-svg".strip(), n], timeout=timeout)


def still(page, selector: str, frames: int = 10, timeout: int = 10_000) -> None:
    """`selector`'s box has not moved for `frames` animation frames (folds, fonts, banners done)."""
    page.wait_for_function("""([sel, frames]) => new Promise(done => {
        let last = '', same = 0;
        const step = () => { const e = document.querySelector(sel);
          const r = e ? JSON.stringify(e.getBoundingClientRect()) : '';
          same = r && r === last ? same + 1 : 0; last = r;
          if (same >= frames) done(true); else requestAnimationFrame(step); };
        step(); })""", arg=[selector, frames], timeout=timeout)


def ready(page, timeout: int = TIMEOUT) -> None:
    """Run is enabled and the first status poll has landed (what a visitor sees once settled)."""
    page.wait_for_selector("#sv-run:not([disabled])", timeout=timeout)
    narrow = page.evaluate("window.innerWidth <= 720")
    page.wait_for_function(READY_JS, arg=narrow, timeout=timeout)


class Pages:
    """The pages one test module opened; close_all() after each test (an autouse fixture)."""

    def __init__(self, timeout_ms: int):
        self.opened: list = []
        self.timeout_ms = timeout_ms

    def open(self, browser, url: str, *, query: str = "", size=(1280, 720), scheme: str = "light"):
        """A page at `url` in `scheme`, once Run is enabled and the first status poll has come:
        (page, the page errors it raises)."""
        page = browser.new_page(viewport={"width": size[0], "height": size[1]}, color_scheme=scheme)
        self.opened.append(page)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}?__theme={scheme}{'&' + query if query else ''}")
        ready(page, self.timeout_ms)
        return page, errors

    def close_all(self) -> None:
        while self.opened:
            page = self.opened.pop()
            if not page.is_closed():
                page.close()
