"""Where draft tokens come from: one interface (engine/proposer.py), one file per
method. Each method file registers itself with `@register(...)`; every module
in this folder is imported here, so a new method is one new file."""
from __future__ import annotations

import importlib
import pkgutil

from ...errors import RequestError
from ..proposer import REGISTRY, MethodSpec, Proposal, Proposer, register, target_vocab

__all__ = ["Proposal", "Proposer", "MethodSpec", "register", "make_proposer", "method_names",
           "method_spec", "target_vocab", "AdaptiveDraftProposer", "DraftModelProposer",
           "PromptLookupProposer"]

for _mod in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_mod.name}")

from .draft import AdaptiveDraftProposer, DraftModelProposer  # noqa: E402
from .lookup import PromptLookupProposer  # noqa: E402


def method_names() -> tuple[str, ...]:
    """Registered methods, in registration order (chain methods first)."""
    return tuple(sorted(REGISTRY, key=lambda m: REGISTRY[m].order))


def method_spec(method: str) -> MethodSpec:
    if method not in REGISTRY:
        raise RequestError(f"Unknown method {method!r}: choose one of {', '.join(method_names())}.")
    return REGISTRY[method]


def make_proposer(pair, method: str, req=None) -> Proposer:
    """A fresh proposer for one run of `method` on `pair` (`req` carries its options)."""
    return method_spec(method).build(pair, req)
