"""One thread drives both sides of a GPU race, each on its own stream, and never waits on either.

A side is a loop generator (graphs.py): each next() enqueues work on the side's stream and
returns; the scheduler records an event after it and resumes that side only once event.query()
says the work is done, so the side's host reads after resuming never block. Between polls it
serves the other side. Both streams stay fed, and no two threads ever replay graphs at once.

Why one thread rather than one per side: the 2026-11-28 H100 race ran a thread per side, each
replaying graphs and waiting on its own stream; it hung with both threads inside replay. Here the
only waits are non-blocking query() calls, and a watchdog ends a race that makes no progress for
`watchdog_s` seconds with one line (RaceStuck), whatever the device does.
"""
from __future__ import annotations

import contextlib
import time

import torch

WATCHDOG_S = 20.0  # no side finished any work for this long: the race ends (issue 58)
POLL_S = 20e-6  # the sleep between two polls in which no work finished


class RaceStuck(RuntimeError):
    """The race made no progress for the watchdog's time."""


class CudaParts:
    """The device calls the scheduler makes (a test passes fakes)."""

    def __init__(self, device):
        self.device = torch.device(device)
        self.cuda = self.device.type == "cuda"

    def stream(self):
        if not self.cuda:
            return None
        s = torch.cuda.Stream(self.device)
        s.wait_stream(torch.cuda.current_stream(self.device))  # the models' setup work comes first
        return s

    def on(self, stream):
        return torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()

    def event(self, stream):
        """An event recorded on `stream` now, with timing; None on a CPU (work is done on return)."""
        if stream is None:
            return None
        e = torch.cuda.Event(enable_timing=True)
        e.record(stream)
        return e

    def done(self, event) -> bool:
        return event is None or event.query()

    def seconds(self, start, end) -> float | None:
        if start is None or end is None:
            return None
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def run_sides(loops: dict, device, *, watchdog_s: float = WATCHDOG_S, parts=None,
              clock=time.perf_counter) -> tuple[dict, dict]:
    """Drive every loop to its end, each on its own stream -> (values, seconds per side: its
    stream's time from its first work to its last, by events; wall time on a CPU)."""
    parts = parts or CudaParts(device)
    streams = {k: parts.stream() for k in loops}
    pending: dict = {k: None for k in loops}
    first: dict = {}
    t_first: dict = {}
    values, seconds = {}, {}
    live = list(loops)
    last = clock()
    while live:
        moved = False
        for k in list(live):
            if not parts.done(pending[k]):
                continue
            moved = True
            with parts.on(streams[k]):
                if k not in first:
                    first[k], t_first[k] = parts.event(streams[k]), clock()
                try:
                    next(loops[k])
                except StopIteration as end:
                    values[k] = end.value
                    seconds[k] = parts.seconds(first[k], parts.event(streams[k]))
                    if seconds[k] is None:
                        seconds[k] = clock() - t_first[k]
                    live.remove(k)
                    continue
                pending[k] = parts.event(streams[k])
        now = clock()
        if moved:
            last = now
        elif now - last > watchdog_s:
            for k in live:
                loops[k].close()
            raise RaceStuck(f"the race made no progress for {watchdog_s:.0f} s ({', '.join(live)} still "
                            "running) and was ended")
        else:
            time.sleep(POLL_S)
    return values, seconds
