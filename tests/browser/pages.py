"""Pages a browser test opens on the app, and their closing after each test.

A failed test's page is closed too (which cancels its run): a run left going holds the one run
slot, and the next test's run waits behind it (issue 21: a failed test's 200-token run kept the
next test's badge away for 120 s)."""
from __future__ import annotations


class Pages:
    """The pages one test module opened; close_all() after each test (an autouse fixture)."""

    def __init__(self, timeout_ms: int):
        self.opened: list = []
        self.timeout_ms = timeout_ms

    def open(self, browser, url: str, *, query: str = "", size=(1280, 720), scheme: str = "light",
             settle_ms: int = 1200):
        """A page at `url` in `scheme`, once Run is enabled and the first status poll has come
        (settle_ms): (page, the page errors it raises)."""
        page = browser.new_page(viewport={"width": size[0], "height": size[1]}, color_scheme=scheme)
        self.opened.append(page)
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(f"{url}?__theme={scheme}{'&' + query if query else ''}")
        page.wait_for_selector("#sv-run:not([disabled])", timeout=self.timeout_ms)
        page.wait_for_timeout(settle_ms)
        return page, errors

    def close_all(self) -> None:
        while self.opened:
            page = self.opened.pop()
            if not page.is_closed():
                page.close()
