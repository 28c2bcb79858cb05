"""Model-facing half of tree speculation: one KV-cached forward of committed
tokens plus a token tree, and the tree attention masks it reads.

The masks are additive (0 / dtype min) and live here, beside the forward that
reads them (tree_bias: the target's verify forward; frontier_bias: the draft
growing its tree). The forward itself and the cache gather are forward.py's
masked_forward and keep_cache_slots, shared with lookahead.
"""
from __future__ import annotations

import torch

from .forward import context_apart, masked_forward


def ancestor_matrix(parents: list[int]) -> torch.Tensor:
    """(N, N) bool: [i, j] is True iff node j is node i or one of its ancestors."""
    n = len(parents)
    anc = torch.eye(n, dtype=torch.bool)
    for i, par in enumerate(parents):
        if par >= 0:
            anc[i] |= anc[par]
    return anc


def tree_bias(parents: list[int], *, n_past: int, n_fed: int, dtype=torch.float32,
              n_cached_nodes: int = 0, cached_parents: list[int] | None = None) -> torch.Tensor:
    """Additive attention bias (1, 1, n_fed + N, n_past + n_fed + N) for one forward.

    The first n_fed inputs are committed tokens (causal among themselves), then
    N tree nodes. Every row sees the n_past cached positions; a node sees the fed
    tokens and its ancestors. Used as-is: 0 = attend, dtype min = blocked.
    """
    n = len(parents)
    rows, cols = n_fed + n, n_past + n_fed + n
    ok = torch.zeros(rows, cols, dtype=torch.bool)
    ok[:, :n_past] = True
    ok[:n_fed, n_past:n_past + n_fed] = torch.ones(n_fed, n_fed, dtype=torch.bool).tril()
    ok[n_fed:, n_past:n_past + n_fed] = True
    ok[n_fed:, n_past + n_fed:] = ancestor_matrix(parents)
    bias = torch.zeros(rows, cols, dtype=dtype)
    bias.masked_fill_(~ok, torch.finfo(dtype).min)
    return bias[None, None]


def frontier_bias(anc_slots: list[list[int]], *, n_prefix: int, n_cache: int,
                  dtype=torch.float32) -> torch.Tensor:
    """Bias (1, 1, R, n_cache + R) for R new nodes whose strict ancestors all sit
    in the cache already (at `anc_slots[r]`): each row sees the committed prefix,
    its ancestors' slots and itself (how the draft extends its tree)."""
    r = len(anc_slots)
    ok = torch.zeros(r, n_cache + r, dtype=torch.bool)
    ok[:, :n_prefix] = True
    for i, slots in enumerate(anc_slots):
        ok[i, slots] = True
        ok[i, n_cache + i] = True
    bias = torch.zeros(r, n_cache + r, dtype=dtype)
    bias.masked_fill_(~ok, torch.finfo(dtype).min)
    return bias[None, None]


def tree_forward_logits(model, cache, *, fed: list[int], tokens: list[int], parents: list[int],
                        depths: list[int], keep: int) -> torch.Tensor:
    """Forward `fed` (committed, causal) then the tree nodes `tokens`.

    A node attends to the cache, the fed tokens and its ancestors; its position
    is that of the last fed token plus its depth. Returns float logits of the
    last `keep` inputs. The cache grows by len(fed) + len(tokens) entries.
    """
    fed = context_apart(model, cache, fed, 1)  # row-exact targets: the prompt as plain decoding reads it
    n_past = cache.get_seq_length()
    root = n_past + len(fed) - 1  # position of the last committed token
    pos = list(range(n_past, n_past + len(fed))) + [root + d for d in depths]
    bias = tree_bias(parents, n_past=n_past, n_fed=len(fed), dtype=next(model.parameters()).dtype)
    return masked_forward(model, cache, ids=fed + tokens, positions=pos, bias=bias, keep=keep)

