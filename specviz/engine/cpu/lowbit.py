"""Low-bit weights for CPU targets and drafts, row-independent.

Only the weights are quantised; activations stay float, so a token's logits do
not depend on the other tokens of the same forward (beyond float rounding): no
per-tensor activation scale as in torch.ao's dynamic int8. Plain and
speculative decoding share the one low-bit target, so greedy output stays
identical.

Formats (each a real torch CPU kernel; which is fastest differs by CPU class, so
calibration times them):
- w16: fbgemm's fp16 GEMM (`quantized.linear_dynamic_fp16`): fp16 weights,
  fp32 activations. On a 2-core AVX2 EPYC the 1.5B's MLP shapes ran 19 ms for
  1..5 rows vs 67..194 ms for fp32 F.linear (flat verify, half the bytes).
- w8a8: int8 weights (per row) through fbgemm's u8·s8 GEMM, with each token's
  activations quantised on its own scale to 7 bits (fbgemm's reduce_range): the
  rows are pre-scaled to integers and padded so fbgemm's per-tensor scale is
  exactly 1, so no token's rounding depends on another's. 11 ms for 1..5 rows
  on the same shapes; lossy in the activations too.
- w4: groups of 32 input weights share an affine (scale, zero) pair,
  w = s·q + m with q in 0..15: the shape of a GGUF Q4_K sub-block, so weights
  dequantised from Q4_K come back exactly wherever a group uses codes 0 and 15
  (`torch._weight_int4pack_mm_for_cpu`).
- w8: one symmetric scale per output row (`torch._weight_int8pack_mm`).
- w4a8: 4-bit codes in super-blocks of 8 × 32 (GGUF Q4_K's shape: 8-bit sub-scales and
  sub-minimums, float scales per 256) times activations quantised per row and per 256 to int8,
  on our own kernel (engine/cpu/qgemm.py: AVX2, AVX-VNNI or AVX-512 VNNI; the output layer in
  8-bit codes in the same super-blocks, as GGUF keeps it at higher precision): the integer dots
  llama.cpp decodes with.
w4/w8 take bf16 activations: with fp32 ones torch 2.13 falls back to a
kernel 10-20x slower (AVX2 EPYC: 208 vs 14 ms for the MLP shapes at M = 1).
"""
from __future__ import annotations

import copy
import functools
import warnings

import torch
from torch import nn

from ...machine import pause_point
from . import qgemm
from .lean import kernel_rows, settle
from .rowwise_attention import use_rowwise

FORMATS = ("w16", "w8a8", "w8", "w4", "w4a8")  # weight bits (and activation bits)
GROUP = 32  # a Q4_K sub-block
# the names say the activations' type: the greedy near-tie rule (run/equality.py) reads it
NAMES = {"w16": "fp16 weights, float32 activations", "w8a8": "int8 weights, 7-bit per-token activations",
         "w8": "int8 weights, bfloat16 activations", "w4": "int4 g32 weights, bfloat16 activations",
         "w4a8": "int4 g32 weights, 8-bit per-block activations"}
# Which formats `auto` may pick for a target: those whose Linear is row-exact here (row_exact()).
# w8a8 rounds every activation to 7 bits, so a 1e-7 difference between a verify forward and
# single steps would flip a code now and then (greedy quicksort on the default pair differed
# from plain at token 21, top-2 gap 0.74); to_lowbit gives it row-wise attention
# (engine/cpu/rowwise_attention.py), which makes a verify forward bit-identical to single steps, so
# that cannot happen. Every format gets it, but w4/w8 round activations to bf16 and their logits
# to bf16 steps (0.125 at |logit| 20), so a 1e-7 attention difference flipped greedy ties
# (docs/why.md#lowbit-ties).
# Whether a Linear itself is row-exact is the CPU's kernels' business: fbgemm's fp16 GEMM was on
# that Xeon, and on a 2-core AVX2 EPYC the same day 8 rows at once differed from single rows
# by 6e-7 (w8a8, w8, w4 row-exact on both). So it is measured, never assumed by CPU name.


