"""The 16-bit overflow guard of a pair loaded on a GPU.

Qwen2 in fp16 has produced nothing but "!": NaN logits in Qwen2-7B's generate (QwenLM/Qwen3#761) and
in Qwen2-1.5B under sglang (sgl-project/sglang#589); eager fp16 attention can give NaN where SDPA
does not (transformers#33317). A T4 (compute capability 7.5) has no native bf16, so fp16 is its half
type (machine.half_for_capability). So the warm-up reads a short code prompt through both models
and, if either model's logits are not all finite, the pair falls back to fp32 (reloaded: the
originals, not the fp16 weights widened) and the page says why (pair.note stays in sight).
"""
from __future__ import annotations

import torch

PROBE = "def quicksort(arr):\n    if len(arr) <= 1:\n        return arr\n    pivot = arr[len(arr) // 2]\n"
HALF = (torch.float16, torch.bfloat16)


def dtype_of(model) -> torch.dtype:
    return next(model.parameters()).dtype


@torch.no_grad()
def finite_logits(model, ids: list[int]) -> bool:
    """Whether one forward of ids gives finite logits everywhere."""
    dev = next(model.parameters()).device
    logits = model(input_ids=torch.tensor([ids], device=dev), use_cache=False).logits
    return bool(torch.isfinite(logits).all())


def probe_ids(tokenizer, vocab: int | None = None) -> list[int]:
    ids = list(tokenizer(PROBE)["input_ids"]) if tokenizer is not None else list(range(3, 67))
    return [i % vocab for i in ids] if vocab else ids


def guard(target, draft, ids: list[int], reload=None, progress=None) -> tuple[object, object, str]:
    """(target, draft, why): unchanged with why "" when every 16-bit model's logits on ids are
    finite; else both in fp32 (reload.target()/reload.draft() when given, else widened in place)
    and why says which model overflowed in which type."""
    bad = [(name, m) for name, m in (("target", target), ("draft", draft))
           if m is not None and dtype_of(m) in HALF and not finite_logits(m, ids)]
    if not bad:
        return target, draft, ""
    kind = str(dtype_of(bad[0][1])).replace("torch.", "")
    if progress:
        progress(f"{kind} logits not finite: reloading the pair in float32", 0.97)
    dev = next(target.parameters()).device

    def widened(model, again):
        if model is None:
            return None
        fresh = again() if again is not None else None
        return (fresh if fresh is not None else model).to(device=dev, dtype=torch.float32)

    target = widened(target, getattr(reload, "target", None))
    draft = widened(draft, getattr(reload, "draft", None))
    who = " and ".join(name for name, _ in bad)
    return target, draft, (f"float32, not {kind}: the {who}'s warm-up logits in {kind} were not finite "
                           "(an overflow), so both models run in float32 (slower, correct)")


def mark(pair, why: str) -> None:
    """What a fallback changes on a loaded pair: its type, labels and the note the page keeps in sight."""
    if not why:
        return
    pair.dtype = torch.float32
    pair.precision_label = "float32"
    pair.precision_note = f"{why}; {pair.precision_note}" if pair.precision_note else why
    pair.note = f"{pair.note} {why}".strip()
