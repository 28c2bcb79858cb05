"""A live run on the page: the engines run at full speed, the panes follow at the measured pace.

Why (issue 71): the page used to step the race from the generator gradio resumes, so the engines
waited for every page update to be rendered, serialised, sent and drawn (with a pause after each,
engine/cpu/threads.settle). A default run on a quiet 2-core machine measured 7.96 s (5.21 s plain,
2.75 s speculative) and took 16.1 s from Run to the end; the plain pane typed ~6.5 tok/s beside a
table that said 20.8.

Now:

- `Pump` takes the race's events on a thread of its own, as fast as the engines make them. Nothing
  the page does makes the engines wait, except the page's own Python work on an update (a few
  milliseconds: the panes' HTML and the numbers), done under isolation.untimed_work, between two
  timed steps, while neither side's clock runs.
- `Pacer` says which of those events the panes show at a given moment. Fair mode times the two
  sides in turn, each alone on its own virtual clock, so while both run their shared clock moves at
  about half the wall clock: shown as they come, the panes would type at half the pace the table
  reports. The pacer shows them instead on that shared clock, one second of it per second. The
  page's race steps both sides by tokens, then the speculative side's last share alone, then plain's
  (run/race.py, pace "split"); the replay starts at that split, so it never waits for the engines,
  ends a little after them, and a browser drawing it on the same cores slows both sides alike.
  Without a split (another pace, or a side that ended before it) it starts late enough not to wait:
  the engines' predicted end less the longer side's duration. The page says it shows a replay of
  what was timed. Parallel mode's events are stamped on the wall clock: shown as they come.
- The page takes an update every UI_INTERVAL, with the latest state, never one per token. The charts
  (plotly: the heavy part of an update, for the server and for a browser on the same cores) are drawn
  at the start and at the end only (ui/handlers.py).

No gradio here; the page's outputs come from ui/panes.PaneStream.
"""
from __future__ import annotations

import os
import threading
import time
from collections import deque
from typing import Callable, Iterable, Iterator

from ..engine.cpu.threads import settle
from ..engine.events import RoundEvent, RunSummary, TokenEvent, event_time
from ..run import isolation

UI_INTERVAL = float(os.environ.get("SPECVIZ_UI_INTERVAL", 0.25))  # seconds between two page updates (≤ 4/s)
# fair mode: seconds the engines wait after each update in a run, while a browser on these cores draws it
# (engine/cpu/threads.settle: and on until the cores are back to their load before); 0: never wait
HOLD = float(os.environ.get("SPECVIZ_UI_HOLD", 0.0))
TAIL = 0.2  # the replay ends at most this share of the engines' wall time after them (Pacer.due)
KEEPALIVE = 0.5  # seconds without an update after which follow yields a no-change one
JOIN_S = 10.0  # the next run waits at most this long for a closed run's engines to end their step
# pumps of runs closed early whose engines may still be ending their step: the next run waits for them
# on its own worker thread (gradio closes a cancelled run's generator on its event loop, which must
# never wait: the soak test's 8 visitors cancelling at once timed out when the close joined the pump)
_CLOSED: set = set()
_CLOSED_LOCK = threading.Lock()


class Pump:
    """A (side, event) stream taken to its end on a thread of its own, as fast as it comes; the
    reader `take`s what came meanwhile and never makes the stream wait. The stream is closed on that
    thread (a generator cannot be closed from another while it runs); an error is kept for the
    reader (`error`)."""

    def __init__(self, stream: Iterable, name: str = "specviz-pump"):
        self._stream = stream
        self._items: list = []
        self._lock = threading.Lock()
        self.finished = threading.Event()
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Pump:
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            for item in self._stream:
                with self._lock:
                    self._items.append(item)
        except BaseException as err:  # noqa: BLE001 - handed to the reader
            self.error = err
        finally:
            try:
                close = getattr(self._stream, "close", None)
                if close is not None:
                    close()
            except BaseException as err:  # noqa: BLE001
                self.error = self.error or err
            self.finished.set()

    def take(self) -> tuple[list, bool]:
        """(the items that came since the last take, whether the stream has ended). `finished` is
        read first: once it says ended, this take holds the stream's last items."""
        ended = self.finished.is_set()
        with self._lock:
            items, self._items = self._items, []
        return items, ended

    def join(self, timeout: float) -> bool:
        """Wait for the stream's end; True once it ended."""
        self._thread.join(timeout)
        return self.finished.is_set()


