"""The command line, one parser with subcommands:

    python -m specviz generate ...        one run (or both sides), coloured per round or --json
    python -m specviz trace record ...    record a race as a replayable JSON trace
    python -m specviz trace info FILE...  what traces hold (also: python -m specviz.trace ...)
    python -m specviz race ...            how much running both sides at once distorts the speedup

The bench has its own command, python -m specviz.bench. Bad input gives one
clear line and exit code 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from .engine.events import OUTCOME_ANSI, Outcome, RoundEvent, RunSummary, TokenEvent
from .engine.metrics import run_stats
from .errors import OOM_ADVICE, ModelError, is_oom
from .format import number
from .race import MODES
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


def _generate_args(sub) -> None:
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


def _trace_args(sub) -> None:
    tr = sub.add_parser("trace", help="record a race to a JSON trace, or describe traces")
    trace_sub = tr.add_subparsers(dest="trace_command", required=True)
    rec = trace_sub.add_parser("record", help="record a race to a JSON trace that the app can replay")
    add_pair_args(rec)
    rec.add_argument("--preset", default=None, help="take prompt, γ and chat template from this UI preset")
    rec.add_argument("--prompt", default=None)
    rec.add_argument("--method", default="draft", choices=METHODS)
    rec.add_argument("--gamma", type=int, default=None)
    rec.add_argument("--max-new-tokens", type=int, default=40)
    rec.add_argument("--temperature", type=float, default=0.0)
    rec.add_argument("--top-p", type=float, default=1.0)
    rec.add_argument("--top-k", type=int, default=0)
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--chat", action="store_true", default=None, help="use the chat template")
    rec.add_argument("--mode", choices=MODES, default="fair")
    rec.add_argument("--warmup", type=int, default=4,
                     help="new tokens of an unrecorded warm-up race first (0: none), as a warm app would be")
    rec.add_argument("--label", default="")
    rec.add_argument("--out", required=True)
    info = trace_sub.add_parser("info", help="print what traces hold")
    info.add_argument("files", nargs="+")


def _race_args(sub) -> None:
    r = sub.add_parser("race", help="fair vs parallel: how much running both sides at once distorts "
                                    "the speedup (one line per run, then the medians)")
    add_pair_args(r)
    r.add_argument("--prompt", default="def quicksort(arr):\n")
    r.add_argument("--gamma", type=int, default=4)
    r.add_argument("--max-new-tokens", type=int, default=24)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--warmup", type=int, default=1)


def build_parser(prog: str = "python -m specviz") -> argparse.ArgumentParser:
    ap = _Parser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    _generate_args(sub)
    _trace_args(sub)
    _race_args(sub)
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
    req = make_request(args.prompt, method=args.method, gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                       chat_template=args.chat, options=method_options(args))
    if args.num_samples < 1:
        raise RequestError("--num-samples must be at least 1.")
    # progress only for a person at a terminal; scripts get clean stderr
    progress = None if args.json or not sys.stderr.isatty() else (
        lambda msg, frac: print(f"[{frac:4.0%}] {msg}", file=sys.stderr))
    if progress is None:  # transformers' own "Loading weights" bars too
        from transformers.utils import logging as hf_logging
        hf_logging.disable_progress_bar()
    pair = load_from_args(args, progress=progress)
    ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
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


def _print_human(mode, events, summary: RunSummary, stats):
    print(f"\n== {mode} ({summary.method}) ==")
    if mode == "speculative":
        print("".join(_ansi(t) for r in events for t in r.tokens))
        legend = "  ".join(f"{OUTCOME_ANSI[o]}{o.value}{RESET}" for o in
                           (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RESAMPLED, Outcome.BONUS))
        print(f"legend: {legend}")
    else:
        print(summary.text)
    print(f"{summary.n_tokens} tokens in {summary.elapsed:.2f} s = {summary.tokens_per_s:.2f} tokens/s "
          f"(prefill {summary.prefill:.2f} s, {summary.target_forwards} target forwards, "
          f"stop: {summary.stop_reason})")
    if stats:
        print(f"rounds {summary.rounds}  drafted {summary.drafted}  accepted {summary.accepted}  "
              f"α {number(stats['alpha'])}  α̂ {number(stats['alpha_hat'])}  "
              f"τ {number(stats['tau'], '{:.2f}')}  "
              f"c {number(stats['c'])}")
        print(f"time: draft {summary.draft_time:.2f} s, verify {summary.verify_time:.2f} s  "
              f"speedup {number(stats['speedup'], '{:.2f}×')}  "
              f"predicted {number(stats['predicted'], '{:.2f}×')}  best γ {stats['best_gamma']}")


# ------------------------------------------------------------------- trace


def _preset(name: str | None) -> dict:
    if not name:
        return {}
    from .prompts import load_presets
    by_name = {p["name"]: p for p in load_presets()}
    if name not in by_name:
        raise RequestError(f"unknown preset {name!r}: one of {', '.join(by_name)}")
    return by_name[name]


def trace_record(args) -> int:
    """Run one race (baseline vs speculative) on a model pair and save it as a trace the app can replay."""
    from dataclasses import replace

    from .race import on_engine_thread, race
    from .trace import describe, record, trace_for
    preset = _preset(args.preset)
    prompt = args.prompt if args.prompt is not None else preset.get("prompt")
    if prompt is None:
        raise RequestError("give --prompt or --preset")
    gamma = args.gamma if args.gamma is not None else preset.get("gamma", 4)
    chat = args.chat if args.chat is not None else preset.get("chat_template", False)
    req = make_request(prompt, method=args.method, gamma=gamma, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                       chat_template=chat)
    print("loading the model pair…", file=sys.stderr)
    pair = on_engine_thread(load_from_args, args)  # load where the race decodes
    ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
    if args.warmup > 0:
        for _ in race(pair, replace(req, max_new_tokens=args.warmup), ids, args.mode):
            pass
    tr = trace_for(req, pair, args.mode, args.label or preset.get("name") or prompt[:40])
    for side, ev in record(race(pair, req, ids, args.mode), tr):
        if isinstance(ev, RunSummary):
            print(f"{side}: {ev.n_tokens} tokens in {ev.elapsed:.2f} s ({ev.tokens_per_s:.2f} tokens/s), "
                  f"stop: {ev.stop_reason}", file=sys.stderr)
    out = tr.save(args.out)
    print(f"{out}: {describe(tr)} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def trace_info(args) -> int:
    from .trace import describe, load_trace
    for f in args.files:
        try:
            tr = load_trace(f)
        except ValueError as e:
            print(f"{f}: {e}", file=sys.stderr)
            return 2
        print(f"{f}: {describe(tr)}")
    return 0


# -------------------------------------------------------------------- race


def race_distortion(args) -> int:
    """How much does running both sides at once (parallel) distort the speedup,
    compared with timing each side alone (fair)? One line per run, then the medians."""
    import statistics
    import threading

    import torch

    from .race import MODES, measure
    pair = load_from_args(args)
    req = make_request(args.prompt, method="draft", gamma=args.gamma, max_new_tokens=args.max_new_tokens,
                       temperature=0.0)
    ids = encode_prompt(pair.tokenizer, req)
    results: dict[str, list[dict]] = {}

    def work() -> None:
        # in a worker thread, like the app (gradio steps generators in worker
        # threads), so both modes run under the same threading conditions
        for _ in range(args.warmup):
            measure(pair, req, ids, "fair")
        for i in range(args.repeats):
            for mode in (MODES if i % 2 == 0 else MODES[::-1]):
                r = measure(pair, req, ids, mode)[0]
                results.setdefault(mode, []).append(r)
                print(f"{mode:8s} base {r['base_tps']:8.2f} tok/s  spec {r['spec_tps']:8.2f} tok/s  "
                      f"speedup {r['speedup']:.3f}  alpha {r['alpha']:.3f}  c {r['c']:.3f}  "
                      f"wall {r['wall']:.2f} s  tokens {r['tokens']}", flush=True)

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    med = {m: statistics.median(r["speedup"] for r in rows) for m, rows in results.items()}
    print(f"median speedup: fair {med['fair']:.3f}  parallel {med['parallel']:.3f}  "
          f"distortion (parallel/fair) {med['parallel'] / med['fair']:.3f}  "
          f"torch threads {torch.get_num_threads()}")
    return 0


# -------------------------------------------------------------------- main


def _dispatch(args) -> int:
    if args.command == "generate":
        return generate(args)
    if args.command == "trace":
        return trace_record(args) if args.trace_command == "record" else trace_info(args)
    return race_distortion(args)


def main(argv=None, prog: str = "python -m specviz") -> int:
    args = build_parser(prog).parse_args(argv)
    try:
        return _dispatch(args)
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - out of memory: one line, not a traceback; bugs still raise
        if not is_oom(e):
            raise
        print(f"error: out of memory. {OOM_ADVICE}", file=sys.stderr)
        return 1
