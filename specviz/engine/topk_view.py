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


def round_parts(p: torch.Tensor, q: torch.Tensor, r: torch.Tensor | None, k: int = TOP_K) -> dict:
    """round_dists' top-k on the device, nothing read: the top-k of every row of p (γ+1, V), q (γ, V)
    and of the residual row r (1, V) (None: a greedy round shows none), and p and q at each other's
    top ids. round_dists_of(those parts, read) gives round_dists' rows."""
    kk, gamma = min(k, p.shape[-1]), q.shape[0]
    p, q = p.float(), q.float()
    pt, qt = torch.topk(p, kk), torch.topk(q, kk)
    parts = dict(p_top=pt.values, p_ids=pt.indices, q_top=qt.values, q_ids=qt.indices,
                 p_at_q=p[:gamma].gather(-1, qt.indices), q_at_p=q.gather(-1, pt.indices[:gamma]))
    if r is not None and r.shape[0]:
        rt = torch.topk(r[0].float(), kk)
        parts.update(r_top=rt.values, r_ids=rt.indices)
    return parts


def _row_of(ids, top, text_of, q=None) -> dict:
    """A row of round_dists from its read parts: p's top ids (p > 0), then q's (q > 0) not among them.
    q: (q_ids, q_top, p at q's ids, q at p's ids)."""
    keep = [j for j, v in enumerate(top) if v > 0]
    row_ids, ps = [int(ids[j]) for j in keep], [top[j] for j in keep]
    if q is not None:
        q_ids, q_top, p_at_q, q_at_p = q
        qs = [q_at_p[j] for j in keep]
        for j, v in enumerate(q_top):
            if v > 0 and int(q_ids[j]) not in row_ids:
                row_ids.append(int(q_ids[j]))
                ps.append(p_at_q[j])
                qs.append(v)
    row = {"ids": row_ids, "t": [text_of(i) for i in row_ids], "p": _r(ps)}
    if q is not None:
        row["q"] = _r(qs)
    return row


def round_dists_of(h: dict, n_accepted: int, resampled: bool, *, text_of=str,
                   raw: bool = False) -> tuple[list[dict], dict | None]:
    """round_dists from round_parts' parts read to the host (the same rows, the same floats)."""
    gamma = len(h["q_top"])
    dists = [_row_of(h["p_ids"][i], h["p_top"][i], text_of,
                     (h["q_ids"][i], h["q_top"][i], h["p_at_q"][i], h["q_at_p"][i])) for i in range(gamma)]
    dists.append(_row_of(h["p_ids"][gamma], h["p_top"][gamma], text_of))
    if raw:
        for row in dists:
            row["raw"] = 1
    res = None
    if resampled and not raw and n_accepted < gamma:
        r = _row_of(h["r_ids"], h["r_top"], text_of)
        res = {"pos": n_accepted, "ids": r["ids"], "t": r["t"], "r": r["p"]}
    return dists, res
