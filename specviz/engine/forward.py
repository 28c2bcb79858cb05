"""Model-forward helpers shared by the decoding engines and the proposers:
one KV-cached forward, cache rollback, and drawing a token from a distribution."""
from __future__ import annotations

import torch

from .sampling import SamplingParams, sample


def pick(probs: torch.Tensor, params: SamplingParams, generator) -> int:
    # greedy: argmax of a one-hot, without touching the RNG
    if params.greedy:
        return int(probs.argmax())
    return int(sample(probs, generator))


def forward_logits(model, ids: list[int], cache, keep: int) -> torch.Tensor:
    """One KV-cached forward of `ids`; returns float logits of the last `keep` positions."""
    x = torch.tensor([ids], device=model.device)
    out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of a KV cache.

    A negative argument means "remove that many" in every transformers version
    we support (newer ones refuse a positive absolute length)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)
