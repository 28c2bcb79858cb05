"""Record a run as a JSON trace and replay it as the same event stream.

A trace holds the settings, model names, device and every (side, event) pair
with its timestamp, so a run recorded on a GPU plays back faithfully on a
CPU-only laptop: the UI renders replayed events exactly like live ones.
"""
from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass, field, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

from ..engine.events import Outcome, RoundEvent, RunSummary, TokenEvent, event_time
from ..engine.pair import runs_as
from ..engine.sampling import Gap
from ..machine import hardware  # noqa: F401 (traces record it)

VERSION = 1
_TYPES = {"token": TokenEvent, "round": RoundEvent, "summary": RunSummary}


def event_to_dict(ev) -> dict:
    kind = {TokenEvent: "token", RoundEvent: "round", RunSummary: "summary"}[type(ev)]
    d = asdict(ev)
    d["type"] = kind
    for t in [d] if kind == "token" else d.get("tokens") or []:  # a Gap's tokens (run/equality.py)
        g = t.get("gap")
        if isinstance(g, Gap):
            t["gap"] = [float(g), g.top, g.second, g.top_logit]
    return d


def _token(d: dict) -> TokenEvent:
    d = dict(d)
    d["outcome"] = Outcome(d["outcome"])
    if isinstance(d.get("gap"), list):
        d["gap"] = Gap(*d["gap"])
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
    if cls is RunSummary and "side" not in kw and "mode" in d:  # recorded before 2026-11-27
        kw["side"] = d["mode"]
    return cls(**kw)


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


def _no_constant(name: str):
    raise ValueError(f"the file holds {name}, not a number (a recorded time or count is always finite)")


def parse_json(text: str):
    """json.loads for uploaded files: ValueError, never RecursionError, for arrays or objects nested
    too deeply (a 400 KB file of 200,000 '[' ended a replay in a traceback, issue 51), and NaN or
    Infinity refused where they are read, not rendered as "nan tok/s"."""
    try:
        return json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("its JSON is nested too deeply to be a recording") from None


def load_trace(source) -> Trace:
    """From a path or a JSON string. ValueError with a readable message if invalid."""
    try:
        text = Path(source).read_text() if not str(source).lstrip().startswith("{") else str(source)
        raw = parse_json(text)
        if raw.get("kind") == "race-methods":  # specviz/run/race_bundle.py: several runs in one file
            raise ValueError("this is a race bundle (several methods' runs): show it in the Race all methods "
                             "tab, or with python -m specviz race-methods --from FILE")
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


# ---------------------------------------------------------------- recording


def record(stream: Iterable[tuple[str, object]], trace: Trace,
           on_end=None) -> Iterator[tuple[str, object]]:
    """Pass a (side, event) stream through, adding every pair to `trace`.

    When the stream ends, fails or is closed (a stopped run), `on_end(trace)`
    is called with what was recorded, and the wrapped stream is closed."""
    try:
        for side, ev in stream:
            trace.add(side, ev)
            yield side, ev
    finally:
        close = getattr(stream, "close", None)
        if close is not None:
            close()
        if on_end is not None and trace.events:
            on_end(trace)


def request_meta(req, pair, chat_applied: bool | None = None) -> dict:
    """Extra trace metadata for a run of `req` on `pair` (a ModelPair)."""
    chat = bool(req.chat_template and getattr(pair.tokenizer, "chat_template", None)) \
        if chat_applied is None else chat_applied
    costs = pair.costs
    return {"pair_label": pair.spec.label, "pair_name": pair.spec.name, "chat_applied": chat,
            "precision_note": pair.precision_note,  # what ran and why (calibrate.py)
            "costs": costs.to_dict() if costs is not None else None}


def trace_for(req, pair, mode: str, label: str = "") -> Trace:
    """An empty trace for a run of `req` (a RunRequest) on `pair`, meta filled."""
    tr = new_trace(asdict(req), pair.spec.target, pair.spec.draft or "", str(pair.device),
                   runs_as(pair), mode, label)
    tr.meta.update(request_meta(req, pair))
    import torch
    tr.meta["torch_threads"] = torch.get_num_threads()  # CPU timings depend on it
    costs = pair.costs
    if costs is not None:  # the calibration (plain step, v(k)) the page's predictions use
        tr.meta["costs"] = costs.to_dict()
    return tr


def trace_costs(tr: Trace):
    """The CostModel recorded with a trace, or None (older traces, uncalibrated pairs)."""
    from ..engine.costs import CostModel
    d = tr.meta.get("costs")
    try:
        return CostModel.from_dict(d) if d else None
    except (TypeError, KeyError):
        return None


def headline(meta: dict, settings: dict | None = None) -> dict[str, str]:
    """What a recorded run ran, from a trace's or a race's meta: its models, precision, hardware,
    date and sampling. The CLI, the replay and the leaderboard all read them here."""
    settings = (meta.get("settings") or {}) if settings is None else settings
    temp, raw = settings.get("temperature"), str(meta.get("recorded") or "")
    try:
        date = datetime.fromisoformat(raw).strftime("%Y-%m-%d %H:%M UTC")
    except ValueError:
        date = raw or "an unknown date"
    models = meta.get("pair_label") or " + ".join(x for x in (meta.get("target"), meta.get("draft")) if x)
    return {"models": str(models or "unknown models"), "hardware": meta.get("hardware") or "unknown hardware",
            "precision": meta.get("precision") or "unknown precision", "date": date,
            "sampling": "greedy" if temp == 0 else f"sampled at T {temp}" if temp is not None else "?"}


def headline_text(meta: dict, settings: dict | None = None) -> str:
    """"Qwen2.5-Coder 1.5B + 0.5B, bfloat16 on AMD EPYC (2 cores), 2026-11-27 09:00 UTC"."""
    h = headline(meta, settings)
    return f"{h['models']}, {h['precision']} on {h['hardware']}, {h['date']}"


def describe(tr: Trace) -> str:
    """One line: label, models, settings, hardware, date, and the measured speedup."""
    m, s = tr.meta, tr.summaries()
    settings = m.get("settings") or {}
    base, spec = s.get("baseline"), s.get("speculative")
    speed = ""
    if base is not None and spec is not None and base.tokens_per_s > 0:
        speed = (f", {spec.tokens_per_s / base.tokens_per_s:.2f}× "
                 f"({spec.n_tokens} tokens, α {spec.accepted / spec.drafted if spec.drafted else 0:.2f})")
    return (f"{m.get('label') or 'unlabelled'}: {settings.get('method', '?')} "
            f"γ {settings.get('gamma', '?')}, {headline(m)['sampling']}, {headline_text(m)}{speed}")
