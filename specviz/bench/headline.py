"""The docs' headline from one or more bench runs: per-prompt speedups with their spread.

    python -m specviz headline bench-results/A [bench-results/B ...] [--json out.json]

Reads each run's runs.csv and pairs every run with the plain run of the same prompt and repeat
(the bench interleaves them, so both saw the same machine). Reports, per task and pooled:
(a) each method at the same γ; (b) each family at its own best γ (best = highest median speedup
over the prompts, chosen per task; HF swept over the same γ values plus its heuristic schedule);
(c) γ auto. Each cell: median speedup over prompts, a bootstrap 95% interval of that median and
the min–max. Also measured ÷ predicted per γ for the draft-model sweep (decode speedup over the
verify-cost-aware prediction of each run).
"""
from __future__ import annotations

import argparse
import csv
import json
import random
import statistics
from collections import defaultdict
from pathlib import Path

ALL = "all"
SAME_GAMMA = 4  # (a): the γ every family ran at


def load_runs(dirs: list[str]) -> list[dict]:
    """Every run of every folder; a prompt run again in a later folder (e.g. a rerun of prompts
    a busy machine disturbed) replaces all of that prompt's runs from earlier folders."""
    rows = []
    for i, d in enumerate(dirs):
        with open(Path(d) / "runs.csv", newline="") as f:
            new = [dict(r, source=i) for r in csv.DictReader(f) if not r.get("error")]
        again = {r["prompt_id"] for r in new}
        rows = [r for r in rows if r["prompt_id"] not in again] + new  # plain pairs within a folder
    return rows


def _f(x: str) -> float | None:
    try:
        return float(x)
    except (TypeError, ValueError):
        return None


def _run_key(r: dict) -> tuple:
    return r["source"], r["prompt_id"], r["repeat"]


def plain_by_run(rows: list[dict], key: str) -> dict:
    """The plain run's `key` per (folder, prompt, repeat): what every other run is divided by."""
    return {_run_key(r): _f(r[key]) for r in rows if r["variant"] == "plain"}


def per_prompt_speedups(rows: list[dict], key: str = "tokens_per_s") -> dict:
    """{(task, variant): {prompt: median over repeats of run / plain run}}."""
    plain = plain_by_run(rows, key)
    acc: dict = defaultdict(lambda: defaultdict(list))
    for r in rows:
        base = plain.get(_run_key(r))
        val = _f(r[key])
        if r["variant"] == "plain" or not base or val is None:
            continue
        acc[(r["task"], r["variant"])][(r["source"], r["prompt_id"])].append(val / base)
    return {k: {p: statistics.median(v) for p, v in d.items()} for k, d in acc.items()}


def bootstrap_median(xs: list[float], n: int = 2000, seed: int = 0) -> tuple[float, float]:
    """95% percentile interval of the median over prompts (resampling prompts)."""
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(n))
    return meds[int(0.025 * n)], meds[int(0.975 * n) - 1]


def cell(xs: list[float]) -> dict:
    lo, hi = bootstrap_median(xs)
    return {"median": statistics.median(xs), "ci95": [lo, hi], "min": min(xs), "max": max(xs), "n": len(xs)}


def with_pooled(sp: dict) -> dict:
    """Add task 'all': every prompt of every task (a prompt id is unique across tasks)."""
    out = dict(sp)
    pooled: dict = defaultdict(dict)
    for (task, variant), d in sp.items():
        pooled[variant].update({(task,) + p: v for p, v in d.items()})
    out.update({(ALL, v): d for v, d in pooled.items()})
    return out


def family(variant: str) -> str:
    return variant.split(":")[0]


def best_of(sp: dict, task: str, fam: str) -> str | None:
    """The variant of `fam` with the highest median speedup on `task` (auto is its own row)."""
    cands = [v for (t, v) in sp if t == task and family(v) == fam and not v.endswith(":auto")]
    if fam == "hf-assisted":  # HF's best includes its heuristic schedule
        cands += [v for (t, v) in sp if t == task and family(v) == "hf-heuristic"]
    return max(cands, key=lambda v: statistics.median(sp[(task, v)].values()), default=None)


