"""Medusa heads: K trained residual blocks on the target's last hidden state
propose the next K tokens as a chain (specviz/heads/ trains and caches them).

No second model and no extra target forward: the hidden state comes from the
verify forward the engine runs anyway. This proposer runs that forward itself
(verify_logits, in the engine's cache) with a hook on the target's final norm,
which keeps the post-norm states of the positions just read; the row of the
last accepted position is the h the heads read next round. Round 1 drafts
nothing (no state yet): it is the prompt's forward, as plain decoding's.
Per round the heads cost K residual blocks plus one LM-head pass for all K
rows (~1/7 of a 1.5B step by parameter count: the 151936 x 1536 head).

Lossless: head k's q is its softmax after the request's warp, and each token
is drawn from its own head independently of the others, so q_k is exactly the
law of the k-th draft given the drafts before it; the engine's modified
rejection sampling then keeps the target's law (greedy: argmax chains, output
identical to plain decoding). The heads see h_{n-1} (the state that predicted
the last committed token), not that token itself: Medusa's design.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ...errors import RequestError
from ...heads import store
from ...heads.model import head_logits
from ..forward import forward_logits, pick
from ..sampling import warp
from .base import Proposal, Proposer, register, target_vocab


def final_norm(model):
    body = getattr(model, "model", None)
    return getattr(body, "norm", None)


@dataclass
class HeadsProposer(Proposer):
    reads_target_cache = True
    supplies_verify_logits = True

    model: torch.nn.Module
    heads: torch.nn.Module  # specviz.heads.model.Heads
    vocab_size: int
    name: str = "heads"
    cache: object = field(default=None, repr=False)
    h: torch.Tensor | None = field(default=None, repr=False)  # state at the last committed position - 1
    rows: torch.Tensor | None = field(default=None, repr=False)  # states of the last verify's kept rows

    def reset(self, prompt_ids):
        self.h = self.rows = None
        return 0

    def attach_target_cache(self, cache) -> None:
        self.cache = cache
        if getattr(cache, "compiled", None) is not None:
            cache.compiled = None  # a compiled graph would not run the norm hook: verify eagerly

    def propose(self, committed, gamma, params, generator, eos_ids):
        if self.h is None or gamma < 1:  # round 1: no state yet, the prompt's forward makes one
            return Proposal([], torch.zeros(0, self.vocab_size), forwards=0,
                            info={"heads": self.heads.k, "head_ms": 0.0})
        t0 = time.perf_counter()
        k = min(gamma, self.heads.k)
        logits = head_logits(self.heads, self.model.get_output_embeddings(), self.h[None])[:k, 0]
        qs = warp(logits[:, : self.vocab_size], params)
        tokens = []
        for q in qs:
            tokens.append(pick(q, params, generator))
            if tokens[-1] in eos_ids:  # nothing useful follows an end-of-sequence
                break
        info = {"heads": self.heads.k, "head_ms": round((time.perf_counter() - t0) * 1e3, 3)}
        return Proposal(tokens, qs[: len(tokens)], forwards=0, info=info)

    def verify_logits(self, fed, tokens, keep):
        """The engine's verify forward, keeping the post-norm hidden states of its last `keep` rows."""
        box = []
        handle = final_norm(self.model).register_forward_hook(lambda m, i, out: box.append(out))
        try:
            logits = forward_logits(self.model, fed + tokens, self.cache, keep)
        finally:
            handle.remove()
        self.rows = box[-1][0, -keep:] if box else None
        return logits

    def rollback(self, committed, n_accepted, n_drafted):
        # the last accepted position's state predicted the appended token; the heads read it next
        self.h = self.rows[n_accepted] if self.rows is not None else None
        self.rows = None


@register("heads", "Medusa heads", order=22, note="The heads are trained once on the server (python -m "
          "specviz.heads train); γ above their number K proposes K tokens.",
          description="K trained heads on the target's last hidden state propose the next K tokens "
                      "(train once: python -m specviz.heads train)")
def _build_heads(pair, req=None):
    if final_norm(pair.target) is None:
        raise RequestError("Medusa heads need a decoder with a final norm (model.norm); this target "
                           "has another layout.")
    heads = store.load(pair).to(pair.target.device)
    return HeadsProposer(pair.target, heads, target_vocab(pair.target))
