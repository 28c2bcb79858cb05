"""The static KV cache (engine/gpu/static.py's StaticKV, the one the GPU's graph path runs over too)
served to transformers' models, eager: `model(...)` with explicit position_ids and a prepared mask,
so the transformers versions we support (5.17 .. 5.23) only ever call `update(k, v, layer_idx, ...)`
on it. Where the lean forward serves (the eager layout), it runs instead: the same bits, less
Python (lean.py). compiled.py runs its step under torch.compile (the masked layout).
"""
from __future__ import annotations

import torch

from ..cpu import kernel_layer, lean_forward
from ..gpu.static import StaticKV
from .base import runtime
from .lean import Lean


def causal_mask(model, p: int, n: int, kv_len: int, device) -> torch.Tensor | None:
    """Query i (position p+i) sees keys 0..p+i: the causal mask, which also hides
    every stale entry past the pointer (engine/layers.py runs a target's layers over it too)."""
    if n == 1 and kv_len == p + 1:
        return None  # the one query sees every key
    keys, queries = torch.arange(kv_len, device=device), torch.arange(p, p + n, device=device)
    allowed = keys[None, :] <= queries[:, None]
    allowed = allowed[None, None]
    if model.config._attn_implementation == "sdpa":
        return allowed
    dtype = model.dtype
    blocked = torch.zeros(allowed.shape, dtype=dtype, device=device)
    return blocked.masked_fill_(~allowed, torch.finfo(dtype).min)


def call(model, x, pos_ids, mask, cache, keep):
    """`model(...)` over a StaticKV (compiled.py compiles this very function)."""
    # Qwen2-style models take a mask per layer type; Llama/Mistral (5.23) a prepared 4D tensor,
    # which they pass through (a dict there raises AttributeError)
    if hasattr(model.config, "layer_types"):
        mask = {"full_attention": mask}
    elif mask is None:
        mask = torch.ones((1, 1, x.shape[1], cache.pos + x.shape[1]), dtype=torch.bool, device=x.device)
    return model(input_ids=x, position_ids=pos_ids, attention_mask=mask,
                 past_key_values=cache, use_cache=True, logits_to_keep=keep).logits


def inputs(model, ids: list[int], cache: StaticKV):
    """(x, position ids, mask) of a forward of `ids` at the cache's pointer; its write positions set."""
    n, p, dev = len(ids), cache.pos, model.device
    x = torch.tensor([ids], device=dev)
    pos_ids = torch.arange(p, p + n, device=dev)
    kv_len = cache.capacity if cache.full else p + n
    cache.write_pos = pos_ids
    return x, pos_ids[None], causal_mask(model, p, n, kv_len, dev)


class Static(Lean):
    """The static cache, eager: the lean forward where it serves (the eager layout), else
    `model(...)` with explicit positions and the causal mask. Masked forwards as lean.py's."""

    name = "static"

    def new_cache(self, model, capacity: int = 1024):
        rt = runtime(model)
        return StaticKV(capacity, full=rt.masked, rows=rt.rows, backend=self)

    def rows_exact(self, model, n: int) -> bool:
        return False  # the prompt is read apart from its last row (forward.context_apart)

    def keys(self, model, ids: list[int], cache) -> None:
        self.forward(model, ids, cache, 1)

    def forward(self, model, ids: list[int], cache, keep: int):
        """One forward of `ids` at positions pos..pos+n-1; the last `keep` rows of logits."""
        n, p = len(ids), cache.pos
        if not cache.keys:
            cache.allocate(model)
        cache.reserve(p + n)
        if self.epoch != kernel_layer.epoch():
            self.plan(model)
        if not cache.full and 0 < n <= self.rows and not (model._forward_hooks or model._forward_pre_hooks):
            # the lean forward: the same bits, less Python
            logits = lean_forward.run(model, ids, cache, keep, self.stack, self.joint)
        else:
            logits = call(model, *inputs(model, ids, cache), cache, keep)
        cache.pos = p + n
        return logits[0, -keep:]
