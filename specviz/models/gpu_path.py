"""The page's decode path on a CUDA GPU: both sides over static caches replayed as CUDA graphs
(engine/backends/graphs.py), captured at load, and the pair's costs (plain step, v(k), draft step)
timed again on that path, since those are the forwards every run makes.

Why: the 2026-11-28 H100 ran the page's default path (transformers' forward over a DynamicCache)
at 8.6-13.2 tok/s plain for the 1.5B target, while the same model replayed as one CUDA graph took
4.11 ms a step; a batch-1 step on a GPU is bound by kernel launches, which a graph removes.
SPECVIZ_GPU_GRAPHS=0 keeps the dynamic cache (eager); --cache dynamic does the same per run.
"""
from __future__ import annotations

import os
from dataclasses import replace

from .. import machine
from ..engine.costs import MAX_VERIFY_TOKENS, CostModel

NOTE = "both sides replay CUDA graphs over static caches (captured at load)"
BASELINE_CACHES, DRAFT_CACHES = 2, 1  # the baseline's and the verifier's; the draft's


def no_cudnn_attention() -> None:
    """SDPA without its cuDNN backend, for the eager forwards (tree methods, self-speculation,
    SPECVIZ_GPU_GRAPHS=0). Why: cuDNN builds an execution plan per new key length, and an eager
    decode step meets a new length every token. 2026-11-28, H200, the 1.5B's shapes, transformers'
    forward over a DynamicCache: 58.5 ms a step at fresh lengths against 19.1 ms at a repeated one;
    with cuDNN's SDPA off, 18.7 ms fresh (docs/gpu/h200-2026-11-28/page_probe.json). That is the
    "mystery 80 ms" of the 2026-11-28 H100. The graphs capture one length (the whole cache) once."""
    import torch
    torch.backends.cuda.enable_cudnn_sdp(False)


def wanted(device) -> bool:
    """Graphs on a CUDA device, unless SPECVIZ_GPU_GRAPHS=0 (on ZeroGPU captured inside each call)."""
    cuda = getattr(device, "type", str(device)) == "cuda"
    return cuda and os.environ.get("SPECVIZ_GPU_GRAPHS", "1") != "0"


PER_CALL_NOTE = ("both sides replay CUDA graphs over static caches, captured inside each GPU call (ZeroGPU "
                 "runs each call in a fresh process) before the race's clocks start")


def use_graphs(target, draft, costs, compile: bool = False):
    """Put both models on graphs, capture their caches and re-time the costs on that path ->
    (costs, note); (costs, "") where the target's family has no graph path (it stays dynamic).
    On ZeroGPU nothing is captured or timed now, where no GPU is held: each call captures what its
    run needs and times the costs on it (prepare_call)."""
    from ..engine.forward import set_cache
    from ..engine.kvcache import backend
    if set_cache(target, "graphs", compile=compile).split()[0] != "graphs":
        return costs, ""
    if draft is not None and set_cache(draft, "graphs", compile=compile).split()[0] != "graphs":
        set_cache(target, "dynamic")  # a speed trick reaches both sides or neither
        return costs, ""
    if machine.on_zerogpu():
        return costs, PER_CALL_NOTE
    backend(target).prewarm(target, BASELINE_CACHES)
    if draft is not None:
        backend(draft).prewarm(draft, DRAFT_CACHES)
    if costs is None:
        return costs, NOTE
    costs = timed(target, draft, costs)
    return costs, NOTE + "; costs timed on them; " + recommendation(costs)


def timed(target, draft, costs=None):
    """The costs runs price by (the plain step, v(k) for k = 1..16, the draft's step), timed on the
    graphs now: `costs` with those replaced, or new ones (None: nothing was timed at load)."""
    from ..calibration.calibrate import time_forwards
    verify = time_forwards(target, range(1, MAX_VERIFY_TOKENS + 1), interleave=True)
    step = time_forwards(draft, [1])[1] if draft is not None else None
    fields = dict(plain_step_s=verify[1], verify_s=tuple(verify[n] for n in sorted(verify)),
                  draft_step_s=step if step is not None else getattr(costs, "draft_step_s", None))
    return replace(costs, **fields) if costs is not None else CostModel(**fields)


