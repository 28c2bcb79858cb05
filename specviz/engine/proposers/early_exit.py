"""Early exit (training-free LayerSkip): the target's first L layers, then its
own final norm and LM head, draft γ tokens; the full target verifies them.

The draft is an ordinary q-draft (q = the warped early-exit distribution), so
the standard verification keeps greedy output identical to plain decoding and
the target's law under sampling. No second model: `--draft` is ignored.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from ...errors import RequestError
from ..forward import pick
from ..layers import decoder_parts, layers_forward, n_layers
from ..sampling import warp
from .base import Proposal, Proposer, register, target_vocab


@dataclass
class LayerSubsetProposer(Proposer):
    """Drafts autoregressively with a subset of the target's own layers, with its
    own KV cache (slots of unused layers stay empty)."""

    model: torch.nn.Module
    layers: tuple[int, ...]
    vocab_size: int | None = None
    name: str = "early-exit"
    cache: DynamicCache | None = field(default=None, repr=False)
    seen: int = 0  # positions in the cache (layer 0 may be skipped: count ourselves)

    def reset(self, prompt_ids):
        self.cache, self.seen = DynamicCache(), 0
        # the last prompt token is fed with the first propose() call
        if len(prompt_ids) > 1:
            self._logits(prompt_ids[:-1])
            return 1
        return 0

    def _logits(self, ids):
        logits = layers_forward(self.model, ids, self.cache, self.layers, start=self.seen, keep=1)
        self.seen += len(ids)
        return logits[..., : self.vocab_size] if self.vocab_size else logits

    def propose(self, committed, gamma, params, generator, eos_ids):
        feed = committed[self.seen:]  # 1 token, or 2 after a bonus round
        tokens, qs = [], []
        for _ in range(gamma):
            q = warp(self._logits(feed)[-1], params)
            x = pick(q, params, generator)
            tokens.append(x)
            qs.append(q)
            if x in eos_ids:  # nothing useful follows an end-of-sequence
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens))

    def rollback(self, committed, n_accepted, n_drafted):
        # keep what is still committed, leaving the last committed token to be fed next round
        extra = self.seen - (len(committed) - 1)
        if extra > 0:
            self.cache.crop(-extra)
            self.seen -= extra


def check_exit_options(options: dict) -> dict:
    if options.get("exit_layer") is None:
        options.pop("exit_layer", None)
        return options
    try:
        options["exit_layer"] = int(options["exit_layer"])
    except (TypeError, ValueError):
        raise RequestError(f"Exit layer must be a whole number, not {options['exit_layer']!r}.") from None
    if options["exit_layer"] < 1:
        raise RequestError(f"Exit layer {options['exit_layer']} is out of range: use 1 or more.")
    return options


def exit_layers(model, exit_layer: int) -> tuple[int, ...]:
    n = n_layers(model)
    if not 1 <= exit_layer <= n:
        raise RequestError(f"Exit layer {exit_layer} is out of range: this target has {n} layers "
                           f"(use 1..{n}; fewer layers draft faster but are accepted less).")
    return tuple(range(exit_layer))


@register("early-exit", "early exit (self)", order=20, check_options=check_exit_options,
          description="the target's first L layers + its own LM head draft (training-free LayerSkip)")
def _build_early_exit(pair, req=None):
    decoder_parts(pair.target)
    exit_layer = check_exit_options(dict(getattr(req, "options", None) or {})).get("exit_layer")
    if exit_layer is None:
        from ...selfspec import default_exit_layer
        exit_layer = default_exit_layer(pair)
    return LayerSubsetProposer(pair.target, exit_layers(pair.target, exit_layer),
                               vocab_size=target_vocab(pair.target), name="early-exit")
