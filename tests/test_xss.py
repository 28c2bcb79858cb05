"""Untrusted text in a real browser (headless Chromium): markup typed in the
prompt, markup written by the model, and markup typed as a model id all show
as literal text; no element is created from them and no script runs.

The model is the tiny random pair (character-level tokenizer, whose CHARS
include < > = " and friends) with the target's engine step scripted so that it
writes a chosen payload: the page renders what a model could write.
"""
import os
from pathlib import Path

import pytest

CHROMIUM = os.environ.get("SPECVIZ_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api")
from browser.pages import ready, run, shows  # noqa: E402

TIMEOUT = 120_000
PANES = "#sv-baseline, #sv-speculative"
# what the visitor types: markup, an entity, a lone surrogate (a half emoji), U+FFFD
PROMPT = '<img src=x onerror="window.__xss=1"> <script>window.__xss=2</script> &amp; \ud800 \ufffd: '
# what the scripted target writes (only characters of the tiny tokenizer)
OUTPUT = '<img src=x onerror="window.__xss=3"><script>window.__xss=4</script><b>bold</b>'


@pytest.fixture(scope="module")
def app(inproc_app):
    """The session's in-process page (conftest.py); `browser`: the session's Chromium."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the app server in tests: the browser needs the other core
    yield inproc_app
    torch.set_num_threads(threads)


@pytest.fixture()
def scripted_target(monkeypatch, app):
    """The target's engine step (decoding.forward_logits: only the target goes
    through it) returns logits that pick OUTPUT's next character, so baseline
    and speculative decoding both write OUTPUT (the draft's guesses are
    rejected or accepted as usual)."""
    import torch

    import specviz.engine.decoding as decoding
    real = decoding.forward_logits
    tok = app.manager.pair.tokenizer
    ids = [tok.convert_tokens_to_ids(c) for c in OUTPUT]
    assert tok.unk_token_id not in ids
    n_prompt = len(tok.encode(PROMPT.replace("\ud800", "\ufffd")))

    def scripted(model, feed, cache, keep):
        logits = real(model, feed, cache, keep)  # keeps the KV cache exactly as before
        total = cache.get_seq_length()
        out = torch.full_like(logits, -1e4)
        for i in range(keep):
            k = total - keep + i + 1 - n_prompt  # index in the output of the token row i predicts
            out[i, ids[k % len(ids)]] = 0.0
        return out

    monkeypatch.setattr(decoding, "forward_logits", scripted)


def no_injection(page):
    """No element made from the text, nothing ran."""
    assert page.evaluate("typeof window.__xss") == "undefined"
    found = page.evaluate(f"""() => Array.from(document.querySelectorAll(
        '{PANES}')).flatMap(p => Array.from(p.querySelectorAll('img, script, b, iframe, [onerror]')))
        .map(e => e.outerHTML)""")
    assert found == [], found
    # nowhere in the page (status line, run info, toasts included)
    assert page.locator("img[src=x], [onerror], iframe").count() == 0
    assert page.evaluate("Array.from(document.scripts).filter(s => s.text.includes('__xss')).length") == 0


def test_markup_in_prompt_and_output_shows_as_text(browser, app, scripted_target):
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(app.url)
    ready(page, TIMEOUT)
    page.fill("#sv-prompt textarea", PROMPT)
    box = page.locator("#sv-max-new input[type=number]")
    box.fill(str(len(OUTPUT)))
    box.press("Enter")
    run(page, timeout=TIMEOUT)  # the run's outputs final (the badge may land before the last update)
    page.wait_for_selector("#sv-runinfo .sv-badge", timeout=TIMEOUT)
    no_injection(page)
    base = page.inner_text("#sv-baseline")
    spec = page.inner_text("#sv-speculative")
    # the prompt, as typed (the lone surrogate shown as U+FFFD)
    shown_prompt = PROMPT.replace("\ud800", "\ufffd")
    assert base.startswith(shown_prompt.rstrip()) and spec.startswith(shown_prompt.rstrip()), base[:200]
    # the model's markup, literally
    assert base.replace("\n", "").endswith(OUTPUT)
    # speculative: the same text once rejected guesses (struck through) are left out
    kept = page.evaluate("""() => Array.from(document.querySelectorAll('#sv-speculative .sv-tok'))
        .filter(e => !e.classList.contains('sv-rejected')).map(e => e.textContent).join('')""")
    assert kept == OUTPUT
    assert "identical outputs" in page.inner_text("#sv-runinfo")
    # hover text (title attributes) carries the token text escaped, not as markup
    titles = page.evaluate("""() => Array.from(document.querySelectorAll('#sv-baseline .sv-tok'))
        .map(e => e.getAttribute('title'))""")
    assert any("'<'" in t for t in titles)
    assert not errors, errors
    page.close()


def test_markup_in_a_model_id_shows_as_text(browser, app):
    """The custom pair's model id comes back in the status line and in a toast
    (gradio renders toast text as HTML): both escaped."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.goto(app.url)
    ready(page, TIMEOUT)
    page.get_by_text("Model pair", exact=True).click()
    page.get_by_label("Target + draft").click()
    page.get_by_role("option", name="Custom: type a target and a draft below").click()
    page.get_by_label("Target model").fill('<img src=x onerror="window.__xss=5">')
    page.get_by_label("Draft model").fill("<b>org/x</b>")
    page.get_by_role("button", name="Load pair").click()
    toast = page.get_by_test_id("toast-text")
    toast.wait_for(timeout=30_000)
    assert '<img src=x onerror="window.__xss=5">' in toast.inner_text()
    # the toast comes first, the status line when the event's result lands (issue 59: read at once,
    # it still said "processing | 0.1s")
    shows(page, "#sv-status", "is neither a Hugging Face Hub id", TIMEOUT)
    no_injection(page)
    page.close()
