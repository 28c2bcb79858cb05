"""Race: run the baseline and speculative decoding side by side as one stream.

`race()` yields `(side, event)` pairs, side being "baseline" or "speculative"
and event the engine's own TokenEvent / RoundEvent / RunSummary, in display
order. Two execution modes:

fair (default on CPU)
    Both engines run in this thread, one step at a time. Each has its own
    VirtualClock that only counts while that engine is being stepped, so each
    side is timed as if it ran alone on the machine. We always step the side
    whose virtual clock is behind and emit events in virtual-time order, so the
    two sides can be shown on one shared (virtual) clock. Work done by the
    consumer between events (rendering, charts) is never counted.
    pace="tokens" (the race of all methods) steps instead the side with fewer
    tokens out, so both sides finish in the same wall-clock moments and meet
    the same load; the events still come in virtual-time order.
    pace="split" (the page's race) steps by tokens until both sides have the
    same share of their work left, then the speculative side to its end, then
    plain: the page replays from that split on (ui/live.py), and a browser
    drawing on the same cores meets the same share of each side (_Split).

parallel
    Two worker threads run both engines at the same time (on a CUDA device each
    on its own stream). Events are merged through a queue in wall-clock order.
    On CPU the two sides compete for the same cores, which distorts the
    measured speedup (see the report in the UI/README); this mode shows what a
    naive side-by-side demo would measure.

Both modes stop promptly when `stop` is set (the engines check it between
steps), when `time_limit` seconds of wall time have passed, or when the
consumer closes the generator; worker threads are always joined.

No gradio or plotly here: the UI, tests and scripts all consume this stream.
"""
from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import torch

from ..engine.cpu.threads import Governor
from ..engine.events import RoundEvent, RunSummary, TokenEvent, event_time
from ..engine.gpu.scheduler import WATCHDOG_S, RaceStuck
from ..engine.rounds import Clock, VirtualClock
from ..machine import after_fork
from . import isolation
from .runner import run_events, side_pair

SIDES = ("baseline", "speculative")
MODES = ("fair", "parallel")
PACES = ("clock", "tokens", "split")  # fair mode: which side steps next (_behind, _Split)

Event = TokenEvent | RoundEvent | RunSummary


DEFAULT_MODE = "fair"  # on CPU two threads share the cores; on a GPU parallel is an option, fair stays honest


class _Either:
    """Duck-typed stop flag for the engines: set when any of its events is."""

    def __init__(self, *events: threading.Event | None):
        self.events = [e for e in events if e is not None]

    def is_set(self) -> bool:
        return any(e.is_set() for e in self.events)


class RaceInfo:
    """What the consumer may want to know besides the events."""

    def __init__(self, mode: str):
        self.mode = mode
        self.timed_out = False
        self.wall_start = time.perf_counter()
        self.split_at: float | None = None  # pace="split": when the sides' last shares began (_Split)

    @property
    def wall(self) -> float:
        return time.perf_counter() - self.wall_start


def race(pair, req, prompt_ids: list[int], mode: str = "fair", *, stop: threading.Event | None = None,
         sides: tuple[str, ...] = SIDES, time_limit: float | None = None,
         info: RaceInfo | None = None, pace: str = "clock") -> Iterator[tuple[str, Event]]:
    """Run `sides` of one request and yield (side, event) in display order.

    The generators are created through runner.run_events, so the engines are
    called exactly as the CLI calls them. Exceptions from an engine (e.g. out
    of memory) propagate to the consumer after the other side was stopped.
    """
    if mode not in MODES:
        raise ValueError(f"unknown execution mode {mode!r}: choose one of {', '.join(MODES)}")
    if pace not in PACES:
        raise ValueError(f"unknown pace {pace!r}: choose one of {', '.join(PACES)}")
    info = info or RaceInfo(mode)
    halt = threading.Event()
    if time_limit:
        timer = threading.Timer(time_limit, lambda: (setattr(info, "timed_out", True), halt.set()))
        timer.daemon = True
        timer.start()
    else:
        timer = None
    either = _Either(stop, halt)
    try:
        with isolation.racing():  # the page refuses pair loads meanwhile
            if mode == "fair":
                yield from _fair(pair, req, prompt_ids, either, sides, pace, info)
            else:
                yield from _parallel(pair, req, prompt_ids, either, halt, sides)
    finally:
        halt.set()
        if timer is not None:
            timer.cancel()


_DONE = object()

# Fair mode steps both engines on this one long-lived thread, whichever thread
# the consumer calls next() from (a web server resumes a generator from any of
# its worker threads). Torch's CPU thread pool belongs to the calling thread, so
# this keeps one warm pool instead of one per server thread; and two fair races
# (two visitors, a test and the app) never overlap, so each side stays timed in
# isolation.
# SPECVIZ_FIXED_THREADS=1: every step at torch's thread count, whatever the load (engine/cpu/threads.py)
GOVERN = os.environ.get("SPECVIZ_FIXED_THREADS", "") != "1"
_FAIR_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-fair")


