"""What every forward backend provides, and the Runtime a model's backend is held in.

A backend holds no reference to its model (the Runtime map is weak: a value that held its key
would keep every model alive); each method takes the model. It holds what it decided about the
model once (which path serves, up to how many rows) and re-checks per call only what can change.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from ..cpu.rowwise_attention import is_rowwise
from ..gpu.static import COMPILE_MAX_NEW


@dataclass
class Runtime:
    """What SpecViz keeps per loaded model: the KV cache every engine builds for it
    (forward.set_cache), the backend that serves it, and its compiled forward. Held beside the
    model, in a weak map, never as attributes stuck onto a torch module we don't own."""

    cache: str = "dynamic"
    compile: bool = False
    masked: bool = False  # attend over the whole buffer under a mask (the compiled layout)
    compiled: object = None  # None: not built yet; False: cannot compile (eager); else the compiled call
    rows: int = COMPILE_MAX_NEW  # forwards of at most this many new tokens run compiled
    dynamic: bool | None = None  # torch.compile's `dynamic` (True: one shape-generic graph)
    sizes: tuple = (1,)  # row counts the graph cache captures (the step; γ+1 for a verify: graphs.py)
    backend: Backend | None = None  # the backend set_cache chose (it makes new caches); None: not yet
    on_dynamic: Backend | None = None  # the backend that serves a DynamicCache of this model


_RUNTIME: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def runtime(model) -> Runtime:
    """The model's Runtime (a fresh default one the first time)."""
    rt = _RUNTIME.get(model)
    if rt is None:
        rt = _RUNTIME[model] = Runtime()
    return rt


class Backend:
    """One way to run a model's KV-cached forward over one kind of cache.

    Its caches answer get_seq_length() and crop(length) (transformers' convention: a negative
    length removes that many), which is all a rollback needs (forward.crop_cache); a cache class
    of ours names its backend (`cache.backend`), a transformers DynamicCache is served by the
    model's Runtime.on_dynamic."""

    name = "dynamic"  # the cache kind it serves, as set_cache reports it

    def new_cache(self, model, capacity: int = 1024):
        raise NotImplementedError

    def forward(self, model, ids: list[int], cache, keep: int):
        """One forward of `ids` at the cache's next positions: logits of the last `keep` rows,
        (keep, vocab) in the model's dtype."""
        raise NotImplementedError

    def forward_masked(self, model, ids: list[int], positions: list[int], bias, cache, keep: int):
        """One forward with explicit positions and an additive 4D bias (forward.masked_forward):
        float logits of the last `keep` inputs."""
        raise NotImplementedError

    def keep_slots(self, cache, prefix: int, slots: list[int]) -> None:
        """Keep cache positions [0, prefix) and `slots` (forward.keep_cache_slots)."""
        raise NotImplementedError(f"{type(self).__name__} keeps no slots")

    def rows_exact(self, model, n: int) -> bool:
        """Whether an n-row chain forward gives each row the bits it would get alone."""
        return False

    def keys(self, model, ids: list[int], cache) -> None:
        """Write the keys and values of `ids` (its output is not read)."""
        self.forward(model, ids, cache, 1)

    def context_apart(self, model, cache, ids: list[int], keep: int, causal: bool = False) -> list[int]:
        """Row-exact targets (w8a8 with row-wise attention): the rows before the `keep` read ones
        (the prompt, in a run's first forward) get a forward of their own, the one plain decoding's
        prefill makes, so both runs hold bit-identical KV for them; returns the ids left to feed.
        Why: one forward of prompt + drafts computed the prompt's KV in another shape, which flipped
        a 7-bit activation code; greedy on the chat preset then differed at token 12 (gap 0.85).
        causal (a chain forward follows): not where the C layer stack reads every row, whose bits
        never depend on the shape; there the split cost a whole step and an output layer per prompt
        (docs/why.md#prompt-whole)."""
        n = len(ids) - keep
        if n <= 0 or not is_rowwise(model):
            return ids
        if causal and self.rows_exact(model, len(ids)):
            return ids
        self.keys(model, ids[:n], cache)  # one call for the whole context, as plain decoding's prefill
        return ids[n:]