def close(stream) -> None:
    """Close a stream that a Pump may still be running (the pump closes it itself when it ends)."""
    try:
        stream.close()
    except ValueError:  # "generator already executing": on the pump's thread, which closes it
        pass


class Pacer:
    """Which of a run's events the panes show at a moment of `wall` (seconds since the engines
    started): in fair mode, those at or before the display clock, which runs at the events' own
    pace from `start` on (see the module's docstring); in parallel mode, all that came."""

    def __init__(self, mode: str, max_new_tokens: int, sides: tuple[str, ...] = ("baseline", "speculative"),
                 tail: float = TAIL, split: Callable[[], bool] | None = None):
        self.paced = mode == "fair"
        self.split = split  # True once the race has split (run/race.py pace "split"): the replay starts
        self.budget = max(1, int(max_new_tokens))
        self.expected = sides
        self.tail = tail
        self.pending: deque = deque()
        self.horizon = 0.0  # the latest event's time: every event before it has come (race.py's order)
        self.sides: dict[str, list] = {}  # side -> [latest event time, tokens out, elapsed once ended]
        self.start: float | None = None  # the wall time at which the display clock left 0
        self.shown = 0.0  # the display clock, on the events' clock
        self.wall = 0.0  # the wall time of the last due()
        self.ended_at: float | None = None  # the wall time the stream was seen ended
        self.skipped = 0.0  # seconds of the replay skipped so that it ends within the tail

    def feed(self, side: str, ev) -> None:
        self.pending.append((side, ev))
        t = event_time(ev)
        self.horizon = max(self.horizon, t)
        p = self.sides.setdefault(side, [0.0, 0, None])
        p[0] = max(p[0], t)
        if isinstance(ev, RunSummary):
            p[1], p[2] = ev.n_tokens, ev.elapsed
        elif isinstance(ev, RoundEvent):
            p[1] = ev.total_tokens
        elif isinstance(ev, TokenEvent) and ev.in_output:
            p[1] += 1

    def end(self, wall: float) -> None:
        """The stream has ended (seen at `wall`): the rest plays out, within the tail."""
        if self.ended_at is None:
            self.ended_at = wall

    @property
    def drained(self) -> bool:
        return not self.pending

    @property
    def replaying(self) -> bool:
        """The panes show a replay of what was timed (fair mode), not the events as they come."""
        return self.paced

    def planned_start(self, wall: float) -> float | None:
        """When the display clock should leave 0 so that it need not wait for the engines: the
        engines' predicted end less the longer side's predicted duration (each side's end
        extrapolated from its tokens so far; the engines' wall per second of their clocks so far).
        None until every side has written a token."""
        ends, spent = [], 0.0
        for side in self.expected:
            p = self.sides.get(side)
            if p is None:
                return None
            t, n, done = p
            if done is not None:
                ends.append(done)
                spent += done
                continue
            if n <= 0 or t <= 0:
                return None
            ends.append(t * max(self.budget, n) / n)
            spent += t
        k = max(1.0, wall / spent) if spent > 0 else 1.0  # the engines' wall per clock second
        return k * sum(ends) - max(ends)

    def _may_start(self, wall: float) -> bool:
        """Whether the display clock leaves 0 now: at the race's split, else at planned_start; at once
        once the engines have ended."""
        if self.ended_at is not None:
            return True
        if self.split is not None:
            if self.split():
                return True
            if all(p[2] is None for p in self.sides.values()):  # the split is still to come
                return False
        plan = self.planned_start(wall)
        return plan is not None and wall >= plan

    def due(self, wall: float, flush: bool = False) -> list:
        """The events to show now, in order; `flush`: all that came (a stop, an error)."""
        dt, self.wall = max(0.0, wall - self.wall), wall
        if flush or not self.paced:
            out = list(self.pending)
            self.pending.clear()
            self.shown = max(self.shown, self.horizon)
            return out
        if self.start is None:
            if not self._may_start(wall):
                return []
            self.start, dt = wall, 0.0
        if self.ended_at is None:
            self.shown = min(self.shown + dt, self.horizon)  # never ahead of the engines
        else:
            self.shown += dt
            # where the display clock must be now to end within the tail: skip to there if behind
            need = self.horizon - (self.ended_at * (1 + self.tail) - wall)
            if need > self.shown:
                self.skipped += need - self.shown
                self.shown = need
        out = []
        while self.pending and event_time(self.pending[0][1]) <= self.shown:
            out.append(self.pending.popleft())
        return out


