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
            q = warp(self._logits(feed)[-1], params)
            x = pick(q, params, generator)
            tokens.append(x)
            qs.append(q)
            if x in eos_ids:  # nothing useful follows an end-of-sequence
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens))

    def rollback(self, committed, n_accepted, n_drafted):
        # the cache holds a prefix of what was fed; keep what is still committed,
        # leaving the last committed token to be fed next round
        crop_cache(self.cache, len(committed) - 1)