# ------------------------------------------------------------ pure quantisers


def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q int32 [N, K] in 0..15, scale [N, K/group], minimum [N, K/group]): w ≈ scale·q + minimum."""
    n, k = w.shape
    wg = w.float().reshape(n, k // group, group)
    lo, hi = wg.amin(-1), wg.amax(-1)
    scale = (hi - lo) / 15
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = ((wg - lo[..., None]) / safe[..., None]).round().clamp(0, 15).to(torch.int32)
    return q.reshape(n, k), scale, lo


def dequantize_int4(q: torch.Tensor, scale: torch.Tensor, lo: torch.Tensor,
                    group: int = GROUP) -> torch.Tensor:
    n, k = q.shape
    return (q.reshape(n, k // group, group).float() * scale[..., None] + lo[..., None]).reshape(n, k)


def quantize_int8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 [N, K], scale [N]): w ≈ scale·q, symmetric per output row."""
    scale = w.float().abs().amax(1) / 127
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = (w.float() / safe[:, None]).round().clamp(-127, 127).to(torch.int8)
    return q, scale


# ------------------------------------------------------------------ modules


class Int4Linear(nn.Module):
    """y = x Wᵀ + b with W in packed int4 groups (CPU kernel)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16,
                 group: int = GROUP):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.group = group
        q, scale, lo = quantize_int4(weight, group)
        # the kernel computes (q - 8)·s + z, so z = lo + 8·s
        sz = torch.stack([scale, lo + 8 * scale], -1).transpose(0, 1).contiguous()
        self.register_buffer("packed", torch._convert_weight_to_int4pack_for_cpu(q, 1))
        self.register_buffer("scales_zeros", sz.to(dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.scales_zeros.dtype)
        y = torch._weight_int4pack_mm_for_cpu(x2, self.packed, self.group, self.scales_zeros)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Int8Linear(nn.Module):
    """y = x Wᵀ + b with W in int8, one scale per output row."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, dtype: torch.dtype = torch.bfloat16):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        q, scale = quantize_int8(weight)
        self.register_buffer("qweight", q)
        self.register_buffer("scales", scale.to(dtype))
        self.register_buffer("bias", None if bias is None else bias.detach().to(dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).to(self.scales.dtype)
        y = torch._weight_int8pack_mm(x2, self.qweight, self.scales)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


class Fp16Linear(nn.Module):
    """y = x Wᵀ + b with W in fp16, through fbgemm (fp32 activations and output)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.packed = torch.ops.quantized.linear_prepack_fp16(
            weight.detach().float(), None if bias is None else bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        y = torch.ops.quantized.linear_dynamic_fp16(x2, self.packed)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


ROW_LEVELS = 63  # fbgemm's reduce_range leaves 128 activation levels: a row spans -63..63


class W8A8Linear(nn.Module):
    """int8 weights, each activation row quantised on its own scale (row-independent)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        w = weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp(min=1e-12)
        with warnings.catch_warnings():  # fbgemm still takes its weights as a quantized tensor
            warnings.simplefilter("ignore", UserWarning)
            qw = torch.quantize_per_channel(w, scale.double(), torch.zeros(w.shape[0], dtype=torch.long), 0,
                                            torch.qint8)
        self.packed = torch.ops.quantized.linear_prepack(qw, None)
        self.register_buffer("bias", None if bias is None else bias.detach().float())
        # one extra row holding -64 and 63 pins the per-tensor range to 127 levels: scale 1, exact
        pad = torch.zeros(1, self.in_features)
        pad[0, 0], pad[0, 1 % self.in_features] = -(ROW_LEVELS + 1), ROW_LEVELS
        self.register_buffer("pad", pad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x2 = x.reshape(-1, self.in_features).float()
        s = x2.abs().amax(1, keepdim=True).clamp(min=1e-12) / ROW_LEVELS
        y = torch.ops.quantized.linear_dynamic(torch.cat([(x2 / s).round(), self.pad]), self.packed, True)
        y = y[:-1] * s
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)


def fits_int4(linear: nn.Linear, group: int = GROUP) -> bool:
    n, k = linear.weight.shape
    return k % group == 0 and n % 8 == 0


def _low(linear: nn.Linear, fmt: str) -> nn.Module:
    w, b = linear.weight.data, linear.bias
    if fmt in ("w4a8", "q8a8"):  # q8a8: w4a8's output layer (8-bit codes, same super-blocks)
        return qgemm.BlockLinear(w, b, 4 if fmt == "w4a8" else 8) if qgemm.fits(linear) else W8A8Linear(w, b)
    if fmt == "w16":
        return Fp16Linear(w, b)
    if fmt == "w8a8":
        return W8A8Linear(w, b)
    if fmt == "w4" and fits_int4(linear):
        return Int4Linear(w, b)
    return Int8Linear(w, b)


def to_lowbit(model: nn.Module, fmt: str, *, head: str | None = None) -> nn.Module:
    """Swap every nn.Linear of a CPU model for its low-bit twin, in place.

    The output layer uses `head` (default: w8 under w4 and 8-bit codes under w4a8, as GGUF
    ships it in Q6_K; the format itself otherwise). Embeddings stay float."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown low-bit format '{fmt}': use {', '.join(FORMATS)}")
    head = head or {"w4": "w8", "w4a8": "q8a8"}.get(fmt, fmt)
    swap_linears(model, fmt, head, model.get_output_embeddings())
    if getattr(model.config, "_attn_implementation", None) == "sdpa":
        use_rowwise(model)  # every format: see the note after NAMES
    return kernel_rows(model)


DROP_EVERY = 8  # Linears packed between two drop_file_pages() calls: about a decoder layer's


def swap_linears(module: nn.Module, fmt: str, head: str | None = None, out: nn.Module | None = None) -> None:
    """Every nn.Linear under `module` for its low-bit twin (`out`, the output layer, in `head`), in
    place. Each weight read from a checkpoint mapping is read once: its pages are dropped from the
    process a few Linears later (memory.drop_file_pages), so a packing holds one layer's fp32
    pages, not the whole file's (the 1.5B's fp32 checkpoint is 7.1 GB)."""
    from .memory import drop_file_pages
    swaps = [(name, mod) for name, mod in module.named_modules() if type(mod) is nn.Linear]
    for i in range(len(swaps)):
        pause_point()  # a background calibration waits here while a run goes (machine.PAUSE)
        (name, mod), swaps[i] = swaps[i], None  # this list must not keep a packed Linear's fp32 weight
        module.set_submodule(name, _low(mod, head if mod is out else fmt))
        del mod
        if i % DROP_EVERY == DROP_EVERY - 1:
            drop_file_pages()
    drop_file_pages()


class HalfEmbedding(nn.Module):
    """An input embedding table held in bfloat16, its rows handed on in the model's float type.
    Beside low-bit Linears the fp32 tables were the biggest tensors left: 0.93 GB (1.5B) +
    0.54 GB (0.5B) of a 3.3 GB pair; GGUF stores token_embd quantised too. A buffer, not a
    parameter: transformers reads a model's dtype from its first parameter."""

    def __init__(self, emb: nn.Embedding):
        super().__init__()
        self.num_embeddings, self.embedding_dim = emb.weight.shape
        self.padding_idx, self.out_dtype = emb.padding_idx, emb.weight.dtype
        self.register_buffer("weight", emb.weight.detach().to(torch.bfloat16))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return nn.functional.embedding(ids, self.weight).to(self.out_dtype)


