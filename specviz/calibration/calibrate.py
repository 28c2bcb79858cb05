"""Precision chosen by measurement, per machine, and the measured cost curve.

At load, time a few real KV-cached forwards (1 new token and n = 2..17 on a
~100-token context) of the target in each candidate precision and 1-token
steps of the draft in each candidate, pick the fastest per side, and keep the
chosen precision's timings as the pair's CostModel (v(k), c). The choice and
the costs are cached per pair and machine: later loads skip the timing.

Rules (measured, issue 11): on a CPU with native bf16 (AVX512-BF16/AMX) a bf16
target step is 2.2x faster than fp32 (128 vs 279 ms) and a bf16 verify of 8
tokens costs one plain step, where fp32 costs 1.9; without native bf16 torch
emulates it, so auto keeps fp32 there WITHOUT timing bf16. Models under 100M
parameters stay fp32 (nothing to gain; test pairs keep exact equality). On
CUDA the device's half type is the natural choice.

The choice logic (calibration/choice.py) is pure, tested with injected timings.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path

import torch

from ..engine.costs import MAX_VERIFY_TOKENS
from ..engine.cpu import lowbit
from ..engine.cpu.lean import settle
from ..engine.cpu.memory import trim_heap
from ..machine import pause_point  # before each timed forward: a background calibration's pause
from . import probe
from .cache import CACHE_VERSION, Choice, cache_path, load_cached, save  # noqa: F401 - callers' calibrate.X
from .choice import (  # noqa: F401 - the choice logic's names, re-exported with the measuring
    CHOICE_N,
    DRAFT_PROMPT_SPREAD,
    NAMES,
    PROMPT_N,
    PROMPT_SPREAD,
    PRUNE,
    SMALL_MODEL_PARAMS,
    _score,
    candidates,
    choose_draft,
    choose_target,
    class_default,
    cost_model,
    draft_default,
    draft_score,
    note,
    pruned,
)
from .handoff import Handoff, Loaded, n_params  # noqa: F401 - re-exported: callers hand models over here
from .handoff import take as _take

PRECISIONS = ("auto", "fp32", "bf16", *lowbit.FORMATS)
LOWBIT = lowbit.FORMATS
CONTEXT = 100  # tokens in the cache while timing: a typical prompt
# a traceable draft whose step compiled this much faster would win gets its compiled step timed
# (the most measured: 0.5B w4 27.9 -> 18.4 ms on an AVX-512 Xeon; 63 -> 54 ms on an AVX2 EPYC)
COMPILE_HOPE = 1.5
REPEATS = 3  # median of 3: ~15 s for a first calibration of the default pair on 2 cores
CURVE_REPEATS = 7  # the verify curve's rounds (docs/why.md#verify-interleaved)
CONFIRM_MARGIN = 1.3  # the two fastest are re-timed only when this close (choice.PRUNE: further timings)
BUSY_LOAD_PER_CORE = 2.0  # above this 1-minute load per core a calibration is not cached

# auto: the cache, else measure now; cached: the cache, else an untimed default (never times anything,
# for a page that must be usable at once); fresh: measure and cache, a noisy old entry or none (the
# app's background calibration, beside the pair in service: it keeps no twin between timings)
MODES = ("auto", "cached", "fresh")

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


# --------------------------------------------------------------- measuring


def _sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def time_forwards(model, ns, *, context: int = CONTEXT, repeats: int = REPEATS, enough=None,
                  warm: bool = True, keep: dict | None = None, interleave: bool = False) -> dict[int, float]:
    """Median seconds of a KV-cached forward of n new tokens after `context` cached ones;
    enough(timings so far) -> True stops before the next n. keep: holds the model's cache of the
    context from one call to the next (re-timings: a 100-token prefill of the 1.5B is ~3 s at one
    thread); warm=False: no untimed first call per shape (shapes this model has already run).
    interleave: each repeat times every n in turn (no `enough`), so that ratios between shapes
    share the machine's minute (docs/why.md#verify-interleaved)."""
    from transformers import DynamicCache

    from ..engine.forward import cache_kind, crop_cache, forward_logits, new_cache
    dev, ns = next(model.parameters()).device, list(ns)
    vocab = model.get_input_embeddings().num_embeddings
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (context + max(MAX_VERIFY_TOKENS, *ns),), generator=g).tolist()
    keep = {} if keep is None else keep
    if "cache" not in keep:  # graphs (a GPU): time the cache runs use (engine/backends/graphs.py)
        keep["cache"] = new_cache(model) if cache_kind(model)[0] == "graphs" else DynamicCache()
        # forward_logits: the path runs take (engine/cpu/lean_forward.py where it applies)
        forward_logits(model, ids[:context], keep["cache"], 1)
    cache, runs, out = keep["cache"], {n: [] for n in ns}, {}

    def once(n, timed=True):
        pause_point()
        _sync(dev)
        t0 = time.perf_counter()
        forward_logits(model, ids[context:context + n], cache, n)
        _sync(dev)
        if timed:
            runs[n].append(time.perf_counter() - t0)
        crop_cache(cache, context)

    # each shape once untimed: oneDNN/AMX builds a kernel per new shape (bf16 measured
    # 7x a warm step on its first call), and the first call also pays page faults
    if interleave:
        for n in ns if warm else ():
            once(n, timed=False)
        for _ in range(repeats):
            for n in ns:
                once(n)
        return {n: statistics.median(runs[n]) for n in ns}
    for n in ns:
        if warm:
            once(n, timed=False)
        for _ in range(repeats):
            once(n)
        out[n] = statistics.median(runs[n])
        if enough is not None and enough(out):
            break
    return out


