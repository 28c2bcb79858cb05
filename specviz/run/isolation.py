"""Fair-mode isolation: nothing else this process does may share the CPU with
a timed engine step.

A fair race times each side on a VirtualClock that only runs while that side is
stepped (run/race.py). Work elsewhere in the process during a step (a replay
rendering its panes, a model pair loading) would slow the step down and be
counted as the engine's time. So:

- the fair race holds TIMED during each timed step (`timed_step()`);
- replays render, and pair loads run, under the same lock (`untimed_work()`),
  so they wait for the step in progress and the next step waits for them,
  while both virtual clocks are paused;
- `race_running()` lets the page refuse a pair load while any race runs (a load
  also keeps two pairs in memory).
"""
from __future__ import annotations

import contextlib

from ..machine import Lock

TIMED = Lock()  # made anew in a fork (machine.Lock): ZeroGPU races in one
_count_lock = Lock()
_races = 0


@contextlib.contextmanager
def timed_step():
    with TIMED:
        yield


@contextlib.contextmanager
def untimed_work():
    with TIMED:
        yield


@contextlib.contextmanager
def racing():
    """Mark a race (any mode) as running for its whole duration."""
    global _races
    with _count_lock:
        _races += 1
    try:
        yield
    finally:
        with _count_lock:
            _races -= 1


def race_running() -> bool:
    with _count_lock:
        return _races > 0


REFUSE_LOAD = ("A timed race is running: loading another model pair now would compete for the CPU with its "
               "timed steps and hold two pairs in memory. Load the pair when the run has finished.")