def half_embeddings(model: nn.Module) -> nn.Module:
    """Swap a float32 input embedding table for a bfloat16 one (HalfEmbedding), in place."""
    emb = model.get_input_embeddings()
    if type(emb) is nn.Embedding and emb.weight.dtype == torch.float32:
        model.set_input_embeddings(HalfEmbedding(emb))
    return model


def lowbit_format(model: nn.Module) -> str | None:
    """'w4' / 'w8' / ... when to_lowbit swapped this model's Linears, else None."""
    kinds = {type(m) for m in model.modules()}
    if any(isinstance(m, qgemm.BlockLinear) and m.bits == 4 for m in model.modules()):
        return "w4a8"
    for fmt, cls in (("w4", Int4Linear), ("w8a8", W8A8Linear), ("w16", Fp16Linear), ("w8", Int8Linear)):
        if cls in kinds:
            return fmt
    return None


def lowbit_copy(model: nn.Module, fmt: str) -> nn.Module:
    """A low-bit twin of an fp32 model that shares every non-Linear tensor's memory with it and
    leaves it intact (calibration times several formats from one fp32 load). The twin gets its
    own Parameter objects: nn.Module.to() casts a parameter in place (param.data = cast), so a
    shared Parameter let calibration's bf16 candidate, cast after the twins were made, turn the
    chosen w4a8 twin's norms to bf16; its layers then missed the one-call C path (fp32 norms
    only) and every plain step ran slower than the same choice loaded from the cache
    (docs/why.md#twin-parameters)."""
    return pack(twin(model), fmt)


