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

from .machine import hardware  # noqa: F401 (traces record it)
from .engine.events import Outcome, RoundEvent, RunSummary, TokenEvent, event_time

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
    return {"pair_label": pair.spec.label, "pair_name": pair.spec.name, "chat_applied": chat}


def trace_for(req, pair, mode: str, label: str = "") -> Trace:
    """An empty trace for a run of `req` (a RunRequest) on `pair`, meta filled."""
    tr = new_trace(asdict(req), pair.spec.target, pair.spec.draft or "", str(pair.device),
                   getattr(pair, "precision", "") or str(pair.dtype).removeprefix("torch."), mode, label)
    tr.meta.update(request_meta(req, pair))
    import torch
    tr.meta["torch_threads"] = torch.get_num_threads()  # CPU timings depend on it
    costs = getattr(pair, "costs", None)
    if costs is not None:  # the calibration (plain step, v(k)) the page's predictions use
        tr.meta["costs"] = costs.to_dict()
    return tr


def trace_costs(tr: Trace):
    """The CostModel recorded with a trace, or None (older traces, uncalibrated pairs)."""
    from .engine.costs import CostModel
    d = tr.meta.get("costs")
    try:
        return CostModel.from_dict(d) if d else None
    except (TypeError, KeyError):
        return None


def main(argv=None) -> int:
    """`python -m specviz.trace record --preset NAME --out FILE` (or --prompt ...):
    run one race (baseline vs speculative) on a model pair and save it as a
    trace that the app can replay. `python -m specviz.trace info FILE...`
    prints what a trace holds."""
    import argparse
    import sys

    ap = argparse.ArgumentParser(prog="python -m specviz.trace", description=main.__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="record a race to a JSON trace")
    from .cli import add_pair_args
    add_pair_args(rec)
    rec.add_argument("--preset", default=None, help="take prompt, γ and chat template from this UI preset")
    rec.add_argument("--prompt", default=None)
    rec.add_argument("--method", default="draft", choices=["draft", "lookup", "adaptive"])
    rec.add_argument("--gamma", type=int, default=None)
    rec.add_argument("--max-new-tokens", type=int, default=40)
    rec.add_argument("--temperature", type=float, default=0.0)
    rec.add_argument("--top-p", type=float, default=1.0)
    rec.add_argument("--top-k", type=int, default=0)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--chat", action="store_true", default=None, help="use the chat template")
    rec.add_argument("--mode", choices=["fair", "parallel"], default="fair")
    rec.add_argument("--warmup", type=int, default=4,
                     help="new tokens of an unrecorded warm-up race first (0: none), as a warm app would be")
    rec.add_argument("--label", default="")
    rec.add_argument("--out", required=True)
    info = sub.add_parser("info", help="print what traces hold")
    info.add_argument("files", nargs="+")
    args = ap.parse_args(argv)

    if args.command == "info":
        for f in args.files:
            try:
                tr = load_trace(f)
            except ValueError as e:
                print(f"{f}: {e}", file=sys.stderr)
                return 2
            print(f"{f}: {describe(tr)}")
        return 0

    from .cli import load_from_args
    from .models import ModelError
    from .prompts import load_presets
    from .race import race
    from .request import RequestError, encode_prompt, make_request
    try:
        preset = {}
        if args.preset:
            by_name = {p["name"]: p for p in load_presets()}
            if args.preset not in by_name:
                raise RequestError(f"unknown preset {args.preset!r}: one of {', '.join(by_name)}")
            preset = by_name[args.preset]
        prompt = args.prompt if args.prompt is not None else preset.get("prompt")
        if prompt is None:
            raise RequestError("give --prompt or --preset")
        gamma = args.gamma if args.gamma is not None else preset.get("gamma", 4)
        chat = args.chat if args.chat is not None else preset.get("chat_template", False)
        req = make_request(prompt, args.method, gamma, args.max_new_tokens, args.temperature, args.top_p,
                           args.top_k, args.seed, chat)
        print("loading the model pair…", file=sys.stderr)
        from .race import on_engine_thread
        pair = on_engine_thread(load_from_args, args)  # load where the race decodes
        ids = encode_prompt(pair.tokenizer, req, getattr(pair.target.config, "max_position_embeddings", None))
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.warmup > 0:
        from dataclasses import replace
        for _ in race(pair, replace(req, max_new_tokens=args.warmup), ids, args.mode):
            pass
    label = args.label or (preset.get("name") if preset else "") or prompt[:40]
    tr = trace_for(req, pair, args.mode, label)
    for side, ev in record(race(pair, req, ids, args.mode), tr):
        if isinstance(ev, RunSummary):
            print(f"{side}: {ev.n_tokens} tokens in {ev.elapsed:.2f} s ({ev.tokens_per_s:.2f} tokens/s), "
                  f"stop: {ev.stop_reason}", file=sys.stderr)
    out = tr.save(args.out)
    print(f"{out}: {describe(tr)} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def describe(tr: Trace) -> str:
    """One line: label, models, hardware, date, and the measured speedup."""
    m = tr.meta
    s = tr.summaries()
    base, spec = s.get("baseline"), s.get("speculative")
    speed = ""
    if base is not None and spec is not None and base.tokens_per_s > 0:
        speed = (f", {spec.tokens_per_s / base.tokens_per_s:.2f}× "
                 f"({spec.n_tokens} tokens, α {spec.accepted / spec.drafted if spec.drafted else 0:.2f})")
    return (f"{m.get('label') or 'unlabelled'}: {m.get('pair_label') or m.get('target')}, "
            f"{m.get('settings', {}).get('method', '?')} γ {m.get('settings', {}).get('gamma', '?')}, "
            f"T {m.get('settings', {}).get('temperature', '?')}, {m.get('precision') or '?'} on "
            f"{m.get('hardware') or '?'}, {str(m.get('recorded', '?'))[:10]}{speed}")


if __name__ == "__main__":
    raise SystemExit(main())