def _dtype_name(model) -> str:
    dt = next(model.parameters()).dtype
    return {v: k for k, v in DTYPES.items()}.get(dt, str(dt))


def _form(model) -> str:
    """What a model runs in: its low-bit format, "int8" (dynamic int8 Linears) or its float type.
    Not its first parameter's type alone: a packed w4a8 model's is its fp32 input table, and taking
    it for fp32 let the bf16 candidate cast it in place, its kernels' float32 scales read as bf16
    (the default pair wrote one token over and over: CI, 2026-11-30; docs/why.md#packed-not-fp32)."""
    from ..engine.cpu import speed
    return lowbit.lowbit_format(model) or ("int8" if speed.has_int8(model) else _dtype_name(model))


def convert(model, prec: str, reload=None):
    """`model` in precision `prec`. Float casts are in place; int8 makes a
    quantised copy of an fp32 model; fp32 after a lossy cast, or anything from a packed or int8
    model, needs reload()."""
    from ..engine.cpu import speed
    have = _form(model)
    if prec in LOWBIT and have == prec:
        return model  # converted at load (a cached choice)
    if prec in LOWBIT:  # quantised from the fp32 weights, which stay intact for other candidates
        if have != "fp32":
            model = reload()
        return lowbit.lowbit_copy(model, prec)
    if prec == "int8":
        if have != "fp32":
            model = reload()
        # on a twin sharing the fp32 tensors: quantize_dynamic's own copy is a deepcopy of the whole
        # model (the 0.5B draft: 2 GB more beside a serving pair; a first start peaked at 9.48 GB)
        return speed.quantize_int8(lowbit.twin(settle(model)), inplace=True)
    if have != "fp32" and (prec == "fp32" or have not in DTYPES):
        # bf16 -> fp32 would not give the original weights back; a packed or int8 model has no
        # float weights to cast (its scales would be cast under its kernels)
        model = reload()
    # a deferred fusion (lean.defer) casts each layer as it is fused: one layer's fused fp32 at a time
    settle(model, None if prec == "fp32" else lambda layer: layer.to(DTYPES[prec]))
    model = model.to(DTYPES[prec])
    speed.patch_small_m_linear(model)  # a no-op unless CPU fp32
    return model


