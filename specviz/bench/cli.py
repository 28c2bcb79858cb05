"""Benchmark: plain target decoding vs SpecViz speculative decoding vs Hugging
Face assisted generation, on the same pair, prompts and machine, in one process.

    python -m specviz bench --quick              # a few minutes on a 2-core CPU
    python -m specviz bench                      # the full run (about 30 min on CPU)
    python -m specviz bench --quick --quantize int8

Every prompt is run by every method, `--repeats` times, interleaved: for each
prompt and repeat the methods run one after another, their order rotated each
time, so slow drift of the machine hits all methods alike. Numbers are medians
over repeats. SpecViz numbers come only from `run_events` and `run_stats`; this
module holds no decoding of its own (Hugging Face numbers come from
`model.generate`).

Greedy outputs must match the plain baseline token for token: a SpecViz method
that differs makes the bench exit with code 1 (after writing its files) naming
the method, prompt and first differing position. Hugging Face runs that differ
are reported in their own column (`HF≠`), since HF's batched kernels can flip a
numerical near-tie.

Writes bench.json, runs.csv, summary.csv, per_prompt.csv, table.txt,
plots.html (plotly, self-contained) and SVG/PNG plots (plotly via kaleido and
the system's Chromium) to `--out` (default bench-results/<timestamp>/).
See docs/benchmarks.md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import shlex
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..engine.cpu.memory import freeze_imports
from ..errors import RequestError, exit_code
from ..hosting.bandwidth import bench_lines, weight_bytes
from ..machine import loadavg
from ..run.flags import add_pair_args
from . import llamacpp_rows, vllm_rows
from . import runs as runs_mod
from .plots import write_plots
from .report import machine_info, report_text, write_csv
from .runs import RUN_COLUMNS, OutputMismatch, Run, Variant, build_variants, check_outputs, measure
from .settings import (
    FAMILIES,
    FULL,
    QUICK,
    TASK_TOKENS,
    TASKS,
    WARMUP_TOKENS,
    BenchPrompt,
    Settings,
    load_prompts,
    resolve_settings,
)
from .summary import SUMMARY_COLUMNS, best_lines, median, summarize


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m specviz bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.add_argument("--quick", action="store_true",
                    help=f"small subset: {QUICK['n_prompts']} prompts, {QUICK['max_new_tokens']} new tokens, "
                         f"γ {QUICK['gammas']}, {QUICK['repeats']} repeats, "
                         f"HF assisted γ={QUICK['hf_gammas']} only")
    ap.add_argument("--tasks", help=f"comma list of {','.join(TASKS)} (default {FULL['tasks']})")
    ap.add_argument("--n-prompts", help="prompts per task: N, or task=N,... (default 1)")
    ap.add_argument("--prompts-json", help="JSON list of {id, task, text[, chat_template]} to use instead "
                                           "of the packaged prompt sets")
    ap.add_argument("--max-new-tokens", help="tokens per run: N, or N,task=N,... (default 32; edit "
                                             f"{TASK_TOKENS['edit']} unless named: edit=N)")
    ap.add_argument("--gammas", help="γ sweep of the draft-model method (default 1,2,...,8,auto; "
                                     "auto: γ chosen each round from the measured costs)")
    ap.add_argument("--hf-gammas", help="constant γ values for HF assisted generation (default 4)")
    ap.add_argument("--gamma-other", type=int, default=4,
                    help="γ for the other SpecViz methods (lookup: tokens per round; adaptive: start) "
                         "(default 4)")
    ap.add_argument("--sweep", action="append", metavar="METHOD.OPTION=V1,V2",
                    help="also run METHOD once per value of one of its settings, e.g. "
                         "tree.tree_budget=4,8,16 (repeatable)")
    ap.add_argument("--repeats", type=int,
                    help="runs per prompt and method; the median is reported (default 3)")
    ap.add_argument("--methods", help="comma list from: " + ",".join(FAMILIES) + " (plain always runs)")
    ap.add_argument("--no-hf", action="store_true", help="skip Hugging Face generate (greedy and assisted)")
    ap.add_argument("--out", help="output folder (default bench-results/<timestamp>/)")
    ap.add_argument("--llamacpp-gammas", metavar="N,N",
                    help="draft n_max of the llama.cpp speculative rows "
                         "(--methods ...,llamacpp,llamacpp-spec; default: --gamma-other)")
    ap.add_argument("--llamacpp-threads", type=int, help="threads of the llama.cpp servers (default: ours)")
    ap.add_argument("--llamacpp-gguf", metavar="TARGET[,DRAFT]",
                    help="GGUF files for the llama.cpp rows (default: the default pair's own)")
    ap.add_argument("--warmup", action=argparse.BooleanOptionalAction, default=True,
                    help=f"one untimed {WARMUP_TOKENS}-token run per method first (default on)")
    return ap


@dataclass
class Bench:
    """Everything one bench run works with, filled step by step."""

    settings: Settings
    out: Path
    pair: object = None
    meta: dict = field(default_factory=dict)
    variants: list[Variant] = field(default_factory=list)
    encoded: list[tuple[BenchPrompt, list[int]]] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)  # variant key -> error, dropped from later runs
    notes: list[str] = field(default_factory=list)
    llamacpp: object = None  # LlamaCppRows: the llama.cpp servers (bench/llamacpp_rows.py)

    def note(self, text: str) -> None:
        self.notes.append(text)
        _log("note: " + text)


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _estimate(warm: dict[str, Run], n_tokens: int) -> float:
    """Seconds for one run of each variant at n_tokens, from the warm-up runs."""
    total = 0.0
    for r in warm.values():
        if r.first_t is None or r.n_tokens <= r.first_n or r.elapsed <= r.first_t:
            total += r.elapsed * n_tokens / max(1, r.n_tokens)
        else:
            per = (r.elapsed - r.first_t) / (r.n_tokens - r.first_n)
            total += r.first_t + per * max(0, n_tokens - r.first_n)
    return total


def _load(bench: Bench, args, argv: list[str], t_start: float) -> None:
    import transformers

    from ..run.flags import load_from_args
    transformers.logging.set_verbosity_error()
    _log(f"loading the pair (load average {loadavg()}) ...")
    bench.pair = pair = load_from_args(args, progress=lambda msg, frac: _log(f"  [{frac:4.0%}] {msg}"))
    bench.meta = {"machine": machine_info(pair, pair.target.device),
                  "command": "python -m specviz bench " + shlex.join(argv), "pair": pair.spec.label,
                  "pair_target": pair.spec.target, "pair_draft": pair.spec.draft,
                  "max_new_tokens": bench.settings.max_new_tokens, "tokens_line": bench.settings.tokens_line,
                  "repeats": bench.settings.repeats,
                  "warmup": args.warmup, "settings": asdict(bench.settings),
                  "load_s": round(time.perf_counter() - t_start, 1),
                  "precision_note": pair.precision_note,
                  "costs": pair.costs.to_dict() if pair.costs else None}
    if pair.precision_note:
        _log(f"precision: {pair.precision_note}")
    bench.variants = build_variants(pair, bench.settings, bench.notes)
    if "hf-assisted" in bench.settings.families and pair.draft is None:
        bench.notes.append("HF assisted skipped: this pair has no draft model")


def _encode(bench: Bench, prompts: list[BenchPrompt]) -> None:
    """Tokenize every prompt once; skip (with a note) those that do not fit."""
    from ..run.request import encode_prompt, make_request
    for p in prompts:
        n = bench.settings.tokens_for(p.task)
        req = make_request(p.text, max_new_tokens=n, chat_template=p.chat_template)
        try:
            bench.encoded.append((p, encode_prompt(bench.pair.tokenizer, req, bench.pair.max_positions)))
        except RequestError as e:
            bench.notes.append(f"prompt {p.id} skipped: {e}")
    if not bench.encoded:
        raise RequestError("no prompt fits this model: " + "; ".join(bench.notes))
    tasks = bench.settings.tasks
    bench.meta["prompts_line"] = ", ".join(f"{t} {sum(1 for p, _ in bench.encoded if p.task == t)}"
                                           for t in tasks) + " (" + ", ".join(
        f"{p.id} [{len(ids)} tok{', chat' if p.chat_template else ''}]" for p, ids in bench.encoded) + ")"


def _measure_or_note(bench: Bench, variant: Variant, prompt, ids, max_new_tokens: int, run: Run, when: str):
    """measure(); a failing method (never plain) is noted and dropped from later runs."""
    try:
        pair = bench.llamacpp if variant.engine == "llamacpp" else bench.pair
        return measure(pair, variant, prompt, ids, max_new_tokens, run)
    except Exception as e:  # noqa: BLE001 - one broken method must not sink the others
        if variant.family == "plain":
            raise
        run.error = bench.failed[variant.key] = f"{type(e).__name__}: {e}"
        bench.note(f"{variant.key} {when}: {run.error}")
        return None


def _warm_up(bench: Bench) -> None:
    """One untimed short run per variant on the first prompt; estimates the total time."""
    warm = {}
    prompt, ids = bench.encoded[0]
    n = min(WARMUP_TOKENS, bench.settings.tokens_for(prompt.task))
    for variant in bench.variants:
        t0 = time.perf_counter()
        run = _measure_or_note(bench, variant, prompt, ids, n, Run.of(variant, prompt, -1, 0),
                               "failed in warm-up and was skipped")
        if run is not None:
            warm[variant.key] = run
            _log(f"  warm-up {variant.key}: {time.perf_counter() - t0:.1f} s")
    bench.variants = [v for v in bench.variants if v.key not in bench.failed]
    per_round = sum(_estimate(warm, bench.settings.tokens_for(p.task)) for p, _ in bench.encoded)
    est = per_round * bench.settings.repeats
    bench.meta["estimated_s"] = round(est)
    _log(f"estimated time: {est / 60:.1f} min (from the warm-up runs; prefill length varies by prompt)")


def _run_block(bench: Bench, prompt: BenchPrompt, ids: list[int], repeat: int, rotate: int) -> list[Run]:
    """Every live variant once on one prompt, in rotated order; speculative runs get their Stats."""
    live = [v for v in bench.variants if v.key not in bench.failed]
    k = rotate % len(live)
    order = live[k:] + live[:k]  # rotate: no method always first or last
    block = []
    for pos, variant in enumerate(order):
        run = Run.of(variant, prompt, repeat, pos)
        _measure_or_note(bench, variant, prompt, ids, bench.settings.tokens_for(prompt.task), run,
                         f"failed on {prompt.id} and was dropped from later runs")
        block.append(run)
    base = next(r for r in block if r.family == "plain")
    for run in block:
        if run.summary is not None and run.summary.side == "speculative":  # ours and llama.cpp's
            runs_mod.add_stats(run, base.summary, bench.pair.costs)
    with open(bench.out / "runs.partial.jsonl", "a") as f:  # what a killed bench leaves behind
        for run in block:
            f.write(json.dumps({**run.row(), "token_ids": run.token_ids}) + "\n")
    return block


def _run_all(bench: Bench) -> None:
    settings = bench.settings
    blocks, done, t_runs = len(bench.encoded) * settings.repeats, 0, time.perf_counter()
    for pi, (prompt, ids) in enumerate(bench.encoded):
        for rep in range(settings.repeats):
            block = _run_block(bench, prompt, ids, rep, rep + pi)
            bench.runs += block
            done += 1
            spent = time.perf_counter() - t_runs
            plain = next(r for r in block if r.family == "plain")
            _log(f"[{done}/{blocks}] {prompt.id} repeat {rep + 1}: plain {plain.tokens_per_s:.2f} tok/s; "
                 f"{spent / 60:.1f} min so far, about {spent / done * (blocks - done) / 60:.1f} min left")


def _check(bench: Bench, dtype: torch.dtype) -> str | None:
    """Greedy outputs against plain: HF differences become notes, a SpecViz one the failure text.
    `dtype`: the target's float type (the near-tie threshold), read before vLLM rows free our pair."""
    for warning in check_outputs(bench.runs, strict_only=False, dtype=dtype):
        bench.notes.append(warning if warning.startswith("numerical near-tie") else
                           "HF, vLLM or llama.cpp output differs from plain (near-tie?): " + warning)
    try:
        check_outputs(bench.runs, dtype=dtype)
    except OutputMismatch as e:
        return str(e)
    return None


