"""Run a subset of a decoder-only target's own layers: the draft of the
self-speculative methods (early exit = the first L layers, layer skip = all
layers but a skipped set), then the target's final norm and its own LM head.

Built from the Hugging Face modules (embed_tokens, layers[i], norm, lm_head,
rotary_emb), not by swapping `model.model.layers`: the same target object
keeps serving plain decoding and verification, possibly on another thread.
Decoder-layer call checked in the sources of transformers 5.23 and 5.17 (same
in both, no cache_position): layer(h, attention_mask=, position_ids=,
past_key_values=, use_cache=, position_embeddings=(cos, sin)). DynamicCache()
grows its layers lazily up to each attention's own layer_idx, so a skipped
layer simply leaves its cache slot empty (drop_last crops around it).
"""
from __future__ import annotations

import torch

from ..errors import RequestError
from . import kvcache

# Architectures whose forward is exactly embed_tokens -> layers -> norm -> lm_head, checked
# against the model's own forward in tests/test_lossless_arch.py.
# Others refuse: their forward may scale on the way (Granite's embedding_multiplier and
# logits_scaling, Cohere's logit_scale, Gemma 2's soft-capping), which the parts alone miss.
VERIFIED = ("apertus", "arcee", "bitnet", "gemma", "llama", "mistral", "qwen2", "qwen3")


def drop_last(cache, n: int) -> None:
    """Remove the last `n` positions from a DynamicCache that a subset of layers wrote. Layers left
    empty (skipped, or past the exit) are left alone: transformers 5.17's DynamicLayer.crop fails on
    them ('NoneType' object is not subscriptable), where 5.23 returns; the device machine has 5.17."""
    if n <= 0:
        return
    for layer in cache.layers:
        if layer.is_initialized:
            layer.crop(-n)


def decoder_parts(model):
    """(backbone, lm_head) of a verified Llama-style causal LM, or a clear error."""
    kind = getattr(model.config, "model_type", None)
    if kind not in VERIFIED:
        raise RequestError(f"Self-speculation (early exit, layer skip) rebuilds the target's forward "
                           f"from its parts, checked exact only for {', '.join(VERIFIED)}; this target is "
                           f"{kind!r} (its own scaling would be missed): pick another method.")
    body = getattr(model, "model", None)
    need = ("embed_tokens", "layers", "norm", "rotary_emb")
    if body is None or not all(hasattr(body, n) for n in need) or not hasattr(model, "lm_head"):
        raise RequestError("Self-speculation needs a Llama-style decoder (embed_tokens, layers, "
                           "norm, rotary_emb, lm_head); this target has another layout.")
    types = set(getattr(model.config, "layer_types", None) or ["full_attention"])
    if types != {"full_attention"}:
        raise RequestError("Self-speculation supports full-attention layers only "
                           f"(this target has {sorted(types)}).")
    return body, model.lm_head


def n_layers(model) -> int:
    return int(model.config.num_hidden_layers)


def causal_mask(q_len: int, past: int, dtype, device) -> torch.Tensor | None:
    """Additive (1, 1, q, past+q) mask; None for one new token (it sees everything).
    An additive float mask is read the same way by the eager and SDPA kernels."""
    if q_len == 1:
        return None
    i = torch.arange(q_len, device=device)[:, None] + past
    j = torch.arange(past + q_len, device=device)[None, :]
    mask = torch.zeros(q_len, past + q_len, dtype=dtype, device=device)
    mask.masked_fill_(j > i, torch.finfo(dtype).min)
    return mask[None, None]


def embed(model, ids: list[int]) -> torch.Tensor:
    return decoder_parts(model)[0].embed_tokens(torch.tensor([ids], device=model.device))


def _static_mask(model, cache: kvcache.StaticKV, start: int, n: int):
    """Ready a static cache for n positions from `start` (its buffers, write pointer) and
    return the mask of its layout: the engine's StaticKV serves these calls as its own."""
    if not cache.keys:
        cache.allocate(model)
    cache.reserve(start + n)
    cache.pos = start
    cache.write_pos = torch.arange(start, start + n, device=model.device)
    kv_len = cache.capacity if cache.full else start + n
    return kvcache.causal_mask(model, start, n, kv_len, model.device)


def run_layers(model, h: torch.Tensor, cache, layers, *, start: int) -> torch.Tensor:
    """Hidden states (1, n, d) at positions start.. through `layers`, KV-cached
    (a DynamicCache, or the engine's StaticKV when the target runs a static cache)."""
    body = decoder_parts(model)[0]
    n = h.shape[1]
    pos = torch.arange(start, start + n, device=h.device)[None]
    rope = body.rotary_emb(h, pos)
    static = isinstance(cache, kvcache.StaticKV)
    mask = _static_mask(model, cache, start, n) if static else causal_mask(n, start, h.dtype, h.device)
    for i in layers:
        h = body.layers[i](h, attention_mask=mask, position_ids=pos, past_key_values=cache,
                           use_cache=True, position_embeddings=rope)
        h = h[0] if isinstance(h, tuple) else h  # older releases returned a tuple
    if static:
        cache.pos = start + n
    return h


def logits_of(model, h: torch.Tensor, keep: int) -> torch.Tensor:
    """The target's final norm and LM head on the last `keep` positions (float logits)."""
    body, head = decoder_parts(model)
    return head(body.norm(h[:, -keep:]))[0].float()


def layers_forward(model, ids: list[int], cache, layers, *, start: int, keep: int) -> torch.Tensor:
    """KV-cached forward of `ids` (at positions start..) through `layers` only, then
    the target's norm and LM head. Returns float logits of the last `keep` positions."""
    return logits_of(model, run_layers(model, embed(model, ids), cache, layers, start=start), keep)
