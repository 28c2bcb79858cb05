"""The draft's one-token step under torch.compile on a CPU, kept only when it measures faster.

A small draft's CPU step is mostly not its weights: inductor fuses the norms, rotary and casts
between them and drops the Python around them (docs/why.md#draft-compile).

Only the draft, and only its one-token forward (the prompt and the odd two-token feed stay
eager): the draft's logits may move by rounding under compilation, and nothing depends on them
but its own proposals (q is recorded as computed; acceptance and resampling use that q).
The target stays eager and row-exact, so greedy speculative output is still plain greedy's.
Formats: w4 and w8 (aten kernels dynamo traces; kvcache.TRACEABLE). One shape-generic
graph (dynamic=True) over the growing KV length: with automatic dynamic shapes the second
step recompiled (20 s cold).
"""
from __future__ import annotations

import os
import statistics
import time
import weakref
from dataclasses import dataclass, replace

import torch

from ..engine import kvcache
from ..engine.cpu import kernel_layer
from ..engine.cpu.lowbit import lowbit_format
from ..engine.forward import cache_kind, forward_logits, new_cache, set_cache
from ..machine import pause_point

ENV = "SPECVIZ_DRAFT_COMPILE"  # 0: never
CONTEXT, STEPS = 32, 8
_DONE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> its DraftStep


@dataclass(frozen=True)
class DraftStep:
    """What load measured: the eager and compiled draft step, and which one runs."""

    compiled: bool
    eager_ms: float
    compiled_ms: float | None
    compile_s: float
    why: str = ""

    def note(self) -> str:
        if self.compiled_ms is None:
            return f"draft step eager ({self.why})"
        kept = "compiled" if self.compiled else "eager"
        return (f"draft step {kept}: {self.compiled_ms:.1f} ms compiled vs {self.eager_ms:.1f} ms eager "
                f"(compiling took {self.compile_s:.0f} s)")


def unwanted(draft) -> str | None:
    """Why the draft's step is not compiled here, or None."""
    if draft is None:
        return "no draft"
    if os.environ.get(ENV, "1") == "0":
        return f"{ENV}=0"
    if next(draft.parameters()).device.type != "cpu":
        return "not on a CPU (--compile covers GPUs)"
    if lowbit_format(draft) not in kvcache.TRACEABLE:
        return "its weight format does not trace"
    if kernel_layer.covers(draft):
        # nothing left to fuse: a graph splits each layer back into aten calls around the kernel's
        # custom op, and compiling lost (docs/why.md#draft-compile)
        return "its layers already run as kernel calls"
    if not kvcache.supported(draft):
        return "no static cache for this architecture"
    return None


@torch.inference_mode()
def step_ms(model, steps: int = STEPS, wait: bool = True) -> float:
    """Median ms of a one-token forward through the cache the engines build for `model`
    (the first two steps untimed: they compile, or page in)."""
    ids = torch.randint(0, 30000, (CONTEXT + steps + 2,), generator=torch.Generator().manual_seed(0)).tolist()
    ids = [i % model.get_input_embeddings().num_embeddings for i in ids]
    # a background calibration (ui/loader.py) loads through here: like its timed forwards, these
    # (and the compile they start) wait while a visitor's run goes, or stop at its budget
    pause = pause_point if wait else (lambda: None)
    cache = new_cache(model)
    pause()
    forward_logits(model, ids[:CONTEXT], cache, 1)
    times = []
    for i, t in enumerate(ids[CONTEXT:]):
        pause()
        t0 = time.perf_counter()
        forward_logits(model, [t], cache, 1)
        if i >= 2:
            times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def compile_draft(draft, progress=None, *, keep: str = "faster") -> DraftStep | None:
    """Compile the draft's one-token step when wanted, time it against the eager step and keep
    the faster (keep="compiled": keep it regardless, for tests); None when there is no draft."""
    why = unwanted(draft)
    if why is not None:
        return None if why == "no draft" else DraftStep(False, 0.0, None, 0.0, why)
    rt = kvcache.runtime(draft)
    if rt.rows == 1 and draft in _DONE:
        # compiled by the calibration's draft choice, its input table already the one it runs with
        # (lowbit.half_embeddings): time the compiled step again, so that anything load changed since
        # recompiles here, not in a visitor's first run. One cold compile instead of two: each takes
        # over a minute on 2 cores (docs/why.md#draft-compile).
        return replace(_DONE[draft], compiled_ms=step_ms(draft))
    if rt.rows == 1:  # compiled elsewhere: time both again
        _restore(draft, ("dynamic", False, False))
    before = cache_kind(draft)
    eager = step_ms(draft)
    if progress:
        progress("compiling the draft's step (torch.compile; cached after the first time)", 0.96)
    set_cache(draft, "static", compile=True, masked=False)
    rt.rows, rt.dynamic = 1, True
    pause_point()  # outside the try: a background calibration's stop is not a compile failure
    t0 = time.perf_counter()
    try:
        step_ms(draft, steps=1, wait=False)  # compiles
    except Exception as err:  # noqa: BLE001 - any compiler failure leaves the eager step
        rt.compiled = False
        why = f"compile failed: {type(err).__name__}"
    compile_s = time.perf_counter() - t0
    if rt.compiled is False:  # failed here, or static_forward fell back
        _restore(draft, before)
        return DraftStep(False, eager, None, compile_s, why or "compile failed")
    compiled = step_ms(draft)
    kept = compiled < eager or keep == "compiled"
    if not kept:
        _restore(draft, before)
        return DraftStep(False, eager, compiled, compile_s)
    _DONE[draft] = DraftStep(True, eager, compiled, compile_s)
    return _DONE[draft]


def _restore(model, kind: tuple[str, bool, bool]) -> None:
    set_cache(model, kind[0], compile=kind[1], masked=kind[2])
    rt = kvcache.runtime(model)
    rt.rows, rt.dynamic = kvcache.COMPILE_MAX_NEW, None
