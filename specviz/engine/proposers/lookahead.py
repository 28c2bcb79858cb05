"""Lookahead decoding (Fu et al., 2024): no draft model. One target forward
per round carries three parts, kept apart by a 4D attention mask:

  fed        the committed tokens the cache has not seen (usually 1), causal;
  lookahead  a Jacobi window of L ≤ N-1 levels × W columns of guessed tokens.
             Level l, column j sits at position P+1+l+j (P = last committed)
             and sees the fed tokens, level 0 up to column j and levels
             1..l of its own column: a causal context of P+1 .. P+l+j.
             The outputs of the newest level are the next Jacobi level; each
             column's trajectory (level 0..L-1 token, new output) is an N-gram
             of consecutive positions, stored in the pool under its first token;
  verify     up to G pool n-grams keyed by the last committed token, N-1 tokens
             each at positions P+1.., each seeing the fed tokens and itself.

The two branches never see each other, so the verify logits are those of
plain decoding: greedy acceptance (longest guess prefix equal to the target's
argmax chain, plus the target's next token) gives exactly plain greedy output.
The pool also starts with the prompt's n-grams (the reference's
POOL_FROM_PROMPT option). Greedy only: the lossless sampling variant is not
built, so temperature > 0 is refused.

Settings: γ = N-1 (the guess length), `window` W, `guesses` G.
This file holds the state, the mask and the method's verifier loop (its kind is
"jacobi": run/runner.py calls lookahead() for it). One target forward per round reads
the fed tokens, the Jacobi window and the pool's guesses under a 4D mask
(forward.masked_forward; checked exactly against a plain causal forward on a tiny
Qwen2). Afterwards the cache keeps the fed tokens and the winning guess's accepted
tokens (gathered; their keys were computed at their true positions seeing only
committed tokens), nothing else. Same event stream as speculative().
"""
from __future__ import annotations

import random
import threading
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache

from ...errors import RequestError
from ..events import Outcome, RoundEvent, RunSummary, commit_round, round_tokens
from ..forward import bias_of, context_apart, keep_cache_slots, masked_forward, path_extra
from ..proposer import Option, Proposer, register
from ..rounds import Clock, cut_at_eos, drive_rounds, new_summary
from ..sampling import SamplingParams, top2_gap
from ..text import TextStream

DEFAULT_WINDOW = 4  # each extra token in a forward costs on a CPU: keep the branches small
DEFAULT_GUESSES = 2
MAX_WINDOW = 16
MAX_GUESSES = 16


@dataclass
class Layout:
    """Where each part of one lookahead forward sits in its input."""

    fed: int  # tokens fed from the committed sequence
    levels: int  # Jacobi levels present (L)
    window: int  # W
    guesses: list[list[int]]  # verify branch: G' guesses of N-1 tokens

    def la(self, level: int, col: int) -> int:
        return self.fed + level * self.window + col

    def guess(self, g: int, i: int) -> int:
        return self.fed + self.levels * self.window + sum(len(x) for x in self.guesses[:g]) + i

    @property
    def size(self) -> int:
        return self.fed + self.levels * self.window + sum(len(x) for x in self.guesses)


def build_mask(lay: Layout) -> torch.Tensor:
    """(n, n) bool: which new token may see which (all see the cache)."""
    n = lay.size
    m = torch.zeros(n, n, dtype=torch.bool)
    m[: lay.fed, : lay.fed] = torch.tril(torch.ones(lay.fed, lay.fed, dtype=torch.bool))
    m[lay.fed:, : lay.fed] = True
    for lv in range(lay.levels):
        for j in range(lay.window):
            row = lay.la(lv, j)
            m[row, lay.la(0, 0): lay.la(0, j) + 1] = True
            for up in range(1, lv + 1):
                m[row, lay.la(up, j)] = True
    for g, guess in enumerate(lay.guesses):
        start = lay.guess(g, 0)
        for i in range(len(guess)):
            m[start + i, start: start + i + 1] = True
    return m