def _fair_thread_anew() -> None:
    # a fork (ZeroGPU runs each GPU call in one) copies the executor but not its thread: every step
    # submitted there waited for ever (tests/test_zerogpu_fork.py, once the parent had raced)
    global _FAIR_THREAD
    _FAIR_THREAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="specviz-fair")


after_fork(_fair_thread_anew)


def on_engine_thread(fn, *args, **kwargs):
    """Run `fn` (e.g. load_pair) on the thread that steps fair races. Every thread
    that computes gets its own OpenMP team; a process that loaded its models on a
    thread that stays alive (the main thread) and then raced here decoded ~20 %
    slower per step on 2 cores (measured 2.1 vs 2.6 tok/s). Loading on a thread
    that exits, as the app's loader does, or on this one, avoids it."""
    return _FAIR_THREAD.submit(fn, *args, **kwargs).result()


def _step(gen, clock: VirtualClock, governor: Governor | None = None, side: str = ""):
    # the lock first: waiting for a replay's render or a load is not this side's time
    with isolation.timed_step():
        if governor is not None:  # the threads for this step: the cores others leave free
            governor.apply(side)
        clock.resume()
        try:
            return next(gen)
        finally:
            clock.pause()


def _out(ev: Event) -> int:
    """Tokens `ev` adds to its side's output (a RunSummary adds none)."""
    if isinstance(ev, RoundEvent):
        return ev.n_new
    return int(isinstance(ev, TokenEvent) and ev.in_output)


def _fair(pair, req, prompt_ids, stop, sides, pace: str = "clock",
          info: RaceInfo | None = None) -> Iterator[tuple[str, Event]]:
    clocks = {side: VirtualClock(side_pair(pair, side).device) for side in sides}
    on_cpu = any(torch.device(side_pair(pair, side).device).type == "cpu" for side in sides)
    governor = Governor() if on_cpu and GOVERN else None
    gens = {side: run_events(pair, req, side, prompt_ids, stop=stop, clock=clocks[side]) for side in sides}
    pending: dict[str, list[Event]] = {side: [] for side in sides}
    out = dict.fromkeys(sides, 0)  # tokens out per side (pace="tokens")
    running = set(sides)
    split = _Split(req.max_new_tokens, info) if pace == "split" and set(sides) == set(SIDES) else None
    try:
        while running or any(pending.values()):
            if running:
                side = _next_side(pace, split, running, clocks, out, sides)
                ev = on_engine_thread(_step, gens[side], clocks[side], governor, side)
                out[side] += _out(ev)
                pending[side].append(ev)
                if isinstance(ev, RunSummary):
                    # CPU seconds of this side's steps (VirtualClock.cpu): beside its wall time, it
                    # tells a ratio that a busy machine bent (run/leaderboard.py)
                    ev.extra["cpu_s"] = clocks[side].cpu
                    if governor is not None:  # steps per thread count (engine/cpu/threads.py)
                        ev.extra["threads"] = {str(n): k for n, k in governor.used.get(side, {}).items()}
                    running.discard(side)
            # emit every pending event that no running side can still precede:
            # a running side's next event is stamped at or after its clock now
            horizon = min((clocks[side].now() for side in running), default=float("inf"))
            while True:
                ready = [(event_time(evs[0]), sides.index(side), side) for side, evs in pending.items()
                         if evs and event_time(evs[0]) <= horizon]
                if not ready:
                    break
                _, _, side = min(ready)
                yield side, pending[side].pop(0)
    finally:
        for g in gens.values():
            g.close()
        if governor is not None:
            on_engine_thread(governor.restore)


def _next_side(pace: str, split, running: set, clocks, out, sides=SIDES) -> str:
    """The side fair mode steps next: the split's once it has one (_Split), else the one most behind."""
    return (split is not None and split.pick(running, clocks, out)) or \
        min(running, key=lambda side: (_behind(pace, side, clocks, out), sides.index(side)))


def _behind(pace: str, side: str, clocks, out) -> float:
    """How far `side` is behind: the side with the least is stepped next (ties: baseline first).
    "clock": its virtual clock, so the page shows both sides on one clock as they run.
    "tokens" (and "split" until its split, _Split): its tokens out. Why: by the clock, the faster
    side ends first and plain then runs its last part alone, so a load that comes or goes there
    bends only plain's time. Beside a loop 3 s on / 3 s off (2-core Xeon, 2026-11-28, 32 tokens) the
    draft's ratio read 1.83-2.58x against 2.04x quiet; see docs/benchmarks.md for the same races
    paced by tokens."""
    return out[side] if pace in ("tokens", "split") else clocks[side].now()