CONFIRM_ROUNDS = 3  # interleaved re-timings of the two fastest


def _two_fastest(timings: dict[str, dict[int, float]]) -> tuple[str, str | None]:
    """The fastest candidate and the runner-up _confirm re-times with it: None when none is that close
    (timed only until pruned, or CONFIRM_MARGIN behind)."""
    a, *rest = sorted(timings, key=lambda p: (_score(timings[p]), list(timings).index(p)))
    b = rest[0] if rest else None
    if b is None or any(n not in timings[b] for n in CHOICE_N) \
            or _score(timings[b]) > CONFIRM_MARGIN * _score(timings[a]):
        return a, None
    return a, b


def _confirm(target, timings, reload, progress, default, twins) -> tuple[object, str, dict]:
    """Re-time the two fastest candidates interleaved (A B A B ...): one noisy sequential
    timing must not pick a format a quiet one would reject. If the order flips, the class
    default wins when it is one of the two, else the interleaved winner. A runner-up pruned
    (PRUNE behind) or CONFIRM_MARGIN behind is not re-timed. `twins` (format -> low-bit
    twin) gains both of them."""
    a, b = _two_fastest(timings)
    if b is None or (a not in LOWBIT and b not in LOWBIT):  # two float casts of one model: not held at once
        return target, a, {}
    models = {}
    for p in sorted((a, b), key=lambda p: p not in LOWBIT):  # twins from fp32 before a float cast
        models[p] = twins[p] if p in twins else convert(target, p, reload)
        if p not in LOWBIT:
            target = models[p]
        else:
            twins[p] = models[p]
    runs: dict[str, list[float]] = {a: [], b: []}
    progress(f"re-timing {NAMES[a]} and {NAMES[b]}, interleaved", 0.92)
    keep: dict[str, dict] = {a: {}, b: {}}  # each model's context read once, its shapes warmed once
    for i in range(CONFIRM_ROUNDS):
        for p in (a, b):
            runs[p].append(_score(time_forwards(models[p], CHOICE_N, repeats=1, warm=i == 0, keep=keep[p])))
    again = {p: statistics.median(v) for p, v in runs.items()}
    winner = a if again[a] <= again[b] else b
    chosen = a if winner == a else (default if default in (a, b) else winner)
    return target, chosen, {"first": a, "again": again, "stable": winner == a, "chosen": chosen}


def _sliced(model, cands: list[str], side: str, probes: dict, progress) -> list[str]:
    """cands less those whose slice loses (calibration/probe.py); probes[side]: what slices said."""
    if len(cands) < 2 or _form(model) != "fp32":
        return cands
    progress(f"timing the {side}'s candidates on a slice of it", 0.9)
    shapes, score, hope = ((CHOICE_N, _score, None) if side == "target" else  # hope: _compiled_draft
                           ((1, PROMPT_N), lambda t: draft_score(t[1], t.get(PROMPT_N)), COMPILE_HOPE))
    cands, probes[side] = probe.prune(model, cands, lambda m, enough: time_forwards(
        m, shapes, context=probe.CONTEXT, enough=enough), score, hope, make=_slice_in)
    trim_heap()
    return cands


def _slice_in(part, prec: str):
    """A probe slice (fp32, sharing the model's tensors) in a float or int8 candidate: cast on a
    copy, so the model it shares its tensors with stays fp32."""
    import copy
    return convert(copy.deepcopy(part), prec)


