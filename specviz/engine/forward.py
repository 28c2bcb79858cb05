"""Model-forward helpers shared by the decoding engines and the proposers:
one KV-cached forward, cache rollback, and drawing a token from a distribution."""
from __future__ import annotations

import torch
from transformers import DynamicCache

from . import kvcache
from .cpu import kernel_layer, lean_forward
from .cpu.rowwise_attention import is_rowwise
from .sampling import SamplingParams, sample

CACHES = ("dynamic", "static")


def pick(probs: torch.Tensor, params: SamplingParams, generator) -> int:
    # greedy: argmax of a one-hot, without touching the RNG
    if params.greedy:
        return int(probs.argmax())
    return int(sample(probs, generator))


def forward_logits(model, ids: list[int], cache, keep: int, *, exact: bool = True) -> torch.Tensor:
    """One KV-cached forward of `ids`; returns float logits of the last `keep` positions.
    exact=False (a draft: nothing depends on its bits but its own q, recorded as computed) skips
    context_apart: a draft's two-token feed after a bonus round is one forward, not two
    (docs/why.md#draft-inexact)."""
    return _forward(model, context_apart(model, cache, ids, keep, causal=True) if exact else ids, cache, keep)


def _forward(model, ids: list[int], cache, keep: int) -> torch.Tensor:
    if isinstance(cache, kvcache.StaticKV):
        return kvcache.static_forward(model, ids, cache, keep)
    if lean_forward.eligible(model, len(ids)):
        return lean_forward.forward(model, ids, cache, keep)[0]
    x = torch.tensor([ids], device=model.device)
    out = model(input_ids=x, past_key_values=cache, use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:]


def context_apart(model, cache, ids: list[int], keep: int, *, causal: bool = False) -> list[int]:
    """Row-exact targets (w8a8 with row-wise attention): the rows before the `keep` read ones
    (the prompt, in a run's first forward) get a forward of their own, the one plain decoding's
    prefill makes, so both runs hold bit-identical KV for them; returns the ids left to feed.
    Why: one forward of prompt + drafts computed the prompt's KV in another shape, which flipped
    a 7-bit activation code; greedy on the chat preset then differed at token 12 (gap 0.85).
    causal (a chain forward follows): not where the C layer stack reads every row, whose bits
    never depend on the shape; there the split cost a whole step and an output layer per prompt
    (docs/why.md#prompt-whole)."""
    n = len(ids) - keep
    if n <= 0 or not is_rowwise(model):
        return ids
    if causal and not isinstance(cache, kvcache.StaticKV) and lean_forward.rows_exact(model, len(ids)):
        return ids
    if not isinstance(cache, kvcache.StaticKV) and lean_forward.eligible(model, n):
        lean_forward.forward(model, ids[:n], cache, 0)  # the keys alone: no output layer (~5 ms, 1.5B)
    else:
        _forward(model, ids[:n], cache, 1)  # one call for the whole context, as plain decoding's prefill
    return ids[n:]


def crop_cache(cache, length: int) -> None:
    """Keep the first `length` positions of a KV cache.

    A negative argument means "remove that many" in every transformers version
    we support (newer ones refuse a positive absolute length)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


def set_cache(model, kind: str = "dynamic", *, compile: bool = False, masked: bool | None = None) -> str:
    """Choose the KV cache every engine builds for `model` (baseline, verify and
    draft alike, so a speed trick reaches both sides). Returns the kind in use:
    a model the static cache cannot serve (sliding windows, flash attention) stays dynamic.
    `masked`: attend over the whole buffer under a mask (the compiled layout; default: when compiled)."""
    if kind not in CACHES:
        raise ValueError(f"cache must be one of {CACHES}, not {kind!r}")
    if kind == "static" and not kvcache.supported(model):
        kind, compile = "dynamic", False
    rt = kvcache.runtime(model)
    rt.cache, rt.compile, rt.masked = kind, compile, compile if masked is None else masked
    return kind + (" + compile" if compile else "")


def cache_kind(model) -> tuple[str, bool, bool]:
    """(kind, compiled, masked layout)"""
    rt = kvcache.runtime(model)
    return rt.cache, rt.compile, rt.masked


def new_cache(model, capacity: int = 1024):
    """A fresh KV cache of the kind chosen with set_cache (DynamicCache by default)."""
    kind, compiled, masked = cache_kind(model)
    if kind == "dynamic":
        return DynamicCache()
    fn = kvcache.compiled_call(model) if compiled else None
    return kvcache.StaticKV(capacity, full=masked, compiled=fn, rows=kvcache.runtime(model).rows)


def masked_forward(model, cache, *, ids: list[int], positions: list[int], bias: torch.Tensor,
                   keep: int) -> torch.Tensor:
    """One KV-cached forward with explicit positions and an additive 4D bias
    (0 = attend, dtype min = blocked); float logits of the last `keep` inputs.

    transformers 5.x (checked on 5.23: masking_utils._preprocess_mask_arguments)
    passes a 4D attention mask through unchanged, and Qwen2/Llama take explicit
    position_ids, so tree and lookahead forwards need no patching. Where every layer is on the C
    kernels, the whole stack runs as one call instead (lean_forward.forward_masked: same bits)."""
    fast = lean_forward.forward_masked(model, ids, positions, bias, cache, keep)
    if fast is not None:
        return fast
    dev = model.device
    dtype = next(model.parameters()).dtype
    out = model(input_ids=torch.tensor([ids], device=dev), attention_mask=bias.to(dev, dtype),
                position_ids=torch.tensor([positions], device=dev), past_key_values=cache,
                use_cache=True, logits_to_keep=keep)
    return out.logits[0, -keep:].float()


def bias_of(allowed: torch.Tensor, n_past: int, dtype=torch.float32) -> torch.Tensor:
    """(1, 1, n, n_past + n) additive bias: every new token sees the cache, and
    new token j where allowed[i, j]."""
    n = allowed.shape[0]
    ok = torch.ones(n, n_past + n, dtype=torch.bool)
    ok[:, n_past:] = allowed
    bias = torch.zeros(n, n_past + n, dtype=dtype)
    bias.masked_fill_(~ok, torch.finfo(dtype).min)
    return bias[None, None]


def keep_cache_slots(cache, *, prefix: int, slots: list[int]) -> None:
    """Keep the first `prefix` cache positions followed by positions `slots`
    (absolute, increasing), and drop everything else: rejected nodes and guesses go."""
    if kernel_layer.keep_slots(cache, prefix, slots):  # in the C stack's buffer, no copy out and back
        return
    idx = torch.tensor(list(range(prefix)) + list(slots), dtype=torch.long)
    for layer in cache.layers:
        if getattr(layer, "keys", None) is None or layer.keys.numel() == 0:
            continue
        i = idx.to(layer.keys.device)
        layer.keys = layer.keys.index_select(-2, i)
        layer.values = layer.values.index_select(-2, i)