def _machine_end(bench: Bench, t_start: float) -> None:
    machine = bench.meta["machine"]
    machine["loadavg_end"] = loadavg()
    loads = [r.load1 for r in bench.runs if r.load1 is not None]
    if loads:
        machine["load1_range"] = f"{min(loads):.2f}–{max(loads):.2f} (median {median(loads):.2f})"
    util = median([r.cpu_s / r.elapsed for r in bench.runs if r.cpu_s and r.elapsed])
    machine["cpu_per_wall"] = round(util, 2) if util else None
    bench.meta["wall_s"] = round(time.perf_counter() - t_start, 1)
    bench.meta["notes"] = bench.notes


def _write(bench: Bench, mismatch: str | None, t_start: float) -> str:
    """All the output files; returns the printed text."""
    used = {r.variant for r in bench.runs}  # a variant dropped mid-run keeps its rows
    variants = [v for v in bench.variants if v.key in used]
    rows = summarize(bench.runs, variants, bench.settings.tasks)
    per_prompt = summarize(bench.runs, variants, bench.settings.tasks, by_prompt=True)
    _machine_end(bench, t_start)
    text = report_text(bench.meta, rows, best_lines(rows) + vllm_rows.vs_plain_lines(rows)
                       + llamacpp_rows.vs_plain_lines(rows), bench.notes)
    bench.notes += write_plots(bench.out, rows, f" — {bench.meta['machine']['precision']}")
    out = bench.out
    payload = {"meta": bench.meta,
               "prompts": [{**asdict(p), "n_prompt_tokens": len(ids)} for p, ids in bench.encoded],
               "summary": rows, "per_prompt": per_prompt, "best": best_lines(rows), "mismatch": mismatch,
               "runs": [{**r.row(), "token_ids": r.token_ids} for r in bench.runs]}
    (out / "bench.json").write_text(json.dumps(payload, indent=1, ensure_ascii=False))
    write_csv(out / "runs.csv", [r.row() for r in bench.runs], RUN_COLUMNS)
    write_csv(out / "summary.csv", rows, SUMMARY_COLUMNS)
    write_csv(out / "per_prompt.csv", [{**r, "prompt_id": r["task"]} for r in per_prompt],
              ["prompt_id" if c == "task" else c for c in SUMMARY_COLUMNS])
    (out / "table.txt").write_text(text + "\n")
    (out / "runs.partial.jsonl").unlink(missing_ok=True)  # bench.json has it all
    return text