def _time_target(target, cands, reload, progress, default, probes: dict,
                 keep: bool = True) -> tuple[object, str, dict, dict]:
    """Time the target's candidates on the choice shapes (those a slice did not prune), keep the
    fastest (confirmed interleaved), then its whole curve. keep=False: the fastest twin is not kept
    while the others are timed (packed again once chosen): beside a serving pair, a first start held
    8.41 GB with it (issue 41's bar: 8)."""
    timings: dict[str, dict[int, float]] = {}
    cands = _sliced(target, sorted(cands, key=lambda p: p != default), "target", probes, progress)
    twins: dict[str, object] = {}
    if len(cands) > 1:
        # fp32 and the low-bit twins (made from fp32) before bf16: its in-place cast is lossy;
        # the class default first, so the others can be pruned against it
        for prec in sorted(cands, key=lambda p: (p == "bf16", p != default)):
            progress(f"timing the target in {NAMES[prec]}", 0.9)
            model = convert(target, prec, reload)
            timings[prec] = time_forwards(model, CHOICE_N, enough=lambda t: pruned(t, timings))
            if prec not in LOWBIT:
                target = model
            else:
                # the fastest so far is kept for the re-timing and the load (a w8a8 twin of the 1.5B
                # took 28-32 s to pack at one thread on a 2-core AVX2 EPYC); the runner-up is packed
                # again if it is re-timed: two twins kept beside the one being packed and the serving
                # pair took a first start to 10.0 GB (issue 41's bar: 8)
                twins[prec] = model
                twins = {p: m for p, m in twins.items() if keep and p == _two_fastest(timings)[0]}
            del model
            trim_heap()
    chosen = choose_target(timings) if timings else cands[0]
    confirm = {}
    if len(timings) > 1:
        target, chosen, confirm = _confirm(target, timings, reload, progress, default or cands[0], twins)
    if chosen in twins:
        target = twins[chosen]
    twins.clear()  # the re-timed runner-up's twin is freed before the curve is timed
    if _form(target) != chosen or chosen == "int8" or chosen in LOWBIT:
        target = convert(target, chosen, reload)
    have = timings.get(chosen, {})
    progress(f"measuring verify costs v(k), k = 1..{MAX_VERIFY_TOKENS - 1}", 0.93)
    # every shape again, the plain step too, side by side: v(k) is a ratio of two of them; 7 rounds
    # of the 17 shapes take ~4 s on the default pair (2 cores), and medians of 3 wandered ±0.1
    curve = time_forwards(target, range(1, MAX_VERIFY_TOKENS + 1), interleave=True, repeats=CURVE_REPEATS)
    timings[chosen] = dict(sorted({**have, **curve}.items()))
    return target, chosen, timings, confirm


def _time_draft(draft, cands, reload, progress, probes: dict) -> tuple[object, str, dict, dict]:
    import copy
    timings: dict[str, float] = {}
    first = draft_default(cands)  # the class's default first: the others are pruned against it
    cands = _sliced(draft, sorted(cands, key=lambda p: p != first), "draft", probes, progress)
    prompts: dict[str, float] = {}
    models = {}
    for prec in cands:
        progress(f"timing the draft in {NAMES[prec]}", 0.96)
        if prec == "int8" or prec in LOWBIT:  # both make a new model and leave the fp32 one intact
            m = convert(draft, prec, reload)
        elif prec != "fp32" and len(cands) > 1:
            m = convert(copy.deepcopy(draft), prec, reload)
        else:
            m = convert(draft, prec, reload)
        models[prec] = m
        timings[prec] = time_forwards(m, (1,), repeats=2 * REPEATS)[1]
        best = min((draft_score(timings[p], prompts[p]) for p in prompts), default=None)
        if len(cands) > 1 and (best is None or timings[prec] <= PRUNE * best):  # else its step alone loses
            prompts[prec] = time_forwards(m, (PROMPT_N,))[PROMPT_N]
        del m
        _drop_hopeless(models, timings, prompts)
    chosen = _compiled_draft(models, timings, choose_draft(timings, prompts), progress, prompts)
    return models[chosen], chosen, timings, prompts


def _could_win(p: str, timings: dict[str, float], prompts: dict[str, float], goal: float) -> bool:
    """Whether draft candidate p would score better than `goal` if compiling made its step
    COMPILE_HOPE times faster."""
    return draft_score(timings[p] / COMPILE_HOPE, prompts.get(p)) < goal


