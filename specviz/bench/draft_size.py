"""Draft-size analysis (the notebook's K × draft size): α and speedup over γ
for drafts of different cost on the same prompts: early exit at several
depths L, layer skip, the separate draft model (int8 and fp32), and the other
registered draft-free methods (prompt lookup, staged, rest when present).

    python -m specviz draft-size --prompts 2 --max-new-tokens 32 --gammas 1,2,4,6,8 \
        --out docs/draft_size.json

Each size runs every γ on every prompt (greedy; outputs checked against plain).
Speedup = decode tokens/s (prefill excluded) ÷ plain decode tokens/s measured
right before that size (the shared CPU's load drifts within minutes). The theory's optimum uses
the verify-cost-aware model (1−α̂^{γ+1}) / ((1−α̂)(γc + v(γ))), with α̂ and c
pooled over the size's runs and v(γ) from pair.costs when present, else the
verify forwards measured in the run. `--append` merges into an existing JSON, so
a long analysis can be run as several short invocations.
"""
from __future__ import annotations

import argparse
import copy
import datetime as _dt
import json
import shlex
import sys
import time
from pathlib import Path

from ..engine.decoding import baseline, speculative
from ..engine.layers import n_layers
from ..engine.proposers import make_proposer, method_names, method_spec
from ..engine.sampling import SamplingParams
from ..engine.theory import ALPHA_MAX, speedup
from ..errors import ModelError, RequestError
from ..machine import hardware, loadavg
from ..run.flags import add_pair_args, load_from_args

GREEDY = SamplingParams(temperature=0)
EXIT_LAYERS = (4, 8, 12, 16, 20, 24)
DEFAULT_SIZES = tuple(f"early-exit:{L}" for L in EXIT_LAYERS) + (
    "layer-skip", "draft-int8", "draft-fp32", "lookup", "staged", "rest")


def _log(msg: str) -> None:
    print(f"[draft-size] {msg}", file=sys.stderr, flush=True)


def decode_rate(events) -> tuple[float, float]:
    """(tokens, seconds) after the prefill (round 1 / first token) of one run."""
    s = events[-1]
    first = events[0].total_tokens if s.side == "speculative" else 1
    return s.n_tokens - first, s.elapsed - s.prefill


def plain_runs(pair, prompts, n_new):
    """Decode tokens/s of plain greedy decoding and its outputs (the reference)."""
    tok = sec = 0.0
    outs = []
    for ids in prompts:
        events = list(baseline(pair.target, pair.tokenizer, ids, n_new, GREEDY, pair.eos_ids))
        t, s = decode_rate(events)
        tok, sec = tok + t, sec + s
        outs.append(events[-1].token_ids)
    return tok / sec, sec / tok, outs


def resolve_size(pair, name: str, drafts: dict):
    """(method, options, pair to run with, label) for a size name, or None when not available."""
    method, _, arg = name.partition(":")
    if method == "early-exit":  # early-exit:L, or early-exit:L:fresh (no KV reuse)
        layer, _, fresh = arg.partition(":")
        opts = {"exit_layer": int(layer), "kv_reuse": not fresh}
        return "early-exit", opts, pair, f"early exit L={layer}" + (" no KV reuse" if fresh else "")
    if method == "layer-skip":
        opts = {"skip_layers": arg} if arg else {}
        return "layer-skip", opts, pair, "layer skip" + (f" {arg}" if arg else " (calibrated)")
    if method in ("draft-int8", "draft-fp32"):
        draft = drafts.get(method)
        if draft is None:
            return None
        with_draft = copy.copy(pair)  # the same target; only the draft differs
        with_draft.draft = draft
        return "draft", {}, with_draft, f"draft model {held_weights(draft)}"
    if method in method_names():
        return method, {}, pair, method_spec(method).label
    return None


def held_weights(model) -> str:
    """What a draft's weights are, read from its modules, not from the size's name: 'int8' (torch.ao's
    dynamic int8), 'int4' / 'int8' / 'fp16' (engine/cpu/lowbit.py), else its float type. The int8
    step converts plain nn.Linear layers only: a draft already low-bit stays as it was (docs/draft_size.json
    of 2026-11-24 labelled such a 4-bit draft "draft model int8", issue 71)."""
    import torch

    from ..engine.cpu import lowbit, speed
    if speed.has_int8(model):
        return "int8"
    fmt = lowbit.lowbit_format(model)
    if fmt:
        return {"w16": "fp16"}.get(fmt, f"int{fmt[1]}")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    return {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype, "fp32")


