"""A leaner Llama-family block: fused projections swapped into the transformers skeleton.

A batch-1 decoding step on a CPU is a few hundred small calls around the weight
matmuls. The Llama family (Llama, Qwen2, Mistral: one attention with q/k/v/o
projections, one gated MLP) lets three of a layer's seven weight matmuls go:
q, k and v read the same input, and so do gate and up. Fused as in gpt-fast's
model.py (`wqkv`, `w13`), a layer makes four matmul calls, and a low-bit format
that quantises its activations (w8a8) quantises each input once, not five times.

The swap is in place and keeps everything else of transformers' model (its
cache handling, masks, rotary table, layer list, generate()), so every engine,
proposer and the static cache work unchanged; `to_lowbit` turns the fused
nn.Linears into fused low-bit ones like any other Linear. A fused matmul is one
GEMM whose output columns are the original ones, so each token's row still
depends only on its own input row (row-exact, as engine/cpu/rowwise_attention.py
needs); in float formats the wider GEMM may block the sum differently, so
logits can move by rounding (checked by the lossless tests, which run with it).
"""
from __future__ import annotations

import sys

import torch
from torch import nn

from ...machine import pause_point
from . import qgemm

FAMILY = ("llama", "qwen2", "mistral")  # config.model_type values with this block


def supported(model) -> bool:
    cfg = getattr(model, "config", None)
    return getattr(cfg, "model_type", None) in FAMILY and hasattr(getattr(model, "model", None), "layers")


def is_lean(model) -> bool:
    return any(isinstance(m, (FusedAttention, FusedMLP)) for m in model.modules())


