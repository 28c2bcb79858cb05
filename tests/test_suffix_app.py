"""Two visitors through the app's API (gradio_client, each with its own session): a suffix run
drafts from the visitor's own earlier output, never from another visitor's (issue 52)."""
import pytest

pytest.importorskip("gradio_client")
from test_app import args, client as _client, server  # noqa: E402,F401 (fixtures)
from gradio_client import Client  # noqa: E402

SPEC = 1
PROMPT = "zebra quokka xylophone, zebra quokka"  # no preset: its output is this visitor's own text
MINE = "your earlier run"


def test_two_visitors_never_share_drafts(server, _client):
    alice, bob = _client, Client(server.url, verbose=False)
    first = alice.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE not in first[SPEC]  # nothing remembered yet
    again = alice.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE in again[SPEC], "a visitor's second run copies from their first"
    other = bob.predict(*args(PROMPT, max_new_tokens=40), "suffix", api_name="/run")
    assert MINE not in other[SPEC] and "memory" not in other[SPEC]
