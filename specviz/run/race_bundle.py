"""A whole method race (specviz/run/leaderboard.py) as one JSON file: the race's
meta, the reference plain run's events, and each contender's settings, events
(its own and those of the plain run raced beside it) or reason for not running.
Events are encoded exactly as in a trace
(trace.event_to_dict), and each contender unpacks to an ordinary two-sided
Trace (Board.trace), so the page replays and renders it like any recorded run.

    {"version": 1, "kind": "race-methods", "meta": {...}, "keys": ["draft", ...],
     "baseline": [event, ...],
     "runs": [{"key": "draft", "method": "draft", "auto": false, "settings": {...},
               "error": "", "events": [event, ...], "plain": [event, ...]}, ...]}

A bundle recorded before 2026-11-28 has no "plain" per run (plain was timed apart from
the methods): its rows say so and none ranks above plain (Board._row).

load_trace() refuses a bundle with a message that says what it is.
"""
from __future__ import annotations

import json
from pathlib import Path

from .leaderboard import Board, Entry, MethodRun
from .trace import VERSION, event_from_dict, event_to_dict, headline_text, parse_json

KIND = "race-methods"


def bundle_dict(board: Board) -> dict:
    runs = [{"key": k, "method": r.entry.method, "auto": r.entry.auto, "settings": r.settings,
             "error": r.error, "events": [event_to_dict(e) for e in r.events],
             "plain": [event_to_dict(e) for e in r.plain]}
            for k, r in ((k, board.runs[k]) for k in board.keys)]
    return {"version": VERSION, "kind": KIND, "meta": board.meta, "keys": list(board.keys),
            "baseline": [event_to_dict(e) for e in board.baseline], "runs": runs}


def save_bundle(board: Board, path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(bundle_dict(board)))
    return path


def is_bundle(raw) -> bool:
    return isinstance(raw, dict) and raw.get("kind") == KIND


def board_from_dict(raw: dict) -> Board:
    if not is_bundle(raw):
        raise ValueError("not a SpecViz race bundle (a single run's trace goes in the live tab's replay)")
    if raw.get("version") != VERSION:
        raise ValueError(f"unsupported bundle version {raw.get('version')!r}")
    try:
        meta = raw["meta"]
        if not isinstance(meta, dict):
            raise TypeError("its meta is not an object")
        board = Board(meta, [str(k) for k in raw["keys"]])
        board.baseline = [event_from_dict(e) for e in raw["baseline"]]
        for r in raw["runs"]:
            e = Entry(str(r["key"]), str(r["method"]), bool(r.get("auto")))
            board.runs[e.key] = MethodRun(e, dict(r.get("settings") or {}),
                                          [event_from_dict(x) for x in r.get("events") or []],
                                          str(r.get("error") or ""),
                                          [event_from_dict(x) for x in r.get("plain") or []])
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        raise ValueError(f"not a SpecViz race bundle: {type(err).__name__}: {err}") from None
    missing = [k for k in board.keys if k not in board.runs]
    if missing:
        raise ValueError(f"not a SpecViz race bundle: no run for {missing[0]!r}")
    return board


def load_bundle(source) -> Board:
    """From a path or a JSON string. ValueError with a readable message if invalid."""
    try:
        text = str(source) if str(source).lstrip().startswith("{") else Path(source).read_text()
        raw = parse_json(text)  # deep nesting, NaN: a ValueError as below, never a RecursionError
    except UnicodeDecodeError:  # random bytes, an image: not Python's "'utf-8' codec can't decode…"
        raise ValueError("not a SpecViz race bundle: the file is not text") from None
    except (OSError, ValueError) as err:
        raise ValueError(f"not a SpecViz race bundle: {err}") from None
    return board_from_dict(raw)


def describe(board: Board) -> str:
    """One line: label, models, hardware, date, and the winner."""
    m = board.meta
    rows = [r for r in board.rows() if r.ranked]
    best = next((r for r in rows if r.key != "plain"), None)
    win = (f", fastest {best.label} {best.tokens_per_s:.2f} tok/s ({best.speedup or 0:.2f}× plain)"
           if best else "")
    return f"{m.get('label') or 'unlabelled'}: race of {len(board.keys)} methods, {headline_text(m)}{win}"
