"""The lookahead decoding loop (proposers/lookahead.py explains the method).

One target forward per round reads the fed tokens, the Jacobi window and the
pool's guesses under a 4D mask (transformers 5.23 takes a 4D mask with
explicit position ids and a DynamicCache as given: checked exactly against a
plain causal forward on a tiny Qwen2). Afterwards the cache keeps the fed
tokens and the winning guess's accepted tokens (gathered; their keys were
computed at their true positions seeing only committed tokens), nothing else.
Same event stream as speculative(): RoundEvents, then a RunSummary.
"""
from __future__ import annotations

import threading
from typing import Iterator

import torch
from transformers import DynamicCache

from ..errors import RequestError
from .clock import Clock
from .decoding import cut_at_eos, drive_rounds, new_summary
from .events import Outcome, RoundEvent, RunSummary, TokenEvent
from .forward import crop_cache
from .proposers.lookahead import GREEDY_ONLY, Layout, LookaheadProposer, build_mask, positions
from .sampling import SamplingParams, top2_gap
from .text import TextStream


def forward_masked(model, ids: list[int], cache, pos: list[int], allowed: torch.Tensor) -> torch.Tensor:
    """One forward of `ids` at positions `pos`; new token i sees every cached
    token and the new tokens j with allowed[i, j]. Returns (n, V) float logits."""
    past = cache.get_seq_length()
    n = len(ids)
    dtype = next(model.parameters()).dtype
    mask = torch.zeros(1, 1, n, past + n, dtype=dtype, device=model.device)
    mask[0, 0, :, past:].masked_fill_(~allowed.to(model.device), torch.finfo(dtype).min)
    out = model(input_ids=torch.tensor([ids], device=model.device), attention_mask=mask,
                position_ids=torch.tensor([pos], device=model.device), past_key_values=cache, use_cache=True)
    return out.logits[0].float()


def keep_positions(cache, keep: list[int]) -> None:
    """Keep only cache entries `keep` (ascending). Falls back to a crop to the
    first gap (what it drops is fed again next round) if the cache's layers do
    not expose their key/value tensors."""
    layers = getattr(cache, "layers", None)
    if layers and all(hasattr(layer, "keys") and torch.is_tensor(layer.keys) for layer in layers):
        idx = torch.tensor(keep, device=layers[0].keys.device)
        for layer in layers:
            layer.keys = layer.keys.index_select(-2, idx)
            layer.values = layer.values.index_select(-2, idx)
        return
    run = next((i for i, k in enumerate(keep) if k != i), len(keep))
    crop_cache(cache, run)


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
    tokens = [TokenEvent(x, stream.push(x), Outcome.ACCEPTED, t_end, r, i + 1, p=1.0, q=1.0, gap=gaps[i])
              for i, x in enumerate(new[: k] if not appended else new[:-1])]
    if appended:
        if k < len(guess):
            tokens.append(TokenEvent(guess[k], stream.token_text(guess[k]), Outcome.REJECTED, t_end, r,
                                     k + 1, p=0.0, q=1.0))
        kind = Outcome.RESAMPLED if k < len(guess) else Outcome.BONUS
        tokens.append(TokenEvent(new[-1], stream.push(new[-1]), kind, t_end, r, 0, p=1.0,
                                 gap=gaps[len(new) - 1]))
    return tokens


@torch.inference_mode()
def lookahead(target, prop: LookaheadProposer, tokenizer, prompt_ids: list[int], max_new_tokens: int,
              gamma: int, params: SamplingParams, eos_ids=(), seed: int | None = None,
              stop: threading.Event | None = None, clock: Clock | None = None,
              ) -> Iterator[RoundEvent | RunSummary]:
    if not params.greedy:
        raise RequestError(GREEDY_ONLY)
    eos = frozenset(eos_ids)
    clock = clock or Clock(target.device)
    cache = DynamicCache()
    stream = TextStream(tokenizer)
    s = new_summary(prop.name, prop.ngram - 1, target.device)
    committed, out = list(prompt_ids), s.token_ids
    prop.reset(prompt_ids)
    yield from drive_rounds(s, stream, clock, max_new_tokens, stop, lambda r, remaining: _round(
        target, prop, cache, committed, out, stream, s, eos, remaining, r, clock))


def _round(target, prop, cache, committed, out, stream, s, eos, remaining, r, clock) -> RoundEvent:
    t_start = clock.now()
    past = cache.get_seq_length()
    fed = committed[past:]
    lay = prop.layout(len(fed), committed[-1])
    ids = fed + [x for lv in prop.levels for x in lv] + [x for g in lay.guesses for x in g]
    allowed = build_mask(lay)
    pos = positions(lay, len(committed) - 1)
    t_drafted = clock.now()
    logits = forward_masked(target, ids, cache, pos, allowed)
    argmax = logits.argmax(-1)
    first = int(argmax[lay.fed - 1])
    won, k, per = best_guess(argmax, lay, first)
    guess = lay.guesses[won] if won >= 0 else []
    gaps = top2_gap(logits[[lay.fed - 1] + [lay.guess(won, i) for i in range(k)]])
    chain = [first] + [int(argmax[lay.guess(won, i)]) for i in range(k)]  # target's tokens
    new, ended = cut_at_eos(guess[:k] + [chain[k]], eos, remaining)
    collected = prop.advance(_new_level(argmax, lay))
    keep = list(range(past + len(fed))) + [past + lay.guess(won, i) for i in range(min(k, len(new)))]
    keep_positions(cache, keep)
    t_end = clock.now()
    s.target_forwards += 1
    appended = len(new) == k + 1
    committed += new
    out += new
    if ended:
        s.stop_reason = "eos"
    tokens = _round_tokens(stream, guess, k, new, appended, t_end, r, gaps)
    s.rounds += 1
    s.drafted += len(guess)
    s.accepted += min(k, len(new))
    prompt_tokens = len(fed) - 1 if r == 0 else 0
    if prompt_tokens:
        s.prefill = t_end
        s.prompt_rounds += 1
    else:
        s.draft_time += t_drafted - t_start
        s.verify_time += t_end - t_drafted
    ok = [1.0 if i < k else 0.0 for i in range(len(guess))]
    s.overlap_sum += sum(ok)
    info = {"guesses": lay.guesses, "won": won if k else -1, "accepted_per_guess": per,
            "window": lay.window, "levels": lay.levels, "ngram": prop.ngram, "pool": prop.pool_size,
            "collected": collected, "input_tokens": len(ids)}
    return RoundEvent(
        index=r, gamma=len(guess), draft_ids=guess, q=[1.0] * len(guess), p=ok,
        u=[], overlap=ok, n_accepted=min(k, len(new)), appended_id=new[-1] if appended else -1,
        resampled=appended and k < len(guess), t_start=t_start, t_draft=t_drafted - t_start,
        t_verify=t_end - t_drafted, t_end=t_end, draft_forwards=0, tokens=tokens,
        total_tokens=len(out), total_drafted=s.drafted, total_accepted=s.accepted,
        target_forwards=s.target_forwards, prompt_tokens=prompt_tokens, info=info)