def _measure_all(bench: Bench, args) -> None:
    """Warm-up and every block, with the llama.cpp servers (if asked for) up only meanwhile."""
    bench.llamacpp = llamacpp_rows.start(bench, args, _log)
    for note in bench.notes:
        _log("note: " + note)
    settings = bench.settings
    n_runs = len(bench.encoded) * len(bench.variants) * settings.repeats
    _log(f"{len(bench.encoded)} prompts × {len(bench.variants)} methods × {settings.repeats} repeats = "
         f"{n_runs} runs of {settings.tokens_line}")
    try:
        if args.warmup:
            _warm_up(bench)
        _run_all(bench)
    finally:
        if bench.llamacpp is not None:
            bench.notes += bench.llamacpp.idle_cpu_lines() + llamacpp_rows.output_lines(bench.runs)
            bench.llamacpp.close()


def run_bench(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    t_start = time.perf_counter()
    out = Path(args.out or Path("bench-results") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S"))
    bench = Bench(resolve_settings(args), out)
    # --prompts-json: every prompt in the file unless --n-prompts limits it
    counts = bench.settings.counts if (args.n_prompts is not None or not args.prompts_json) else None
    prompts = load_prompts(bench.settings.tasks, counts, args.prompts_json)
    if not prompts:
        raise RequestError("no prompts selected: check --tasks / --n-prompts / --prompts-json")
    out.mkdir(parents=True, exist_ok=True)  # after the checks: bad input leaves no empty folder
    if args.engine == "vllm":  # add the vLLM rows; our own rows still run on our engine
        bench.settings.families.extend(f for f in vllm_rows.FAMILIES if f not in bench.settings.families)
        args.engine = "specviz"
    freeze_imports()  # before the pair loads (engine/cpu/memory.py)
    _load(bench, args, argv, t_start)
    nbytes = {k: weight_bytes(m) for k, m in (("target", bench.pair.target), ("draft", bench.pair.draft))
              if m is not None}
    device, dtype = bench.pair.target.device, bench.pair.dtype
    _encode(bench, prompts)
    _measure_all(bench, args)
    bench.notes += bench_lines(device, nbytes, bench.runs)  # --device cuda: steps against the bandwidth limit
    vllm_rows.run_rows(bench, args, _log)
    mismatch = _check(bench, dtype)
    print(_write(bench, mismatch, t_start))
    print(f"\nwrote {out}/ (bench.json, runs.csv, summary.csv, per_prompt.csv, table.txt, plots)")
    if mismatch:
        print(f"\nFAILED: {mismatch}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return exit_code(lambda: run_bench(argv))
