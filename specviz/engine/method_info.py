"""Run-level totals and one round's story from the method-specific RoundEvent.info
fields, for the CLI, bench and page: each method's MethodSpec.summarize and
round_note (in its proposer file). Empty for methods without them (the chains)."""
from __future__ import annotations

from .proposer import REGISTRY


def summarize(rounds, method: str | None) -> dict:
    spec = REGISTRY.get(method)
    infos = [r.info for r in rounds if getattr(r, "info", None)]
    return spec.summarize(infos) if infos and spec is not None and spec.summarize else {}


def describe(d: dict) -> str:
    """One line from summarize()'s dict."""
    return "  ".join(f"{k.replace('_', ' ')} {v}" for k, v in d.items())


def round_note(info: dict, method: str | None) -> str:
    """One round's method-specific story, for a tooltip (empty for chain methods)."""
    spec = REGISTRY.get(method)
    return spec.round_note(info) if info and spec is not None and spec.round_note else ""
