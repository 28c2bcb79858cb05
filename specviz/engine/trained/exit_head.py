"""A trained exit for early-exit (Kangaroo, Liu et al. 2024, in its simplest form): an adapter turns the
target's residual stream after its first L layers into an estimate of its post-norm last state, which
the target's LM head, restricted to the most frequent tokens, reads as the draft's q.

    a = h_L + down(silu(gate(n(h_L))) · up(n(h_L)))      n: an RMSNorm of its own
    f̂ = norm_out(a)                                        (initialised from the target's final norm)
    q(x_{t+1}) = softmax(lm_head_keep(f̂))                  0 outside the kept tokens

Untrained, early exit reads layer L's state through the final norm and LM head as if it were the last
layer's: the target never learned to exit there (issue 51: 0 of 226 drafts accepted at a shallow L).
The adapter learns the map from layer L to the last state on the feature pass (heads/exit_train.py:
soft cross-entropy against the target's own law there, and regression onto its last state). No
attention: layer L already read the context, so the adapter needs no KV cache and costs one MLP a
draft beside the L layers. Lossless as every q-draft: the engine verifies over the whole vocabulary.

Files: eagle_head.pack's int8 rows (kind "exit" in trained/store.py), the config naming L."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .eagle_head import RMSNorm, pack, unpack

VERSION = 1


def config_of(target, layer: int, intermediate: int = 2048) -> dict:
    c = target.config
    return {"hidden": int(c.hidden_size), "layer": int(layer), "intermediate": int(intermediate),
            "eps": float(getattr(c, "rms_norm_eps", 1e-6))}


class ExitAdapter(nn.Module):
    def __init__(self, cfg: dict):
        super().__init__()
        self.cfg = dict(cfg)
        h, i = cfg["hidden"], cfg["intermediate"]
        self.norm = RMSNorm(h, cfg["eps"])
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)
        self.norm_out = RMSNorm(h, cfg["eps"])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """h (..., H): the residual stream after layer L -> the estimated post-norm last state (..., H)."""
        w = getattr(self.gate_proj, "weight", None)  # a low-bit Linear has none: it reads float32
        dt = w.dtype if isinstance(w, torch.Tensor) and w.is_floating_point() else torch.float32
        h = h.to(dt)
        n = self.norm(h)
        return self.norm_out(h + self.down_proj(F.silu(self.gate_proj(n)) * self.up_proj(n)))


def fresh(target, layer: int, intermediate: int = 2048) -> ExitAdapter:
    """An adapter to train: its MLP's output starts near zero (the untrained exit's own reading), its
    output norm from the target's final norm."""
    a = ExitAdapter(config_of(target, layer, intermediate))
    with torch.no_grad():
        a.down_proj.weight.mul_(0.01)
        a.norm_out.weight.copy_(target.model.norm.weight.detach().float())
    return a


def pack_exit(adapter: ExitAdapter, keep: torch.Tensor, extra: dict | None = None) -> dict:
    return pack(adapter, keep, extra, version=VERSION)


def unpack_exit(blob: dict) -> tuple[ExitAdapter, torch.Tensor]:
    return unpack(blob, ExitAdapter, VERSION, "a trained exit")


class TrainedExit(nn.Module):
    """The draft's head for early-exit: adapter, then the kept LM head -> logits over the whole
    vocabulary (the lowest float outside the kept tokens)."""

    def __init__(self, adapter: ExitAdapter, lm: nn.Module):
        super().__init__()
        self.adapter, self.lm = adapter, lm
        self.layer = int(adapter.cfg["layer"])

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm(self.adapter(h))
