"""Calibration of the self-speculative drafts (early exit, layer skip): pick the
exit layer / skip set that gives the most measured tokens/s on a few packaged
prompts, and cache the choice per pair and machine.

Two measured stages, so that only a few real runs are needed:
1. cheap: α̂ = how often the subset's greedy token equals the full target's,
   teacher-forced over the prompts (one forward per candidate), and c = a
   measured 1-token subset step ÷ a measured full step. With v(γ) (pair.costs
   or measured here) the verify-cost-aware theory ranks the candidates.
2. real: the `top` best-ranked candidates run speculative decoding on the
   prompts at their theory-best γ; the highest measured tokens/s wins.
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from types import SimpleNamespace

import torch
from transformers import DynamicCache

from ..engine.layers import drop_last, layers_forward, n_layers
from ..engine.theory import ALPHA_MAX, best_gamma, speedup
from ..errors import RequestError

VERSION = 1
GAMMAS = tuple(range(1, 9))


# ------------------------------------------------------------------ theory

def theory_best(alpha: float, c: float, verify_cost, gammas=GAMMAS) -> tuple[int, float]:
    """(γ in 1..max(gammas), predicted speedup) maximising the theory; verify_cost(γ) = v(γ)."""
    g = best_gamma(alpha, c, verify_cost, max_gamma=max(gammas))
    return g, speedup(alpha, g, c, verify_cost(g))


# ------------------------------------------------------------ measurements

def calib_prompts(pair, n: int = 2, max_tokens: int = 96) -> list[list[int]]:
    """Token ids of `n` packaged code prompts (a fixed snippet if none are installed)."""
    try:
        from ..prompts import prompt_set
        texts = [p.text for p in prompt_set("code", n)]
    except Exception:  # prompts package missing: calibration still works
        texts = ["def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n"] * n
    return [pair.tokenizer.encode(t)[-max_tokens:] for t in texts]


_FULL: dict = {}  # (model id, prompt) -> the full target's argmax per position


def _full_argmax(model, ids) -> torch.Tensor:
    key = (id(model), tuple(ids))
    if key not in _FULL:
        _FULL[key] = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].argmax(-1)
    return _FULL[key]


@torch.inference_mode()
def agreement(model, ids_list, layers) -> float:
    """Teacher-forced share of positions where the subset's argmax is the full target's."""
    hit = total = 0
    for ids in ids_list:
        full = _full_argmax(model, ids)
        sub = layers_forward(model, ids, DynamicCache(), layers, start=0, keep=len(ids)).argmax(-1)
        hit += int((full == sub).sum())
        total += len(ids)
    return hit / total


@torch.inference_mode()
def step_seconds(model, layers, n_tokens: int = 1, ctx: int = 16, reps: int = 5) -> float:
    """Median time of a KV-cached forward of `n_tokens` through `layers` after `ctx` tokens."""
    cache = DynamicCache()
    layers_forward(model, [0] * ctx, cache, layers, start=0, keep=1)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        layers_forward(model, [0] * n_tokens, cache, layers, start=ctx, keep=n_tokens)
        times.append(time.perf_counter() - t0)
        drop_last(cache, n_tokens)
    return sorted(times)[len(times) // 2]


def verify_cost_fn(pair, plain_s: float, step=step_seconds):
    """v(γ) in plain steps: from pair.costs when calibrated, else measured here."""
    costs = pair.costs
    if costs is not None:
        return costs.verify_cost
    every = tuple(range(n_layers(pair.target)))
    v = {g: step(pair.target, every, g + 1) / plain_s for g in GAMMAS}
    return lambda g: v[min(max(g, 1), max(GAMMAS))]


def measured_tps(pair, method: str, options: dict, gamma: int, ids_list, n_new: int = 24) -> float:
    """Decode tokens/s of a real greedy speculative run over the prompts (prefill excluded)."""
    from ..engine.decoding import speculative
    from ..engine.proposers import make_proposer
    from ..engine.sampling import SamplingParams
    tokens = seconds = 0.0
    for ids in ids_list:
        prop = make_proposer(pair, method, SimpleNamespace(options=dict(options)))
        events = list(speculative(pair.target, prop, pair.tokenizer, ids, n_new, gamma,
                                  SamplingParams(temperature=0), pair.eos_ids))
        s = events[-1]
        tokens += s.n_tokens - events[0].total_tokens
        seconds += s.elapsed - s.prefill
    return tokens / seconds if seconds > 0 else 0.0


# -------------------------------------------------------------- calibration

def _rank(pair, candidates, ids_list, step, verify_cost):
    """Stage 1: α̂, c and the theory's best γ / speedup per candidate layer subset."""
    every = tuple(range(n_layers(pair.target)))
    plain = step(pair.target, every)
    rows = []
    for key, layers in candidates:
        alpha = agreement(pair.target, ids_list, layers)
        c = step(pair.target, layers) / plain
        g, pred = theory_best(min(alpha, ALPHA_MAX), c, verify_cost)
        rows.append(dict(key=key, layers=len(layers), alpha_hat=round(alpha, 4), c=round(c, 4),
                         gamma=g, predicted=round(pred, 4)))
    return rows, plain


