"""Run clocks: real elapsed time (device-synchronised), and the virtual clock
the fair race uses to time each side as if it ran alone."""
from __future__ import annotations

import time

import torch


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
    its timestamps count only its own work, as if it ran alone."""

    def __init__(self, device: torch.device):
        super().__init__(device)
        self.spent = 0.0
        self.since: float | None = None

    def resume(self) -> None:
        self.since = self.now_raw()

    def pause(self) -> None:
        if self.since is not None:
            self.spent += self.now_raw() - self.since
            self.since = None

    def now(self) -> float:
        running = self.now_raw() - self.since if self.since is not None else 0.0
        return self.spent + running

    def exclude(self, seconds: float) -> None:
        self.spent -= seconds