def positions(lay: Layout, last: int) -> list[int]:
    """Position ids: fed tokens end at `last`; lookahead and guesses go beyond."""
    pos = list(range(last - lay.fed + 1, last + 1))
    pos += [last + 1 + lv + j for lv in range(lay.levels) for j in range(lay.window)]
    for guess in lay.guesses:
        pos += [last + 1 + i for i in range(len(guess))]
    return pos


@dataclass
class LookaheadProposer(Proposer):
    """State of one lookahead run: Jacobi levels and the n-gram pool."""

    ngram: int = 5  # N: pool n-grams hold N tokens (key + N-1 guessed)
    window: int = DEFAULT_WINDOW
    max_guesses: int = DEFAULT_GUESSES
    pool_from_prompt: bool = True
    name: str = "lookahead"
    levels: list[list[int]] = field(default_factory=list)
    pool: dict[int, list[tuple[int, ...]]] = field(default_factory=dict)

    def reset(self, prompt_ids):
        # level 0 starts as tokens drawn from the prompt (seeded: runs repeat)
        rng = random.Random(0)
        self.levels = [[rng.choice(prompt_ids) for _ in range(self.window)]]
        self.pool = {}
        if self.pool_from_prompt:
            n = self.ngram
            for s in range(len(prompt_ids) - n + 1):
                self.add(prompt_ids[s: s + n])
        return 0

    def add(self, gram) -> None:
        """Most recent first; a repeated n-gram moves to the front."""
        key, rest = int(gram[0]), tuple(int(x) for x in gram[1:])
        lst = self.pool.setdefault(key, [])
        if rest in lst:
            lst.remove(rest)
        lst.insert(0, rest)
        del lst[2 * self.max_guesses:]

    def candidates(self, last: int) -> list[list[int]]:
        return [list(g) for g in self.pool.get(last, [])[: self.max_guesses]]

    def propose(self, fed: int, last: int) -> Layout:
        """This round's proposal: the Jacobi levels and the pool's guesses for `last`,
        laid out after `fed` committed tokens (the JacobiProposer contract)."""
        return Layout(fed, len(self.levels), self.window, self.candidates(last))

    def advance(self, new_level: list[int]) -> int:
        """Take the newest level's outputs; once N-1 levels exist, each column's
        trajectory is an N-gram for the pool and the oldest level drops out.
        Returns how many n-grams were collected."""
        if len(self.levels) < self.ngram - 1:
            self.levels.append(new_level)
            return 0
        for j in range(self.window):
            self.add([lv[j] for lv in self.levels] + [new_level[j]])
        self.levels = self.levels[1:] + [new_level]
        return self.window

    @property
    def pool_size(self) -> int:
        return sum(len(v) for v in self.pool.values())


def best_guess(argmax: torch.Tensor, lay: Layout, first: int) -> tuple[int, int, list[int]]:
    """Greedy verification: (winning guess or -1, tokens accepted, per-guess accepted).
    `first` is the target's token after the last committed one."""
    per = []
    for g, guess in enumerate(lay.guesses):
        k, want = 0, first
        while k < len(guess) and guess[k] == want:
            want = int(argmax[lay.guess(g, k)])
            k += 1
        per.append(k)
    if not per or max(per) == 0:
        return (0 if per else -1), 0, per
    g = max(range(len(per)), key=lambda i: (per[i], -i))
    return g, per[g], per


def _new_level(argmax: torch.Tensor, lay: Layout) -> list[int]:
    top = lay.levels - 1
    return [int(argmax[lay.la(top, j)]) for j in range(lay.window)]


