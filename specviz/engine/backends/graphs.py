"""A GPU's static cache with its forwards replayed as captured CUDA graphs: engine/gpu/ (StaticModel,
GraphCache; plain torch.cuda.CUDAGraph, no torch.compile, so ZeroGPU can run it too). Chosen with
set_cache(model, "graphs") for a Llama-family model; on a CPU the same forwards run eagerly over the
same cache (the exactness tests). A forward of n rows runs in the smallest captured size >= n,
padded (the Runtime's `sizes`: the step, and γ+1 for a verify); others run eagerly.
Chain forwards only: a token tree's masked forward and kept slots need the DynamicCache, and the
cache holds `capacity` positions (graphs read fixed buffers: it never grows).
Untested on a GPU as of 2026-11-27 (none lent yet)."""
from __future__ import annotations

from ..gpu.cache import GraphCache
from ..gpu.static import StaticModel
from .base import Backend, runtime


class Graphs(Backend):
    name = "graphs"

    def new_cache(self, model, capacity: int = 1024):
        cache = GraphCache(StaticModel(model, capacity), sizes=runtime(model).sizes)
        cache.backend = self
        return cache

    def forward(self, model, ids: list[int], cache, keep: int):
        return cache.forward(ids, keep)

    def forward_masked(self, model, ids, positions, bias, cache, keep):
        raise NotImplementedError("the graph cache runs chain forwards only (tree methods: a dynamic cache)")
