"""The p/q inspector in a real headless Chromium: click a rejected token, the
panel shows p, q and the residual. Screenshot: test-artifacts/inspector.png."""
import pytest
from test_browser import ARTIFACTS, TIMEOUT, browser, open_page, run_and_wait, server, set_number  # noqa: F401


def _legend(page):
    return page.locator("#sv-insp-plot .legendtext").evaluate_all("els => els.map(e => e.textContent)")


def test_click_rejected_token_shows_three_distributions(browser, server):  # noqa: F811
    page, errors = open_page(browser, server, "light")
    set_number(page, "sv-max-new", 48)
    run_and_wait(page)
    rejected = page.locator("#sv-speculative .sv-rejected[data-r]")
    if rejected.count() == 0:
        pytest.skip("this run had no rejection")
    rejected.first.click()
    page.wait_for_selector("#sv-insp-plot .js-plotly-plot .legendtext", timeout=TIMEOUT)
    page.wait_for_timeout(600)
    legend = _legend(page)
    assert any(t.startswith("p (target)") for t in legend), legend
    assert any(t.startswith("q (draft)") for t in legend), legend
    assert any(t.startswith("residual") for t in legend), legend
    text = page.inner_text("#sv-insp-html")
    assert "rejected" in text and "u = " in text and "min(1, p/q)" in text
    assert page.locator("#sv-insp-html .sv-insp-gauge").count() == 1
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#sv-inspector").screenshot(path=str(ARTIFACTS / "inspector.png"))
    # a bonus or accepted token: p and q only (no residual at that row)
    other = page.locator("#sv-speculative .sv-accepted[data-r]")
    if other.count():
        other.first.click()
        page.wait_for_function("!document.querySelector('#sv-insp-html').innerText.includes('rejected (u')",
                               timeout=TIMEOUT)
    assert not errors, errors
    page.close()
