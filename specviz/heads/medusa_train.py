"""Medusa heads (engine/proposers/heads.py) retrained on the feature pass (features.py), the data
EAGLE's head learns from. Head k (1..K) reads the target's state h_i and learns the target's own law
at position i+k, softmax(lm_head_keep(h_{i+k})) over the kept tokens (soft cross-entropy, Medusa's
weights 0.8^(k-1)); at run time it proposes over the same kept tokens (q 0 elsewhere: lossless).
Reported: held-out top-1 agreement of each head with the target's greedy token at its position
(teacher-forced, over the whole vocabulary), on chat and code windows."""
from __future__ import annotations

import time

import torch

from ..engine.proposers.heads import VERSION, Heads
from ..engine.trained.eagle_head import head_weight
from .data import progress
from .eagle_train import VAL_EVERY, join_answers, kept_tokens, own_answers, windows_of
from .features import load_shards, trained_on


def _positions(wins, k: int) -> torch.Tensor:
    """Every row i of the windows with i+k in the same window."""
    rows = [torch.arange(s, e - k) for s, e in wins if e - s > k]
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def _loss(heads, w_keep, data, idx):
    h = data["h"][idx]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = heads(h.float())
        logits = (z @ w_keep.T).float()  # (K, B, kept)
    total = 0.0
    for j in range(heads.k):
        with torch.no_grad():
            p = (data["h"][idx + j + 1] @ w_keep.T).float().softmax(-1)
        total = total + 0.8 ** j * -(p * logits[j].log_softmax(-1)).sum(-1).mean()
    return total


@torch.no_grad()
def agreement(heads, w_keep, w_full, keep, data, idx) -> dict:
    out = {}
    for kind, name in ((0, "chat"), (1, "code")):
        sel = idx[data["kind"][idx] == kind][:4000]
        if not len(sel):
            continue
        with torch.autocast("cpu", dtype=torch.bfloat16):
            z = heads(data["h"][sel].float())
            draft = keep[(z @ w_keep.T).float().argmax(-1)]
        hits = []
        for j in range(heads.k):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                target = (data["h"][sel + j + 1] @ w_full.T).float().argmax(-1)
            hits.append(round(float((draft[j] == target).float().mean()), 4))
        out[name] = hits
    return out


def train_medusa(pair, folder, *, k: int = 3, minutes: float = 10.0, epochs: int = 1, lr: float = 1e-3,
                 max_tokens: int | None = None, batch: int = 256, seed: int = 0, also=None,
                 also_times: int = 2) -> tuple[dict, dict]:
    """Medusa's K heads trained on the pass in `folder` (and `also`, the target's own answers: their
    answer rows, `also_times` as often), as a file's dict, and a report."""
    torch.manual_seed(seed)
    data = load_shards(folder, max_tokens)
    first = {n: data[n] for n in ("ids", "kind")}
    w_full = head_weight(pair.target.get_output_embeddings()).to(torch.bfloat16)
    keep = kept_tokens(data["ids"], pair.tokenizer)
    w_keep = w_full[keep].contiguous()
    wins = windows_of(data["seg"])
    val = [w for i, w in enumerate(wins) if i % VAL_EVERY == VAL_EVERY - 1]
    train = [w for i, w in enumerate(wins) if i % VAL_EVERY != VAL_EVERY - 1]
    train_idx, val_idx = _positions(train, k), _positions(val, k)
    also_train = []
    if also is not None:
        data["score"] = torch.ones(len(data["ids"]), dtype=torch.bool)
        data, _, also_train = join_answers(data, also)
        idx = _positions(also_train, k)
        train_idx = torch.cat([train_idx, *[idx[data["score"][idx]]] * also_times])
    heads = Heads(data["h"].shape[1], k)
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    t0, step, seen, losses, stopped = time.perf_counter(), 0, 0, [], "epochs"
    bar = progress(epochs * len(train_idx), f"training {k} Medusa heads")
    for _ in range(epochs):
        order = train_idx[torch.randperm(len(train_idx))]
        for s in range(0, len(order), batch):
            frac = (time.perf_counter() - t0) / (minutes * 60)
            if frac >= 1:
                stopped = "minutes"
                break
            for g in opt.param_groups:
                g["lr"] = lr * min(1.0, (step + 1) / 20) * max(0.05, 1 - frac)
            loss = _loss(heads, w_keep, data, order[s: s + batch])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step, seen = step + 1, seen + len(order[s: s + batch])
            losses.append(float(loss.detach()))
            bar.update(len(order[s: s + batch]))
            if step % 10 == 0:
                bar.set_postfix_str(f"loss {sum(losses[-10:]) / 10:.3f}")
        if stopped == "minutes":
            break
    bar.close()
    heads.eval().requires_grad_(False)
    held = agreement(heads, w_keep, w_full, keep, data, val_idx)
    report = {"design": f"Medusa-1 heads: h + SiLU(W_k h + b_k) through the target's LM head restricted to "
                        f"{len(keep)} tokens", "k": k,
              "trained_on": trained_on(folder, first) + own_answers(also_train, also_times),
              "kept_tokens": len(keep),
              "pass_tokens": int(len(first["ids"])), "steps": step, "positions_seen": seen,
              "train_s": round(time.perf_counter() - t0, 1), "stopped_by": stopped, "lr": lr, "batch": batch,
              "loss_first": _mean(losses[:10]), "loss_last": _mean(losses[-10:]),
              "held_out_top1_by_head": held}
    blob = {"k": k, "hidden": heads.hidden, "version": VERSION, "keep": keep.to(torch.int32),
            "state": {n: t.to(torch.bfloat16) for n, t in heads.state_dict().items()}}
    return blob, report


def _mean(xs):
    return round(sum(xs) / len(xs), 4) if xs else None
