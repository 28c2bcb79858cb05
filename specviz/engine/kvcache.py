"""A static (preallocated) KV cache, as gpt-fast keeps one, and its forward.

Every layer's keys and values live in one buffer of `capacity` positions,
written in place. The cache holds positions [0, pos); rolling back after a
rejection is moving `pos` back: the stale entries past it are never attended
to (sliced away, or masked out by the causal mask) and are overwritten by the
next forward. Nothing is reallocated per step, unlike DynamicCache's cat.

Two layouts of the same cache:
- eager (`full=False`): attention reads the valid prefix k[:, :, :pos+n];
- compiled (`full=True`): attention reads the whole buffer under a mask, so
  every shape is fixed and `torch.compile` (CUDA graphs on a GPU) sees the
  same graph at every step; only the number of new tokens n varies.

The model is called with explicit position_ids and a prepared mask dict, so
the transformers versions we support (5.17 .. 5.23) only ever call
`update(k, v, layer_idx, ...)` on this object.
"""
from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import torch

from .cpu import lean_forward
from .cpu.lowbit import lowbit_format
from .cpu.rowwise_attention import NAME as ROWWISE
from .cpu.speed import has_int8

GROW = 512  # positions added when a run outgrows the buffer (a compiled graph then recompiles once)
# forwards of more new tokens (the prompt) run eagerly: one graph per prompt length otherwise
COMPILE_MAX_NEW = 32
TRACEABLE = ("w4", "w8", "w4a8")  # low-bit formats dynamo traces: aten kernels, or a custom op (qgemm)


@dataclass
class Runtime:
    """What SpecViz keeps per loaded model: the KV cache every engine builds for it
    (forward.set_cache) and its compiled forward. Held beside the model, in a weak
    map, never as attributes stuck onto a torch module we don't own."""

    cache: str = "dynamic"
    compile: bool = False
    masked: bool = False  # attend over the whole buffer under a mask (the compiled layout)
    compiled: object = None  # None: not built yet; False: cannot compile (eager); else the compiled call
    rows: int = COMPILE_MAX_NEW  # forwards of at most this many new tokens run compiled
    dynamic: bool | None = None  # torch.compile's `dynamic` (True: one shape-generic graph)


_RUNTIME: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runtime(model) -> Runtime:
    """The model's Runtime (a fresh default one the first time)."""
    rt = _RUNTIME.get(model)
    if rt is None:
        rt = _RUNTIME[model] = Runtime()
    return rt


def supported(model) -> bool:
    """Full attention everywhere (no sliding-window layers) with an implementation we can mask."""
    cfg = model.config
    impl = getattr(cfg, "_attn_implementation", None) or "eager"
    types = set(getattr(cfg, "layer_types", None) or ["full_attention"])
    # row-wise attention (engine/cpu/rowwise_attention.py) is SDPA row by row; it reads float masks too
    return types == {"full_attention"} and impl in ("sdpa", "eager", ROWWISE)


class StaticKV:
    """Preallocated per-layer K/V buffers and a position pointer (see module doc)."""

    is_compileable = True
    is_sliding = False

    def __init__(self, capacity: int = 1024, *, full: bool = False, compiled=None,
                 rows: int = COMPILE_MAX_NEW):
        self.capacity = capacity
        self.full = full
        self.compiled = compiled  # torch.compile'd forward, or None
        self.rows = rows  # forwards of at most this many new tokens take the compiled call
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


def _mask(model, p: int, n: int, kv_len: int, device) -> torch.Tensor | None:
    """Query i (position p+i) sees keys 0..p+i: the causal mask, which also hides
    every stale entry past the pointer."""
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


causal_mask = _mask  # engine/layers.py runs a target's layers over the same cache


def _call(model, x, pos_ids, mask, cache, keep):
    # Qwen2-style models take a mask per layer type; Llama/Mistral (5.23) a prepared 4D tensor,
    # which they pass through (a dict there raises AttributeError)
    if hasattr(model.config, "layer_types"):
        mask = {"full_attention": mask}
    elif mask is None:
        mask = torch.ones((1, 1, x.shape[1], cache.pos + x.shape[1]), dtype=torch.bool, device=x.device)
    return model(input_ids=x, position_ids=pos_ids, attention_mask=mask,
                 past_key_values=cache, use_cache=True, logits_to_keep=keep).logits


