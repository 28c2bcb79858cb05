"""What the p/q inspector keeps of a round: the top-k of p and q at each drafted
position (and of p at the appended one), and the top-k of the residual
norm(max(0, p - q)) a resampled token was drawn from. Never the full vocabulary,
so events and traces stay small.

Rows are plain dicts (JSON as they are):
  dists[i]  = {"ids", "t", "p", "q"}  drafted position i (0-based): ids = top-k of p ∪ top-k of q,
              t their texts, p and q the probabilities of each id;
  dists[γ]  = {"ids", "t", "p"}       the position after the last draft (a bonus token's law);
  residual  = {"pos", "ids", "t", "r"} top-k of the residual at the rejected position pos.
"""
from __future__ import annotations

import torch

from .sampling import residual as residual_dist

TOP_K = 10
DIGITS = 6  # probabilities are stored rounded: enough for bars, small traces


def _top(x: torch.Tensor, k: int) -> list[int]:
    k = min(k, x.shape[-1])
    vals, idx = torch.topk(x, k)
    return [int(i) for i, v in zip(idx.tolist(), vals.tolist(), strict=True) if v > 0]


def _r(xs) -> list[float]:
    return [round(float(x), DIGITS) for x in xs]


def _row(p: torch.Tensor, q: torch.Tensor | None, k: int, text_of) -> dict:
    ids = _top(p, k)
    if q is not None:
        ids += [i for i in _top(q, k) if i not in ids]
    idx = torch.tensor(ids, dtype=torch.long, device=p.device)
    row = {"ids": ids, "t": [text_of(i) for i in ids], "p": _r(p[idx].tolist())}
    if q is not None:
        row["q"] = _r(q[idx].tolist())
    return row


@torch.inference_mode()
def round_dists(p: torch.Tensor, q: torch.Tensor, n_accepted: int, resampled: bool, *,
                text_of=str, k: int = TOP_K, raw: bool = False) -> tuple[list[dict], dict | None]:
    """p: (γ+1, V) target, q: (γ, V) draft distributions of one round (as verified);
    text_of(id) -> the token's text (traces replay without the tokenizer).
    raw: greedy, p and q are the models' plain softmax (rows say so: "raw": 1)."""
    gamma = q.shape[0]
    p, q = p.float(), q.float()
    dists = [_row(p[i], q[i], k, text_of) for i in range(gamma)] + [_row(p[gamma], None, k, text_of)]
    if raw:
        for row in dists:
            row["raw"] = 1
    res = None
    if resampled and not raw and n_accepted < gamma:
        r = residual_dist(p[n_accepted], q[n_accepted])
        ids = _top(r, k)
        res = {"pos": n_accepted, "ids": ids, "t": [text_of(i) for i in ids],
               "r": _r(r[torch.tensor(ids, dtype=torch.long, device=r.device)].tolist())}
    return dists, res
