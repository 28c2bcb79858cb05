"""Which forward backend serves a model, chosen once per model and cache kind, and the static KV
cache's names for the code that reads them (engine/backends/: one file per backend).

set_cache (engine/forward.py) chooses the backend that makes the model's new caches and serves
them (choose); a cache of ours names its backend, so a forward asks nothing of the model but
which backend its cache has (serving), and a DynamicCache is served by the backend held in the
model's Runtime. Backends: eager.py (transformers over a DynamicCache), lean.py (the Llama
family's lean forward and C layer stack over one), static.py (the static cache, eager),
compiled.py (its step under torch.compile), graphs.py (a GPU's static cache as CUDA graphs).
"""
from __future__ import annotations

from .backends.base import _RUNTIME, COMPILE_MAX_NEW, Backend, Runtime, runtime
from .backends.compiled import TRACEABLE, Compiled, _inductor_cache_per_class, compiled_call
from .backends.eager import Eager
from .backends.graphs import SIZES as GRAPH_SIZES
from .backends.graphs import Graphs
from .backends.lean import Lean
from .backends.static import Static, causal_mask
from .cpu import lean
from .cpu.rowwise_attention import NAME as ROWWISE
from .gpu.static import GROW, StaticKV

__all__ = ["COMPILE_MAX_NEW", "GROW", "TRACEABLE", "Backend", "Runtime", "StaticKV",
           "_inductor_cache_per_class", "backend", "causal_mask", "choose", "compiled_call", "runtime",
           "serving", "static_forward", "supported", "dynamic_backend"]


def supported(model) -> bool:
    """Full attention everywhere (no sliding-window layers) with an implementation we can mask."""
    cfg = model.config
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    # row-wise attention (engine/cpu/rowwise_attention.py) is SDPA row by row; it reads float masks too
    return types == {"full_attention"} and impl in ("sdpa", "eager", ROWWISE)


def _on_dynamic(model, rt: Runtime) -> Backend:
    if rt.on_dynamic is None:
        rt.on_dynamic = Lean() if lean.supported(model) else Eager()
    return rt.on_dynamic


def choose(model, kind: str, compile: bool, masked: bool) -> Backend:
    """The model's backend for caches of `kind` ("dynamic" | "static" | "graphs"), held in its Runtime
    with the settings it reads (the caller checked that the cache kind serves this model)."""
    rt = runtime(model)
    rt.cache, rt.compile, rt.masked = kind, compile, masked
    if kind == "dynamic":
        rt.backend = _on_dynamic(model, rt)
    elif kind == "graphs":
        rt.backend, rt.sizes = Graphs(), GRAPH_SIZES
    else:
        rt.backend = Compiled(compiled_call) if compile else Static()  # the name here: tests replace it
    return rt.backend


def dynamic_backend(model) -> Backend:
    """The backend that serves the model's DynamicCaches (whatever cache kind was chosen)."""
    return _on_dynamic(model, runtime(model))


def backend(model) -> Backend:
    """The backend set_cache chose for `model` (its dynamic-cache one if none was chosen)."""
    rt = runtime(model)
    return rt.backend or _on_dynamic(model, rt)


def serving(model, cache) -> Backend:
    """The backend that serves `cache` for `model`: the one named on the cache, else the model's
    dynamic-cache backend. One attribute read per forward on a cache of ours."""
    b = getattr(cache, "backend", None)
    if b is not None:
        return b
    if isinstance(cache, StaticKV):  # made outside new_cache: bound to a backend at its first forward
        b = cache.backend = Compiled() if cache.compiled is not None else Static()
        return b
    rt = _RUNTIME.get(model)
    if rt is not None and rt.on_dynamic is not None:
        return rt.on_dynamic
    return _on_dynamic(model, runtime(model))


def static_forward(model, ids: list[int], cache: StaticKV, keep: int):
    """One forward of `ids` at positions pos..pos+n-1 of a static cache; the last `keep` rows of logits."""
    return serving(model, cache).forward(model, ids, cache, keep)
