"""Aggregation: runs -> one row per (task or prompt, variant), medians over repeats."""
from __future__ import annotations

import math
import statistics

from ..format import number
from .runs import Run, Variant

SUMMARY_COLUMNS = [
    "task", "variant", "label", "family", "engine", "gamma", "n_prompts", "repeats", "n_tokens",
    "tokens_per_s", "speedup", "paired_speedup", "decode_tokens_per_s", "decode_speedup",
    "cpu_tokens_per_s", "cpu_speedup", "cpu_per_wall",
    "alpha", "alpha_hat", "tau", "c", "v", "predicted", "measured_over_predicted",
    "peak_rss_mb", "cuda_peak_mb", "mismatches", "runs", "first_diff", "best",
]


def median(xs):
    xs = [x for x in xs if x is not None and not (isinstance(x, float) and math.isnan(x))]
    return statistics.median(xs) if xs else None


def _ratio(a, b):
    return a / b if a and b else None


def _per_repeat(runs: list[Run]) -> dict[int, tuple[float | None, float | None, float | None]]:
    """repeat -> (tokens/s, decode tokens/s, tokens per CPU second) over all the prompts of that repeat."""
    out = {}
    for rep in sorted({r.repeat for r in runs}):
        sel = [r for r in runs if r.repeat == rep]
        n, t = sum(r.n_tokens for r in sel), sum(r.elapsed for r in sel)
        dsel = [r for r in sel if r.decode_tokens_per_s is not None]
        dn = sum(r.n_tokens - r.first_n for r in dsel)
        dt = sum(r.elapsed - r.first_t for r in dsel)
        cpu = sum(r.cpu_s or 0.0 for r in sel)
        out[rep] = (n / t if t > 0 else None, dn / dt if dt > 0 and len(dsel) == len(sel) else None,
                    n / cpu if cpu > 0 else None)
    return out


def _rates(reps: dict) -> tuple:
    """Medians over repeats of (tokens/s, decode tokens/s, tokens per CPU second)."""
    return tuple(median([x[i] for x in reps.values()]) for i in range(3))


def _row(group: str, variant: Variant, sel: list[Run], plain: dict) -> dict:
    reps = _per_repeat(sel)
    tps, dtps, ctps = _rates(reps)
    p_tps, p_dtps, p_ctps = _rates(plain)
    paired = median([reps[k][0] / plain[k][0] for k in reps if k in plain and reps[k][0] and plain[k][0]])
    dspeed = _ratio(dtps, p_dtps)
    pred = median([r.value("predicted") for r in sel])
    diffs = [r for r in sel if r.match is False]
    return {
        "task": group, "variant": variant.key, "label": variant.label, "family": variant.family,
        "engine": variant.engine, "gamma": variant.gamma or None,
        "n_prompts": len({r.prompt_id for r in sel}),
        "repeats": len(reps), "n_tokens": median([r.n_tokens for r in sel]),
        "tokens_per_s": tps, "speedup": _ratio(tps, p_tps), "paired_speedup": paired,
        "decode_tokens_per_s": dtps, "decode_speedup": dspeed,
        "cpu_tokens_per_s": ctps, "cpu_speedup": _ratio(ctps, p_ctps),
        "cpu_per_wall": median([r.cpu_s / r.elapsed for r in sel if r.cpu_s and r.elapsed]),
        **{k: median([r.value(k) for r in sel]) for k in ("alpha", "alpha_hat", "tau", "c", "v")},
        "predicted": pred, "measured_over_predicted": _ratio(dspeed, pred),
        "peak_rss_mb": max((r.peak_rss_mb or 0) for r in sel) or None,
        "cuda_peak_mb": max((r.cuda_peak_mb or 0) for r in sel) or None,
        "mismatches": len(diffs), "runs": len(sel),
        "first_diff": min(r.first_diff for r in diffs) if diffs else None,
        "best": False,
    }


def summarize(runs: list[Run], variants: list[Variant], tasks: list[str],
              by_prompt: bool = False) -> list[dict]:
    """Rows per task (and "all"), or per prompt with by_prompt=True (then "task" holds the prompt id)."""
    rows = []
    ok = [r for r in runs if r.error is None]
    if by_prompt:
        groups = list(dict.fromkeys(r.prompt_id for r in ok))
    else:
        groups = tasks + (["all"] if len(tasks) > 1 else [])

    def member(run: Run, group: str) -> bool:
        return run.prompt_id == group if by_prompt else group in ("all", run.task)

    for group in groups:
        in_group = [r for r in ok if member(r, group)]
        plain = _per_repeat([r for r in in_group if r.family == "plain"])
        if not plain:
            continue
        for variant in variants:
            sel = [r for r in in_group if r.variant == variant.key]
            if sel:
                rows.append(_row(group, variant, sel, plain))
        # best γ of the draft-model sweep: highest median speedup
        sweep = [r for r in rows if r["task"] == group and r["family"] == "draft" and r["speedup"]]
        if sweep:
            max(sweep, key=lambda r: r["speedup"])["best"] = True
    return rows


def best_lines(rows: list[dict]) -> list[str]:
    """One line per task: SpecViz at its best γ vs plain and vs HF assisted."""
    out = []
    for task in dict.fromkeys(r["task"] for r in rows):
        best = next((r for r in rows if r["task"] == task and r["best"]), None)
        if best is None:
            continue
        line = (f"{task}: SpecViz draft best γ={best['gamma']}: {_x(best['speedup'])} vs plain "
                f"(decode {_x(best['decode_speedup'])}, predicted {_x(best['predicted'])}, "
                f"measured/predicted {number(best['measured_over_predicted'], '{:.2f}', missing='–')})")
        for hf in rows:
            if hf["task"] != task or hf["engine"] != "hf" or hf["family"] == "hf-greedy":
                continue
            if hf["tokens_per_s"] and best["tokens_per_s"]:
                line += f"; {best['tokens_per_s'] / hf['tokens_per_s']:.2f}× {hf['label']}"
        out.append(line)
    return out


def _x(value) -> str:
    return number(value, "{:.2f}×", missing="–")