def twin(model: nn.Module) -> nn.Module:
    """A copy of `model` whose tensors are the model's memory, under Parameter objects of its own
    (see lowbit_copy: a cast of the model after the copy leaves the copy as it was). Swapping the
    copy's modules (packing, int8) never touches the model."""
    shared = {id(t): t for t in model.buffers()}  # .to() rebinds a buffer, never writes through it
    shared.update({id(p): nn.Parameter(p.detach(), requires_grad=p.requires_grad)
                   for p in model.parameters()})
    return copy.deepcopy(model, memo=shared)


def pack(model: nn.Module, fmt: str) -> nn.Module:
    """to_lowbit, with a deferred fusion (lean.defer) made a layer at a time and each layer packed as
    soon as it is fused: one layer's fused fp32 weights held at a time, not 3.1 GB of the 1.5B's."""
    settle(model, lambda layer: swap_linears(layer, fmt))
    return to_lowbit(model, fmt)


@functools.cache
def row_exact() -> tuple[str, ...]:
    """The available formats whose Linear gives a row the same bits alone or among others,
    measured on this CPU (2, 5 and 8 rows at once vs one at a time): the formats `auto` may
    pick for a target here (the note after NAMES says why)."""
    g = torch.Generator().manual_seed(0)
    probe = nn.Linear(256, 384)
    with torch.no_grad():
        probe.weight.copy_(torch.randn(384, 256, generator=g) * 0.05)
    x = torch.randn(8, 256, generator=g)
    ok = []
    for fmt in available():
        low = _low(probe, fmt)
        with torch.no_grad():
            one = torch.cat([low(x[i:i + 1]) for i in range(8)])
            if all(torch.equal(low(x[:m]), one[:m]) for m in (2, 5, 8)):
                ok.append(fmt)
    return tuple(ok)


def _probe(fmt: str) -> str | None:
    """Why `fmt` fails on a small probe here, in words, or None when it runs."""
    try:
        _low(nn.Linear(64, 32, bias=False), fmt)(torch.zeros(2, 64))
    except (RuntimeError, AttributeError, NotImplementedError) as err:
        return str(err).splitlines()[0][:200] or type(err).__name__
    return None


def why_not(fmt: str) -> str:
    """Why `fmt` is not among available() here, in words."""
    return _probe(fmt) or "it runs"


@functools.cache
def available() -> tuple[str, ...]:
    """The formats this torch build runs on this CPU (fbgemm is x86 only; the packed
    int4/int8 kernels need a recent torch; w4a8 needs gcc and AVX2)."""
    return tuple(fmt for fmt in FORMATS if _probe(fmt) is None)
