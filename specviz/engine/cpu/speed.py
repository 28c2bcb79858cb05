"""Speed tricks for the decoding hot path. Each one is applied to the model
objects, so the baseline and the speculative engine get it alike.

CPU: with fp32 weights, torch's F.linear on 2..32 input rows (what verifying
γ drafts needs) runs 2-3x slower than on one row, although the weights are
read once either way; computing `W @ x.T` instead takes the fast path for
those shapes (measured in ../shared/models.md and docs/benchmarks.md).
"""
from __future__ import annotations

import contextlib
from types import MethodType

import torch
import torch.nn.functional as F

from . import qgemm

SMALL_M = 32  # above this, F.linear's own kernel is as good


def _linear_small_m(self, x: torch.Tensor) -> torch.Tensor:
    m = x.numel() // x.shape[-1]
    if 2 <= m <= SMALL_M and x.device.type == "cpu" and x.dtype == torch.float32:
        # x must be row-major for x.T to hit the fast kernel: an upstream
        # transposed output would silently send W @ x.T down the slow path (3x)
        y = (self.weight @ x.reshape(m, x.shape[-1]).contiguous().T).T.contiguous()
        if self.bias is not None:
            y += self.bias
        return y.reshape(*x.shape[:-1], y.shape[-1])
    return F.linear(x, self.weight, self.bias)


def patch_small_m_linear(model: torch.nn.Module) -> int:
    """Route every nn.Linear of a CPU fp32 model through the small-M path.
    Returns how many layers were patched (0 on GPU or other dtypes)."""
    n = 0
    for mod in model.modules():
        if type(mod) is torch.nn.Linear and mod.weight.device.type == "cpu" \
                and mod.weight.dtype == torch.float32:
            mod.forward = MethodType(_linear_small_m, mod)
            n += 1
    return n


@contextlib.contextmanager
def unpatched(*models: torch.nn.Module):
    """Temporarily give patched Linears back their stock forward (the bench's
    "as shipped" Hugging Face reference)."""
    undone = []
    for model in models:
        for mod in model.modules():
            fwd = mod.__dict__.get("forward")
            if getattr(fwd, "__func__", None) is _linear_small_m:
                del mod.forward
                undone.append((mod, fwd))
    try:
        yield len(undone)
    finally:
        for mod, fwd in undone:
            mod.forward = fwd


def quantize_int8(model: torch.nn.Module, inplace: bool = False) -> torch.nn.Module:
    """Dynamic int8 weights for every Linear (CPU only). This makes a different
    model from the fp32 one: use it for both sides, and say so in the UI.

    torch.ao (deprecated) rather than torchao's Int8DynamicActivationInt8WeightConfig:
    on this CPU the 0.5B draft's 1-token forward took 1.47 s vs 2.40 s (median of 12
    interleaved, machine at load 17) and a 5-token forward 1.8 s vs 5.0 s."""
    from torch.ao.quantization import quantize_dynamic
    return quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=inplace)


def kernel_note(*models: torch.nn.Module | None) -> str:
    """'; kernel neon-i8mm (OpenMP)' where a model runs on our block-quantised kernel (else ''): the
    page's precision line names the variant that computes it (x86 or Arm, and on Arm its threads)."""
    if not any(isinstance(m, qgemm.BlockLinear) for model in models if isinstance(model, torch.nn.Module)
               for m in model.modules()):
        return ""
    return f"; kernel {qgemm.describe()}"


def has_int8(model: torch.nn.Module) -> bool:
    """Whether quantize_int8 (or an int8 load) swapped any Linear of this model."""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear
    return any(isinstance(m, DynamicInt8Linear) for m in model.modules())


@torch.inference_mode()
def warm_up(model: torch.nn.Module) -> None:
    """Run the shapes decoding uses once, untimed: the first forwards of a
    freshly loaded model pay page faults and kernel set-up, and whichever side
    of a race ran first would otherwise be charged for them."""
    from transformers import DynamicCache
    dev = next((p.device for p in model.parameters()), torch.device("cpu"))
    cache = DynamicCache()
    for n in (8, 1, 5):  # prefill, a plain step, a verify-sized step
        ids = torch.zeros((1, n), dtype=torch.long, device=dev)
        model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=n)
