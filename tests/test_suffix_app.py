"""Two visitors through the app's API (gradio_client, each with its own session): a suffix run
drafts from the visitor's own earlier output, never from another visitor's (issue 52)."""
import re

import pytest

pytest.importorskip("gradio_client")
from browser.server import shared_server  # noqa: E402
from gradio_client import Client  # noqa: E402
from test_app import args  # noqa: E402

SPEC = 1
PROMPT = "zebra quokka xylophone, zebra quokka"  # no preset: its output is this visitor's own text
MINE = "your earlier run"


def _ready_client(url):
    import time
    c = Client(url, verbose=False)
    end = time.monotonic() + 120
    while time.monotonic() < end and "sv-status-ready" not in c.predict(api_name="/status")[0]:
        time.sleep(0.5)
    return c


def test_two_visitors_never_share_drafts():
    server = shared_server()
    alice, bob = _ready_client(server.url), _ready_client(server.url)
    first = alice.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE not in first[SPEC]  # nothing remembered yet
    again = alice.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE in again[SPEC], "a visitor's second run copies from their first"
    other = bob.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE not in other[SPEC]
    # without "share memory" (off by default, issue 71) bob reads no memory but his own: not alice's
    # runs, and not the presets' shared outputs either (another test on this shared server may have
    # filled those: the visitor59 browser test runs a preset twice)
    froms = re.findall(r'data-src-where="memory" data-src-from="([^"]*)"', other[SPEC])
    assert not froms, froms
