"""Command line: `python -m specviz generate ...`.

Prints the output coloured per round (or JSON lines with --json) and the
measured statistics. Bad input gives one clear line and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .engine.events import OUTCOME_ANSI, Outcome, RoundEvent, RunSummary, TokenEvent
from .engine.metrics import run_stats
from .request import METHODS, RequestError, encode_prompt, make_request

RESET = "\x1b[0m"


def add_pair_args(p: argparse.ArgumentParser) -> None:
    """Model pair options shared by the CLI, the app and the bench."""
    p.add_argument("--pair", default=None, help="registry pair name (default: the embedded offline pair)")
    p.add_argument("--target", default=None, help="target model: local directory or Hub id")
    p.add_argument("--draft", default=None, help="draft model: local directory or Hub id")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--quantize", choices=["auto", "none", "int8", "draft-int8"], default="auto",
                   help="CPU only. draft-int8: dynamic int8 weights for the draft only (output unchanged); "
                        "int8: both models (a different, faster target, for both sides); auto (default): "
                        "draft-int8 on a CPU when the draft has 100M+ parameters, else none")


def load_from_args(args, progress=None, allow_local_paths=True):
    from .models import load_pair, resolve_pair
    pair = args.pair if (args.pair or args.target or args.draft) else "default"
    spec = resolve_pair(pair, args.target, args.draft, allow_local_paths=allow_local_paths)
    return load_pair(spec, device=args.device, progress=progress, quantize=args.quantize)


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line on stderr and exit 2, like every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m specviz", description=__doc__)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate", help="generate text with the baseline or speculative decoding")
    add_pair_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--mode", choices=["speculative", "baseline", "both"], default="speculative")
    g.add_argument("--method", choices=METHODS, default="draft", help="where drafts come from")
    g.add_argument("--gamma", default=4, help="draft tokens per round (1-16)")
    g.add_argument("--max-new-tokens", default=64)
    g.add_argument("--temperature", default=0.0, help="0 = greedy")
    g.add_argument("--top-p", default=1.0)
    g.add_argument("--top-k", default=0)
    g.add_argument("--seed", default=0)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--num-samples", type=int, default=1)
    g.add_argument("--json", action="store_true", help="one JSON object per sample and mode")
    g.add_argument("--exit-layer", default=None,
                   help="early-exit: draft with the target's first L layers (default: calibrated, cached)")
    g.add_argument("--skip-layers", default=None,
                   help="layer-skip: layers to skip, e.g. 4,6-9 (default: calibrated, cached)")
    return ap


def _ansi(tok: TokenEvent) -> str:
    style = OUTCOME_ANSI[tok.outcome]
    return f"{style}{tok.text}{RESET}" if style else tok.text


def _round_dict(r: RoundEvent) -> dict:
    d = asdict(r)
    d["tokens"] = [{**asdict(t), "outcome": t.outcome.value} for t in r.tokens]
    return d


def method_options(args) -> dict:
    """Method settings from CLI flags (RunRequest.options); unset flags are left out."""
    flags = {k: getattr(args, k, None) for k in ("exit_layer", "skip_layers")}
    return {k: v for k, v in flags.items() if v is not None}


def run_once(pair, req, mode, ids, stop=None):
    """Run one mode to completion; returns (events, summary)."""
    from .runner import run_events
    events = list(run_events(pair, req, mode, ids, stop=stop))
    return events[:-1], events[-1]


def generate(args) -> int:
    req = make_request(args.prompt, args.method, args.gamma, args.max_new_tokens, args.temperature,
                       args.top_p, args.top_k, args.seed, args.chat, options=method_options(args))
    if args.num_samples < 1:
        raise RequestError("--num-samples must be at least 1.")
    # progress only for a person at a terminal; scripts get clean stderr
    progress = None if args.json or not sys.stderr.isatty() else (
        lambda msg, frac: print(f"[{frac:4.0%}] {msg}", file=sys.stderr))
    if progress is None:  # transformers' own "Loading weights" bars too
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    pair = load_from_args(args, progress=progress)
    ids = encode_prompt(pair.tokenizer, req, getattr(pair.target.config, "max_position_embeddings", None))
    modes = ["baseline", "speculative"] if args.mode == "both" else [args.mode]
    for i in range(args.num_samples):
        sreq = req if req.seed is None else req.__class__(**{**req.__dict__, "seed": req.seed + i})
        results = {m: run_once(pair, sreq, m, ids) for m in modes}
        base = results.get("baseline", (None, None))[1]
        for mode, (events, summary) in results.items():
            stats = run_stats(summary, base).to_dict() if mode == "speculative" else None
            if args.json:
                obj = {"sample": i, "mode": mode, "seed": sreq.seed, "token_ids": summary.token_ids,
                       "text": summary.text, "stats": {**summary.to_dict(), **(stats or {})}}
                obj["stats"].pop("token_ids"), obj["stats"].pop("text")
                if mode == "speculative":
                    obj["rounds"] = [_round_dict(r) for r in events]
                print(json.dumps(obj), flush=True)
            else:
                _print_human(mode, events, summary, stats)
    return 0


def _print_human(mode, events, s: RunSummary, stats):
    print(f"\n== {mode} ({s.method}) ==")
    if mode == "speculative":
        print("".join(_ansi(t) for r in events for t in r.tokens))
        legend = "  ".join(f"{OUTCOME_ANSI[o]}{o.value}{RESET}" for o in
                           (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RESAMPLED, Outcome.BONUS))
        print(f"legend: {legend}")
    else:
        print(s.text)
    print(f"{s.n_tokens} tokens in {s.elapsed:.2f} s = {s.tokens_per_s:.2f} tokens/s "
          f"(prefill {s.prefill:.2f} s, {s.target_forwards} target forwards, stop: {s.stop_reason})")
    if stats:
        fmt = lambda v, f="{:.3f}": "n/a" if v is None else f.format(v)  # noqa: E731
        print(f"rounds {s.rounds}  drafted {s.drafted}  accepted {s.accepted}  "
              f"α {fmt(stats['alpha'])}  α̂ {fmt(stats['alpha_hat'])}  τ {fmt(stats['tau'], '{:.2f}')}  "
              f"c {fmt(stats['c'])}")
        print(f"time: draft {s.draft_time:.2f} s, verify {s.verify_time:.2f} s  "
              f"speedup {fmt(stats['speedup'], '{:.2f}×')}  "
              f"predicted {fmt(stats['predicted'], '{:.2f}×')}  best γ {stats['best_gamma']}")


def main(argv=None) -> int:
    from .models import ModelError
    args = build_parser().parse_args(argv)
    try:
        if args.command == "generate":
            return generate(args)
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - out of memory: one line, not a traceback; bugs still raise
        from .runner import is_oom
        if not is_oom(e):
            raise
        print("error: out of memory: try fewer new tokens, a shorter prompt, a smaller γ or a smaller pair",
              file=sys.stderr)
        return 1
    return 1
