"""Draft-model proposers: a small model of the same vocabulary drafts γ tokens
autoregressively (KV-cached); the adaptive variant moves γ with acceptance."""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ...errors import RequestError
from ..forward import crop_cache, forward_logits, new_cache, on_graphs, pick
from ..gpu.cache import Behind
from ..proposer import Proposal, Proposer, register, target_vocab
from ..sampling import greedy_rows, sample, warp


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
        if self.length is not None:
            self.length.start()
        if on_graphs(self.cache):
            return self._propose_on_device(committed, gamma, params, generator, eos_ids)
        # feed what the cache has not seen: 1 token, or 2 after a bonus round
        feed = committed[self.cache.get_seq_length():]
        tokens, qs, raw = [], [], []
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
            if not self._go_on(x, [float(c) for c in self._confidences(logits, q, params)], eos_ids, gamma):
                break
            feed = [x]
        return Proposal(tokens, torch.stack(qs), forwards=len(tokens), raw=raw if params.greedy else None)

    def _propose_on_device(self, committed, gamma, params, generator, eos_ids):
        """propose() on a graph cache (a GPU's): each token stays on the device and is fed from there,
        and the host reads a token and its confidences in one read (gpu/cache.Behind), where it read
        the token and each confidence apart (a sync each: up to three a draft step). The same rules
        decide on the same values, so the proposal is propose()'s.
        With no stop rule but end-of-sequence (draft, γ fixed or priced per round), token i is read
        only after token i+1's step is enqueued, so the device never waits for the host; an EOS then
        costs one step for nothing (counted in `forwards`; a sampled run also drew one token more).
        With a stop rule (adaptive's confidence, the hybrid's priced length) the step after a stop
        would run for nothing on most rounds: a whole draft step (2.4-3.3 ms for the 0.5B on the
        2026-11-28 H200) against the host's read and launch between two steps. There the host reads
        a token before it enqueues the next step."""
        behind = self.confidence is None and self.length is None
        feed = committed[self.cache.get_seq_length():]
        qs, raw, rows, tokens = [], [], [], []

        def step():
            nonlocal feed
            logits = self._logits(feed)[-1]
            raw.append(logits)  # a reference: the inspector's greedy softmax, computed off the clock
            if params.greedy:
                q, x = greedy_rows(logits)
            else:
                q = warp(logits, params)
                x = sample(q, generator)
            feed = x.view(1)  # the next step reads it on the device
            qs.append(q)
            conf = [c.double() for c in self._confidences(logits, q, params)]
            rows.append(Behind(torch.stack([x.double(), *conf])))

        step()
        while True:
            if behind and len(rows) < gamma:
                step()  # runs while the host reads the row before it
            x, *conf = rows[len(tokens)].read()
            tokens.append(int(x))
            if not self._go_on(tokens[-1], conf, eos_ids, gamma) or len(tokens) == gamma:
                break
            if not behind:
                step()
        n = len(tokens)
        raw = raw[:n] if params.greedy else None
        return Proposal(tokens, torch.stack(qs[:n]), forwards=len(rows), raw=raw)

    def _confidences(self, logits, q, params) -> list:
        """On the device, what the stop rules read: the softmax's top probability (the confidence
        stop) and the chain's confidence (_confidence: the length's price), each only if in use."""
        out = []
        if self.confidence is not None:
            out.append(_top(logits))
        if self.length is not None:
            out.append(_confidence(logits, q, params))
        return out

    def _go_on(self, x: int, conf: list[float], eos_ids, gamma: int) -> bool:
        """Whether to draft after token x, given its confidences (as _confidences lists them)."""
        if x in eos_ids:  # nothing useful follows an end-of-sequence
            return False
        # an unsure draft is likely rejected: stop spending draft forwards.
        # The stop depends only on what was drafted, so verification stays exact.
        if self.confidence is not None and conf[0] < self.confidence:
            return False
        return self.length is None or self.length.more(conf[-1], gamma)

    def rollback(self, committed, n_accepted, n_drafted):
        # the cache holds a prefix of what was fed; keep what is still committed,
        # leaving the last committed token to be fed next round
        crop_cache(self.cache, len(committed) - 1)


def _top(logits) -> torch.Tensor:
    """The softmax's top probability of a row of logits (a 0-d tensor, on their device)."""
    return logits.float().softmax(-1).max()


def _confidence(logits, q, params) -> torch.Tensor:
    """The draft's top probability at this row: of its warped law q under sampling, of its
    softmax under greedy (q is one-hot there); a 0-d tensor."""
    return _top(logits) if params.greedy else q.max()


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


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES_DRAFT = (
    "When it tends to lose: a draft model that is slow next to the target (c near 0.5 or more), or "
    "that often disagrees with it (text unlike what both were trained on): each round pays γ draft "
    "steps and a verify pass and keeps few tokens.")


@register("draft", "draft model", loses_when=LOSES_DRAFT, needs_draft=True, order=0,
          description="a smaller model of the same vocabulary drafts γ tokens")
def _build_draft(pair, req=None):
    return DraftModelProposer(_need_draft(pair), vocab_size=target_vocab(pair.target))


@register("adaptive", "draft model, adaptive γ", loses_when=LOSES_DRAFT, needs_draft=True, order=2,
          description="draft model; γ +1 after a fully accepted round, −1 after a rejection")
def _build_adaptive(pair, req=None):
    return AdaptiveDraftProposer(_need_draft(pair), vocab_size=target_vocab(pair.target))