def _confirm(rows, measure, top: int):
    """Stage 2: the `top` ranked rows are run for real; the fastest measured wins."""
    for row in sorted(rows, key=lambda r: -r["predicted"])[:top]:
        row["measured_tps"] = round(measure(row["key"], row["gamma"]), 4)
    return max((r for r in rows if "measured_tps" in r), key=lambda r: r["measured_tps"])


def _say(msg: str) -> None:
    print(f"[specviz calibration] {msg}", file=sys.stderr, flush=True)


def _rename(row: dict, name: str) -> dict:
    return {(name if k == "key" else k): (list(v) if isinstance(v, tuple) else v) for k, v in row.items()}


def exit_candidates(n: int) -> list[int]:
    """About six exit layers spread over the depth (4, 8, .., 24 for 28 layers)."""
    step = max(1, n // 7)
    return [L for L in range(step, n, step)][:6] or [1]


def calibrate_exit_layer(pair, *, ids_list=None, step=step_seconds, measure=None,
                         candidates=None, top: int = 2, n_new: int = 16) -> dict:
    """Choose the early-exit layer L by measured tokens/s (see the module doc)."""
    ids_list = ids_list or calib_prompts(pair)
    candidates = candidates or exit_candidates(n_layers(pair.target))
    plain_s = step(pair.target, tuple(range(n_layers(pair.target))))
    verify_cost = verify_cost_fn(pair, plain_s, step)
    rows, plain = _rank(pair, [(L, tuple(range(L))) for L in candidates], ids_list, step, verify_cost)
    measure = measure or (lambda L, g: measured_tps(pair, "early-exit", {"exit_layer": L}, g,
                                                    ids_list, n_new))
    best = _confirm(rows, measure, top)
    return dict(exit_layer=best["key"], gamma=best["gamma"], plain_step_s=round(plain, 5),
                rows=[_rename(r, "exit_layer") for r in rows])


def _importance(pair, ids_list, candidates) -> list[tuple[int, float]]:
    """α̂ with one layer skipped, per candidate layer (higher = safer to skip)."""
    every = range(n_layers(pair.target))
    return [(i, agreement(pair.target, ids_list, tuple(j for j in every if j != i))) for i in candidates]


def calibrate_skip_layers(pair, *, ids_list=None, step=step_seconds, measure=None,
                          top: int = 2, n_new: int = 16, imp_tokens: int = 48) -> dict:
    """Choose the skip set: order the layers by measured single-skip α̂ (greedy:
    least harmful first, first and last layer always kept), rank the skip sets of
    the k least harmful layers with the theory, confirm the best by real runs."""
    n = n_layers(pair.target)
    ids_list = ids_list or calib_prompts(pair)
    plain_s = step(pair.target, tuple(range(n)))
    verify_cost = verify_cost_fn(pair, plain_s, step)
    # one short prompt for the n-2 single-skip probes (the costly part): measured, not exhaustive
    imp = sorted(_importance(pair, [ids_list[0][-imp_tokens:]], range(1, n - 1)), key=lambda t: -t[1])
    order = [i for i, _ in imp]
    sizes = sorted({k for k in range(max(1, n // 7), n - 1, max(1, n // 7))} | {1})
    cands = [(tuple(sorted(order[:k])), tuple(j for j in range(n) if j not in order[:k]))
             for k in sizes if k <= len(order)]
    rows, plain = _rank(pair, cands, ids_list, step, verify_cost)
    measure = measure or (lambda skip, g: measured_tps(pair, "layer-skip", {"skip_layers": skip}, g,
                                                       ids_list, n_new))
    best = _confirm(rows, measure, top)
    return dict(skip_layers=list(best["key"]), gamma=best["gamma"], plain_step_s=round(plain, 5),
                single_skip_alpha={i: round(a, 4) for i, a in imp},
                rows=[_rename(r, "skip_layers") for r in rows])


# ------------------------------------------------------------------- cache

def pair_key(pair) -> str:
    from ..machine import machine_key
    # only the target drafts and verifies here: the draft's precision does not matter
    spec, target_int8 = pair.spec, pair.quantize == "int8"
    ident = "|".join([getattr(spec, "name", ""), getattr(spec, "target", ""),
                      str(pair.dtype), "int8" if target_int8 else "",
                      str(n_layers(pair.target)), machine_key(), str(VERSION)])
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def reuse_probe(pair, exit_layer: int, gammas=(1, 2, 4, 8), step=step_seconds) -> list[dict]:
    """What reusing the drafted positions' layer-<L KV in the verify pass could save:
    a full verify forward of γ+1 tokens vs layers < L for the one undrafted token
    plus layers >= L for all γ+1 tokens (the LM head counted once), in seconds."""
    n = n_layers(pair.target)
    low, high = tuple(range(exit_layer)), tuple(range(exit_layer, n))
    head = step(pair.target, (), 1)
    out = []
    for g in gammas:
        full = step(pair.target, tuple(range(n)), g + 1)
        reuse = step(pair.target, low, 1) - head + step(pair.target, high, g + 1)
        out.append(dict(gamma=g, full_s=round(full, 4), reuse_s=round(reuse, 4),
                        saved=round(1 - reuse / full, 3)))
    return out


def cache_file(pair):
    from ..paths import cache_root
    return cache_root() / "selfspec" / f"{pair_key(pair)}.json"


def _read_cache(path) -> dict:
    try:
        return json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return {}  # a corrupt cache is recomputed


def cached(pair, what: str, calibrate) -> dict:
    """The cached calibration `what` for this pair and machine, computed once."""
    path = cache_file(pair)
    data = _read_cache(path)
    if what not in data:
        _say(f"{what}: measuring once for this pair on this machine (cached in {path})")
        data[what] = calibrate(pair)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data, indent=1))
    return data[what]


def default_exit_layer(pair) -> int:
    return int(cached(pair, "early-exit", calibrate_exit_layer)["exit_layer"])


def default_skip_layers(pair) -> tuple[int, ...]:
    return tuple(cached(pair, "layer-skip", calibrate_skip_layers)["skip_layers"])


# the option each self-speculative method leaves to calibration, and who chooses it
CALIBRATED = {"early-exit": ("exit_layer", default_exit_layer),
              "layer-skip": ("skip_layers", default_skip_layers)}


def pending(pair, method: str, options: dict | None) -> str | None:
    """The calibration a run of `method` would measure before it starts (its name), or None: the
    option was given, or this pair and machine have it cached. The page says so while it runs (a
    visitor's first layer-skip run sat 35-45 s before its first token, 2-core Xeon, 2026-11-28)."""
    if method not in CALIBRATED or (options or {}).get(CALIBRATED[method][0]) not in (None, ""):
        return None
    if method == "early-exit":
        try:
            if trained_exit_layer(pair, options) is not None:
                return None
        except RequestError:
            return None  # a bad trained file: the run says so in one line, and calibrates nothing
    return None if method in _read_cache(cache_file(pair)) else method


def trained_exit_layer(pair, options: dict | None) -> int | None:
    """The layer of the exit trained for this target (proposers/early_exit.load_trained_exit), where one
    is shipped or cached and the run keeps the option `trained` on; else None."""
    if not (options or {}).get("trained", True):
        return None
    from ..engine.proposers.early_exit import load_trained_exit
    trained = load_trained_exit(pair)  # RequestError: a bad file, one line
    return None if trained is None else trained.layer


def resolve_options(pair, method: str, options: dict | None) -> dict:
    """`options` with what calibration chooses filled in (cached per pair and machine),
    so a proposer's builder always receives resolved values and never calibrates."""
    options = dict(options or {})
    if method in CALIBRATED:
        name, choose = CALIBRATED[method]
        layer = trained_exit_layer(pair, options) if method == "early-exit" else None
        if options.get(name) in (None, ""):
            options[name] = layer if layer is not None else choose(pair)
        if method == "early-exit":  # resolved: whether the trained exit drafts this run (the header says)
            options["trained"] = layer is not None and int(options[name]) == layer
    return options
