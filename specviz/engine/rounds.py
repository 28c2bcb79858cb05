"""The one round loop every speculative engine runs: a round is
propose → verify → commit (see docs: the chain, tree and Jacobi verifiers
live in decoding.py, tree_decoding.py and proposers/lookahead.py; each round's
outcome is committed to the run's books by events.commit_round).

Cache invariant for every engine: the target's KV cache holds every committed
token but the last one, which is fed by the next forward pass.
"""
from __future__ import annotations

import threading
from typing import Iterator

import torch
import torch.nn.functional as F

from .clock import Clock
from .events import RoundEvent, RunSummary
from .forward import new_cache
from .text import TextStream


def check_stop(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def make_generator(device, seed):
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def pad_to(q: torch.Tensor, vocab: int) -> torch.Tensor:
    # a draft with a smaller output layer proposes nothing past its size
    return F.pad(q, (0, vocab - q.shape[-1])) if q.shape[-1] < vocab else q


def run_state(model, tokenizer, eos_ids, seed, clock):
    """What every run starts with: the EOS set, its generator, clock, KV cache and text stream."""
    return (frozenset(eos_ids), make_generator(model.device, seed), clock or Clock(model.device),
            new_cache(model), TextStream(tokenizer))


def new_summary(method: str, gamma: int, device, **extra) -> RunSummary:
    """A speculative run's summary before its first round; finish_run closes it."""
    return RunSummary(side="speculative", method=method, token_ids=[], text="", n_tokens=0,
                      elapsed=0.0, prefill=0.0, target_forwards=0, stop_reason="max_new_tokens",
                      gamma=gamma, device=str(device), **extra)


def cut_at_eos(new: list[int], eos, remaining: int) -> tuple[list[int], bool]:
    """A round's new tokens and whether they hit EOS: EOS or the budget can end
    the output inside a round, as in plain decoding."""
    for i, x in enumerate(new):
        if x in eos:
            return new[: i + 1][:remaining], True
    return new[:remaining], False


def drive_rounds(s: RunSummary, stream: TextStream, clock: Clock, max_new_tokens: int,
                 stop: threading.Event | None, one_round) -> Iterator[RoundEvent | RunSummary]:
    """The loop of every speculative engine: one_round(r, remaining) -> RoundEvent
    while tokens are due, until a stop or EOS (s.stop_reason); the summary last."""
    r = 0
    while len(s.token_ids) < max_new_tokens:
        if check_stop(stop):
            s.stop_reason = "stopped"
            break
        yield one_round(r, max_new_tokens - len(s.token_ids))
        r += 1
        if s.stop_reason == "eos":
            break
    yield finish_run(s, stream, clock)


def finish_run(s: RunSummary, stream: TextStream, clock: Clock) -> RunSummary:
    """Close a speculative run's summary: the last event of every speculative engine."""
    s.n_tokens = len(s.token_ids)
    s.text = stream.final()
    s.elapsed = clock.now()
    return s
