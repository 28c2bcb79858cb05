"""Model-facing half of tree speculation: one KV-cached forward of committed
tokens plus a token tree under a tree attention mask, and keeping exactly the
accepted path's cache entries afterwards.

transformers 5.x (checked on 5.23: masking_utils._preprocess_mask_arguments)
passes a 4D attention mask through unchanged ("already prepared, or custom"),
and Qwen2/Llama take explicit position_ids, so no patching is needed. The mask
is additive (0 / dtype min), which both the eager and the SDPA attention read.
"""
from __future__ import annotations

import torch

from .tree_sampling import tree_bias


def masked_forward(model, cache, *, ids: list[int], positions: list[int], bias: torch.Tensor,
                   keep: int) -> torch.Tensor:
    """One KV-cached forward with explicit positions and an additive 4D bias;
    float logits of the last `keep` inputs."""
    dev = model.device
    dtype = next(model.parameters()).dtype
    out = model(input_ids=torch.tensor([ids], device=dev), attention_mask=bias.to(dev, dtype),
                position_ids=torch.tensor([positions], device=dev), past_key_values=cache,
                use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:].float()


def tree_forward_logits(model, cache, *, fed: list[int], tokens: list[int], parents: list[int],
                        depths: list[int], keep: int) -> torch.Tensor:
    """Forward `fed` (committed, causal) then the tree nodes `tokens`.

    A node attends to the cache, the fed tokens and its ancestors; its position
    is that of the last fed token plus its depth. Returns float logits of the
    last `keep` inputs. The cache grows by len(fed) + len(tokens) entries.
    """
    n_past = cache.get_seq_length()
    root = n_past + len(fed) - 1  # position of the last committed token
    pos = list(range(n_past, n_past + len(fed))) + [root + d for d in depths]
    bias = tree_bias(parents, n_past=n_past, n_fed=len(fed), dtype=next(model.parameters()).dtype)
    return masked_forward(model, cache, ids=fed + tokens, positions=pos, bias=bias, keep=keep)


def keep_cache_slots(cache, *, prefix: int, slots: list[int]) -> None:
    """Keep the first `prefix` cache positions followed by positions `slots`
    (absolute, increasing), and drop everything else: the rejected nodes go."""
    idx = torch.tensor(list(range(prefix)) + list(slots), dtype=torch.long)
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        i = idx.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, i)
        layer.values = layer.values.index_select(-2, i)
