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
  also keeps two pairs in memory);
- a background job (the page's calibration of a second copy of the pair, ui/loader.py) holds
  `background_job()` while it computes and lets go at its pause points (`background_paused()`);
  a race starts its clocks only once every such job is paused (`racing()`, at most
  BACKGROUND_WAIT_S), so no step is timed beside it (a fresh start's first run read its prompt
  2.1x slower than the next, 2-core Zen 4, 2026-11-29).
"""
from __future__ import annotations

import contextlib
import threading

from ..machine import Lock

TIMED = Lock()  # made anew in a fork (machine.Lock): ZeroGPU races in one
_count_lock = Lock()
_races = 0
BACKGROUND_WAIT_S = 10.0  # a race waits at most this long for background jobs to pause (their longest
# stretch between two pause points: 2.5 s, a fresh start on a 2-core Zen 4, 2026-11-29)
_background = threading.Condition()
_working = 0  # background jobs computing now (between two pause points)


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
        wait_background(BACKGROUND_WAIT_S)
        yield
    finally:
        with _count_lock:
            _races -= 1


@contextlib.contextmanager
def background_job():
    """Held by a background job while it computes (see the module's docstring)."""
    global _working
    with _background:
        _working += 1
    try:
        yield
    finally:
        with _background:
            _working -= 1
            _background.notify_all()


@contextlib.contextmanager
def background_paused():
    """A background job's wait at a pause point: races may time meanwhile."""
    global _working
    with _background:
        _working -= 1
        _background.notify_all()
    try:
        yield
    finally:
        with _background:
            _working += 1


def wait_background(timeout: float) -> bool:
    """Wait until no background job computes (at most `timeout` s); True once none does."""
    with _background:
        return _background.wait_for(lambda: _working <= 0, timeout)


def race_running() -> bool:
    with _count_lock:
        return _races > 0


REFUSE_LOAD = ("A timed race is running: loading another model pair now would compete for the CPU with its "
               "timed steps and hold two pairs in memory. Load the pair when the run has finished.")
