"""Prompt lookup: draft by copying what followed the current n-gram earlier in
the prompt or output. No model, so drafting costs nothing; verifying a guess does
not (each guess is one more row of the target's verify forward)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from ..proposer import Proposal, Proposer, register, target_vocab


@dataclass
class HitRate:
    """A discounted hit rate with a prior (worth `weight` observations)."""

    rate: float
    weight: float = 2.0
    decay: float = 0.9  # a memory of ~10 observations: code bodies and prose copy differently
    hits: float = field(init=False)
    seen: float = field(init=False)

    def __post_init__(self):
        self.hits, self.seen = self.rate * self.weight, self.weight

    def add(self, hits: float, seen: float) -> None:
        keep = self.decay ** seen
        self.hits, self.seen = keep * self.hits + hits, keep * self.seen + seen

    @property
    def value(self) -> float:
        return self.hits / self.seen


@dataclass
class PromptLookupProposer(Proposer):
    """Copy what followed the last occurrence of the current n-gram in the
    prompt or output (no model). Its q is one-hot: the token is proposed with
    certainty, so it is accepted with probability p(x) and a rejection
    resamples from p with x removed, which keeps the target's law.

    With the target's measured verify costs (`verify_cost`, v(k) in plain steps
    for k guesses) it guesses only as many tokens as pay for their rows: the
    expected tokens of a round, 1 + a1 (1 + ar + ... + ar^(k-1)), against v(k),
    where a1 is how often its first guess was the token committed next (checked
    every round, guessed or not) and ar how often a guess after a right one was
    right too. Both are read from committed tokens only, so what it proposes
    depends on the prefix alone, never on the target's p at the new position:
    the output law is unchanged."""

    vocab_size: int
    # a single-token match is mostly chance (" ", "(", "\n"): on this CPU a
    # wasted guess costs ~0.45 of a step, so match two tokens at least
    max_ngram: int = 4
    min_ngram: int = 2
    verify_cost: Callable[[int], float] | None = None  # None: guess whatever matches
    name: str = "lookup"

    def __post_init__(self):
        self.reset([])

    def reset(self, prompt_ids: list[int]) -> int:
        # priors: half the first guesses right, 0.7 of the guesses after a right one
        self.first, self.more = HitRate(0.5), HitRate(0.7)
        self._last: tuple[int, list[int], int] | None = None  # (position, guesses, proposed)
        return 0

    def propose(self, committed, gamma, params, generator, eos_ids):
        tokens = self._match(committed, gamma)
        if self.verify_cost is not None:
            self._learn(committed)
            k = self._worth(len(tokens))
            self._last = (len(committed), tokens, k) if tokens else None
            tokens = tokens[:k]
        q = torch.zeros(len(tokens), self.vocab_size)
        if tokens:
            q[torch.arange(len(tokens)), torch.tensor(tokens)] = 1.0
        return Proposal(tokens, q, forwards=0)

    def _learn(self, seq: list[int]) -> None:
        """Score last round's guesses against what was committed since."""
        if self._last is None:
            return
        at, guess, k = self._last
        got = seq[at:at + k + 1]
        if not got:
            return
        self.first.add(float(got[0] == guess[0]), 1.0)
        m = 0  # guesses accepted: a rejected one is never the committed token
        while m < min(k, len(got)) and got[m] == guess[m]:
            m += 1
        if k >= 2 and m >= 1:  # guesses 2..min(k, m + 1) were tested after a right one
            self.more.add(m - 1.0, min(k, m + 1) - 1.0)

    def _worth(self, n: int) -> int:
        """How many of n guesses to propose: the k maximising expected tokens per
        plain-step cost, 0 (a plain step) unless some k beats 1."""
        a1, ar = self.first.value, self.more.value
        best, best_rate, run = 0, 1.0, 0.0
        for k in range(1, n + 1):
            run += ar ** (k - 1)
            rate = (1.0 + a1 * run) / self.verify_cost(k)
            if rate > best_rate:
                best, best_rate = k, rate
        return best

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


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: when the output does not repeat the prompt or itself: its guesses rarely "
    "pass, and their verify rows still cost.")


@register("lookup", "prompt lookup", loses_when=LOSES, order=1,
          description="copy what followed the current n-gram earlier in the prompt or output; "
                      "with measured costs, only as many guesses as pay for their verify rows")
def _build_lookup(pair, req=None):
    from ..gamma import monotone
    costs = pair.costs
    return PromptLookupProposer(target_vocab(pair.target),
                                verify_cost=monotone(costs.verify_cost) if costs is not None else None)