def cat_linear(parts: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear whose output is the parts' outputs side by side."""
    w = torch.cat([p.weight.data for p in parts])
    has_bias = any(p.bias is not None for p in parts)
    # skip_init: nn.Linear's random init of a weight replaced at once is wasted (docs/why.md#skip-init)
    out = nn.utils.skip_init(nn.Linear, w.shape[1], w.shape[0], bias=has_bias, device=w.device, dtype=w.dtype)
    out.weight.data = w
    if has_bias:
        out.bias.data = torch.cat([p.bias.data if p.bias is not None else
                                   w.new_zeros(p.out_features) for p in parts])
    return out.requires_grad_(any(p.weight.requires_grad for p in parts))


class FusedMLP(nn.Module):
    """down(act(gate(x)) * up(x)) with gate and up in one matmul."""

    def __init__(self, mlp: nn.Module):
        super().__init__()
        self.inter = mlp.gate_proj.out_features
        self.gate_up = cat_linear([mlp.gate_proj, mlp.up_proj])
        self.down_proj = mlp.down_proj
        self.act_fn = mlp.act_fn

    kernel = False  # silu(gate) * up as one C call (kernel_rows: low-bit CPU models)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up(x)
        if self.kernel and gu.dtype == torch.float32 and gu.device.type == "cpu" and gu.is_contiguous() \
                and not torch.compiler.is_compiling():
            return self.down_proj(qgemm.silu_mul(gu, self.inter))
        gate, up = gu.split(self.inter, dim=-1)
        return self.down_proj(self.act_fn(gate) * up)


class FusedAttention(nn.Module):
    """The family's attention forward (transformers 5.x, same signature) with q, k, v in one
    matmul; rotary and the attention kernel are the model's own (its module's functions and
    config._attn_implementation, so row-wise attention applies as before)."""

    kernel = False  # row-wise attention on the C kernel (kernel_rows: low-bit CPU models)

    def __init__(self, attn: nn.Module):
        super().__init__()
        for name in ("config", "layer_idx", "head_dim", "num_key_value_groups", "scaling",
                     "attention_dropout", "is_causal", "sliding_window", "layer_type"):
            setattr(self, name, getattr(attn, name, None))
        self.sizes = [attn.q_proj.out_features, attn.k_proj.out_features, attn.v_proj.out_features]
        self.qkv_proj = cat_linear([attn.q_proj, attn.k_proj, attn.v_proj])
        self.o_proj = attn.o_proj
        mod = sys.modules[type(attn).__module__]
        self._rotary = mod.apply_rotary_pos_emb
        self._eager = mod.eager_attention_forward

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        qkv = self.qkv_proj(hidden_states).split(self.sizes, -1)
        q, k, v = (t.view(hidden_shape).transpose(1, 2) for t in qkv)
        cos, sin = position_embeddings
        q, k = self._rotary(q, k, cos, sin)
        if past_key_values is not None:
            k, v = past_key_values.update(k, v, self.layer_idx)
        impl = self.config._attn_implementation
        attend = ALL_ATTENTION_FUNCTIONS.get_interface(impl, self._eager) if hasattr(
            ALL_ATTENTION_FUNCTIONS, "get_interface") else ALL_ATTENTION_FUNCTIONS.get(impl, self._eager)
        out, weights = attend(self, q, k, v, attention_mask, dropout=0.0, scaling=self.scaling,
                              sliding_window=self.sliding_window, **kwargs)
        return self.o_proj(out.reshape(*input_shape, -1).contiguous()), weights


LATER = "_specviz_lean_later"  # on a loaded model whose fusion waits for its conversion (copies keep it)


def defer(model: nn.Module) -> nn.Module:
    """Mark a loaded model to be fused when it is converted (settle), not now: a calibration's
    fp32 target, fused at load, held 3.1 GB of fused fp32 weights (the 1.5B's q/k/v and gate/up)
    through all its timings, where unfused they stay pages of the checkpoint file that a
    conversion reads once and hands back (memory.drop_file_pages)."""
    if supported(model) and not is_lean(model):
        setattr(model, LATER, True)
    return model


def settle(model: nn.Module | None, each=None) -> nn.Module | None:
    """Fuse a deferred model now (make_lean, with `each`); anything else is returned as it is."""
    if model is not None and getattr(model, LATER, False):
        make_lean(model, each)
        setattr(model, LATER, False)
    return model


def make_lean(model: nn.Module, each=None) -> nn.Module:
    """Fuse every layer's q/k/v and gate/up projections in place (plain nn.Linear weights:
    call before any low-bit swap). Models outside the family, or already fused, are left as
    they are. each(layer), if given, runs on every layer right after its fusion (a low-bit load
    packs it there: one layer's fused fp32 weights at a time, not 3.1 GB of the 1.5B's).
    Returns the model."""
    if not supported(model) or is_lean(model):
        return model
    for layer in model.model.layers:
        pause_point()  # a background calibration waits here while a run goes (machine.PAUSE)
        attn, mlp = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if attn is None or mlp is None or not all(
                type(getattr(attn, n, None)) is nn.Linear for n in ("q_proj", "k_proj", "v_proj")) or not all(
                type(getattr(mlp, n, None)) is nn.Linear for n in ("gate_proj", "up_proj")):
            continue
        layer.self_attn = FusedAttention(attn)
        layer.mlp = FusedMLP(mlp)
        if each is not None:
            each(layer)
    return model


NORMS = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm")  # weight * (x * rsqrt(mean(x²) + eps))


class KernelRMSNorm(nn.Module):
    """The family's RMSNorm as one C call (engine/cpu/qgemm.py's rms_norm) on a CPU's float32 rows,
    where aten makes six (docs/why.md#rms-norm). Traced (the draft's compiled step)
    or off the CPU: transformers' own forward."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon
        self._stock = type(norm).forward

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (x.dtype == self.weight.dtype == torch.float32 and x.device.type == "cpu" and x.is_contiguous()
                and not torch.compiler.is_compiling()):
            return qgemm.rms_norm(x, self.weight, self.variance_epsilon)
        return self._stock(self, x)


def kernel_rows(model: nn.Module) -> nn.Module:
    """Put a low-bit family model's work between the matmuls on the C kernels where they build
    (lowbit.to_lowbit; float models keep transformers' own bits): its RMSNorms become
    KernelRMSNorm, a fused layer's row-wise attention (engine/cpu/rowwise_attention.py and
    lean_forward) and its MLP gate (SiLU only) one C call each. Every path of the model then
    calls the same code (the kernels' sums round unlike aten's): the lean forward stays
    bit-identical to model(...), and each row's bits the same alone or among others. Returns
    the model."""
    if not supported(model):
        return model
    try:
        qgemm.library()
    except RuntimeError:
        return model
    for name, mod in list(model.named_modules()):
        if type(mod).__name__ in NORMS and hasattr(mod, "variance_epsilon"):
            model.set_submodule(name, KernelRMSNorm(mod))
        elif isinstance(mod, FusedAttention):
            mod.kernel = True
        elif isinstance(mod, FusedMLP):
            mod.kernel = getattr(model.config, "hidden_act", None) == "silu"
    return model
