"""Why a server we started failed, from its log: the one scanner for llama-server and vLLM."""
from __future__ import annotations

from pathlib import Path


def log_reason(log: Path | None) -> str:
    """The last line of a failed server's log that names an error or a failure, else its last line
    (300 characters at most)."""
    try:
        lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except (OSError, AttributeError):
        return "no log"
    for ln in reversed(lines):
        if "error" in ln.lower() or "failed" in ln.lower():
            return ln[-300:]
    return lines[-1][-300:] if lines else "empty log"
