"""The command line, one entry point: python -m specviz <subcommand>.

    python -m specviz generate ...        one run (or both sides), coloured per round or --json
    python -m specviz trace record ...    record a race as a replayable JSON trace
    python -m specviz trace info FILE...  what traces hold
    python -m specviz race ...            how much running both sides at once distorts the speedup
    python -m specviz race-methods ...    race several methods on one prompt: the leaderboard

and the tools in TOOLS below (bench, kernels, heads ...), each with its own --help. Bad input
gives one clear line and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from dataclasses import asdict

from ..engine import proposer as method_info
from ..engine.events import OUTCOME_ANSI, Outcome, RoundEvent, RunSummary, TokenEvent
from ..engine.metrics import run_stats
from ..errors import exit_code
from ..format import number
from ..run.flags import (
    add_method_args,
    add_pair_args,
    load_from_args,
    method_options,
    preset_named,
    preset_settings,
)
from ..run.race import MODES
from ..run.request import METHODS, RequestError, encode_prompt, make_request

RESET = "\x1b[0m"

# name -> (module whose main(argv) runs it, what it does): each parses its own flags
TOOLS = {
    "bench": ("specviz.bench.cli", "benchmark plain against speculative decoding (docs/benchmarks.md)"),
    "first-start": ("specviz.bench.first_start", "the app's first start, empty cache, against a later one"),
    "headline": ("specviz.bench.headline", "the docs' headline from a bench run"),
    "round-profile": ("specviz.bench.round_profile", "where a round's time goes"),
    "step-profile": ("specviz.bench.step_profile", "a plain step: matmuls, the rest, GB/s against the floor"),
    "draft-size": ("specviz.bench.draft_size", "acceptance and speedup over γ and draft size"),
    "ui-overhead": ("specviz.bench.ui_overhead", "engine speed with the page streaming against headless"),
    "kernels": ("specviz.engine.cpu.qgemm", "build the CPU kernel's variants into the cache (setup.sh)"),
    "bandwidth": ("specviz.hosting.bandwidth", "this machine's memory read bandwidth"),
    "datastore": ("specviz.engine.datastore", "build REST's datastore"),
    "selfspec": ("specviz.cli.selfspec", "calibrate the early-exit layer and layer-skip set"),
    "heads": ("specviz.heads.cli", "train Medusa heads for --method heads"),
    # also dispatched by __main__.py before this module's imports: a bare GPU machine has no gradio etc.
    "gpu-check": ("specviz.cli.gpu_check", "the GPU verdict in one command (random weights, torch only)"),
}


class _Parser(argparse.ArgumentParser):
    """Usage mistakes as one line on stderr and exit 2, like every other bad input."""

    def error(self, message):
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _generate_args(sub) -> None:
    g = sub.add_parser("generate", help="generate text with the baseline or speculative decoding")
    add_pair_args(g)
    g.add_argument("--prompt", required=True)
    g.add_argument("--side", "--mode", dest="side", choices=["speculative", "baseline", "both"],
                   default="speculative", help="which side runs (--mode: its older name)")
    g.add_argument("--method", choices=METHODS, default="draft", help="where drafts come from")
    g.add_argument("--gamma", default=4, help="draft tokens per round (1-16), or auto: chosen each round "
                                              "from the measured verify cost v(γ), c and the running α̂")
    g.add_argument("--max-new-tokens", default=64)
    g.add_argument("--temperature", default=0.0, help="0 = greedy")
    g.add_argument("--top-p", default=1.0)
    g.add_argument("--top-k", default=0)
    g.add_argument("--seed", default=0)
    g.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")
    g.add_argument("--num-samples", type=int, default=1)
    g.add_argument("--json", action="store_true", help="one JSON object per sample and side")
    add_method_args(g)


def _trace_args(sub) -> None:
    tr = sub.add_parser("trace", help="record a race to a JSON trace, or describe traces")
    trace_sub = tr.add_subparsers(dest="trace_command", required=True)
    rec = trace_sub.add_parser("record", help="record a race to a JSON trace that the app can replay")
    add_pair_args(rec)
    rec.add_argument("--preset", default=None, help="take prompt, γ and chat template from this UI preset")
    rec.add_argument("--prompt", default=None)
    rec.add_argument("--method", default="draft", choices=METHODS)
    add_method_args(rec)
    rec.add_argument("--gamma", default=None, help="1-16 or auto")
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
    r.add_argument("--gamma", default=4, help="1-16 or auto")
    r.add_argument("--max-new-tokens", type=int, default=24)
    r.add_argument("--repeats", type=int, default=3)
    r.add_argument("--warmup", type=int, default=1)


def build_parser(prog: str = "python -m specviz") -> argparse.ArgumentParser:
    tools = "\n".join(f"  {name:<14} {doc}" for name, (_, doc) in TOOLS.items())
    ap = _Parser(prog=prog, description=__doc__, epilog=f"tools:\n{tools}",
                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    _generate_args(sub)
    _trace_args(sub)
    _race_args(sub)
    from .leaderboard import add_args as race_methods_args
    race_methods_args(sub)
    return ap


def _ansi(tok: TokenEvent) -> str:
    style = OUTCOME_ANSI[tok.outcome]
    return f"{style}{tok.text}{RESET}" if style else tok.text


def _round_dict(r: RoundEvent) -> dict:
    d = asdict(r)
    d["tokens"] = [{**asdict(t), "outcome": t.outcome.value} for t in r.tokens]
    return d


def run_once(pair, req, side, ids, stop=None):
    """Run one side to completion; returns (events, summary)."""
    from ..run.runner import run_events
    events = list(run_events(pair, req, side, ids, stop=stop))
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
    try:
        return _generate(args, req, pair)
    finally:
        pair.close()


def _generate(args, req, pair) -> int:
    ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
    sides = ["baseline", "speculative"] if args.side == "both" else [args.side]
    if not args.json and pair.precision_note:
        print(f"precision: {pair.precision_note}")  # stdout: part of the report; stderr stays errors only
    failed = False
    for i in range(args.num_samples):
        sreq = req if req.seed is None else req.__class__(**{**req.__dict__, "seed": req.seed + i})
        results = {}
        for side in sides:  # each row as soon as its run ends: a run stopped later keeps what finished
            results[side] = run_once(pair, sreq, side, ids)
            eq = _greedy_check(pair, sreq, results, ids) if side == "speculative" else None
            failed |= eq is not None and not eq.ok
            _report(args, pair, sreq, i, side, *results[side], results.get("baseline", (None, None))[1], eq)
            if eq is not None and not args.json:
                print(f"greedy check: {eq.message()}")
    return 1 if failed else 0


def _greedy_check(pair, req, results, ids):
    """Greedy speculative vs plain output: identical, a numerical near-tie, or a bug
    (run/equality.py; an ambiguous flip is recomputed in fp32 on the target)."""
    if not req.sampling.greedy or set(results) != {"baseline", "speculative"}:
        return None
    import torch

    from ..run.equality import compare_greedy, fp32_recompute, output_tokens
    recompute = fp32_recompute(pair.target, ids) if isinstance(pair.target, torch.nn.Module) else None
    return compare_greedy(*(output_tokens(results[m][0]) for m in ("baseline", "speculative")),
                          pair.dtype, recompute=recompute)


def _report(args, pair, sreq, i: int, side: str, events, summary: RunSummary, base, eq) -> None:
    """One finished run: a JSON row (--json) or the human report."""
    costs = pair.costs
    stats = run_stats(summary, base, costs).to_dict() if side == "speculative" else None
    if stats is not None and method_info.summarize(events, sreq.method):
        stats["method_info"] = method_info.summarize(events, sreq.method)
    if not args.json:
        return _print_human(side, events, summary, stats)
    obj = {"sample": i, "side": side, "seed": sreq.seed, "token_ids": summary.token_ids,
           "text": summary.text, "stats": {**summary.to_dict(), **(stats or {})},
           "precision": pair.precision_label, "precision_note": pair.precision_note,
           "gamma": sreq.gamma_label}
    obj["stats"].pop("token_ids"), obj["stats"].pop("text")
    if side == "speculative":
        obj["rounds"] = [_round_dict(r) for r in events]
        obj["greedy_equality"] = asdict(eq) if eq is not None else None
    print(json.dumps(obj), flush=True)


def _print_human(side, events, summary: RunSummary, stats):
    policy = f", γ {summary.gamma_policy}" if summary.gamma_policy else ""
    print(f"\n== {side} ({summary.method}{policy}) ==")
    if side == "speculative":
        print("".join(_ansi(t) for r in events for t in r.tokens))
        legend = "  ".join(f"{OUTCOME_ANSI[o]}{o.value}{RESET}" for o in
                           (Outcome.ACCEPTED, Outcome.REJECTED, Outcome.RESAMPLED, Outcome.BONUS))
        print(f"legend: {legend}")
    else:
        print(summary.text)
    print(f"{summary.n_tokens} tokens in {summary.elapsed:.2f} s = {summary.tokens_per_s:.2f} tokens/s "
          f"(prefill {summary.prefill:.2f} s, {summary.target_forwards} target forwards, "
          f"stop: {summary.stop_reason})")
    if summary.extra.get("accepted_per_position"):
        print("vLLM acceptance per draft position: "
              + "  ".join(f"{i + 1}: {a:.2f}" for i, a in enumerate(summary.extra["accepted_per_position"])))
    if stats and summary.extra.get("not_exposed"):
        print(f"note: {summary.extra['not_exposed']}")
    if stats:
        _print_stats(summary, stats)
        if stats.get("method_info"):
            print(f"method: {method_info.describe(stats['method_info'])}")


def _print_stats(s: RunSummary, stats: dict) -> None:
    missing = "n/a" if s.unmeasured else "–"  # n/a: this engine cannot measure it; "–": not yet

    def fmt(v, f="{:.3f}"):
        return number(v, f, missing=missing)
    basis = f" (÷ {stats['c_basis']})" if stats.get("c_basis") else " (no draft forward timed yet)"
    print(f"rounds {s.rounds}  drafted {s.drafted}  accepted {s.accepted}  "
          f"mean γ drafted {fmt(stats['gamma_mean'], '{:.2f}')}  τ {fmt(stats['tau'], '{:.2f}')}")
    print(f"expected acceptance α̂ (mean Σ min(p,q), Leviathan's α) {fmt(stats['alpha_hat'])}  "
          f"accepted ÷ drafted {fmt(stats['alpha'])}  c {fmt(stats['c'])}{basis}")
    print(f"time: draft {s.draft_time:.2f} s, verify {s.verify_time:.2f} s  "
          f"verify cost v {fmt(stats['verify_cost'], '{:.2f}')} plain steps  "
          f"speedup {fmt(stats['speedup'], '{:.2f}×')}")
    print(f"predicted {fmt(stats['predicted_v'], '{:.2f}×')} with v of {stats['predicted_v_basis'] or '–'}, "
          f"{fmt(stats['predicted'], '{:.2f}×')} by Leviathan (v = 1)  "
          f"best γ {fmt(stats['best_gamma'], '{}')} (v = 1: {fmt(stats['best_gamma_leviathan'], '{}')})")


# ------------------------------------------------------------------- trace


def trace_record(args) -> int:
    """Run one race (baseline vs speculative) on a model pair and save it as a trace the app can replay."""
    from dataclasses import replace

    from ..run.race import on_engine_thread, race
    from ..run.trace import describe, record, trace_for
    prompt, gamma, chat = preset_settings(args)
    req = make_request(prompt, method=args.method, gamma=gamma, max_new_tokens=args.max_new_tokens,
                       temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                       chat_template=chat, options=method_options(args))
    print("loading the model pair…", file=sys.stderr)
    pair = on_engine_thread(load_from_args, args)  # load where the race decodes
    ids = encode_prompt(pair.tokenizer, req, pair.max_positions)
    if args.warmup > 0:
        for _ in race(pair, replace(req, max_new_tokens=args.warmup), ids, args.mode):
            pass
    tr = trace_for(req, pair, args.mode, args.label or preset_named(args.preset).get("name") or prompt[:40])
    for side, ev in record(race(pair, req, ids, args.mode), tr):
        if isinstance(ev, RunSummary):
            print(f"{side}: {ev.n_tokens} tokens in {ev.elapsed:.2f} s ({ev.tokens_per_s:.2f} tokens/s), "
                  f"stop: {ev.stop_reason}", file=sys.stderr)
    out = tr.save(args.out)
    print(f"{out}: {describe(tr)} ({out.stat().st_size / 1024:.0f} KiB)")
    return 0


def trace_info(args) -> int:
    from ..run.trace import describe, load_trace
    for f in args.files:
        try:
            tr = load_trace(f)
        except ValueError as e:
            if "race bundle" in str(e):  # several runs in one file (specviz/run/race_bundle.py)
                from ..run.race_bundle import describe as describe_race
                from ..run.race_bundle import load_bundle
                print(f"{f}: {describe_race(load_bundle(f))}")
                continue
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

    from ..run.race import MODES, measure
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
                      f"speedup {r['speedup']:.3f}  alpha {r['alpha']:.3f}  c {number(r['c'], missing='–')}  "
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
    if args.command == "race-methods":
        from .leaderboard import run
        return run(args)
    return race_distortion(args)


def main(argv=None, prog: str = "python -m specviz") -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in TOOLS:  # a tool parses its own flags
        return importlib.import_module(TOOLS[argv[0]][0]).main(argv[1:])
    args = build_parser(prog).parse_args(argv)
    return exit_code(lambda: _dispatch(args))
