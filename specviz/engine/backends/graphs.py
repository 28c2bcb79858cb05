"""A GPU's static cache with its forwards replayed as captured CUDA graphs: engine/gpu/ (StaticModel,
GraphCache; plain torch.cuda.CUDAGraph, no torch.compile, so ZeroGPU can run it too). Chosen with
set_cache(model, "graphs") for a Llama-family model (the page's default on CUDA: run/flags.py); on a
CPU the same forwards run eagerly over the same cache (the exactness tests). A forward of n rows runs
in the smallest captured size >= n, padded (the Runtime's `sizes`); longer ones (a prompt) eagerly.

Caches are pooled per model: a run's cache goes back to the pool when the run drops it, and the next
run reuses its buffers and captured graphs, so only the first runs (or prewarm(), at load) capture.
A race holds two target caches at once (baseline and verify), each its own StaticModel with its
own capture stream (gpu/static.py says why).
Chain forwards only: a token tree's masked forward and kept slots need the DynamicCache (tree and
lookahead engines make their own; self-speculation gets one: decoding.py), and the cache holds
`capacity` positions (graphs read fixed buffers: it never grows)."""
from __future__ import annotations

import weakref

from ...machine import Lock
from ..gpu.cache import GraphCache
from ..gpu.static import StaticModel
from .base import Backend, runtime
from .compiled import inductor

# positions every graph cache holds: the page's longest prompt (2048) + its most new tokens (512)
# + a verify's rows past the end, rounded to 16 (attention reads the whole buffer under a mask:
# 2592 positions of the 1.5B's KV: 76 MB a step, 2.5 % of its 3.1 GB of weights)
CAPACITY = 2592
SIZES = (1, 2, 4, 8, 17)  # verify rows padded up (17: γ 16): v(k) is flat on a GPU (H100 v(8)/v(5) 1.002)


class Graphs(Backend):
    name = "graphs"

    def __init__(self):
        self.pool: list[StaticModel] = []
        self.lock = Lock()  # two sides of a parallel race take caches at once
        self.upto: int | None = None  # prepare()'s last position: a cache made later captures no further

    def _take(self, model, capacity: int) -> StaticModel:
        with self.lock:
            for i, sm in enumerate(self.pool):
                if sm.max_len >= capacity:
                    return self.pool.pop(i)
        compile = inductor if runtime(model).compile else None
        return self._limit(StaticModel(model, max(capacity, CAPACITY), weak=True, compile=compile))

    def _limit(self, sm: StaticModel) -> StaticModel:
        """sm capturing no span past prepare()'s last position (none set: every span)."""
        if self.upto is not None:
            sm.capture_upto = sm.span_for(min(self.upto, sm.max_len))
        return sm

    def _give(self, sm: StaticModel) -> None:
        with self.lock:
            self.pool.append(sm)

    def new_cache(self, model, capacity: int = 1024):
        cache = GraphCache(self._take(model, capacity), sizes=runtime(model).sizes)
        cache.backend = self
        weakref.finalize(cache, self._give, cache.static)  # back to the pool when the run drops it
        return cache

    def prewarm(self, model, caches: int) -> None:
        """Capture `caches` caches' graphs now (at load), so that no run's timing holds a capture."""
        made = [self.new_cache(model) for _ in range(max(0, caches - len(self.pool)))]
        del made  # each returns to the pool

    def prepare(self, model, caches: int, sizes, end: int) -> int:
        """Capture now what one run reaching position `end` replays: graphs of `sizes` rows over the
        spans up to `end`, in `caches` caches (then pooled for the run) -> the graphs captured. Why:
        ZeroGPU runs each GPU call in a freshly forked process, which graphs captured at load never
        reach; captured here, inside the call and before the race's clocks, no side's time holds a
        capture. Forwards of other sizes, or past `end`, run eagerly (correct, slower)."""
        runtime(model).sizes, self.upto = tuple(sorted(set(sizes))), end
        taken = [self._take(model, end) for _ in range(caches)]
        before = sum(len(sm.graphs) for sm in taken)
        for sm in taken:
            self._limit(sm)  # a pooled cache too, whatever an earlier call had set
            for n in runtime(model).sizes:
                sm.capture(n)
        made = sum(len(sm.graphs) for sm in taken) - before
        for sm in taken:
            self._give(sm)
        return made

    def forward(self, model, ids: list[int], cache, keep: int):
        return cache.forward(ids, keep)

    def forward_masked(self, model, ids, positions, bias, cache, keep):
        raise NotImplementedError("the graph cache runs chain forwards only (tree methods: a dynamic cache)")
