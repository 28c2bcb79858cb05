"""The static cache's step under torch.compile: mode "reduce-overhead" on CUDA (CUDA graphs:
eager batch-1 decoding is launch-bound), inductor's default on a CPU. Forwards of more than the
Runtime's `rows` new tokens, the prompt's, and any the compiler refused run as static.py's."""
from __future__ import annotations

import warnings

import torch

from ..cpu.lowbit import lowbit_format
from ..cpu.speed import has_int8
from ..gpu.static import StaticKV
from .base import runtime
from .static import Static, call, inputs

TRACEABLE = ("w4", "w8", "w4a8")  # low-bit formats dynamo traces: aten kernels, or a custom op (qgemm)


class Compiled(Static):
    name = "static"

    def __init__(self, build=None):
        super().__init__()
        self.build = build or compiled_call  # model -> its compiled call, or None (cannot compile)

    def new_cache(self, model, capacity: int = 1024):
        rt = runtime(model)
        return StaticKV(capacity, full=rt.masked, compiled=self.build(model), rows=rt.rows, backend=self)

    def forward(self, model, ids: list[int], cache, keep: int):
        # the prompt's forward (pos 0) runs eagerly: a graph per prompt length is not worth compiling
        if cache.compiled is None or cache.pos == 0 or len(ids) > cache.rows:
            return Static.forward(self, model, ids, cache, keep)
        p = cache.pos
        if not cache.keys:
            cache.allocate(model)
        cache.reserve(p + len(ids))
        x, pos_ids, mask = inputs(model, ids, cache)
        try:
            logits = _compiled_step(cache.compiled, model, x, pos_ids, mask, cache, keep)
        except Exception as err:  # a backend that cannot compile this model (e.g. int8 weights)
            # the failed call wrote nothing past what the eager call rewrites: run eagerly from now on
            warnings.warn(f"torch.compile failed ({type(err).__name__}: {err}); running eagerly",
                          stacklevel=3)
            cache.compiled, runtime(model).compiled = None, False
            logits = call(model, x, pos_ids, mask, cache, keep)
        cache.pos = p + len(ids)
        return logits[0, -keep:]


def _compiled_step(fn, model, x, pos_ids, mask, cache, keep):
    # one graph for n = 1 and one shape-generic graph for n >= 2 (verify, a draft's 2-token feed);
    # all n logits are computed so that `keep` adds no graph
    if x.shape[1] > 1:
        for t, dim in ((x, 1), (pos_ids, 1), (mask, 2), (cache.write_pos, 0)):
            torch._dynamo.mark_dynamic(t, dim)
    return fn(model, x, pos_ids, mask, cache, 0)


def compiled_call(model):
    """The model's forward under torch.compile, built once per model and reused by every run
    (None where it cannot compile)."""
    rt = runtime(model)
    fn = rt.compiled
    if fn is False:  # failed before: eager
        return None
    if fn is None and (has_int8(model) or lowbit_format(model) not in (None, *TRACEABLE)):
        # torch.ao's dynamic int8 Linear breaks the graph inside every attention block; the resumed
        # frames specialise on layer_idx and hit dynamo's recompile limit (measured on the 0.5B
        # int8 draft: 32 recompiles, then eager anyway, after minutes of compiling); w8a8 and w16
        # call fbgemm's prepacked kernels, which dynamo cannot trace either
        rt.compiled = False
        return None
    if fn is None:
        _inductor_cache_per_class()
        # target and draft share call's code object, so their graphs share one recompile budget
        cfg = torch._dynamo.config
        name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
        setattr(cfg, name, max(getattr(cfg, name), 32))
        mode = "reduce-overhead" if model.device.type == "cuda" else None
        fn = torch.compile(call, mode=mode, dynamic=rt.dynamic)
        rt.compiled = fn
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


def inductor(fn):
    """fn under torch.compile (inductor, static shapes: one compile per row count and model), for
    engine/gpu/static.py's graphs, which are ours (so no "reduce-overhead")."""
    cfg = torch._dynamo.config
    name = "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"
    setattr(cfg, name, max(getattr(cfg, name), 64))  # row counts x models x caches
    return torch.compile(fn, dynamic=False)
