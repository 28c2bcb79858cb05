"""Where draft tokens come from. One small interface, several proposers.

A proposer is told the committed sequence (prompt + output so far), returns up
to γ tokens together with the distributions q they were drawn from, and is then
told how much of the sequence survived verification so it can roll back.
The speculative engine does not care which proposer it talks to.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from .sampling import SamplingParams, sample, warp


@dataclass
class Proposal:
    tokens: list[int]
    q: torch.Tensor  # (len(tokens), V) distributions the tokens were drawn from
    forwards: int = 0  # draft-model forward passes spent


class Proposer:
    name = "base"

    def reset(self, prompt_ids: list[int]) -> int:
        """Start a new sequence. Returns forward passes spent (prefill)."""
        return 0

    def next_gamma(self, requested: int) -> int:
        """How many tokens to draft next round (adaptive proposers change it)."""
        return requested

    def propose(self, committed: list[int], gamma: int, params: SamplingParams,
                generator: torch.Generator | None, eos_ids: frozenset[int]) -> Proposal:
        raise NotImplementedError

    def rollback(self, committed: list[int], n_accepted: int, n_drafted: int) -> None:
        """Verification kept `committed` (now including the appended token)."""


def pick(probs: torch.Tensor, params: SamplingParams, generator) -> int:
    # greedy: argmax of a one-hot, without touching the RNG
    if params.greedy:
        return int(probs.argmax())
    return int(sample(probs, generator))


def forward_logits(model, ids: list[int], cache, keep: int) -> torch.Tensor:
    """One KV-cached forward of `ids`; returns float logits of the last `keep` positions."""
    x = torch.tensor([ids], device=model.device)
    out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of a KV cache.

    A negative argument means "remove that many" in every transformers version
    we support (newer ones refuse a positive absolute length)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


@dataclass
class DraftModelProposer(Proposer):
    """A small model of the same vocabulary drafts autoregressively (KV-cached)."""

    model: torch.nn.Module
    vocab_size: int | None = None  # cut the draft's logits to the target's vocabulary
    name: str = "draft"
    confidence: float | None = None  # stop drafting below this top probability
    cache: DynamicCache | None = field(default=None, repr=False)

    def reset(self, prompt_ids: list[int]) -> int:
        self.cache = DynamicCache()
        # the last prompt token is fed with the first propose() call
        if len(prompt_ids) > 1:
            forward_logits(self.model, prompt_ids[:-1], self.cache, 1)
            return 1
        return 0

    def _logits(self, ids, keep=1):
        logits = forward_logits(self.model, ids, self.cache, keep)
        return logits[..., : self.vocab_size] if self.vocab_size else logits

    def propose(self, committed, gamma, params, generator, eos_ids):
        # feed what the cache has not seen: 1 token, or 2 after a bonus round
        feed = committed[self.cache.get_seq_length():]
        tokens, qs = [], []
        for _ in range(gamma):
            logits = self._logits(feed)[-1]
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
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens))

    def rollback(self, committed, n_accepted, n_drafted):
        # the cache holds a prefix of what was fed; keep what is still committed,
        # leaving the last committed token to be fed next round
        crop_cache(self.cache, len(committed) - 1)


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
        if n_drafted and n_accepted == n_drafted:
            self.current = min(self.max_gamma, self.current + 1)
        elif n_accepted < n_drafted:
            self.current = max(1, self.current - 1)


@dataclass
class PromptLookupProposer(Proposer):
    """Copy what followed the last occurrence of the current n-gram in the
    prompt or output (no model). Its q is one-hot: the token is proposed with
    certainty, so it is accepted with probability p(x) and a rejection
    resamples from p with x removed, which keeps the target's law."""

    vocab_size: int
    # a single-token match is mostly chance (" ", "(", "\n"): on this CPU a
    # wasted guess costs ~0.45 of a step, so match two tokens at least
    max_ngram: int = 4
    min_ngram: int = 2
    name: str = "lookup"

    def propose(self, committed, gamma, params, generator, eos_ids):
        tokens = self._match(committed, gamma)
        q = torch.zeros(len(tokens), self.vocab_size)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Proposal(tokens, q, forwards=0)

    def _match(self, seq: list[int], gamma: int) -> list[int]:
        n_seq = len(seq)
        for n in range(min(self.max_ngram, n_seq - 1), self.min_ngram - 1, -1):
            tail = seq[n_seq - n:]
            # latest earlier occurrence first: recent context predicts best
            for start in range(n_seq - n - 1, -1, -1):
                if seq[start:start + n] == tail:
                    follow = seq[start + n:start + n + gamma]
                    if follow:
                        return follow
        return []
