"""Decoding engines: plain autoregressive baseline and speculative decoding.

Both are generators of events (see events.py) and share the same forward,
warp and timing code, so any speed trick reaches both or neither. The last
event of every run is a RunSummary.

Cache invariant for both models: the KV cache holds every committed token but
the last one, which is fed by the next forward pass.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

import torch

from .events import Outcome, RoundEvent, RunSummary, TokenEvent, commit_round, round_tokens
from .forward import crop_cache, forward_logits, new_cache, on_graphs, path_extra, pick
from .gpu.cache import to_device
from .gpu.graphs import PLAIN_BATCH
from .proposer import ChainProposer
from .rounds import Clock, check_stop, copy_once, cut_at_eos, drive_rounds, new_summary, pad_to, run_state
from .sampling import (
    SamplingParams,
    Verdict,
    gaps_of,
    greedy_pick,
    plain_of,
    plain_row,
    top2_gap,
    verdict_of,
    verify,
    verify_device,
    warp,
)
from .text import TextStream
from .topk_view import round_dists, round_dists_of, round_parts


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
    """Plain KV-cached autoregressive decoding of the target: a token read per step, or on a graph
    cache (a GPU's) in batches (_plain_batches), the same tokens either way."""
    eos, gen, clock, cache, stream = run_state(model, tokenizer, eos_ids, seed, clock)
    out: list[int] = []
    run = _Plain()
    steps = _plain_batches if on_graphs(cache) else _plain_steps
    for x, px, gap, t in steps(model, list(prompt_ids), max_new_tokens, params, gen, stop, clock, cache, run):
        if not out:
            run.prefill = t
        out.append(x)
        yield TokenEvent(x, stream.push(x), Outcome.TARGET, t, p=px, gap=gap)
        if x in eos:
            run.reason = "eos"
            break
    yield RunSummary(
        side="baseline", method="plain", token_ids=out, text=stream.final(), n_tokens=len(out),
        elapsed=clock.now(), prefill=run.prefill, target_forwards=run.forwards, stop_reason=run.reason,
        device=str(model.device), extra=path_extra(model, cache),
    )


@dataclass
class _Plain:
    forwards: int = 0
    prefill: float = 0.0
    reason: str = "max_new_tokens"


def _plain_steps(model, feed, new, params, gen, stop, clock, cache, run):
    """(token, p, gap, time) per step, each token read from the device as it is chosen."""
    while run.forwards < new:
        if check_stop(stop):
            run.reason = "stopped"
            return
        logits = forward_logits(model, feed, cache, 1)[-1]
        run.forwards += 1
        if params.greedy:  # p is one-hot at x
            (x, gap), px = greedy_pick(logits), 1.0
        else:
            p = warp(logits, params)
            x, gap = pick(p, params, gen), None
            px = float(p[x])
        yield x, px, gap, clock.now()
        feed = [x]


PLAIN_BATCH_S = 0.05  # a batch reads PLAIN_BATCH tokens (gpu/graphs.py's), or fewer after this long


def _plain_batches(model, feed, new, params, gen, stop, clock, cache, run):
    """_plain_steps' tokens on a graph cache, read in batches: each token stays on the device and is
    fed from there (GraphCache takes a device tensor), its row (sampling.plain_row) is kept there,
    and one read a batch brings the batch's rows to the host: PLAIN_BATCH tokens, or fewer once
    PLAIN_BATCH_S of host time went by. The prompt's token is a batch of its own, so prefill is
    read exactly. The consumer (baseline) cuts at the first EOS: the tokens are those of
    _plain_steps, and the forwards past EOS in its batch ran (target_forwards counts them).
    Times: the read's time is the batch's last token's; the batch's span since the previous read is
    split evenly over its tokens. Why split, not all at the read: every step in a batch replays the
    same 1-token graph, so their device times are equal but for noise, and a staircase of identical
    times would show a burst where the device produced a steady stream."""
    since = None
    while run.forwards < new:
        if check_stop(stop):
            run.reason = "stopped"
            return
        size = 1 if since is None else min(PLAIN_BATCH, new - run.forwards)
        rows, start = [], time.perf_counter()
        while len(rows) < size and (not rows or time.perf_counter() - start < PLAIN_BATCH_S):
            logits = forward_logits(model, feed, cache, 1)[-1]
            run.forwards += 1
            feed, row = plain_row(logits, params, gen)
            rows.append(row)
        host = torch.stack(rows).tolist()  # the batch's one read
        t = clock.now()
        t0 = t if since is None else since
        for i, r in enumerate(host):
            yield (*plain_of(r, params), t0 + (t - t0) * (i + 1) / len(host))
        since = t


@dataclass
class _Round:
    """What one round computed, before it is committed and reported."""

    tokens: list[int]  # drafted
    forwards: int  # draft forwards spent
    fed: list[int]  # what the target read before the drafts (the prompt in round 1)
    p: torch.Tensor  # (k+1, V) warped target distributions
    gaps: list[float] | None  # target top-2 logit gap per row (greedy runs only)
    v: Verdict
    t_start: float
    t_drafted: float
    t_end: float
    info: dict = field(default_factory=dict)  # the proposal's method-specific info, for RoundEvent.info
    q: torch.Tensor | None = None  # (k, V) draft distributions (the inspector's top-k reads them)
    raw: tuple | None = None  # greedy: (target logits, draft logits or None): the inspector's softmax
    dists: list = field(default_factory=list)  # engine/topk_view.py, filled by _inspect
    residual: dict | None = None
    copied: dict | None = None  # a graph cache's round: what _verify_copied read in its one copy


def _inspect(rd: _Round, stream: TextStream, clock: Clock) -> None:
    """The p/q inspector's top-k (a few ms on a 150k vocabulary): page bookkeeping, off the clock.
    A round on a graph cache brought them to the host with its verdict (_verify_copied)."""
    t = clock.now()
    if rd.copied is not None:
        rd.dists, rd.residual = round_dists_of(rd.copied, rd.v.n_accepted, rd.v.resampled,
                                               text_of=stream.token_text, raw=rd.raw is not None)
    else:
        p, q = _shown(rd.p, rd.q, rd.raw)
        rd.dists, rd.residual = round_dists(p, q, rd.v.n_accepted, rd.v.resampled, text_of=stream.token_text,
                                            raw=rd.raw is not None)
    clock.exclude(clock.now() - t)


def _shown(p, q, raw):
    """The inspector's p and q: as verified, or for greedy (one-hot p and q say nothing) the models'
    softmax, which says why."""
    if raw is not None:
        p = raw[0].float().softmax(-1)
        if raw[1]:
            q = torch.stack([x.float() for x in raw[1]]).softmax(-1)
            q = pad_to(q.to(p.device), p.shape[-1])
    return p, q


def _verify_copied(logits, p, q, tokens: list[int], params: SamplingParams, gen, raw):
    """verify, top2_gap and the inspector's top-k of a round on a graph cache (a GPU's), computed on
    the device and brought to the host in one copy (rounds.copy_once), not a read each: the same
    verdict, gaps and rows (sampling.verify_device, topk_view.round_parts). Their few top-k kernels
    run before the read, so inside t_verify (tens of µs on a GPU, beside a round of ms).
    -> (Verdict, gaps, the parts read: the inspector's)."""
    parts, r = verify_device(to_device(tokens, p.device), q, p, gen, greedy=params.greedy)
    if params.greedy:
        top = logits.reshape(-1, logits.shape[-1]).topk(2, dim=-1)
        parts.update(gap_v=top.values.float(), gap_i=top.indices)
    parts.update(round_parts(*_shown(p, q, raw), None if params.greedy else r))
    host = copy_once(parts)  # the round's one read
    gaps = gaps_of(host["gap_v"], host["gap_i"]) if params.greedy else None
    return verdict_of(host, len(tokens)), gaps, host


def _draft_and_verify(target, proposer, committed, cache, g, params, gen, eos, clock) -> _Round:
    """One round's work: the proposer drafts up to g tokens, the target reads
    them in one forward, modified rejection sampling decides."""
    # read before drafting: a self-speculative proposer writes into the target's cache
    fed = committed[cache.get_seq_length():]  # the whole prompt in round 1, then the last token
    t_start = clock.now()
    prop = proposer.propose(committed, g, params, gen, eos)
    t_drafted = clock.now()
    k = len(prop.tokens)
    if proposer.supplies_verify_logits:  # the proposer already ran part of the target on its drafts
        logits = proposer.verify_logits(fed, prop.tokens, k + 1)
    else:
        logits = forward_logits(target, fed + prop.tokens, cache, k + 1)
    p = warp(logits, params)
    q = pad_to(prop.q.to(p.device), p.shape[-1]) if k else p[:0]
    raw = (logits, prop.raw) if params.greedy else None
    copied = None
    if on_graphs(cache):
        v, gaps, copied = _verify_copied(logits, p, q, prop.tokens, params, gen, raw)
    else:
        drafted = torch.tensor(prop.tokens, device=p.device, dtype=torch.long)
        v = verify(drafted, q, p, gen, greedy=params.greedy)
        gaps = top2_gap(logits) if params.greedy else None
    return _Round(prop.tokens, prop.forwards, fed, p, gaps, v, t_start, t_drafted, clock.now(),
                  info=prop.info, q=q, raw=raw, copied=copied)


def _token_events(rd: _Round, new: list[int], stream: TextStream, r: int) -> list[TokenEvent]:
    """The round's tokens in display order: accepted, then rejected + resampled, or bonus."""
    v, gap = rd.v, (lambda i: rd.gaps[i] if rd.gaps else None)
    appended = len(new) == v.n_accepted + 1
    accepted = [(x, dict(p=v.p_x[i], q=v.q_x[i], u=v.u[i], gap=gap(i)))
                for i, x in enumerate(new[:-1] if appended else new)]
    rejected = last = None
    if appended:
        j = v.n_accepted
        if v.resampled:
            rejected = (rd.tokens[j], j + 1, dict(p=v.p_x[j], q=v.q_x[j], u=v.u[j], gap=gap(j)))
        kind = Outcome.RESAMPLED if v.resampled else Outcome.BONUS
        px = float(rd.p[j, v.token]) if rd.copied is None else rd.copied["p_token"][0]
        last = (v.token, kind, dict(p=px, gap=gap(j)))
    return round_tokens(stream, rd.t_end, r, accepted, rejected, last)


def _round_event(rd: _Round, s: RunSummary, r: int, appended: bool, tokens, prompt_tokens) -> RoundEvent:
    v = rd.v
    return RoundEvent(
        index=r, gamma=len(rd.tokens), draft_ids=rd.tokens, q=v.q_x, p=v.p_x, u=v.u, overlap=v.overlap,
        n_accepted=v.n_accepted, appended_id=v.token if appended else -1,
        resampled=v.resampled, t_start=rd.t_start, t_draft=rd.t_drafted - rd.t_start,
        t_verify=rd.t_end - rd.t_drafted, t_end=rd.t_end, draft_forwards=rd.forwards, tokens=tokens,
        total_tokens=len(s.token_ids), total_drafted=s.drafted, total_accepted=s.accepted,
        target_forwards=s.target_forwards, prompt_tokens=prompt_tokens, info=rd.info,
        dists=rd.dists, residual=rd.residual,
    )


@torch.inference_mode()
def speculative(
    target,
    proposer: ChainProposer,
    tokenizer,
    prompt_ids: list[int],
    max_new_tokens: int,
    gamma: int,
    params: SamplingParams,
    eos_ids=(),
    seed: int | None = None,
    stop: threading.Event | None = None,
    clock: Clock | None = None,
    *,
    policy=None,
) -> Iterator[RoundEvent | RunSummary]:
    """Speculative decoding: the proposer drafts, the target verifies all drafts
    in one forward pass, modified rejection sampling keeps the target's law.

    policy: an optional γ policy (engine/gamma.py) that picks each round's γ
    (at most `gamma`) and learns from each verdict; without one the proposer
    decides (fixed γ, or its own adaptive rule)."""
    eos, gen, clock, cache, stream = run_state(target, tokenizer, eos_ids, seed, clock)
    committed = list(prompt_ids)
    # a proposer whose draft costs are not γ·c (suffix: free; hybrid: free or a model chain, round by
    # round) has no chain-formula prediction: the page says so instead of pricing it as a chain
    s = new_summary(proposer.name, gamma, target.device, gamma_policy=getattr(policy, "name", ""),
                    unmeasured=[] if getattr(proposer, "chain_formula", True) else ["predicted"])
    # the target reads the prompt in round 1, together with the first drafts:
    # one forward fewer than a separate prefill (HF assisted generation does the
    # same). Round 1 therefore counts as prefill, not in the draft/verify split.
    proposer.reset(prompt_ids)  # the draft's prefill, not in draft_forwards
    if proposer.reads_target_cache:  # self-speculation drafts in the target's cache
        if on_graphs(cache) and not getattr(proposer, "reads_graph_cache", False):
            # it runs the target's layers one by one: a graph replays the whole model. This run goes
            # eager over a dynamic cache, and its summary says so
            cache = new_cache(target, dynamic=True)
        proposer.attach_target_cache(cache)
    s.extra.update(path_extra(target, cache))

    def one_round(r: int, remaining: int) -> RoundEvent:
        g = policy.next_gamma(gamma) if policy is not None else proposer.next_gamma(gamma)
        # never draft past the budget: the last slot is the target's own token
        g = min(g, max(1, remaining - 1))
        proposer.remaining = remaining
        rd = _draft_and_verify(target, proposer, committed, cache, g, params, gen, eos, clock)
        _inspect(rd, stream, clock)
        new, hit_eos = cut_at_eos(rd.tokens[: rd.v.n_accepted] + [rd.v.token], eos, remaining)
        committed.extend(new)
        crop_cache(cache, len(committed) - 1)
        proposer.rollback(committed, rd.v.n_accepted, len(rd.tokens))
        if policy is not None:
            policy.observe(rd.v.overlap, rd.v.n_accepted)
        tokens = _token_events(rd, new, stream, r)
        prompt_tokens = len(rd.fed) - 1
        commit_round(s, new, drafted=len(rd.tokens), accepted=rd.v.n_accepted, draft_forwards=rd.forwards,
                     overlap_sum=sum(rd.v.overlap), prompt_tokens=prompt_tokens,
                     t_draft=rd.t_drafted - rd.t_start, t_verify=rd.t_end - rd.t_drafted, t_end=rd.t_end,
                     hit_eos=hit_eos)
        return _round_event(rd, s, r, len(new) == rd.v.n_accepted + 1, tokens, prompt_tokens)

    yield from drive_rounds(s, stream, clock, max_new_tokens, stop, one_round)
