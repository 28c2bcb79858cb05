"""How many CPU threads the next engine step uses: the cores other programs leave free.

Why: beside a program that keeps one of two cores busy, a two-thread step waits at every barrier
for the thread that shares the busy core. On a 2-core Intel Xeon (2026-11-28, the default pair,
transformers' forward), the 1.5B target's step took 148-202 ms with 2 threads and 93-94 ms with
1; quiet, 53-55 ms and 91 ms. The draft's small steps went 55-62 ms against 28-30 ms. The loss
swings with the other program's phase, and it hits the draft's many small forwards differently
from the target's. So the speedup a race showed moved with the load (issue 59: a draft ratio
29 % under its quiet value). One thread per free core keeps both sides near their quiet speed.

The fair race (run/race.py) asks before each step, on the thread that steps both sides, so both
sides meet the same thread count at the same moments; the count it used is recorded per side.
"""
from __future__ import annotations

import time
from collections import Counter

import torch

from ...machine import CpuMeter, read_proc

INTERVAL = 0.1  # seconds between two readings of /proc (10 ms ticks: ±0.2 of a core at worst)
METER = CpuMeter(interval=INTERVAL)  # one history for every race: the first step has a reading


class Governor:
    """threads(): the cores others leave free (at least 1, at most the count at the first call)."""

    def __init__(self, meter: CpuMeter | None = None):
        self.meter = meter or METER
        self.base: int | None = None  # torch's thread count before the race (restored after)
        self.used: dict[str, Counter] = {}

    def threads(self) -> int:
        # only /proc's reading: the meter's fallback (the load average) counts our own threads too
        others = self.meter.sample()
        if others is None or not self.meter.exact:
            return self.base
        return max(1, min(self.base, int(self.meter.cores - others + 0.5)))

    def apply(self, side: str) -> int:
        """Set the calling thread's torch threads for `side`'s next step; returns the count."""
        if self.base is None:
            self.base = torch.get_num_threads()
        n = self.threads()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        self.used.setdefault(side, Counter())[n] += 1
        return n

    def restore(self) -> None:
        if self.base is not None and torch.get_num_threads() != self.base:
            torch.set_num_threads(self.base)


SETTLE_CAP = 0.5  # seconds a pause after a page update may last in all
SETTLE_POLL = 0.05  # seconds per reading while it waits (10 ms ticks: 0.2 of a core on 1 tick)
SETTLE_MARGIN = 0.35  # cores above what others used before the update: one tick, not two


def settle(pause: float, read=read_proc, sleep=time.sleep, clock=time.monotonic) -> float:
    """After a page update, before the next timed step of a fair race: sleep `pause`, then on until
    the cores in use (everyone's, ours included) fall back to what other programs used before the
    update (METER's last reading) plus SETTLE_MARGIN, at most SETTLE_CAP in all. Returns the seconds
    waited. Why: a browser on the same machine draws each update for longer than a fixed pause. On
    the 2-core Xeon (2026-11-28), headless Chromium drawing the race of all methods took a core
    while the next step ran on two threads; most steps of a race are plain's (64 against 12 rounds
    of the draft model), and plain read 13 tok/s against 22 without a browser, the draft model 3.27x
    plain against 1.95x.
    A program that keeps a core busy all along is in the reading before, so it adds no wait."""
    if pause <= 0:
        return 0.0
    start = clock()
    sleep(pause)
    before = METER.others if METER.exact and METER.others is not None else 0.0
    last = read()
    while last is not None and clock() - start < SETTLE_CAP:
        t = clock()
        sleep(SETTLE_POLL)
        got = read()
        if got is None:
            break
        if (got[0] - last[0]) / max(clock() - t, 1e-3) <= before + SETTLE_MARGIN:
            break
        last = got
    return clock() - start