def headline(rows: list[dict]) -> dict:
    sp = with_pooled(per_prompt_speedups(rows))
    tasks = sorted({t for t, _ in sp}, key=lambda t: (t == ALL, t))
    fams = sorted({family(v) for _, v in sp} - {"hf-heuristic"})
    out: dict = {"same_gamma": {}, "best_gamma": {}, "auto": {}, "ours_over_hf": {}}
    for task in tasks:
        same = {v: cell(list(sp[(task, v)].values())) for (t, v) in sp
                if t == task and v.endswith(f":{SAME_GAMMA}")}
        out["same_gamma"][task] = same
        best = {f: best_of(sp, task, f) for f in fams}
        out["best_gamma"][task] = {b: cell(list(sp[(task, b)].values())) for b in best.values() if b}
        if (task, "draft:auto") in sp:
            out["auto"][task] = cell(list(sp[(task, "draft:auto")].values()))
        ours, hf = best.get("draft"), best.get("hf-assisted")
        if ours and hf:  # per prompt: our best fixed γ over HF's best (γ chosen on the median)
            a, b = sp[(task, ours)], sp[(task, hf)]
            out["ours_over_hf"][task] = {"ours": ours, "hf": hf, **cell([a[p] / b[p] for p in a if p in b])}
    out["measured_over_predicted"] = measured_over_predicted(rows)
    out["round_overhead"] = round_overhead(rows)
    return out


def round_overhead(rows: list[dict]) -> dict:
    """Per speculative variant: share of decode time (after prefill) spent outside the timed draft
    and verify work: event building, detokenising, cache bookkeeping, the generator's own loop."""
    acc = defaultdict(list)
    for r in rows:
        el, pre, d, v = (_f(r.get(k)) for k in ("elapsed", "prefill", "draft_time", "verify_time"))
        timed = None not in (el, pre, d, v) and el > pre and d + v > 0  # not ended in round 1
        if r["engine"] == "specviz" and r["variant"] != "plain" and timed:
            acc[r["variant"]].append((el - pre - d - v) / (el - pre))
    return {k: cell(xs) for k, xs in sorted(acc.items())}


def measured_over_predicted(rows: list[dict]) -> dict:
    """Per γ of the draft sweep: median over runs of decode speedup ÷ verify-aware prediction."""
    plain = plain_by_run(rows, "decode_tokens_per_s")
    by_gamma = defaultdict(list)
    for r in rows:
        base, pred = plain.get(_run_key(r)), _f(r.get("predicted_v"))
        if r["family"] == "draft" and base and pred and _f(r["decode_tokens_per_s"]):
            by_gamma[r["variant"].split(":")[1]].append(_f(r["decode_tokens_per_s"]) / base / pred)
    return {g: cell(xs) for g, xs in sorted(by_gamma.items(), key=lambda kv: (kv[0] == "auto", kv[0]))}


def _fmt(c: dict) -> str:
    return (f"{c['median']:.2f}× [{c['ci95'][0]:.2f}–{c['ci95'][1]:.2f}] "
            f"(min {c['min']:.2f}, max {c['max']:.2f}, n={c['n']})")


def markdown(h: dict) -> str:
    lines = [f"(a) same γ = {SAME_GAMMA}: speedup over plain, median over prompts [bootstrap 95%] (min–max)"]
    for task, d in h["same_gamma"].items():
        lines += [f"- {task}: " + "; ".join(f"{v} {_fmt(c)}" for v, c in sorted(d.items()))]
    lines += ["", "(b) each family at its own best γ (chosen per task on the median)"]
    for task, d in h["best_gamma"].items():
        lines += [f"- {task}: " + "; ".join(f"{v} {_fmt(c)}" for v, c in sorted(d.items()))]
    lines += ["", "(c) γ auto (chosen each round from the measured costs)"]
    lines += [f"- {task}: {_fmt(c)}" for task, c in h["auto"].items()]
    lines += ["", "ours at best ÷ HF at best, per prompt"]
    lines += [f"- {t}: {c['ours']} ÷ {c['hf']}: {_fmt(c)}" for t, c in h["ours_over_hf"].items()]
    lines += ["", "measured ÷ predicted (decode speedup ÷ verify-aware prediction), draft model, per γ"]
    lines += [f"- γ {g}: {_fmt(c)}" for g, c in h["measured_over_predicted"].items()]
    lines += ["", "round overhead: share of decode time outside the draft and verify work, per variant"]
    lines += [f"- {v}: {c['median']:.1%} (max {c['max']:.1%}, n={c['n']})"
              for v, c in h["round_overhead"].items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="bench output folders (each with runs.csv)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args(argv)
    h = headline(load_runs(args.runs))
    print(markdown(h))
    if args.json:
        Path(args.json).write_text(json.dumps(h, indent=1, default=str))
    return 0
