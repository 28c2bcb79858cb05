"""Record a run as a JSON trace and replay it as the same event stream.

A trace holds the settings, model names, device and every (side, event) pair
with its timestamp, so a run recorded on a GPU plays back faithfully on a
CPU-only laptop: the UI renders replayed events exactly like live ones.
"""
from __future__ import annotations

import json
import platform
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from .events import Outcome, RoundEvent, RunSummary, TokenEvent

VERSION = 1
_TYPES = {"token": TokenEvent, "round": RoundEvent, "summary": RunSummary}


def event_to_dict(ev) -> dict:
    kind = {TokenEvent: "token", RoundEvent: "round", RunSummary: "summary"}[type(ev)]
    d = asdict(ev)
    d["type"] = kind
    return d


def _token(d: dict) -> TokenEvent:
    d = dict(d)
    d["outcome"] = Outcome(d["outcome"])
    return TokenEvent(**{k: v for k, v in d.items() if k in _names(TokenEvent)})


def _names(cls) -> set[str]:
    return {f.name for f in fields(cls)}


def event_from_dict(d: dict):
    cls = _TYPES[d["type"]]
    kw = {k: v for k, v in d.items() if k in _names(cls)}
    if cls is TokenEvent:
        return _token(d)
    if cls is RoundEvent:
        kw["tokens"] = [_token(t) for t in kw.get("tokens", [])]
    return cls(**kw)


def event_time(ev) -> float:
    """When the event became visible, in seconds since its run started."""
    if isinstance(ev, TokenEvent):
        return ev.t
    if isinstance(ev, RoundEvent):
        return ev.t_end
    return ev.elapsed


def hardware() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except Exception:  # a trace is still worth saving without it
        pass
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    import os
    return f"{cpu} ({os.cpu_count()} cores)"


@dataclass
class Trace:
    meta: dict
    events: list[tuple[str, object]] = field(default_factory=list)

    def add(self, side: str, ev) -> None:
        self.events.append((side, ev))

    def to_json(self) -> str:
        return json.dumps({"version": VERSION, "meta": self.meta,
                           "events": [{"side": s, **event_to_dict(e)} for s, e in self.events]})

    def save(self, path) -> Path:
        path = Path(path)
        path.write_text(self.to_json())
        return path

    def summaries(self) -> dict[str, RunSummary]:
        return {s: e for s, e in self.events if isinstance(e, RunSummary)}


def new_trace(settings: dict, target: str, draft: str, device: str, precision: str = "",
              mode: str = "fair", label: str = "") -> Trace:
    return Trace(meta={
        "settings": settings, "target": target, "draft": draft, "device": device,
        "precision": precision, "execution_mode": mode, "hardware": hardware(), "label": label,
        "recorded": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })


def load_trace(source) -> Trace:
    """From a path or a JSON string. ValueError with a readable message if invalid."""
    try:
        text = Path(source).read_text() if not str(source).lstrip().startswith("{") else str(source)
        raw = json.loads(text)
        if raw.get("version") != VERSION:
            raise ValueError(f"unsupported trace version {raw.get('version')!r}")
        events = [(e["side"], event_from_dict(e)) for e in raw["events"]]
        return Trace(raw["meta"], events)
    except (OSError, KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"not a SpecViz trace: {err}") from None


def replay(events: Iterable[tuple[str, object]], speed: float = 1.0,
           stop: threading.Event | None = None, sleep=time.sleep) -> Iterator[tuple[str, object]]:
    """Yield (side, event) at the recorded times (speed 2 = twice as fast).

    Events are ordered by their own timestamps, the shared clock of a race."""
    ordered = sorted(events, key=lambda se: (event_time(se[1]), isinstance(se[1], RunSummary)))
    t0 = time.perf_counter()
    for side, ev in ordered:
        wait = event_time(ev) / speed - (time.perf_counter() - t0)
        if wait > 0:
            if stop is not None:
                if stop.wait(wait):
                    return
            else:
                sleep(wait)
        if stop is not None and stop.is_set():
            return
        yield side, ev
