"""Medusa heads: K small residual blocks on the target's last (post-norm) hidden
state h. Head k (1..K) predicts the token k positions after the one the target's
own LM head predicts from h; every head reuses that frozen LM head:

    logits_k = lm_head(h + SiLU(W_k h + b_k))

W_k and b_k start at zero, so a fresh head equals the base head (SiLU(0) = 0)
while its gradient is not zero (SiLU'(0) = 1/2)."""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Heads(nn.Module):
    def __init__(self, hidden: int, k: int):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Linear(hidden, hidden) for _ in range(k))
        for b in self.blocks:
            nn.init.zeros_(b.weight)
            nn.init.zeros_(b.bias)

    @property
    def k(self) -> int:
        return len(self.blocks)

    @property
    def hidden(self) -> int:
        return self.blocks[0].in_features

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        """(..., H) hidden states -> (K, ..., H) head states, in the heads' float type."""
        h = h.to(self.blocks[0].weight.dtype)
        return torch.stack([h + F.silu(b(h)) for b in self.blocks])


def head_logits(heads: Heads, lm_head: nn.Module, h: torch.Tensor) -> torch.Tensor:
    """(..., H) -> (K, ..., V) float logits through the shared LM head, in one call
    (the LM head's weights are read once for all K heads)."""
    z = heads(h)
    dtype = h.dtype if h.is_floating_point() else z.dtype  # what the LM head reads in the target
    return lm_head(z.to(dtype)).float()
