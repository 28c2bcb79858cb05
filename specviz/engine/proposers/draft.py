"""Draft-model proposers: a small model of the same vocabulary drafts γ tokens
autoregressively (KV-cached); the adaptive variant moves γ with acceptance."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import RequestError
from ..forward import crop_cache, forward_logits, new_cache, pick
from ..proposer import Proposal, Proposer, register, target_vocab
from ..sampling import greedy_rows, warp


@dataclass
class DraftModelProposer(Proposer):
    """A small model of the same vocabulary drafts autoregressively (KV-cached)."""

    model: torch.nn.Module
    vocab_size: int | None = None  # cut the draft's logits to the target's vocabulary
    name: str = "draft"
    confidence: float | None = None  # stop drafting below this top probability
    cache: object = field(default=None, repr=False)  # a KV cache from forward.new_cache
    length: object = None  # a gamma.ChainLength: each further token priced by the last one's confidence

    def reset(self, prompt_ids: list[int]) -> int:
        self.cache = new_cache(self.model)
        # the last prompt token is fed with the first propose() call
        if len(prompt_ids) > 1:
            forward_logits(self.model, prompt_ids[:-1], self.cache, 1)
            return 1
        return 0

    def open(self) -> int:
        """Start a sequence without reading the prompt: the first propose() reads all the
        cache lacks in one forward (the hybrid's draft, while copied text serves)."""
        self.cache = new_cache(self.model)
        return 0

    def unread(self) -> bool:
        """Opened without reading the prompt, and no propose() since."""
        return self.cache.get_seq_length() == 0

    def lag(self, committed) -> int:
        """Tokens the next propose() must read beyond its usual one or two."""
        return max(0, len(committed) - self.cache.get_seq_length() - 2)

    def _logits(self, ids, keep=1):
        logits = forward_logits(self.model, ids, self.cache, keep, exact=False)
        return logits[..., : self.vocab_size] if self.vocab_size else logits

    def propose(self, committed, gamma, params, generator, eos_ids):
        # feed what the cache has not seen: 1 token, or 2 after a bonus round
        feed = committed[self.cache.get_seq_length():]
        tokens, qs, raw = [], [], []
        if self.length is not None:
            self.length.start()
        for _ in range(gamma):
            logits = self._logits(feed)[-1]
            raw.append(logits)  # a reference: the inspector's greedy softmax, computed off the clock
            if params.greedy:  # q one-hot at the argmax: read it once, not again from q
                q, x = greedy_rows(logits)
                x = int(x)
            else:
                q = warp(logits, params)
                x = pick(q, params, generator)
            tokens.append(x)
            qs.append(q)
            if x in eos_ids:  # nothing useful follows an end-of-sequence
                break
            # an unsure draft is likely rejected: stop spending draft forwards.
            # The stop depends only on what was drafted, so verification stays exact.
            if self.confidence is not None and float(logits.float().softmax(-1).max()) < self.confidence:
                break
            if self.length is not None and not self.length.more(_confidence(logits, q, params), gamma):
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens), raw=raw if params.greedy else None)

    def rollback(self, committed, n_accepted, n_drafted):
        # the cache holds a prefix of what was fed; keep what is still committed,
        # leaving the last committed token to be fed next round
        crop_cache(self.cache, len(committed) - 1)


def _confidence(logits, q, params) -> float:
    """The draft's top probability at this row: of its warped law q under sampling, of its
    softmax under greedy (q is one-hot there)."""
    return float(logits.float().softmax(-1).max()) if params.greedy else float(q.max())


@dataclass
class AdaptiveDraftProposer(DraftModelProposer):
    """Draft model with a γ that follows acceptance: +1 after a fully accepted
    round, -1 after a rejection, plus the draft-confidence stop."""

    name: str = "adaptive"
    confidence: float | None = 0.3
    max_gamma: int = 16
    current: int | None = None

    def reset(self, prompt_ids):
        self.current = None
        return super().reset(prompt_ids)

    def next_gamma(self, requested):
        if self.current is None:
            self.current = requested  # the request's γ is the starting point
        return self.current

    def rollback(self, committed, n_accepted, n_drafted):
        super().rollback(committed, n_accepted, n_drafted)
        if self.current is None:  # a γ policy (γ = auto) picks each round, not this rule
            return
        if n_drafted and n_accepted == n_drafted:
            self.current = min(self.max_gamma, self.current + 1)
        elif n_accepted < n_drafted:
            self.current = max(1, self.current - 1)


def _need_draft(pair):
    if pair.draft is None:
        raise RequestError("This pair has no draft model: pick prompt lookup instead.")
    return pair.draft


@register("draft", "draft model", needs_draft=True, order=0,
          description="a smaller model of the same vocabulary drafts γ tokens")
def _build_draft(pair, req=None):
    return DraftModelProposer(_need_draft(pair), vocab_size=target_vocab(pair.target))


@register("adaptive", "draft model, adaptive γ", needs_draft=True, order=2,
          description="draft model; γ +1 after a fully accepted round, −1 after a rejection")
def _build_adaptive(pair, req=None):
    return AdaptiveDraftProposer(_need_draft(pair), vocab_size=target_vocab(pair.target))
