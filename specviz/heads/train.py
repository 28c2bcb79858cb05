"""Self-distillation of the Medusa heads on the target's cached hidden states.

Only the heads learn; the target is frozen and never runs here (data.py ran it
once). Two losses against the target's own outputs at the shifted positions:
- ce (default): cross-entropy of head k at position i against y_{i+k}, the
  target's greedy token there. Exact, but every sample goes through the
  151936 x 1536 LM head forward and backward (~1 GFLOP per head and token).
- mse: squared error of the head's logits against the target's logits at i+k,
  computed in hidden space with G = EᵀE (E = the LM head's weight):
  |E(z − h_{i+k})|² = (z − h)ᵀG(z − h), a 1536² product instead of the LM head.
Reported at the end: held-out top-1 agreement of each head with y_{i+k} (the
greedy acceptance rate of a head's first token), next to the untrained heads'
(= the base head's) agreement."""
from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from ..engine.proposers.heads import Heads, head_logits
from .data import SEQ, corpus_states, pairs, progress

LOSSES = ("ce", "mse")


def _targets(data, idx: torch.Tensor, k: int) -> torch.Tensor:
    """(K, B) the target's greedy tokens at positions idx+1..idx+K."""
    return torch.stack([data["y"][idx + j] for j in range(1, k + 1)])


def batch_loss(heads: Heads, lm_head, data, idx: torch.Tensor, loss: str, gram=None) -> torch.Tensor:
    h = data["h"][idx]
    if loss == "ce":
        logits = head_logits(heads, lm_head, h)  # (K, B, V)
        return F.cross_entropy(logits.flatten(0, 1), _targets(data, idx, heads.k).flatten())
    z = heads(h)
    ref = torch.stack([data["h"][idx + j] for j in range(1, heads.k + 1)]).to(z.dtype)
    d = z - ref
    return ((d @ gram) * d).sum(-1).mean() / gram.shape[0]


@torch.no_grad()
def evaluate(heads: Heads, lm_head, data, idx: torch.Tensor, batch: int = 64) -> dict:
    """Held-out top-1 agreement and cross-entropy per head, and the untrained heads' agreement."""
    hit = torch.zeros(heads.k)
    ce = torch.zeros(heads.k)
    for s in range(0, len(idx), batch):
        i = idx[s: s + batch]
        logits = head_logits(heads, lm_head, data["h"][i])
        y = _targets(data, i, heads.k)
        hit += (logits.argmax(-1) == y).float().sum(1)
        ce += F.cross_entropy(logits.transpose(1, 2), y, reduction="none").sum(1)
    n = max(len(idx), 1)
    base = [float((data["y"][idx] == data["y"][idx + j]).float().mean()) if len(idx) else 0.0
            for j in range(1, heads.k + 1)]
    return {"top1": [round(float(x) / n, 4) for x in hit], "ce": [round(float(x) / n, 4) for x in ce],
            "top1_untrained": [round(b, 4) for b in base], "positions": len(idx)}


def fit(heads: Heads, lm_head, data, train_idx, *, epochs: int, minutes: float, lr: float, batch: int,
        loss: str, seed: int = 0) -> dict:
    """The training loop: AdamW on the heads only, stopped after `epochs` or `minutes`."""
    gram = None
    if loss == "mse":
        w = lm_head.weight.detach().float()
        gram = w.T @ w
    opt = torch.optim.AdamW(heads.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    steps, seen, t0, losses = 0, 0, time.perf_counter(), []
    bar = progress(epochs * len(train_idx), f"training {heads.k} heads ({loss})")
    stopped = "epochs"
    for _ in range(epochs):
        order = train_idx[torch.randperm(len(train_idx), generator=g)]
        for s in range(0, len(order), batch):
            if time.perf_counter() - t0 > minutes * 60:
                stopped = "minutes"
                break
            value = batch_loss(heads, lm_head, data, order[s: s + batch], loss, gram)
            opt.zero_grad(set_to_none=True)
            value.backward()
            opt.step()
            losses.append(float(value.detach()))
            steps, seen = steps + 1, seen + len(order[s: s + batch])
            bar.update(len(order[s: s + batch]))
            if steps % 10 == 0:
                bar.set_postfix_str(f"loss {sum(losses[-10:]) / 10:.3f}")
        if stopped == "minutes":
            break
    bar.close()
    return {"steps": steps, "positions_seen": seen, "train_s": round(time.perf_counter() - t0, 1),
            "stopped_by": stopped, "loss_first": _mean(losses[:10]), "loss_last": _mean(losses[-10:])}


def _mean(xs) -> float | None:
    return round(sum(xs) / len(xs), 4) if xs else None


def train(pair, *, k: int = 3, n_tokens: int = 16_000, epochs: int = 1, minutes: float = 15.0,
          lr: float = 1e-3, batch: int = 32, loss: str = "ce", seq: int = SEQ, docs=None,
          eval_positions: int = 1000, seed: int = 0) -> tuple[Heads, dict]:
    """Heads for pair.target, trained on its own states over ~n_tokens of the corpus, and a report."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}")
    pair.target.requires_grad_(False)
    data = {n: v.clone() if torch.is_tensor(v) else v for n, v in
            corpus_states(pair, n_tokens, seq, docs).items()}  # plain tensors: autograd may save them
    train_idx, test_idx = pairs(data["seg"], k)
    test_idx = test_idx[:: max(1, len(test_idx) // eval_positions)][:eval_positions]  # every held-out window
    lm_head = pair.target.get_output_embeddings()
    heads = Heads(data["h"].shape[1], k)
    before = evaluate(heads, lm_head, data, test_idx)
    run = fit(heads, lm_head, data, train_idx, epochs=epochs, minutes=minutes, lr=lr, batch=batch,
              loss=loss, seed=seed)
    after = evaluate(heads, lm_head, data, test_idx)
    report = {"k": k, "loss": loss, "lr": lr, "batch": batch, "epochs": epochs, "minutes": minutes,
              "corpus_tokens": int(len(data["seg"])), "windows": int(data["seg"].max()) + 1 if
              len(data["seg"]) else 0, "train_positions": len(train_idx), "states_s": data.get("seconds"),
              **run, "held_out": after, "held_out_ce_untrained": before["ce"],
              "target_dtype": str(data["h"].dtype).replace("torch.", "")}
    return heads.eval().requires_grad_(False), report
