"""The p/q inspector in a real headless Chromium: click a rejected token, the
panel shows p, q and the residual. Screenshot: test-artifacts/inspector.png."""
import pytest
from browser.pages import settled, shows
from test_browser import ARTIFACTS, TIMEOUT, open_page, open_replay, run_and_wait, server, set_number  # noqa: F401


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
    settled(page, "#sv-inspector", TIMEOUT)  # the click's event ended: its text and figure both in
    legend = _legend(page)
    assert any(t.startswith("p (target)") for t in legend), legend
    assert any(t.startswith("q (draft)") for t in legend), legend
    # greedy (the page's default): the models' raw softmax p and q and a deterministic
    # verdict, no random u and no residual (sampled runs: test_sampled_trace_* below)
    text = page.inner_text("#sv-insp-html")
    assert "rejected" in text and "greedy, so no random u" in text, text
    assert not any(t.startswith("residual") for t in legend), legend
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



def test_keyboard_walks_the_tokens_and_opens_the_inspector(browser, server):  # noqa: F811
    """A keyboard reaches the inspector (ui/access.py): the speculative pane is one Tab stop, the arrow
    keys walk its tokens, each read as its outcome and text, and Enter opens the inspector. The panes
    are named regions, the run line is polite, each chart a figure named by its title and last values."""
    import re
    page, errors = open_page(browser, server, "light")
    set_number(page, "sv-max-new", 32)
    run_and_wait(page)
    assert page.get_attribute("#sv-speculative", "role") == "region"
    assert page.get_attribute("#sv-speculative", "aria-labelledby") == "sv-speculative-title"
    assert page.get_attribute("#sv-runinfo", "aria-live") == "polite"
    page.wait_for_function("(document.querySelector('#sv-chart-alpha').getAttribute('aria-label') || '')"
                           ".includes('points')", timeout=TIMEOUT)
    assert page.get_attribute("#sv-chart-alpha", "aria-label").startswith("Accepted ÷ drafted per round.")
    buttons = page.locator("#sv-chart-alpha .modebar-btn").evaluate_all("els => els.map(e => e.dataset.title)")
    assert buttons and len(buttons) <= 2, buttons  # the download (and plotly's logo): not 10 Tab stops
    fill = page.evaluate("() => getComputedStyle(document.querySelector('#sv-chart-alpha .ytick text')).fill")
    assert fill == "rgb(95, 95, 105)", fill  # the charts' grey text, 6:1 on white (was #8c8c8c, 3.4:1)
    focused = "() => { const a = document.activeElement; return [a.dataset.r, a.getAttribute('role'), " \
              "a.getAttribute('aria-label')]; }"
    page.focus("#sv-speculative .prose")
    page.keyboard.press("ArrowRight")
    r, role, label = page.evaluate(focused)
    assert r == "0" and role == "button", (r, role)
    assert re.match(r"(accepted draft|rejected draft|resampled|bonus|plain step): ", label), label
    page.keyboard.press("End")
    last = page.locator("#sv-speculative .sv-tok[data-r]").last.get_attribute("data-r")
    assert page.evaluate(focused)[0] == last
    page.keyboard.press("Enter")
    page.wait_for_function("document.querySelector('#sv-insp-html').innerText.includes('clicked')",
                           timeout=TIMEOUT)
    assert f"Round {int(last) + 1}" in page.inner_text("#sv-insp-html")
    assert not errors, errors
    page.close()

def _sampled_trace(path):
    from specviz.engine.decoding import baseline, speculative
    from specviz.engine.proposers import DraftModelProposer
    from specviz.engine.sampling import SamplingParams
    from specviz.models.tiny import tiny_model, tiny_tokenizer
    from specviz.run.trace import new_trace
    tok = tiny_tokenizer()
    target, draft = tiny_model(len(tok), seed=0, layers=3), tiny_model(len(tok), seed=1, layers=1)
    ids, params = tok.encode("abc"), SamplingParams(temperature=1.0)
    tr = new_trace({"prompt": "abc", "gamma": 3, "temperature": 1.0, "method": "draft", "max_new_tokens": 40},
                   "tiny-target", "tiny-draft", "cpu", label="inspector test")
    for ev in baseline(target, tok, ids, 40, params, seed=3):
        tr.add("baseline", ev)
    for ev in speculative(target, DraftModelProposer(draft), tok, ids, 40, 3, params, seed=3):
        tr.add("speculative", ev)
    return tr.save(path)


def test_inspector_in_replay(browser, server, tmp_path):  # noqa: F811
    path = _sampled_trace(tmp_path / "sampled.json")
    page, errors = open_page(browser, server, "light")
    open_replay(page)
    page.set_input_files("#sv-replay-upload input[type=file]", str(path))
    shows(page, "#sv-replay-info", "inspector test", TIMEOUT)  # the upload read: its label shown
    page.locator("#sv-replay-speed label", has_text="20×").click()
    page.click("#sv-replay-play")
    page.wait_for_function("document.querySelector('#sv-stats').innerText.includes('done')", timeout=TIMEOUT)
    settled(page, "#sv-speculative", TIMEOUT)
    rejected = page.locator("#sv-speculative .sv-rejected[data-r]")
    assert rejected.count() > 0
    rejected.first.click()
    page.wait_for_selector("#sv-insp-plot .js-plotly-plot .legendtext", timeout=TIMEOUT)
    settled(page, "#sv-inspector", TIMEOUT)
    legend = _legend(page)
    assert [t.split(" ")[0] for t in legend] == ["p", "q", "residual"], legend
    assert page.locator("#sv-insp-plot .xtick").count() > 3  # top-k bars, not one-hot
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#sv-inspector").screenshot(path=str(ARTIFACTS / "inspector-replay.png"))
    assert not errors, errors
    page.close()
