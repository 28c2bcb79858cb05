"""Model-forward helpers shared by the decoding engines and the proposers:
one KV-cached forward, cache rollback, and drawing a token from a distribution.
Each forward goes to the backend that serves its cache, chosen once per model and cache kind
(engine/kvcache.py, engine/backends/): these functions ask nothing else per call."""
from __future__ import annotations

import torch

from . import kvcache
from .backends.eager import keep_slots
from .gpu.static import supported as graph_supported
from .kvcache import serving
from .sampling import SamplingParams, sample

CACHES = ("dynamic", "static", "graphs")  # graphs: engine/backends/graphs.py (a GPU's; eager on a CPU)


def pick(probs: torch.Tensor, params: SamplingParams, generator) -> int:
    # greedy: argmax of a one-hot, without touching the RNG
    if params.greedy:
        return int(probs.argmax())
    return int(sample(probs, generator))


def forward_logits(model, ids: list[int], cache, keep: int, *, exact: bool = True) -> torch.Tensor:
    """One KV-cached forward of `ids`; returns float logits of the last `keep` positions, through the
    backend that serves the cache (chosen once: kvcache.choose).
    exact=False (a draft: nothing depends on its bits but its own q, recorded as computed) skips
    context_apart: a draft's two-token feed after a bonus round is one forward, not two
    (docs/why.md#draft-inexact)."""
    b = serving(model, cache)
    if exact and len(ids) > keep:
        ids = b.context_apart(model, cache, ids, keep, True)
    return b.forward(model, ids, cache, keep)


def context_apart(model, cache, ids: list[int], keep: int, *, causal: bool = False) -> list[int]:
    """Row-exact targets: the rows before the `keep` read ones get a forward of their own, the one
    plain decoding's prefill makes; returns the ids left to feed (backends.base.Backend.context_apart
    says why, and where a causal forward needs no split)."""
    return serving(model, cache).context_apart(model, cache, ids, keep, causal)


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of a KV cache.

    A negative argument means "remove that many" in every transformers version
    we support (newer ones refuse a positive absolute length)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def set_cache(model, kind: str = "dynamic", *, compile: bool = False, masked: bool | None = None) -> str:
    """Choose the KV cache every engine builds for `model` (baseline, verify and
    draft alike, so a speed trick reaches both sides), and with it the forward backend that serves
    it (kvcache.choose). Returns the kind in use:
    a model the static cache cannot serve (sliding windows, flash attention) stays dynamic.
    `masked`: attend over the whole buffer under a mask (the compiled layout; default: when compiled)."""
    if kind not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, not {kind!r}")
    if kind == "static" and not kvcache.supported(model) or kind == "graphs" and not graph_supported(model):
        kind, compile = "dynamic", False
    compile = compile and kind != "dynamic"
    # graphs: compile (inductor) runs inside the captured graphs (gpu/static.py); dynamic: never
    kvcache.choose(model, kind, compile, compile if masked is None else masked)
    return kind + (" + compile" if compile else "")


GRAPHS_PATH = "CUDA graphs"
EAGER_PATH = "eager (dynamic cache): a token tree's or a layer-by-layer forward is not a captured graph"


def on_graphs(cache) -> bool:
    """Whether `cache` is a graph cache (engine/backends/graphs.py)."""
    return getattr(getattr(cache, "backend", None), "name", "") == "graphs"


def path_extra(model, cache) -> dict:
    """A run summary's `extra` entry saying what its forwards ran on, where the model is on graphs
    (a GPU): GRAPHS_PATH, or EAGER_PATH for a run that made a dynamic cache instead; {} elsewhere
    (nothing to say, and a CPU's recorded streams stay as they were)."""
    if kvcache.runtime(model).cache != "graphs":
        return {}
    return {"path": GRAPHS_PATH if on_graphs(cache) else EAGER_PATH}


def cache_kind(model) -> tuple[str, bool, bool]:
    """(kind, compiled, masked layout)"""
    rt = kvcache.runtime(model)
    return rt.cache, rt.compile, rt.masked


def new_cache(model, capacity: int = 1024, *, dynamic: bool = False):
    """A fresh KV cache of the kind chosen with set_cache (DynamicCache by default); dynamic: a
    DynamicCache whatever was chosen (a run the graph cache cannot serve)."""
    b = kvcache.dynamic_backend(model) if dynamic else kvcache.backend(model)
    return b.new_cache(model, capacity)


def masked_forward(model, cache, *, ids: list[int], positions: list[int], bias: torch.Tensor,
                   keep: int) -> torch.Tensor:
    """One KV-cached forward with explicit positions and an additive 4D bias
    (0 = attend, dtype min = blocked); float logits of the last `keep` inputs.

    transformers 5.x passes a 4D attention mask through unchanged, and Qwen2/Llama take explicit
    position_ids, so tree and lookahead forwards need no patching (backends/eager.py). Where every
    layer is on the C kernels, the whole stack runs as one call instead (backends/lean.py: same bits)."""
    return serving(model, cache).forward_masked(model, ids, positions, bias, cache, keep)


def bias_of(allowed: torch.Tensor, n_past: int, dtype=torch.float32) -> torch.Tensor:
    """(1, 1, n, n_past + n) additive bias: every new token sees the cache, and
    new token j where allowed[i, j]."""
    n = allowed.shape[0]
    ok = torch.ones(n, n_past + n, dtype=torch.bool)
    ok[:, n_past:] = allowed
    bias = torch.zeros(n, n_past + n, dtype=dtype)
    bias.masked_fill_(~ok, torch.finfo(dtype).min)
    return bias[None, None]


def keep_cache_slots(cache, *, prefix: int, slots: list[int]) -> None:
    """Keep the first `prefix` cache positions followed by positions `slots`
    (absolute, increasing), and drop everything else: rejected nodes and guesses go."""
    b = getattr(cache, "backend", None)  # a cache of ours names its backend; a DynamicCache is eager's
    (b.keep_slots if b is not None else keep_slots)(cache, prefix, slots)
