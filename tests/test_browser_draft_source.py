"""The copied-draft hover (ui/draft_source.py) in a real headless Chromium, on a static page made of
the page's own CSS and pane HTML (no server, no model: a second or two). Hovering a copied round's
token opens the card and highlights the source: the prompt's line, or earlier output tokens.
Screenshots: test-artifacts/draft_source_{light,dark}.png."""
import os
from pathlib import Path

import pytest
from test_draft_source import rnd, suffix_info

from specviz.engine.events import Outcome, RoundEvent, TokenEvent
from specviz.ui import draft_source, render

CHROMIUM = os.environ.get("SPECVIZ_CHROMIUM", "/usr/bin/chromium")
if not Path(CHROMIUM).exists():
    pytest.skip(f"no Chromium at {CHROMIUM}", allow_module_level=True)
pytest.importorskip("playwright.sync_api")

ARTIFACTS = Path(__file__).resolve().parent.parent / "test-artifacts"
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n"


def _texts(i, texts, info):
    r = rnd(i, info, n_acc=len(texts) - 1, gamma=len(texts) - 1)
    r.tokens = [TokenEvent(token_id=7, text=t, outcome=Outcome.ACCEPTED if k < len(texts) - 1 else Outcome.BONUS,
                           t=0.5, round=i, position=k + 1 if k < len(texts) - 1 else 0, p=0.9, q=1.0)
                for k, t in enumerate(texts)]
    return r


def _page(browser, dark: bool, rounds: list[RoundEvent]):
    body = render.prompt_span(PROMPT) + "".join(render.round_html(r, "suffix") for r in rounds)
    page = browser.new_page(viewport={"width": 900, "height": 420})
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.set_content(f"<html class='{'dark' if dark else ''}'><head><meta charset='utf-8'><style>"
                     f"body {{ background: {'#0b0f19' if dark else '#fff'}; color: {'#eee' if dark else '#222'}; }}"
                     f"{render.page_css()}</style></head><body><div id='pane' class='prose sv-pane'>{body}</div>"
                     f"<div>{render.legend_html()}</div></body></html>")
    page.evaluate("js => new Function('element', js)(document.getElementById('pane'))", draft_source.SOURCE_JS)
    return page, errors


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_hover_shows_the_source_and_highlights_it(browser, dark):
    prompt_round = _texts(0, ["    return", " a", " -", " b"],
                          suffix_info("prompt", "the prompt", text="    return a + b", span="    return a",
                                      line_no=2))
    model_round = _texts(1, ["\n\n", "x = 1", "\n"], {"drafter": "model", "source": None})
    output_round = _texts(2, ["x =", " 1", "\n"], suffix_info("output", "this output", text="x = 1", span="x = 1",
                                                               line_no=7))
    page, errors = _page(browser, dark, [prompt_round, model_round, output_round])
    assert page.locator(".sv-src-card").is_hidden()
    page.hover(".sv-round[data-round='1'] .sv-accepted >> nth=0")
    card = page.locator(".sv-src-card")
    card.wait_for(state="visible", timeout=5000)
    assert "copied 3 tokens from the prompt, line 2" in card.inner_text()
    assert card.locator("mark").inner_text() == "    return a"
    hit = page.locator("#pane .sv-pl.sv-src-hit")
    assert hit.count() == 1 and hit.inner_text().strip() == "return a + b"
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"draft_source_{'dark' if dark else 'light'}.png"))
    # an output source: the earlier output tokens that hold the span light up, not the prompt
    page.hover(".sv-round[data-round='3'] .sv-accepted >> nth=0")
    page.wait_for_function("document.querySelector('.sv-src-card').innerText.includes('this output')")
    hits = page.locator("#pane .sv-src-hit")
    assert hits.count() == 1 and hits.inner_text() == "x = 1"
    assert page.locator(".sv-round[data-round='2'] .sv-src-hit").count() == 1
    # a model round: no card; leaving the pane clears everything
    page.hover(".sv-round[data-round='2'] .sv-accepted >> nth=0")
    assert page.locator(".sv-src-card").is_hidden() and page.locator(".sv-src-hit").count() == 0
    assert not errors, errors
    page.close()


def test_a_live_suffix_run_marks_copied_rounds_and_shows_their_source(browser):
    """The page on the tiny pair: a suffix run of a prompt that repeats itself; hovering a copied
    round's token opens the card. Screenshot: test-artifacts/draft_source_live.png."""
    import re

    from specviz.engine.proposers import REGISTRY
    if "suffix" not in REGISTRY:
        pytest.skip("no suffix method in this build")
    from browser.pages import run
    from browser.server import shared_server
    from test_browser import TIMEOUT, open_page
    page, errors = open_page(browser, shared_server(), "light")
    page.get_by_text("More settings: sampling, draft method").click()
    page.locator("#sv-method label", has_text=re.compile(r"^\s*suffix tree")).click()
    page.fill("#sv-prompt textarea", "x = [1, 2, 3]\ny = [1, 2, 3]\nx = [1, 2, 3]\ny = [")
    box = page.locator("#sv-max-new input[type=number]")
    box.fill("32")
    box.press("Enter")
    run(page, timeout=TIMEOUT)  # the run's last update in (the badge may come before it)
    page.wait_for_selector("#sv-runinfo .sv-badge", timeout=TIMEOUT)
    copied = page.locator("#sv-speculative .sv-from-text > .sv-tok")
    assert copied.count() > 0, page.inner_text("#sv-speculative")
    copied.first.hover()
    card = page.locator(".sv-src-card")
    card.wait_for(state="visible", timeout=5000)
    assert re.search(r"copied \d+ tokens from (the prompt|this output)", card.inner_text()), card.inner_text()
    ARTIFACTS.mkdir(exist_ok=True)
    page.locator("#sv-speculative").screenshot(path=str(ARTIFACTS / "draft_source_live.png"))
    assert not errors, errors
    page.close()