def graphs_or_eager(target, draft, costs):
    """use_graphs(), or where capturing fails at load (out of memory on a small card, a driver that
    refuses a capture) both models back on the dynamic cache, eager, with the costs timed on it, and
    a note saying why -> (costs, note). A device a failed capture left unusable (a sticky CUDA error)
    raises the capture's error: nothing could run on it."""
    try:
        return use_graphs(target, draft, costs)
    except Exception as err:  # noqa: BLE001 - checked below: a usable device runs eager
        return costs, _eager_after(err, target, draft)


def _eager_after(err: BaseException, target, draft) -> str:
    """Both models back on dynamic caches after a failed capture -> the note saying why; the error
    raised again where the failed capture left the device unusable (a sticky CUDA error)."""
    from ..engine.forward import set_cache
    for m in (target, draft):
        if m is not None:
            set_cache(m, "dynamic")
    if not _device_works(next(target.parameters()).device):
        raise err
    why = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:160]
    return (f"CUDA graphs could not be captured ({why}); both sides run eager over dynamic caches, "
            "slower, as a CPU does")


def prepare_call(pair, end: int) -> str:
    """On ZeroGPU, inside the GPU call and before the race: capture the graphs this run replays
    (capture_for_run) and time the pair's costs on them ->
    the run's note ("" elsewhere: captured and timed at load). A capture that fails leaves this call
    eager, and the note says why."""
    from ..engine.forward import cache_kind
    target, draft = pair.target, getattr(pair, "draft", None)
    if not machine.on_zerogpu() or not hasattr(target, "parameters") or cache_kind(target)[0] != "graphs":
        return ""  # elsewhere captured at load; another engine's pair (vLLM) has no model here
    try:
        made, capture_s, costs_s = for_this_call(pair, end)
    except Exception as err:  # noqa: BLE001 - this call runs eager, and says why
        return _eager_after(err, target, draft)
    return (f"CUDA graphs captured in this GPU call: {made} in {capture_s:.2f} s, and its costs timed on "
            f"them in {costs_s:.2f} s, before the clocks")


def for_this_call(pair, end: int) -> tuple[int, float, float]:
    """ZeroGPU's preparation of one call: the graphs its run replays captured (every verify size, so
    that v(k) can be timed), then pair.costs timed on them -> (graphs captured, seconds capturing,
    seconds timing). Why the costs: auto γ, the hybrid, lookup, suffix and the chips price by them,
    and nothing could time them at load (no GPU outside a call)."""
    import time
    t0 = time.perf_counter()
    made = capture_for_run(pair.target, pair.draft, end)
    t1 = time.perf_counter()
    pair.costs = timed(pair.target, pair.draft, pair.costs)
    return made, t1 - t0, time.perf_counter() - t1


def capture_for_run(target, draft, end: int) -> int:
    """Capture what one run up to position `end` replays: the target's forwards of every verify size
    (so that v(k) can be timed on them) in its two caches, the draft's 1- and 2-row feeds in its one,
    over the spans up to `end` -> the graphs captured; the device idle when it returns, so no clock
    holds a capture."""
    from ..engine.backends.graphs import SIZES
    from ..engine.forward import cache_kind
    from ..engine.kvcache import backend
    if draft is target:  # the target as its own draft: one model, its sizes and a third cache
        return _idle(target, backend(target).prepare(target, BASELINE_CACHES + DRAFT_CACHES, SIZES, end))
    made = backend(target).prepare(target, BASELINE_CACHES, SIZES, end)
    if draft is not None and cache_kind(draft)[0] == "graphs":
        made += backend(draft).prepare(draft, DRAFT_CACHES, (1, 2), end)
    return _idle(target, made)


def _idle(target, made: int) -> int:
    """made, once the device has done the captures' work (no clock after this holds any of it)."""
    import torch
    device = next(target.parameters()).device
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return made


def _device_works(device) -> bool:
    import torch
    try:
        if getattr(device, "type", "") == "cuda":
            torch.cuda.empty_cache()  # what the failed capture held
            torch.ones(1, device=device).add_(1).item()
            torch.cuda.synchronize(device)
        return True
    except Exception:  # noqa: BLE001 - the answer is no
        return False


def recommendation(costs) -> str:
    """The method this card's measured costs recommend, and why (engine/theory.recommend)."""
    from ..engine.theory import recommend, verify_curve
    method, why = recommend(costs.c, verify_curve(costs))
    return f"recommended here: {method} ({why})"