def run_size(pair, method, options, prompts, gammas, n_new, plain_outs, step_s):
    """One size over every γ and prompt: α, α̂, τ, c, v(γ), tokens/s per γ."""
    from types import SimpleNamespace

    from ..calibration.selfspec import resolve_options
    options = resolve_options(pair, method, options)  # an empty skip set: the calibrated one
    rows = []
    for g in gammas:
        acc = dict(tokens=0.0, sec=0.0, drafted=0, accepted=0, overlap=0.0, rounds=0, n=0,
                   draft_time=0.0, draft_fw=0, verify_time=0.0, timed=0)
        for ids, ref in zip(prompts, plain_outs, strict=True):
            prop = make_proposer(pair, method, SimpleNamespace(options=dict(options)))
            events = list(speculative(pair.target, prop, pair.tokenizer, ids, n_new, g, GREEDY,
                                      pair.eos_ids))
            s = events[-1]
            if s.token_ids != ref:
                raise RuntimeError(f"{method} γ={g}: greedy output differs from plain")
            t, sec = decode_rate(events)
            acc["tokens"] += t
            acc["sec"] += sec
            for k, v in (("drafted", s.drafted), ("accepted", s.accepted), ("overlap", s.overlap_sum),
                         ("rounds", s.rounds), ("n", s.n_tokens), ("draft_time", s.draft_time),
                         ("draft_fw", s.draft_forwards), ("verify_time", s.verify_time),
                         ("timed", s.timed_rounds)):
                acc[k] += v
        rows.append(_row(g, acc, step_s))
    return rows


def _row(g, a, step_s) -> dict:
    div = lambda x, y: x / y if y else None  # noqa: E731
    d_step = div(a["draft_time"], a["draft_fw"])
    v_meas = div(a["verify_time"], a["timed"])
    return dict(gamma=g, alpha=div(a["accepted"], a["drafted"]), alpha_hat=div(a["overlap"], a["drafted"]),
                tau=div(a["n"], a["rounds"]), c=d_step / step_s if d_step is not None else 0.0,
                v=v_meas / step_s if v_meas is not None else None, tps=div(a["tokens"], a["sec"]),
                drafted=a["drafted"], accepted=a["accepted"])


def add_theory(size: dict, plain_tps: float, costs) -> None:
    """Speedup per γ, pooled α̂ and c, theory per γ, measured and theory optima."""
    rows = size["rows"]
    drafted = sum(r["drafted"] for r in rows)
    alpha_hat = sum((r["alpha_hat"] or 0) * r["drafted"] for r in rows) / drafted if drafted else 0.0
    c = sum(r["c"] * r["drafted"] for r in rows) / drafted if drafted else 0.0
    for r in rows:
        r["speedup"] = r["tps"] / plain_tps if r["tps"] else None
        v = costs.verify_cost(r["gamma"]) if costs is not None else (r["v"] or 1.0)
        r["theory"] = speedup(min(alpha_hat, ALPHA_MAX), r["gamma"], c, v)
    size.update(alpha_hat=alpha_hat, c=c, plain_tps=plain_tps,
                v_source="pair.costs" if costs is not None else "measured in-run",
                measured_best=max(rows, key=lambda r: r["speedup"] or 0)["gamma"],
                theory_best=max(rows, key=lambda r: r["theory"])["gamma"])


def _drafts(pair, sizes) -> dict:
    """The separate draft in the precisions asked for. The int8 copy is made from an fp32 one:
    torch.ao's dynamic int8 Linear takes fp32 activations only (a bf16 draft, as `--precision auto`
    loads it on a CPU with native bf16, failed with "expected scalar type Float")."""
    import copy

    import torch

    from ..engine.cpu import speed
    out = {}
    if pair.draft is None or pair.quantize is not None:
        return out
    fp32 = pair.draft if pair.draft.dtype == torch.float32 else copy.deepcopy(pair.draft).float()
    if "draft-fp32" in sizes:
        out["draft-fp32"] = fp32
    if "draft-int8" in sizes:
        out["draft-int8"] = speed.quantize_int8(fp32)
    return out


def analyse(pair, sizes, prompts, gammas, n_new, on_size=None) -> dict:
    plain_tps, step_s, plain_outs = plain_runs(pair, prompts, n_new)
    _log(f"plain: {plain_tps:.2f} tokens/s (load {loadavg()})")
    drafts, costs, result = _drafts(pair, sizes), pair.costs, []
    for name in sizes:
        spec = resolve_size(pair, name, drafts)
        if spec is None:
            _log(f"{name}: not available here, skipped")
            continue
        method, options, run_pair, label = spec
        # a plain run right before each size: the shared CPU's load drifts within minutes
        local_tps, local_step, _ = plain_runs(pair, prompts, n_new)
        rows = run_size(run_pair, method, options, prompts, gammas, n_new, plain_outs, local_step)
        size = dict(name=name, label=label, method=method, options=options, rows=rows)
        result.append(size)
        add_theory(size, local_tps, costs)
        if on_size is not None:  # partial results survive an interrupted run
            on_size(dict(plain_tps_before=plain_tps, plain_tps_after=None, sizes=result))
        _log(f"{label}: " + "  ".join(f"γ{r['gamma']} α={r['alpha'] or 0:.2f} {r['tps']:.2f}t/s"
                                      for r in rows) + f"  (load {loadavg()})")
    plain_after, _, _ = plain_runs(pair, prompts, n_new)
    return dict(plain_tps_before=plain_tps, plain_tps_after=plain_after, sizes=result)