def _drop_hopeless(models: dict, timings: dict[str, float], prompts: dict[str, float]) -> None:
    """Forget the draft candidates that cannot be chosen, eager or compiled: their step even
    COMPILE_HOPE times faster scores no better than the best so far (which only improves)."""
    chosen = choose_draft(timings, prompts)
    goal = draft_score(timings[chosen], prompts.get(chosen))
    for p in [p for p in models if p != chosen]:
        if not _could_win(p, timings, prompts, goal):
            del models[p]
    trim_heap()


def _compiled_draft(models: dict, timings: dict[str, float], chosen: str, progress,
                    prompts: dict[str, float] | None = None) -> str:
    """A w4/w8 draft runs its one-token step compiled (calibration/draft_compile.py), so when the eager
    winner cannot compile, the traceable candidate that would win if compiling made its step
    COMPILE_HOPE times faster is timed compiled (a cold compile: 80-100 s on 2 cores), and wins
    if that scores better (draft_score: the step plus its prompt share); its step timing becomes
    the compiled one (why: docs/why.md#draft-compile)."""
    from . import draft_compile
    if draft_compile.unwanted(models[chosen]) is None:
        return chosen  # the winner compiles at load anyway
    prompts = prompts if prompts is not None else {}
    goal = draft_score(timings[chosen], prompts.get(chosen))
    near = [p for p in timings if p in models and draft_compile.unwanted(models[p]) is None
            and _could_win(p, timings, prompts, goal)]
    if not near:
        return chosen
    best = min(near, key=lambda p: draft_score(timings[p], prompts.get(p)))
    if prompts and best not in prompts:  # pruned on its eager step: its prompt counts against a compiled one
        prompts[best] = time_forwards(models[best], (PROMPT_N,))[PROMPT_N]
        if not _could_win(best, timings, prompts, goal):
            return chosen
    lowbit.half_embeddings(models[best])  # the table it runs with (models/loading._warm): compiled once
    step = draft_compile.compile_draft(models[best], progress)
    if step is None or not step.compiled or draft_score(step.compiled_ms / 1e3, prompts.get(best)) >= goal:
        return chosen
    timings[best] = step.compiled_ms / 1e3  # what it runs at
    return best


