"""transformers' own forward, `model(...)`, over a DynamicCache: any architecture."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ..cpu import kernel_layer
from .base import Backend


class Eager(Backend):
    name = "dynamic"

    def new_cache(self, model, capacity: int = 1024):
        return DynamicCache()

    def forward(self, model, ids: list[int], cache, keep: int):
        x = torch.tensor([ids], device=model.device)
        out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep)
        return out.logits[0, -keep:]

    def forward_masked(self, model, ids: list[int], positions: list[int], bias, cache, keep: int):
        # transformers 5.x (checked on 5.23: masking_utils._preprocess_mask_arguments) passes a 4D
        # attention mask through unchanged, and Qwen2/Llama take explicit position_ids
        dev = model.device
        dtype = next(model.parameters()).dtype
        out = model(input_ids=torch.tensor([ids], device=dev), attention_mask=bias.to(dev, dtype),
                    position_ids=torch.tensor([positions], device=dev), past_key_values=cache,
                    use_cache=True, logits_to_keep=keep)
        return out.logits[0, -keep:].float()

    def keep_slots(self, cache, prefix: int, slots: list[int]) -> None:
        keep_slots(cache, prefix, slots)


def keep_slots(cache, prefix: int, slots: list[int]) -> None:
    """A DynamicCache's first `prefix` positions followed by positions `slots` (absolute,
    increasing); everything else goes (rejected nodes and guesses)."""
    if kernel_layer.keep_slots(cache, prefix, slots):  # in the C stack's buffer, no copy out and back
        return
    idx = torch.tensor(list(range(prefix)) + list(slots), dtype=torch.long)
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        i = idx.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, i)
        layer.values = layer.values.index_select(-2, i)
