"""The page's process and a ZeroGPU call's forked process: what crosses between them.

ZeroGPU runs each GPU call in a forked process (spaces.GPU). What a run wrote into the page's stores
there (the session's trace for downloads and the theory chart, the rounds the p/q inspector reads,
the race-all board its method picker reads, the run queue) stayed in the fork, and a Stop pressed in
the page's process set a flag the fork never saw. spaces' own channels are the call's yields (each
pickled through a queue) and the cancel, which closes the run without a last yield, so a stopped run
never said "stopped by you" (spaces 0.51.3, zero/wrappers.py: generator_function_wrapper). The Bridge
carries both ways:
- fork to home: what the run gives a store (send, track) rides each yield back and is applied in the
  page's process (home);
- home to fork: a Stop is a flag file in a folder the page's process made before any fork; the fork's
  run polls it (POLL_S) and sets its own stop event, so the run ends as a Stop ends it elsewhere and
  its last state reaches the page.
Off ZeroGPU no call is open, so send and track apply at once: the same code path as before.
"""
from __future__ import annotations

import atexit
import functools
import hashlib
import os
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

from ..machine import Lock

POLL_S = 0.05  # how often a forked run looks for a Stop (a stat call; engine steps take longer)
KEEP = 64  # mirrored lists kept at home (the inspector keeps as many sessions' rounds)


class Bridge:
    """Stores by kind (register), the session keys inside a forked call in this process (open), and
    what each has sent since its last yield."""

    def __init__(self):
        self._stores: dict[str, object] = {}
        self._lock = Lock()
        self._open: set[str] = set()
        self._box: dict[str, list] = {}
        self._tracked: dict[str, dict[str, list]] = {}  # key -> kind -> [the run's list, items sent]
        self._home: OrderedDict[tuple[str, str], list] = OrderedDict()  # (kind, key) -> the page's copy
        self.flags: Path | None = None  # where Stop's flags go, once the page's calls are forked (wrap)

    def fork_calls(self) -> None:
        """The page's calls will run forked: the flags' folder, made here in the page's process before
        any call forks (the fork inherits its path), removed when this process exits."""
        if self.flags is None:
            self.flags = Path(tempfile.mkdtemp(prefix="specviz-stop-"))
            home, flags = os.getpid(), self.flags
            atexit.register(lambda: os.getpid() == home and shutil.rmtree(flags, ignore_errors=True))

    def register(self, kind: str, store) -> None:
        """store(key, *args) applies what a run sends under this kind, in the page's process."""
        self._stores[kind] = store

    # ------------------------------------------------------------------ the run's side

    def send(self, kind: str, key: str, *args) -> None:
        """Give the page's store this (for a forked call's session: with the run's next yield)."""
        with self._lock:
            if key in self._open:
                self._box[key].append((kind, args))
                return
        self._stores[kind](key, *args)

    def track(self, kind: str, key: str, items: list) -> None:
        """A list the run goes on appending to (the rounds): the store gets the list itself, or, from
        a forked call, a copy that each yield extends by the items new since the last."""
        with self._lock:
            if key in self._open:
                self._tracked[key][kind] = [items, 0]
                self._box[key].append(("+", (kind,)))  # a fresh list at home, even if nothing follows
                return
        self._stores[kind](key, items)

    def is_open(self, key: str) -> bool:
        with self._lock:
            return key in self._open

    def drain(self, key: str) -> list:
        """What the session's run sent since the last drain, tracked lists as their new items."""
        with self._lock:
            out, self._box[key] = self._box.get(key, []), []
            for kind, entry in self._tracked.get(key, {}).items():
                items, sent = entry
                if len(items) > sent:
                    out.append(("+more", (kind, list(items[sent:]))))
                    entry[1] = len(items)
        return out

    def forked(self, handler, key_of):
        """handler as the forked call runs it: each output paired with what was sent meanwhile,
        then (None, the rest) when it ends (key_of(args, kwargs): the run's session key)."""
        @functools.wraps(handler)
        def call(*args, **kwargs):
            key = key_of(args, kwargs)
            with self._lock:
                self._open.add(key)
                self._box[key], self._tracked[key] = [], {}
            try:
                for out in handler(*args, **kwargs):
                    yield (out,), self.drain(key)
                yield None, self.drain(key)
            finally:
                with self._lock:
                    self._open.discard(key)
                    self._box.pop(key, None)
                    self._tracked.pop(key, None)
        return call

    # ------------------------------------------------------------------ the page's side

    def home(self, calls, key: str):
        """The outputs of a forked call's (output, sent) pairs, what was sent applied here first."""
        for out, sent in calls:
            self.deliver(key, sent)
            if out is not None:
                yield out[0]

    def deliver(self, key: str, sent: list) -> None:
        for kind, args in sent:
            if kind == "+":  # a tracked list begins: the store holds the page's copy, extended later
                (name,), copy = args, []
                with self._lock:
                    self._home[(name, key)] = copy
                    self._home.move_to_end((name, key))
                    while len(self._home) > KEEP:
                        self._home.popitem(last=False)
                self._stores[name](key, copy)
            elif kind == "+more":
                name, items = args
                with self._lock:
                    copy = self._home.get((name, key))
                if copy is not None:
                    copy.extend(items)
            else:
                self._stores[kind](key, *args)

    # ------------------------------------------------------------------ Stop, across the fork

    def _flag(self, key: str) -> Path | None:
        return None if self.flags is None else self.flags / hashlib.sha1(key.encode()).hexdigest()[:16]

    def ask_stop(self, key: str) -> None:
        """From the page's process: the session's forked run should stop (it polls for this)."""
        if (flag := self._flag(key)) is not None:
            flag.touch()

    def clear_stop(self, key: str) -> None:
        if (flag := self._flag(key)) is not None:
            flag.unlink(missing_ok=True)

    def watch_stop(self, key: str, stop: threading.Event, done: threading.Event) -> None:
        """In a forked call: set `stop` when the page asks, until the run is `done`."""
        flag = self._flag(key)
        if flag is None:
            return

        def poll():
            while not done.wait(POLL_S):
                if flag.exists():
                    stop.set()
                    return
        threading.Thread(target=poll, name=f"specviz-stop-{flag.name}", daemon=True).start()


def wrap(bridge: Bridge, handler, decorate, key_of, begin, end):
    """handler as a ZeroGPU page calls it: decorate (spaces.GPU(...)) around bridge.forked(handler).
    In the page's process the session's run is begun (begin(key) -> (stop, done), end(key, done)), so
    a Stop finds it, asks the fork and waits for its last state; what the run sent is applied here."""
    bridge.fork_calls()
    inner = decorate(bridge.forked(handler, key_of))

    @functools.wraps(handler)
    def call(*args, **kwargs):
        key = key_of(args, kwargs)
        _, done = begin(key)  # may stop what the session ran before: that Stop's flag goes next
        bridge.clear_stop(key)
        try:
            yield from bridge.home(inner(*args, **kwargs), key)
        finally:
            end(key, done)
    return call