def calibrate(target, draft, *, precision: str = "auto", quantize: str | None = "auto",
              device: str = "cpu", half: str = "bf16", cache_file: Path | None = None,
              reload: Loaded | None = None, progress=None, native_bf16: bool | None = None,
              min_params: int = SMALL_MODEL_PARAMS, mode: str = "auto"):
    """(target, draft, Choice): both models in their chosen precision, the
    choice's reason and the measured CostModel. Pairs under min_params are
    not timed (costs None); a cached choice for this pair + machine is reused."""
    from .. import machine
    progress = progress or (lambda msg, frac: None)
    native = machine.native_bf16() if native_bf16 is None else native_bf16
    nt, nd = (m.n_params if isinstance(m, Handoff) else n_params(m) if m is not None else None
              for m in (target, draft))
    target = _take(target)  # from here this frame holds the only reference (see Handoff)
    tc, dc = candidates(precision=precision, quantize=quantize, device=device, native_bf16=native,
                        n_target=nt, n_draft=nd, half=half, min_params=min_params,
                        lowbit_candidates=lowbit.available() if device == "cpu" else ())
    if device == "cpu" and precision in LOWBIT and precision not in lowbit.available():
        from ..errors import ModelError
        raise ModelError(f"precision {precision} does not run on this machine ({lowbit.why_not(precision)}): "
                         "use --precision auto")
    reload = reload or Loaded(None, None)
    where = "GPU" if device != "cpu" else "CPU"
    cached = serving(cache_file, mode, progress) if cache_file else None
    if cached and cached.target in tc and (draft is None or cached.draft in dc):
        progress(f"precision from the calibration cache: {cached.note}", 0.9)
        target = convert(target, cached.target, reload.target)
        draft = convert(_take(draft), cached.draft, reload.draft) if draft is not None else None
        return target, draft, cached
    if nt < min_params:  # tiny pairs: nothing worth timing, no cost model
        target = convert(target, tc[0], reload.target)
        draft = convert(_take(draft), dc[0], reload.draft) if draft is not None else None
        dp = dc[0] if dc else None
        return target, draft, Choice(tc[0], dp, note(tc[0], dp, {}, where))
    if mode == "cached":  # nothing cached: what this CPU class runs fastest, untimed
        # (fp32 here made the stage default 1.07x on an AVX2 EPYC; w8a8 + int8 draft: 1.43x)
        tp = class_default(tc, native)
        dp = draft_default(dc, tp)
        target = convert(target, tp, reload.target)
        draft = convert(_take(draft), dp, reload.draft) if draft is not None else None
        return target, draft, Choice(tp, dp, note(tp, dp, {}, where) + " (not timed yet: this CPU class's "
                                     "default)", timings={"untimed": True})
    t0 = time.perf_counter()
    if isinstance(draft, Handoff):
        draft.release()  # not resident while the target's candidates are: loaded again after
    probes: dict = {}  # what the slices said (calibration/probe.py), per side
    target, tp, tt, confirm = _time_target(target, tc, reload.target, progress, class_default(tc, native),
                                           probes, keep=mode != "fresh")
    dp, dt, dpr = None, {}, {}
    if draft is not None:
        draft, dp, dt, dpr = _time_draft(_take(draft), dc, reload.draft, progress, probes)
    timings = {"target": tt, "draft": dt, **({"draft_prompt": dpr} if dpr else {}),
               **({"probe": probes} if any(probes.values()) else {})}
    costs = cost_model(timings, tp, dp, machine.hardware())
    choice = Choice(tp, dp, note(tp, dp, timings, where) + "".join(probe.note(*kv) for kv in probes.items()),
                    costs, timings)
    if confirm:
        choice.timings["confirm"] = confirm
        if not confirm["stable"]:
            choice.note += f" (the two fastest swapped places when re-timed: {NAMES[tp]} by class default)"
    choice.timings["seconds"] = round(time.perf_counter() - t0, 1)  # what the calibration itself cost
    choice.timings["load"] = machine.loadavg()
    choice.timings["noisy"] = busy()
    if choice.noisy:
        choice.note += f" (measured under load {machine.loadavg()}: noisy)"
    old = load_cached(cache_file) if cache_file else None
    if cache_file and (not choice.noisy or old is None or old.noisy):
        save(cache_file, choice)  # noisy beats nothing; a quiet one replaces it, never the reverse
    return target, draft, choice


def serving(cache_file: Path, mode: str, progress=None) -> Choice | None:
    """The cached choice calibrate() will take in `mode`, or None (none, mode fresh, or timed again:
    progress says so)."""
    cached = load_cached(cache_file) if mode != "fresh" else None
    if not retime(cached, mode):
        return cached
    if progress is not None:
        progress("the cached calibration was timed under load: timing it again now", 0.02)
    return None


def retime(cached: Choice | None, mode: str) -> bool:
    """Whether calibrate() times a cached choice again instead of taking it: one timed under load, in
    mode auto, once the machine is quiet."""
    return cached is not None and cached.noisy and mode == "auto" and not busy()


def busy(load1: float | None = None, cores: int | None = None) -> bool:
    """Too busy to trust a timing: 1-minute load above twice the cores. Under a
    load of 13 on 2 cores a bf16 step measured 7.7 s instead of 0.13 s and
    the draft choice came out backwards; such a choice must not be cached."""
    import os
    if load1 is None:
        try:
            load1 = os.getloadavg()[0]
        except OSError:
            return False
    return load1 > BUSY_LOAD_PER_CORE * (cores or os.cpu_count() or 1)
