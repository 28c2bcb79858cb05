"""q and k rotated as one tensor, for the CPU's lean forward (lean_forward.py) and the GPU's graph
step (engine/gpu/static.py): transformers' apply_rotary_pos_emb, per element the same products and
sum (so the same bits), in 4 calls where two of its calls make 10 (14 with the transposed copies)."""
from __future__ import annotations

import torch


def _standard_rotaries() -> tuple:
    """transformers' apply_rotary_pos_emb of the family's modules: q*cos + rotate_half(q)*sin."""
    import importlib
    fns = []
    for arch in ("llama", "qwen2", "mistral"):
        try:
            fns.append(importlib.import_module(f"transformers.models.{arch}.modeling_{arch}").apply_rotary_pos_emb)
        except (ImportError, AttributeError):
            pass
    return tuple(fns)


STANDARD_ROTARIES = _standard_rotaries()


def rotary_tables(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin (1, n, dim) of a forward as rotate_joint() takes them, made once a forward: broadcast
    over the heads, and sin's first half negated, so that rotate_half's negation (a kernel a layer)
    moves into the table: (-x) * s and x * (-s) are the same number, bit for bit."""
    half = sin.shape[-1] // 2
    return cos[:, :, None], torch.cat((-sin[..., :half], sin[..., half:]), -1)[:, :, None]


def rotate_joint(qkv: torch.Tensor, head_dim: int, nq: int, nk: int, tables):
    """q and k rotated as one tensor in the projection's own (1, n, heads, dim) layout -> q, k, v as
    (1, heads, n, dim) views: per element the same products and sum as transformers'
    apply_rotary_pos_emb (so the same bits), in 4 calls instead of 14, and no transposed copies.
    nq, nk: query and key heads; tables: rotary_tables(cos, sin)."""
    n, (cos, sin) = qkv.shape[1], tables
    heads = qkv.view(1, n, -1, head_dim)
    qk, half = heads[:, :, :nq + nk], head_dim // 2
    qk = qk * cos + torch.cat((qk[..., half:], qk[..., :half]), -1) * sin
    return (qk[:, :, :nq].transpose(1, 2), qk[:, :, nq:].transpose(1, 2),
            heads[:, :, nq + nk:].transpose(1, 2))
