"""esc(): the one HTML escape of the page (render.py re-exports it; speedup_box.py needs it
without importing render, which imports the box)."""
from __future__ import annotations

import html


def esc(text) -> str:
    """HTML-escape text that may hold lone surrogates or other odd code points."""
    if text is None:
        return ""
    out = str(text)
    try:
        out.encode("utf-8")
    except UnicodeEncodeError:
        # pair up valid surrogate pairs, turn lone ones into U+FFFD
        out = out.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return html.escape(out, quote=True)
