"""Staged speculation: a draft of a draft.

Stage 1, prompt lookup, guesses tokens for the 0.5B draft at no cost. Stage 2,
the draft model, checks those guesses in ONE forward of its own, exactly as
the target checks drafts: guess l_i is kept with probability min(1, q_i(l_i)/1)
= q_i(l_i) (the guess is one-hot), and on a rejection the draft draws from
norm(max(0, q_i - onehot(l_i))). By the speculative-sampling theorem applied
to the draft, each token that comes out is distributed exactly as q_i given
the tokens before it, i.e. as if the draft had sampled it itself. Where the
lookup has nothing, the draft drafts on its own, one forward per token.

So the chain proposed to the target is a sample of the draft's own
autoregressive law, and its rows q_i are the draft's distributions at those
positions: the target's modified rejection sampling against these q_i is the
usual lossless test. (Under greedy, q_i is one-hot and a guess survives iff it
is the draft's argmax: the chain equals what the draft alone would have
drafted, only with fewer draft forwards.)

Each draft forward yields at least one token: the accepted guesses plus the
corrected (or bonus) token drawn from the same forward. `info` reports how
many draft forwards stage 1 saved against drafting token by token, and which
positions of the chain were lookup's guesses (`lookup_at`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..forward import crop_cache, pick
from ..proposer import Proposal, register, target_vocab
from ..sampling import residual, sample, warp
from .draft import DraftModelProposer, _need_draft
from .lookup import PromptLookupProposer


def check_guesses(q: torch.Tensor, guesses: list[int], params, generator) -> tuple[int, int]:
    """The draft's own rejection test of one-hot guesses against its rows q
    (len(guesses) + 1, V): (number kept, the token drawn after them)."""
    for i, x in enumerate(guesses):
        if params.greedy:
            ok = int(q[i].argmax()) == x
        else:
            u = torch.rand(1, generator=generator, device=generator.device if generator else "cpu")
            ok = float(u) < float(q[i, x])
        if not ok:
            if params.greedy:
                return i, int(q[i].argmax())
            onehot = torch.zeros_like(q[i])
            onehot[x] = 1.0
            return i, int(sample(residual(q[i], onehot), generator))
    return len(guesses), pick(q[len(guesses)], params, generator)


@dataclass
class StagedProposer(DraftModelProposer):
    name: str = "staged"
    lookup: PromptLookupProposer = field(default=None, repr=False)

    def propose(self, committed, gamma, params, generator, eos_ids):
        feed = committed[self.cache.get_seq_length():]
        tokens, qs = [], []
        at = []  # positions of the chain that are lookup's guesses, kept by the draft's own test
        forwards = guessed = kept = 0
        while len(tokens) < gamma:
            guesses = self.lookup._match(committed + tokens, gamma - len(tokens))
            logits = self._logits(feed + guesses, keep=len(guesses) + 1)
            q = warp(logits, params)
            forwards += 1
            n, x = check_guesses(q, guesses, params, generator)
            guessed, kept = guessed + len(guesses), kept + n
            if n < len(guesses):  # the cache read rejected guesses: drop them
                crop_cache(self.cache, self.cache.get_seq_length() - (len(guesses) - n))
            new = (guesses[:n] + [x])[: gamma - len(tokens)]
            at += range(len(tokens), len(tokens) + min(n, len(new)))
            tokens += new
            qs.append(q[: len(new)])
            feed = [x]
            if any(t in eos_ids for t in new):  # nothing useful follows an end-of-sequence
                cut = next(i for i, t in enumerate(tokens) if t in eos_ids) + 1
                tokens = tokens[:cut]
                break
        q = torch.cat(qs)[: len(tokens)]
        # lookup_at: which drafted positions came from lookup (the page counts those the target
        # accepted: a round accepts a prefix of its chain; issue 71: staged showed the draft model's
        # numbers and nothing said what lookup added)
        info = {"lookup_guessed": guessed, "lookup_kept": kept,
                "draft_forwards_saved": len(tokens) - forwards,
                "lookup_at": [p for p in at if p < len(tokens)]}
        return Proposal(tokens, q, forwards=forwards, info=info)


SAVED = ("draft_forwards_saved", "lookup_guessed", "lookup_kept")


def summarize(infos: list[dict]) -> dict:
    return {key: sum(i[key] for i in infos) for key in SAVED}


def round_note(info: dict) -> str:
    return (f"staged: lookup guessed {info['lookup_guessed']}, the draft kept {info['lookup_kept']}: "
            f"{info['draft_forwards_saved']} draft forwards saved")


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: where the draft model loses (slow, or often wrong). Prompt lookup only "
    "saves draft steps, where the output repeats the prompt or itself; under greedy decoding the "
    "chain is the draft model's own, so it cannot change what passes.")


@register("staged", "staged: lookup → draft", needs_draft=True, order=5, summarize=summarize,
          loses_when=LOSES, round_note=round_note,
          description="prompt lookup guesses for the draft model, which checks them in one forward; "
                      "the result is proposed to the target")
def _build_staged(pair, req=None):
    vocab = target_vocab(pair.target)
    return StagedProposer(_need_draft(pair), vocab_size=vocab, lookup=PromptLookupProposer(vocab))
