"""Where draft tokens come from: one interface (base.Proposer), one file per
method, and the registry below that maps a method name to a proposer."""
from __future__ import annotations

from ...request import RequestError
from .base import Proposal, Proposer
from .draft import AdaptiveDraftProposer, DraftModelProposer
from .lookup import PromptLookupProposer

__all__ = ["Proposal", "Proposer", "AdaptiveDraftProposer", "DraftModelProposer",
           "PromptLookupProposer", "make_proposer", "target_vocab"]


def target_vocab(model) -> int:
    return model.get_output_embeddings().out_features


def make_proposer(pair, method: str) -> Proposer:
    vocab = target_vocab(pair.target)
    if method == "lookup":
        return PromptLookupProposer(vocab)
    if method in ("draft", "adaptive"):
        if pair.draft is None:
            raise RequestError("This pair has no draft model: pick prompt lookup instead.")
        cls = DraftModelProposer if method == "draft" else AdaptiveDraftProposer
        return cls(pair.draft, vocab_size=vocab)
    raise RequestError(f"Unknown method {method!r}.")
