"""The Pair protocol: what every model pair provides, and so what the engine, the run layer, the
page and the bench may read without asking. ModelPair (models/loading.py) and VllmPair
(hosting/vllm.py) provide it, and so must a test's fake: a field here is read as `pair.x`, never
through getattr with a default."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch

if TYPE_CHECKING:
    from .costs import CostModel

OURS = "specviz"  # Pair.engine of a pair this engine runs; another streams the same events itself


class Pair(Protocol):
    target: Any  # the target model, p
    draft: Any | None  # the draft model, q; None for draft-free methods (lookup, heads ...)
    tokenizer: Any  # the target's tokenizer (the draft shares its vocabulary)
    spec: Any  # models/registry.PairSpec: name, label, target and draft references
    device: torch.device
    dtype: torch.dtype  # the float type the models compute in
    eos_ids: list[int]
    precision_label: str  # what both sides run, measured ("int4 g32 weights, 8-bit per-block activations");
    # "precision" alone is what a user asks for (--precision auto|fp32|bf16|w4a8 ...)
    precision_note: str  # what runs and why, with the timings that chose it ("" if nothing was timed)
    quantize: str | None  # None, "int8" (both sides) or "draft-int8"
    costs: CostModel | None  # the measured plain step, v(k) and draft step; None: not timed
    calibration: str  # "": costs trusted; "untimed" or "noisy": the page recalibrates in the background
    note: str  # why this pair runs here (GPU placement, the engine), shown under the pair; "" if none
    unmeasured: tuple[str, ...]  # Stats fields this engine cannot measure: shown n/a, never 0
    baseline_pair: Pair | None  # the baseline side's own copy (two GPUs); None: this pair runs both
    draft_step: Any  # the draft's one-token step, eager or compiled (calibration/draft_compile.py)
    engine: str  # OURS, or another engine (vLLM) whose run_events() streams the same events

    @property
    def has_chat_template(self) -> bool: ...

    @property
    def max_positions(self) -> int | None: ...  # the target's context length, when known

    def run_events(self, req, side: str, prompt_ids, stop=None, clock=None) -> Iterator: ...  # engine != OURS

    def close(self) -> None: ...  # servers this pair started (vLLM); nothing for ours


def dtype_name(dtype) -> str:
    """torch.bfloat16 -> "bfloat16"."""
    return str(dtype).removeprefix("torch.")


def runs_as(pair: Pair) -> str:
    """What a pair computes in, as one label: its measured precision label, else its float type."""
    return pair.precision_label or dtype_name(pair.dtype)


def dtype_of(label: str) -> torch.dtype:
    """The float type a precision label's logits carry, where only the label is left (a trace's
    meta, a bench row): "torch.bfloat16", "bf16", "bfloat16 ..." -> torch.bfloat16; low-bit and
    int8 weights compute with fp32 activations -> torch.float32."""
    p = (label or "").replace("bf16", "bfloat16").replace("fp16", "float16")
    return next((d for d in (torch.bfloat16, torch.float16) if dtype_name(d) in p), torch.float32)
