"""The one round loop every speculative engine runs: a round is
propose → verify → commit (see docs: the chain, tree and Jacobi verifiers
live in decoding.py, tree_decoding.py and proposers/lookahead.py; each round's
outcome is committed to the run's books by events.commit_round). Its clocks live here too:
real elapsed time (device-synchronised), and the virtual clock the fair race uses to time
each side as if it ran alone.

Cache invariant for every engine: the target's KV cache holds every committed
token but the last one, which is fed by the next forward pass.
"""
from __future__ import annotations

import threading
import time
from typing import Iterator

import torch
import torch.nn.functional as F

from .events import RoundEvent, RunSummary
from .forward import new_cache
from .text import TextStream


class Clock:
    """Seconds since the run started; synchronises the device before reading."""

    def __init__(self, device: torch.device, t0: float | None = None):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"
        self.t0 = self.now_raw() if t0 is None else t0

    def now_raw(self) -> float:
        if self.cuda:
            # only this thread's stream: a parallel race runs the other side on
            # another stream, and its work must not be counted here
            torch.cuda.current_stream(self.device).synchronize()  # this side's GPU (two GPUs: its own)
        return time.perf_counter()

    def now(self) -> float:
        return self.now_raw() - self.t0

    def exclude(self, seconds: float) -> None:
        """Take `seconds` of bookkeeping for the page (not decoding) off this clock."""
        self.t0 += seconds


class VirtualClock(Clock):
    """A clock that only runs while its owner is resumed.

    The fair race steps two engines in turn; each engine reads this clock, so
    its timestamps count only its own work, as if it ran alone. Beside it, `cpu` adds up the
    process's CPU time (all its threads, time.process_time) over the same steps: on a CPU another
    program's load stretches the wall time of a step far more than its CPU time."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self.spent = 0.0
        self.since: float | None = None
        self.cpu = 0.0
        self._cpu_since = 0.0

    def resume(self) -> None:
        self._cpu_since = time.process_time()
        self.since = self.now_raw()

    def pause(self) -> None:
        if self.since is not None:
            self.spent += self.now_raw() - self.since
            self.cpu += time.process_time() - self._cpu_since
            self.since = None

    def now(self) -> float:
        running = self.now_raw() - self.since if self.since is not None else 0.0
        return self.spent + running

    def exclude(self, seconds: float) -> None:
        self.spent -= seconds


def check_stop(stop: threading.Event | None) -> bool:
    return stop is not None and stop.is_set()


def make_generator(device, seed):
    if seed is None:
        return None
    g = torch.Generator(device=device)
    g.manual_seed(seed)
    return g


def copy_once(parts: dict[str, torch.Tensor]) -> dict:
    """Named device tensors brought to the host in one copy (one sync): packed as one float64 vector
    (exact for float32/bf16 values and for token ids), read once, unpacked by name, each to its shape
    (a number, a list, a list of lists)."""
    host = torch.cat([t.reshape(-1).to(torch.float64) for t in parts.values()]).tolist()
    out, i = {}, 0
    for name, t in parts.items():
        n, shape = t.numel(), tuple(t.shape)
        vals = host[i:i + n]
        i += n
        out[name] = vals[0] if not shape else vals if len(shape) == 1 else \
            [vals[j * shape[1]:(j + 1) * shape[1]] for j in range(shape[0])]
    return out


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