def _compiled_step(fn, model, x, pos_ids, mask, cache, keep):
    # one graph for n = 1 and one shape-generic graph for n >= 2 (verify, a draft's 2-token feed);
    # all n logits are computed so that `keep` adds no graph
    if x.shape[1] > 1:
        for t, dim in ((x, 1), (pos_ids, 1), (mask, 2), (cache.write_pos, 0)):
            torch._dynamo.mark_dynamic(t, dim)
    return fn(model, x, pos_ids, mask, cache, 0)


def static_forward(model, ids: list[int], cache: StaticKV, keep: int) -> torch.Tensor:
    """One forward of `ids` at positions pos..pos+n-1; returns the last `keep` rows of logits."""
    n, p, dev = len(ids), cache.pos, model.device
    if not cache.keys:
        cache.allocate(model)
    cache.reserve(p + n)
    x = torch.tensor([ids], device=dev)
    pos_ids = torch.arange(p, p + n, device=dev)
    kv_len = cache.capacity if cache.full else p + n
    mask = _mask(model, p, n, kv_len, dev)
    cache.write_pos = pos_ids
    # the prompt's forward (p == 0) runs eagerly: a graph per prompt length is not worth compiling
    if cache.compiled is not None and p > 0 and n <= cache.rows:
        try:
            logits = _compiled_step(cache.compiled, model, x, pos_ids[None], mask, cache, keep)
        except Exception as err:  # a backend that cannot compile this model (e.g. int8 weights)
            # the failed call wrote nothing past what the eager call rewrites: run eagerly from now on
            warnings.warn(f"torch.compile failed ({type(err).__name__}: {err}); running eagerly",
                          stacklevel=2)
            cache.compiled, runtime(model).compiled = None, False
            logits = _call(model, x, pos_ids[None], mask, cache, keep)
    elif not cache.full and lean_forward.eligible(model, n):  # same bits, less Python
        logits = lean_forward.forward(model, ids, cache, keep)
    else:
        logits = _call(model, x, pos_ids[None], mask, cache, keep)
    cache.pos = p + n
    return logits[0, -keep:]


def compiled_call(model):
    """The model's forward under torch.compile, built once per model and reused by every run.
    On CUDA, mode "reduce-overhead" replays CUDA graphs (eager batch-1 decoding is launch-bound)."""
    fn = runtime(model).compiled
    if fn is False:  # failed before: eager
        return None
    if fn is None and (has_int8(model) or lowbit_format(model) not in (None, *TRACEABLE)):
        # torch.ao's dynamic int8 Linear breaks the graph inside every attention block; the resumed
        # frames specialise on layer_idx and hit dynamo's recompile limit (measured on the 0.5B
        # int8 draft: 32 recompiles, then eager anyway, after minutes of compiling); w8a8 and w16
        # call fbgemm's prepacked kernels, which dynamo cannot trace either
        runtime(model).compiled = False
        return None
    if fn is None:
        _inductor_cache_per_class()
        # target and draft share _call's code object, so their graphs share one recompile budget
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), 32))
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        fn = torch.compile(_call, mode=mode, dynamic=runtime(model).dynamic)
        runtime(model).compiled = fn
    return fn


def _inductor_cache_per_class() -> None:
    """Compiled kernels cached per CPU class: TORCHINDUCTOR_CACHE_DIR becomes <root>/<torch>-<class>,
    root being the directory the user set or else inductor's default (/tmp/torchinductor_<user>).

    Why: inductor's FX graph cache key holds no CPU ISA (torch 2.13: no vec ISA in
    FxGraphHashDetails, its system info is CUDA's), but the generated kernels hard-code the
    vector width (AVX-512: loops step 16 floats). Reused under ATEN_CPU_CAPABILITY=avx2 they are
    rebuilt against an 8-float Vectorized: wrong tokens or a segfault (docs/why.md#inductor-isa).
    The class directory a parent
    process chose is not a user's choice: a child run under another capability (test_portable's
    emulated AVX2 inherits the xdist worker's environment, .../2.13.0_cpu-AVX512 once any test of
    that worker compiled) takes its own class beside it, not the parent's."""
    import os

    try:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir
    except ImportError:  # another torch layout: leave inductor's choice alone
        return
    prefix = f"{torch.__version__}-".replace("+", "_")
    tag = prefix + torch.backends.cpu.get_cpu_capability()
    # importing transformers already set the variable to the default: the root, as is unset
    current = os.path.abspath(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or default_cache_dir())
    root = os.path.dirname(current) if os.path.basename(current).startswith(prefix) else current
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, tag)
