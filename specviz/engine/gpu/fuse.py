"""q/k/v as one matrix and gate/up as one, for StaticModel's forward (engine/gpu/static.py), in place
and without a second copy of the weights.

Why: a batch-1 decode step on a GPU is launch-bound for the default pair (the 1.5B's graph step ran
at 5.3x its bandwidth floor on an H200, the 0.5B's at 12x, 2026-11-28). Each layer ran seven
projections, each a kernel too small to fill the card; joined, it runs four, on bigger matrices.
gpt-fast joins q/k/v the same way (its `wqkv`). The projections' own weights become views of the
joined matrix, so memory does not grow and the model's eager forward reads the same numbers.

Fewer kernels again, without a compiler (ZeroGPU has none; the page's graphs run uncompiled):
q and k rotated as one tensor (engine/cpu/rotary.py: 4 kernels a layer where transformers' rotary
makes 10) and rms_norm() here, each norm as torch's rms_norm (one fused kernel on CUDA where
transformers' module makes eight), both giving transformers' bits on a CPU
(tests/test_gpu_graphs.py). Counted on a CPU as aten calls a layer (the 1.5B's architecture shrunk
to 4 layers, bf16, one row, the forward's own calls shared out): 45.5 unfolded, 37.8 folded; the
fused norm is CUDA's alone. Their time on a GPU: gpu-check's `fusion` (`joined_ms` against
`unfolded_ms`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

FLOAT = (torch.float16, torch.bfloat16, torch.float32)


@dataclass
class Fused:
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    sizes: list[int]
    gate_up: torch.Tensor | None = None  # None: the MLP runs as the model's own
    gate_up_bias: torch.Tensor | None = None


def _plain(layers) -> bool:
    # plain float Linears of one dtype and device, biases on all or none (quantised layers stay as
    # they are)
    first = layers[0].weight
    if first.device.type == "meta":  # offloaded (accelerate's hooks load it per call): left alone
        return False
    return all(type(lin) is nn.Linear and lin.weight.dtype in FLOAT and lin.weight.dtype == first.dtype
               and lin.weight.device == first.device for lin in layers) and \
        len({lin.bias is None for lin in layers}) == 1


def _join(layers) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One [sum(out), in] weight (and bias); each Linear's weight (and bias) becomes a view of it."""
    with torch.no_grad():
        weight = torch.cat([lin.weight for lin in layers])
        bias = None if layers[0].bias is None else torch.cat([lin.bias for lin in layers])
        start = 0
        for lin in layers:
            end = start + lin.out_features
            lin.weight = nn.Parameter(weight[start:end], requires_grad=False)
            if bias is not None:
                lin.bias = nn.Parameter(bias[start:end], requires_grad=False)
            start = end
    return weight, bias


def _still_joined(f: Fused | None, attn) -> bool:
    # a model moved or reloaded since (its weights replaced) is joined again
    return f is not None and attn.q_proj.weight.data_ptr() == f.qkv.data_ptr()


def fuse_layer(layer) -> Fused | None:
    """The layer's joined projections (joined once, then reused); None where they cannot be joined."""
    attn, mlp = layer.self_attn, layer.mlp
    done = getattr(attn, "_sv_fused", None)
    if _still_joined(done, attn):
        return done
    projs = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj")]
    if any(p is None for p in projs) or not _plain(projs):
        return None
    qkv, qkv_bias = _join(projs)
    fused = Fused(qkv, qkv_bias, [p.out_features for p in projs])
    gu = [getattr(mlp, n, None) for n in ("gate_proj", "up_proj")]
    if all(p is not None for p in gu) and hasattr(mlp, "down_proj") and hasattr(mlp, "act_fn") \
            and _plain(gu) and gu[0].out_features == gu[1].out_features:
        fused.gate_up, fused.gate_up_bias = _join(gu)
    attn._sv_fused = fused
    return fused


def fuse_projections(model, n_layers: int) -> list[Fused | None]:
    """Per layer (the first n_layers), its joined projections or None."""
    return [fuse_layer(layer) for layer in model.model.layers[:n_layers]]


# transformers' RMSNorm classes whose forward is w * (x32 * rsqrt(mean(x32²) + eps)).to(dtype)
RMS_NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")


def rms_norm(module, x: torch.Tensor) -> torch.Tensor:
    """module(x) for a standard RMSNorm in 4 kernels instead of 8: torch's rms_norm in float (on
    CUDA one fused kernel; on a CPU the same pow, mean, add, rsqrt and mul as transformers', so the
    same bits), then the same cast and weight multiply. Any other norm: module(x)."""
    if type(module).__name__ not in RMS_NORMS or not hasattr(module, "variance_epsilon"):
        return module(x)
    y = F.rms_norm(x.to(torch.float32), (x.shape[-1],), None, module.variance_epsilon)
    return module.weight * y.to(x.dtype)