def _round_tokens(stream, guess, k, new, appended, t_end, r, gaps):
    """Display order: accepted guess tokens, the first wrong one (struck), the target's token.
    gaps[j]: the target's top-2 logit gap where it chose new[j] (the bench's near-tie check)."""
    kept = new[:-1] if appended else new[:k]
    accepted = [(x, dict(p=1.0, q=1.0, gap=gaps[i])) for i, x in enumerate(kept)]
    rejected = last = None
    if appended:
        if k < len(guess):
            rejected = (guess[k], k + 1, dict(p=0.0, q=1.0))
        kind = Outcome.RESAMPLED if k < len(guess) else Outcome.BONUS
        last = (new[-1], kind, dict(p=1.0, gap=gaps[len(new) - 1]))
    return round_tokens(stream, t_end, r, accepted, rejected, last)


@torch.inference_mode()
def lookahead(target, prop: LookaheadProposer, tokenizer, prompt_ids: list[int], max_new_tokens: int,
              params: SamplingParams, eos_ids=(), stop: threading.Event | None = None,
              clock: Clock | None = None) -> Iterator[RoundEvent | RunSummary]:
    """The Jacobi verifier loop. Its guess length N-1 and levels are the proposer's
    (prop.ngram, built from the request's γ); greedy only, so no seed."""
    if not params.greedy:
        raise RequestError(GREEDY_ONLY)
    eos = frozenset(eos_ids)
    clock = clock or Clock(target.device)
    cache = DynamicCache()
    stream = TextStream(tokenizer)
    s = new_summary(prop.name, prop.ngram - 1, target.device)
    s.extra.update(path_extra(target, cache))  # the model is on graphs: this run is not
    committed = list(prompt_ids)
    prop.reset(prompt_ids)
    yield from drive_rounds(s, stream, clock, max_new_tokens, stop, lambda r, remaining: _round(
        target, prop, cache, committed, stream, s, eos, remaining, r, clock))


def _round(target, prop, cache, committed, stream, s, eos, remaining, r, clock) -> RoundEvent:
    t_start = clock.now()
    whole = committed[cache.get_seq_length():]  # the prompt in round 1, then the last token
    fed = context_apart(target, cache, whole, 1)  # row-exact targets: the prompt as plain decoding reads it
    past = cache.get_seq_length()
    lay = prop.propose(len(fed), committed[-1])
    ids = fed + [x for lv in prop.levels for x in lv] + [x for g in lay.guesses for x in g]
    allowed = build_mask(lay)
    pos = positions(lay, len(committed) - 1)
    t_drafted = clock.now()
    bias = bias_of(allowed, past, next(target.parameters()).dtype)
    logits = masked_forward(target, cache, ids=ids, positions=pos, bias=bias, keep=len(ids))
    argmax = logits.argmax(-1)
    first = int(argmax[lay.fed - 1])
    won, k, per = best_guess(argmax, lay, first)
    guess = lay.guesses[won] if won >= 0 else []
    gaps = top2_gap(logits[[lay.fed - 1] + [lay.guess(won, i) for i in range(k)]])
    chain = [first] + [int(argmax[lay.guess(won, i)]) for i in range(k)]  # target's tokens
    new, ended = cut_at_eos(guess[:k] + [chain[k]], eos, remaining)
    collected = prop.advance(_new_level(argmax, lay))
    keep_cache_slots(cache, prefix=past + len(fed),
                     slots=[past + lay.guess(won, i) for i in range(min(k, len(new)))])
    t_end = clock.now()
    appended = len(new) == k + 1
    committed += new
    tokens = _round_tokens(stream, guess, k, new, appended, t_end, r, gaps)
    prompt_tokens = len(whole) - 1 if r == 0 else 0
    ok = [1.0 if i < k else 0.0 for i in range(len(guess))]
    commit_round(s, new, drafted=len(guess), accepted=min(k, len(new)), draft_forwards=0,
                 overlap_sum=sum(ok), prompt_tokens=prompt_tokens, t_draft=t_drafted - t_start,
                 t_verify=t_end - t_drafted, t_end=t_end, hit_eos=ended)
    info = {"guesses": lay.guesses, "won": won if k else -1, "accepted_per_guess": per,
            "window": lay.window, "levels": lay.levels, "ngram": prop.ngram, "pool": prop.pool_size,
            "collected": collected, "input_tokens": len(ids)}
    return RoundEvent(
        index=r, gamma=len(guess), draft_ids=guess, q=[1.0] * len(guess), p=ok,
        u=[], overlap=ok, n_accepted=min(k, len(new)), appended_id=new[-1] if appended else -1,
        resampled=appended and k < len(guess), t_start=t_start, t_draft=t_drafted - t_start,
        t_verify=t_end - t_drafted, t_end=t_end, draft_forwards=0, tokens=tokens,
        total_tokens=len(s.token_ids), total_drafted=s.drafted, total_accepted=s.accepted,
        target_forwards=s.target_forwards, prompt_tokens=prompt_tokens, info=info)


