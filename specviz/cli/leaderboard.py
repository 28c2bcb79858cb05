"""`python -m specviz race-methods`: race the methods on one prompt and print the leaderboard.

    python -m specviz race-methods --pair default --prompt "def fib(n):" \\
        --methods draft,auto,tree,hybrid,suffix,staged,lookup,lookahead,rest --max-new-tokens 64 \\
        [--out race.json]

Each method races plain decoding in fair mode, step by step, so each × plain is a ratio
of the same moments (specviz/run/leaderboard.py);
--out saves the whole race as one bundle the page loads in its "Race all
methods" tab (specviz/run/race_bundle.py). `--from FILE` prints a saved bundle's table.
"""
from __future__ import annotations

import json
import sys

from ..format import number
from ..run.flags import add_method_args, add_pair_args, load_from_args, method_options, preset_settings
from ..run.leaderboard import (
    DEFAULT_KEYS,
    END,
    START,
    Board,
    all_keys,
    new_board,
    race_methods,
)
from ..run.trace import headline, headline_text

COLUMNS = ("#", "method", "γ", "tok/s", "× plain", "plain then", "τ", "α̂", "c", "v", "tokens", "output")


def add_args(sub) -> None:
    r = sub.add_parser("race-methods", help="race several methods on one prompt (each raced beside plain "
                                            "decoding, step by step) and print the leaderboard")
    add_pair_args(r)
    r.add_argument("--prompt", default=None)
    r.add_argument("--preset", default=None, help="take prompt, γ and chat template from this UI preset")
    r.add_argument("--methods", default=",".join(DEFAULT_KEYS),
                   help=f"comma-separated, from: {', '.join(all_keys())} (auto = draft model with auto γ; "
                        f"default: {','.join(DEFAULT_KEYS)})")
    r.add_argument("--gamma", default=None, help="γ of every method but auto (1-16, default 4)")
    r.add_argument("--max-new-tokens", default=64)
    r.add_argument("--temperature", default=0.0, help="0 = greedy (outputs checked against plain)")
    r.add_argument("--top-p", default=1.0)
    r.add_argument("--top-k", default=0)
    r.add_argument("--seed", default=0)
    r.add_argument("--chat", action="store_true", default=None, help="wrap the prompt in the chat template")
    r.add_argument("--warmup", type=int, default=4,
                   help="new tokens of an unrecorded warm-up race before each timed race (0: none)")
    r.add_argument("--time-limit", type=float, default=None,
                   help="seconds per race of a method beside plain (default: none)")
    r.add_argument("--label", default="")
    r.add_argument("--out", default=None, help="save the whole race as one bundle (JSON) the page can show")
    r.add_argument("--json", action="store_true", help="print the rows as one JSON list instead of a table")
    r.add_argument("--from", dest="from_file", default=None, help="print the table of a saved bundle instead")
    add_method_args(r)


def _output(row) -> str:
    if row.error:
        return f"not run: {row.error}"
    return (row.cut_note or row.identical) + (f" ⚠ {row.flag}" if row.flag else "")


def cell(col: str, row, rank: int) -> str:
    f = {"tok/s": number(row.tokens_per_s, "{:.2f}", "–"), "× plain": number(row.speedup, "{:.2f}×", "–"),
         "plain then": row.plain_then,
         "τ": number(row.tau, "{:.2f}", "–"), "α̂": number(row.alpha_hat, "{:.3f}", "–"),
         "c": number(row.c, "{:.3f}", "–"), "v": number(row.v, "{:.2f}", "–"),
         "output": _output(row),
         "tokens": str(row.n_tokens) if row.tokens_per_s is not None else "–",
         "#": str(rank) if row.ranked else "–", "method": row.label, "γ": row.gamma}
    return f[col]


def table(board: Board) -> str:
    """The leaderboard as aligned text, fastest first (numbers right-aligned, the last column unpadded)."""
    rows = board.rows()
    cells = [list(COLUMNS)] + [[cell(c, r, i + 1) for c in COLUMNS] for i, r in enumerate(rows)]
    widths = [max(_width(line[i]) for line in cells) for i in range(len(COLUMNS))]
    left = {"method", "output"}

    def pad(name, c, w):
        gap = " " * (w - _width(c))
        return c + gap if name in left else gap + c
    return "\n".join("  ".join(pad(*x) for x in zip(COLUMNS, line, widths, strict=True)).rstrip()
                     for line in cells)


def _width(text: str) -> int:
    """Columns on a terminal: combining marks (the hat of α̂) take none."""
    import unicodedata
    return sum(not unicodedata.combining(ch) for ch in text)


def _request(args):
    from ..run.request import make_request
    prompt, gamma, chat = preset_settings(args)
    return make_request(prompt, method="draft", gamma=gamma, max_new_tokens=args.max_new_tokens,
                        temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                        chat_template=chat), method_options(args)


def run(args) -> int:
    from ..errors import RequestError
    if args.from_file:
        from ..run.race_bundle import load_bundle
        try:
            board = load_bundle(args.from_file)
        except ValueError as e:
            raise RequestError(f"{args.from_file}: {e}") from None
        return _print(args, board)
    if args.warmup < 0:
        raise RequestError("--warmup must be 0 or more.")
    req, options = _request(args)
    from ..run.leaderboard import parse_keys
    keys = parse_keys(args.methods)  # bad names fail before minutes of loading
    from transformers.utils import logging as hf_logging
    hf_logging.disable_progress_bar()
    from ..run.race import on_engine_thread
    from ..run.request import encode_prompt
    from ..ui import busy  # the page's CPU meter (/proc/stat), no gradio
    print("loading the model pair…", file=sys.stderr)
    pair = on_engine_thread(load_from_args, args)  # load where the race decodes (race.on_engine_thread)
    ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
    board = new_board(pair, req, keys, options)
    if args.label:
        board.meta["label"] = args.label
    for key, side, _ev in race_methods(pair, req, ids, board, time_limit=args.time_limit, warmup=args.warmup):
        busy.note_race(board, key, side)  # as the page does: a run that other programs slowed says so
        if side == START:
            print(f"[{board.done() + 1}/{board.total}] {board.runs[key].entry.label} beside plain "
                  "decoding…", file=sys.stderr, flush=True)
        elif side == END and board.runs[key].error:
            print(f"  not run: {board.runs[key].error}", file=sys.stderr)
    if args.out:
        from ..run.race_bundle import save_bundle
        path = save_bundle(board, args.out)
        print(f"saved the race to {path} ({path.stat().st_size / 1024:.0f} KiB)", file=sys.stderr)
    return _print(args, board)


def _print(args, board: Board) -> int:
    if args.json:
        print(json.dumps([r.to_dict() for r in board.rows()]))
        return 0
    s = board.settings
    print(f"{headline_text(board.meta, s)}: {s.get('max_new_tokens')} new tokens, "
          f"{headline(board.meta, s)['sampling']}, each run on its own clock (fair); "
          + ("× plain: ÷ plain decoding raced beside each method, step by step (the same moments)"
             if board.paired else "× plain: ÷ one plain run timed before every method (recorded before "
             "2026-11-28: not the same moments, none ranked above plain)"))
    print(table(board))
    bad = [r for r in board.rows() if r.identical == "mismatch"]
    for r in bad:
        print(f"{r.label}: {r.detail}")
    return 1 if bad else 0