def banner(pacer: Pacer, final: bool = False) -> str:
    """The line above the run info: what the panes show (a replay of what was timed, in fair mode).
    `final`: the run's last update (nothing said if the panes never replayed: stopped before)."""
    if not pacer.replaying or (final and pacer.start is None):
        return ""
    if final:
        text = ("<b>▶ The panes replayed the timed run</b> at its measured pace: fair mode times the two "
                "sides in turn, each on its own clock, and the panes showed each token at its time on "
                "their shared clock.")
    elif pacer.start is None:
        text = ("<b>⏱ Timing both sides</b>, in turn, each on its own clock. The panes then replay what was "
                "timed, at its measured pace, so they type as fast as the numbers say.")
    else:
        text = ("<b>▶ A replay of the timed run</b>, at its measured pace: fair mode times the two sides in "
                "turn, so the panes show each token at its time on their shared clock, a little after "
                "the engines wrote it.")
        if pacer.skipped >= 0.05:
            text += f" {pacer.skipped:.1f} s of it skipped to end with the engines."
    return f"<div class='sv-live-banner' role='status'>{text}</div>"


def follow(panes, stream: Iterable, pacer: Pacer, stop: threading.Event, *,
           interval: float = UI_INTERVAL, clock: Callable[[], float] = time.perf_counter,
           sleep: Callable[[float], object] | None = None, guard=isolation.untimed_work, hold: float = 0.0,
           pause: Callable[[float], object] = settle) -> Iterator[list]:
    """Run `stream` on a Pump and yield the page's outputs (`panes`, a ui/panes.PaneStream) every
    `interval` while there is something new to show; the charts stay as they were (the caller draws
    them at the start and the end). Ends once everything is shown; an error in the stream is
    raised after what came before it was shown. Closed early (a cancel), it stops the engines.
    `hold` > 0: after each update, the engines wait `pause(hold)` under `guard` (HOLD)."""
    wait_closed()
    pump = Pump(stream).start()
    nap = sleep or (lambda s: pump.finished.wait(s) if not pump.finished.is_set() else time.sleep(s))
    t0 = tick = last_yield = clock()
    try:
        while True:
            tick = max(tick + interval, clock())
            nap(max(0.0, tick - clock()))
            items, ended = pump.take()
            for side, ev in items:
                pacer.feed(side, ev)
            wall = clock() - t0
            if ended:
                pacer.end(wall)
            due = pacer.due(wall, flush=stop.is_set() or pump.error is not None)
            if due:
                with guard():  # the page's Python work: never during a timed step
                    for side, ev in due:
                        panes.add(side, ev)
                    panes.banner = banner(pacer)
                    out = panes.outputs(charts=False)
                yield out
                if hold > 0 and not ended:  # sent: the engines wait while a browser here draws it
                    with guard():
                        pause(hold)
                last_yield = clock()
            elif clock() - last_yield >= KEEPALIVE:  # nothing new: a no-change update, so that a
                yield panes.unchanged()  # cancel finds the generator paused (gradio retries a close
                last_yield = clock()  # while it runs: the soak test's cancels timed out)
            if ended and pacer.drained:
                break
        if pump.error is not None:
            raise pump.error
    finally:
        if not pump.finished.is_set():  # closed early: the engines stop at their next step
            stop.set()
            with _CLOSED_LOCK:
                _CLOSED.add(pump)


def wait_closed(timeout: float = JOIN_S) -> None:
    """Wait (at most `timeout` for each) until the engines of runs closed early have ended their step,
    so that no two runs' engines share the cores."""
    with _CLOSED_LOCK:
        pumps = list(_CLOSED)
    for pump in pumps:
        pump.join(timeout)
        with _CLOSED_LOCK:
            _CLOSED.discard(pump)
