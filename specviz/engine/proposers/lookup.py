"""Prompt lookup: draft by copying what followed the current n-gram earlier in
the prompt or output. No model, so drafting costs nothing."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .base import Proposal, Proposer, register, target_vocab


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


@register("lookup", "prompt lookup", order=1,
          description="copy what followed the current n-gram earlier in the prompt or output")
def _build_lookup(pair, req=None):
    return PromptLookupProposer(target_vocab(pair.target))