OPTIONS = (
    Option("window", "Lookahead window W", f"Jacobi positions guessed ahead each forward, collecting n-grams "
           f"(1-{MAX_WINDOW}, default {DEFAULT_WINDOW}); more costs more per forward on a CPU.",
           hi=MAX_WINDOW, default=DEFAULT_WINDOW, short="W", slider=True),
    Option("guesses", "Lookahead guesses G", f"n-gram guesses from the pool verified in the same forward "
           f"(1-{MAX_GUESSES}, default {DEFAULT_GUESSES}). γ sets the n-gram length (N = γ+1).",
           hi=MAX_GUESSES, default=DEFAULT_GUESSES, short="G", slider=True),
)


def summarize(infos: list[dict]) -> dict:
    """Run totals of the rounds' info (RoundEvent.info, written by lookahead() above)."""
    won = [i for i in infos if i["won"] >= 0]
    return {"ngram_rounds_won": len(won),
            "ngram_tokens_won": sum(max(i["accepted_per_guess"]) for i in won),
            "guesses_verified": sum(len(i["guesses"]) for i in infos),
            "input_tokens_per_forward": round(sum(i["input_tokens"] for i in infos) / len(infos), 2),
            "pool_ngrams": infos[-1]["pool"]}


def round_note(info: dict) -> str:
    n = len(info["guesses"])
    head = (f"lookahead: n-gram guess {info['won'] + 1} of {n} won ({max(info['accepted_per_guess'])} tokens)"
            if info["won"] >= 0 else
            f"lookahead: none of {n} n-gram guesses matched" if n else
            "lookahead: no n-gram in the pool for the last token")
    return (f"{head}; Jacobi window {info['window']}×{info['levels']}, pool {info['pool']} n-grams, "
            f"{info['input_tokens']} tokens in the forward")


GREEDY_ONLY = ("Lookahead decoding here is greedy only (its lossless sampling variant is not built): "
               "set temperature to 0, or pick another method.")


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: on a CPU, where every forward carries its Jacobi window and n-gram "
    "guesses, many tokens at once: each check costs several plain steps and keeps only a token or two "
    "more.")


@register("lookahead", "lookahead (Jacobi n-grams)", order=6, options=OPTIONS, greedy_only=True,
          loses_when=LOSES, summarize=summarize, round_note=round_note, kind="jacobi",
          description="no draft model: a Jacobi window collects n-grams; pool guesses are verified in the "
                      "same target forward (greedy only)")
def _build_lookahead(pair, req=None):
    if req is not None and req.temperature > 0:
        raise RequestError(GREEDY_ONLY)
    opts = req.options if req is not None else {}
    # the page's γ is the guess length N-1; γ "auto" (a draft-model setting) falls back to N = 5
    guess_len = req.gamma if req is not None and not getattr(req, "gamma_auto", False) else 4
    return LookaheadProposer(ngram=guess_len + 1, window=opts.get("window") or DEFAULT_WINDOW,
                             max_guesses=opts.get("guesses") or DEFAULT_GUESSES)