class _Split:
    """pace="split": which side steps next, so that a browser drawing the replay on the same cores
    slows both sides alike. Fair mode with pace="clock" ends the speculative side first and steps
    plain alone after it; the page's replay (ui/live.py) starts when about half of the speculative
    side but a quarter of plain remain, so the browser's drawing (2.0-3.1 CPU-s a default run) fell on
    3/4 of plain's steps and 1/2 of the speculative side's: 16 interleaved pairs (2-core Zen 4,
    2026-11-29) read 2.05x in the browser against 1.84x through the API, plain 25 % slower and the
    speculative side 20 %.

    Here both sides step by tokens (the same share of each done at any moment) until a share phi of
    each is left; then the speculative side runs its share alone, then plain its own. The replay starts
    at that split (RaceInfo.split_at), so the browser draws over the same share phi of both sides.
    phi = P/T - LEAD (P: plain's time, T: both sides', estimated from the clocks so far): the replay
    ends LEAD*T after the engines, and never waits for them (phi <= P/T: plain's done share covers
    the speculative side's alone stretch)."""

    LEAD = 0.1  # the replay's end after the engines', in shares of their time (SETTLE, ui/handlers.py)

    def __init__(self, budget: int, info: RaceInfo | None):
        self.budget = max(1, int(budget))
        self.info = info
        self.alone = False

    def share_left(self, clocks, out) -> float:
        """phi: the share of each side to run after the split."""
        per = {s: clocks[s].now() / max(1, out[s]) for s in SIDES}  # seconds a token so far
        p_of_t = per["baseline"] / max(1e-9, per["baseline"] + per["speculative"])
        return min(p_of_t, max(p_of_t - self.LEAD, 0.1))

    def pick(self, running: set, clocks, out) -> str | None:
        """The side to step once the sides split (or one has ended); None before: by tokens (_behind)."""
        if not self.alone and len(running) == 2 and \
                min(out.values()) >= (1 - self.share_left(clocks, out)) * self.budget:
            self.alone = True
            if self.info is not None:
                self.info.split_at = time.perf_counter()
        if self.alone or len(running) < 2:  # the speculative side's share, then plain's
            return "speculative" if "speculative" in running else "baseline"
        return None


def _parallel(pair, req, prompt_ids, stop, halt, sides) -> Iterator[tuple[str, Event]]:
    q: queue.Queue = queue.Queue()
    t0 = time.perf_counter()
    start = threading.Barrier(len(sides))

    def work(side: str) -> None:
        try:
            device = torch.device(side_pair(pair, side).device)  # two GPUs: each side its own
            cuda = device.type == "cuda"
            stream = torch.cuda.Stream(device=device) if cuda else None
            ctx = torch.cuda.stream(stream) if cuda else contextlib.nullcontext()
            with torch.cuda.device(device) if cuda else contextlib.nullcontext(), ctx:
                clock = Clock(device, t0)
                gen = run_events(pair, req, side, prompt_ids, stop=stop, clock=clock)
                try:
                    start.wait(timeout=30)
                except threading.BrokenBarrierError:
                    pass
                try:
                    for ev in gen:
                        q.put((side, ev))
                finally:
                    gen.close()
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            halt.set()
            start.abort()  # a side that failed to start (a method's bad setup) frees the other at once
            q.put((side, err))
        finally:
            q.put((side, _DONE))

    threads = [threading.Thread(target=work, args=(s,), name=f"specviz-{s}", daemon=True) for s in sides]
    for t in threads:
        t.start()
    live = len(threads)
    error: BaseException | None = None
    # a side that makes no progress (a wedged device) ends the race with one line, the page stays up
    cuda = any(torch.device(side_pair(pair, s).device).type == "cuda" for s in sides)
    watchdog = WATCHDOG_S if cuda else None
    try:
        while live:
            try:
                side, item = q.get(timeout=watchdog)
            except queue.Empty:
                raise RaceStuck(f"the race made no progress for {watchdog:.0f} s and was ended") from None
            if item is _DONE:
                live -= 1
            elif isinstance(item, BaseException):
                error = error or item
            elif error is None:
                yield side, item
        if error is not None:
            raise error
    finally:
        halt.set()
        for t in threads:
            t.join(timeout=watchdog)  # a thread stuck in the device stays behind (daemon), not the page


# ------------------------------------------------------------ measurement


def measure(pair, req, prompt_ids, mode: str, repeats: int = 1) -> list[dict]:
    """Run the race `repeats` times in `mode`; per run: tokens/s of each side
    (on that side's own clock), the speedup and the wall time."""
    from ..engine.metrics import run_stats
    rows = []
    for _ in range(repeats):
        info = RaceInfo(mode)
        summaries = {s: ev for s, ev in race(pair, req, prompt_ids, mode, info=info)
                     if isinstance(ev, RunSummary)}
        base, spec = summaries["baseline"], summaries["speculative"]
        st = run_stats(spec, base, pair.costs)
        rows.append(dict(mode=mode, base_tps=base.tokens_per_s, spec_tps=spec.tokens_per_s,
                         speedup=st.speedup, alpha=st.alpha, c=st.c, predicted=st.predicted,
                         wall=info.wall, tokens=(base.n_tokens, spec.n_tokens)))
    return rows