def _calibrate(pair) -> dict:
    from ..calibration import selfspec
    t0 = time.perf_counter()
    res = {"early-exit": selfspec.cached(pair, "early-exit", selfspec.calibrate_exit_layer),
           "layer-skip": selfspec.cached(pair, "layer-skip", selfspec.calibrate_skip_layers)}
    res["seconds"] = round(time.perf_counter() - t0, 1)  # ~0 when read from the cache
    probe_layer = min(8, n_layers(pair.target) - 1)
    res["kv_reuse_probe"] = dict(exit_layer=probe_layer, rows=selfspec.reuse_probe(pair, probe_layer))
    res["load"] = loadavg()
    _log(f"calibration: exit layer {res['early-exit']['exit_layer']}, "
         f"skip {res['layer-skip']['skip_layers']} ({res['seconds']} s)")
    return res


def build_parser():
    ap = argparse.ArgumentParser(prog="python -m specviz draft-size", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_pair_args(ap)
    ap.set_defaults(quantize="none")  # fp32 draft loaded; its int8 copy is made here
    ap.add_argument("--sizes", default=",".join(DEFAULT_SIZES),
                    help="comma list: early-exit:L[:fresh], layer-skip[:SET], draft-int8, draft-fp32, "
                         "lookup, ...")
    ap.add_argument("--gammas", default="1,2,4,6,8")
    ap.add_argument("--prompts", type=int, default=2, help="packaged code prompts")
    ap.add_argument("--prompt-tokens", type=int, default=96, help="keep the last N prompt tokens")
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--out", default="draft_size.json")
    ap.add_argument("--append", action="store_true", help="merge sizes into an existing --out")
    ap.add_argument("--png", default=None, help="also write the heatmap and lines as PNG (kaleido)")
    ap.add_argument("--calibrate", action="store_true",
                    help="first run (or read) the cached self-speculation calibrations and the KV-reuse "
                         "probe in the same process, and keep them in the JSON")
    return ap


def _merge(out: Path, new: dict) -> dict:
    old = json.loads(out.read_text()) if out.exists() else {}
    names = {s["name"] for s in new["sizes"]}
    new["sizes"] = [s for s in old.get("sizes", []) if s["name"] not in names] + new["sizes"]
    new["invocations"] = old.get("invocations", []) + new["invocations"]
    return new


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        gammas = [int(g) for g in args.gammas.split(",")]
        pair = load_from_args(args)
    except (ValueError, RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from ..calibration.selfspec import calib_prompts
    prompts = calib_prompts(pair, args.prompts, args.prompt_tokens)
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    load_before = loadavg()
    calibration = _calibrate(pair) if args.calibrate else None
    out = Path(args.out)

    def write(res, final=False):
        data = _document(args, argv, pair, prompts, gammas, res, load_before, calibration)
        if args.append:
            data = _merge(out, data)
        data["complete"] = final
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(data, indent=1))
        return data

    data = write(analyse(pair, sizes, prompts, gammas, args.max_new_tokens,
                         on_size=lambda res: write(dict(res))), final=True)
    _log(f"wrote {out}")
    if args.png:
        for note in write_png(data, Path(args.png)):
            _log(note)
    return 0


def _document(args, argv, pair, prompts, gammas, res, load_before, calibration) -> dict:
    res = dict(res)
    inv = dict(command="python -m specviz draft-size " + shlex.join(argv or sys.argv[1:]),
               date=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               load_before=load_before, load_after=loadavg(), sizes=[s["name"] for s in res["sizes"]],
               plain_tps_before=res.pop("plain_tps_before"), plain_tps_after=res.pop("plain_tps_after"))
    data = dict(pair=pair.spec.label, precision=pair.precision_label, machine=hardware(), gammas=gammas,
                prompts=len(prompts), max_new_tokens=args.max_new_tokens, invocations=[inv], **res)
    if calibration:
        data["calibration"] = calibration
    return data

def write_png(data: dict, path: Path) -> list[str]:
    """path (heatmap) and path with _lines (lines) as PNG/SVG via kaleido; returns notes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    stem = path.with_suffix("")
    from ..ui.draft_size_plot import heatmap, lines
    from .plots import export_images
    return export_images({stem.name: heatmap(data), f"{stem.name}_lines": lines(data)}, path.parent)
