"""A static (preallocated) KV cache, as gpt-fast keeps one, and its eager forward.

Every layer's keys and values live in one buffer of `capacity` positions,
written in place. The cache holds positions [0, pos); rolling back after a
rejection is moving `pos` back: the stale entries past it are never attended
to (sliced away, or masked out by the causal mask) and are overwritten by the
next forward. Nothing is reallocated per step, unlike DynamicCache's cat.

Two layouts of the same cache:
- eager (`full=False`): attention reads the valid prefix k[:, :, :pos+n];
- compiled (`full=True`): attention reads the whole buffer under a mask, so
  every shape is fixed and `torch.compile` (CUDA graphs on a GPU) sees the
  same graph at every step; only the number of new tokens n varies (compiled.py).

The model is called with explicit position_ids and a prepared mask dict, so
the transformers versions we support (5.17 .. 5.23) only ever call
`update(k, v, layer_idx, ...)` on this object. Where the lean forward serves (the eager
layout), it runs instead: the same bits, less Python (lean.py).
"""
from __future__ import annotations

import torch

from ..cpu import kernel_layer, lean_forward
from .base import COMPILE_MAX_NEW, runtime
from .lean import Lean

GROW = 512  # positions added when a run outgrows the buffer (a compiled graph then recompiles once)


class StaticKV:
    """Preallocated per-layer K/V buffers and a position pointer (see module doc)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int = 1024, *, full: bool = False, compiled=None,
                 rows: int = COMPILE_MAX_NEW, backend=None):
        self.capacity = capacity
        self.full = full
        self.compiled = compiled  # torch.compile'd forward, or None
        self.rows = rows  # forwards of at most this many new tokens take the compiled call
        self.backend = backend  # the backend that made it (None: bound at its first forward)
        self.pos = 0  # positions held
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.write_pos: torch.Tensor | None = None  # positions this forward writes (full layout)

    # ---- what the model calls
    def update(self, key, value, layer_idx, *args, **kwargs):
        k, v = self.keys[layer_idx], self.values[layer_idx]
        if self.full:
            k.index_copy_(2, self.write_pos, key)
            v.index_copy_(2, self.write_pos, value)
            return k, v
        end = self.pos + key.shape[-2]
        k[:, :, self.pos:end] = key
        v[:, :, self.pos:end] = value
        return k[:, :, :end], v[:, :, :end]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.pos

    def buffers(self):
        """(keys, values, pos) for a C forward that writes its new entries at pos in place
        (engine/cpu/kernel_layer.py); None in the masked layout, written at write_pos."""
        return None if self.full else (self.keys, self.values, self.pos)

    def crop(self, length: int) -> None:
        # transformers' convention: a negative length removes that many positions
        self.pos = min(self.pos, length if length >= 0 else max(0, self.pos + length))

    def reset(self) -> None:
        self.pos = 0

    # ---- our side
    def allocate(self, model) -> None:
        """The buffers, before the first forward (never inside a compiled graph)."""
        cfg = model.config
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        for _ in range(cfg.num_hidden_layers):
            for buf in (self.keys, self.values):
                buf.append(torch.zeros((1, heads, self.capacity, dim), dtype=model.dtype,
                                       device=model.device))
        if self.compiled is not None:
            _static_address(*self.keys, *self.values)

    def reserve(self, end: int) -> None:
        if end <= self.capacity:
            return
        new = max(end, self.capacity + GROW)
        for buf in (self.keys, self.values):
            for i, t in enumerate(buf):
                grown = t.new_zeros((*t.shape[:2], new, t.shape[-1]))
                grown[:, :, : self.pos] = t[:, :, : self.pos]
                buf[i] = grown
                if self.compiled is not None:
                    _static_address(grown)
        self.capacity = new


def _static_address(*tensors) -> None:
    # fixed data pointers: CUDA graphs replay without copying the buffers (as transformers' StaticLayer);
    # on a CPU nothing replays, and a static address would make a grown buffer recompile the graph
    if not torch.compiler.is_compiling():
        for t in tensors:
            if t.is_cuda:
                torch._dynamo.mark_static_address(t)


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
