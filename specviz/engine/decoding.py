"""Decoding engines: plain autoregressive baseline and speculative decoding.

Both are generators of events (see events.py) and share the same forward,
warp and timing code, so any speed trick reaches both or neither. The last
event of every run is a RunSummary.

Cache invariant for both models: the KV cache holds every committed token but
the last one, which is fed by the next forward pass.
"""
from __future__ import annotations

import threading
from typing import Iterator

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from .clock import Clock
from .events import Outcome, RoundEvent, RunSummary, TokenEvent
from .forward import crop_cache, forward_logits, pick
from .proposers.base import Proposer
from .sampling import SamplingParams, verify, warp
from .text import TextStream


def _check_stop(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def _pad_to(q: torch.Tensor, vocab: int) -> torch.Tensor:
    # a draft with a smaller output layer proposes nothing past its size
    return F.pad(q, (0, vocab - q.shape[-1])) if q.shape[-1] < vocab else q


@torch.inference_mode()
def baseline(
    model,
    tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    params: SamplingParams,
    eos_ids=(),
    seed: int | None = None,
    stop: threading.Event | None = None,
    clock: Clock | None = None,
) -> Iterator[TokenEvent | RunSummary]:
    """Plain KV-cached autoregressive decoding of the target."""
    eos = frozenset(eos_ids)
    gen = _generator(model.device, seed)
    clock = clock or Clock(model.device)
    cache = DynamicCache()
    stream = TextStream(tokenizer)
    out: list[int] = []
    feed = list(prompt_ids)
    forwards, prefill, reason = 0, 0.0, "max_new_tokens"
    while len(out) < max_new_tokens:
        if _check_stop(stop):
            reason = "stopped"
            break
        p = warp(forward_logits(model, feed, cache, 1)[-1], params)
        forwards += 1
        x = pick(p, params, gen)
        t = clock.now()
        if not out:
            prefill = t
        out.append(x)
        yield TokenEvent(x, stream.push(x), Outcome.TARGET, t, p=float(p[x]))
        if x in eos:
            reason = "eos"
            break
        feed = [x]
    yield RunSummary(
        mode="baseline", method="plain", token_ids=out, text=stream.final(), n_tokens=len(out),
        elapsed=clock.now(), prefill=prefill, target_forwards=forwards, stop_reason=reason,
        device=str(model.device),
    )


def _generator(device, seed):
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


@torch.inference_mode()
def speculative(
    target,
    proposer: Proposer,
    tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    gamma: int,
    params: SamplingParams,
    eos_ids=(),
    seed: int | None = None,
    stop: threading.Event | None = None,
    clock: Clock | None = None,
) -> Iterator[RoundEvent | RunSummary]:
    """Speculative decoding: the proposer drafts, the target verifies all drafts
    in one forward pass, modified rejection sampling keeps the target's law."""
    eos = frozenset(eos_ids)
    gen = _generator(target.device, seed)
    clock = clock or Clock(target.device)
    cache = DynamicCache()
    stream = TextStream(tokenizer)
    committed = list(prompt_ids)
    out: list[int] = []
    s = RunSummary(mode="speculative", method=proposer.name, token_ids=out, text="", n_tokens=0,
                   elapsed=0.0, prefill=0.0, target_forwards=0, stop_reason="max_new_tokens",
                   gamma=gamma, device=str(target.device))
    # the target reads the prompt in round 1, together with the first drafts:
    # one forward fewer than a separate prefill (HF assisted generation does the
    # same). Round 1 therefore counts as prefill, not in the draft/verify split.
    proposer.reset(prompt_ids)  # the draft's prefill, not in draft_forwards
    if hasattr(proposer, "attach_target_cache"):  # self-speculation drafts in the target's cache
        proposer.attach_target_cache(cache)
    verify_logits = getattr(proposer, "verify_logits", None)
    r = 0
    while len(out) < max_new_tokens:
        if _check_stop(stop):
            s.stop_reason = "stopped"
            break
        remaining = max_new_tokens - len(out)
        # never draft past the budget: the last slot is the target's own token
        g = min(proposer.next_gamma(gamma), max(1, remaining - 1))
        fed = committed[cache.get_seq_length():]  # the whole prompt in round 1, then the last token
        t_start = clock.now()
        prop = proposer.propose(committed, g, params, gen, eos)
        t_drafted = clock.now()
        k = len(prop.tokens)
        if verify_logits is not None:  # the proposer already ran part of the target on its drafts
            logits = verify_logits(fed, prop.tokens, k + 1)
        else:
            logits = forward_logits(target, fed + prop.tokens, cache, k + 1)
        p = warp(logits, params)
        q = _pad_to(prop.q.to(p.device), p.shape[-1]) if k else p[:0]
        v = verify(torch.tensor(prop.tokens, device=p.device, dtype=torch.long), q, p, gen)
        t_end = clock.now()
        s.target_forwards += 1

        new = prop.tokens[: v.n_accepted] + [v.token]
        # EOS or the budget can end the output inside the round, as in plain decoding
        for i, x in enumerate(new):
            if x in eos:
                new = new[: i + 1]
                s.stop_reason = "eos"
                break
        new = new[:remaining]
        appended = len(new) == v.n_accepted + 1
        committed += new
        out += new
        crop_cache(cache, len(committed) - 1)
        proposer.rollback(committed, v.n_accepted, k)

        tokens = []
        for i, x in enumerate(new[: v.n_accepted] if not appended else new[:-1]):
            tokens.append(TokenEvent(x, stream.push(x), Outcome.ACCEPTED, t_end, r, i + 1,
                                     p=v.p_x[i], q=v.q_x[i], u=v.u[i]))
        if appended:
            if v.resampled:
                j = v.n_accepted
                tokens.append(TokenEvent(prop.tokens[j], stream.token_text(prop.tokens[j]),
                                         Outcome.REJECTED, t_end, r, j + 1,
                                         p=v.p_x[j], q=v.q_x[j], u=v.u[j]))
            kind = Outcome.RESAMPLED if v.resampled else Outcome.BONUS
            tokens.append(TokenEvent(v.token, stream.push(v.token), kind, t_end, r, 0,
                                     p=float(p[v.n_accepted, v.token])))
        s.rounds += 1
        s.drafted += k
        s.accepted += v.n_accepted
        prompt_tokens = len(fed) - 1
        if prompt_tokens:
            s.prefill = t_end
            s.prompt_rounds += 1  # its draft forwards count with the prefill too
        else:
            s.draft_forwards += prop.forwards
            s.draft_time += t_drafted - t_start
            s.verify_time += t_end - t_drafted
        s.overlap_sum += sum(v.overlap)
        yield RoundEvent(
            index=r, gamma=k, draft_ids=prop.tokens, q=v.q_x, p=v.p_x, u=v.u, overlap=v.overlap,
            n_accepted=v.n_accepted, appended_id=v.token if appended else -1,
            resampled=v.resampled, t_start=t_start, t_draft=t_drafted - t_start,
            t_verify=t_end - t_drafted, t_end=t_end, draft_forwards=prop.forwards, tokens=tokens,
            total_tokens=len(out), total_drafted=s.drafted, total_accepted=s.accepted,
            target_forwards=s.target_forwards, prompt_tokens=prompt_tokens,
        )
        r += 1
        if s.stop_reason == "eos":
            break
    s.n_tokens = len(out)
    s.text = stream.final()
    s.elapsed = clock.now()
    yield s
