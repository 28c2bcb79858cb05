"""Training early-exit's adapter (engine/trained/exit_head.py) on the feature pass (features.py).

The pass kept the target's post-norm last state f per token; the adapter needs the residual stream
after layer L at the same tokens. That is read here once, through the target's first L layers only
(the pass's windows, as the target runs on this machine), and kept beside the pass (exit-L<L>.pt,
written as it goes: an interrupted read resumes at its next window).

Per row (a token whose next token the page would draft: answer_rows), two losses as EAGLE's head:
- regression of the adapter's output onto f (smooth L1, weight 1);
- soft cross-entropy of its q over the kept tokens against the target's law there,
  softmax(lm_head_keep(f)) (weight P_WEIGHT).
No sequence: the adapter is per row (layer L already read the context), so rows are shuffled freely.
Reported: held-out top-1 agreement with the target's greedy token, trained and untrained (the target's
own norm and LM head on layer L's state: what early exit drafts without training)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from ..engine.layers import embed, run_layers
from ..engine.trained.eagle_head import head_weight
from ..engine.trained.exit_head import fresh, pack_exit
from .data import progress
from .eagle_train import VAL_EVERY, answer_rows, kept_tokens, learn, mean_losses, schedule, windows_of
from .features import load_shards, trained_on

P_WEIGHT = 0.3  # the soft cross-entropy's weight (EAGLE's head: 0.1; here q is all the adapter is for)
TRAIN_WINDOWS = 600  # windows whose layer-L states are read (~250k tokens: ~8 min at L 6 on 2 cores)
VAL_WINDOWS = 120


@torch.no_grad()  # not inference_mode: the states feed training (inference tensors could not)
def exit_states(target, data: dict, wins: list[tuple[int, int]], layer: int, path: Path) -> torch.Tensor:
    """The residual stream after `layer` layers for every row of `wins` (bf16, the pass's row order;
    rows of other windows zero), read through the target window by window; resumed from `path`."""
    from transformers import DynamicCache
    got = torch.load(path, weights_only=True) if path.is_file() else {"done": 0}
    h = got.get("h")
    if h is None:
        h = torch.zeros(len(data["ids"]), data["h"].shape[1], dtype=torch.bfloat16)
    done, saved = int(got["done"]), time.perf_counter()
    bar = progress(sum(e - s for s, e in wins), f"layer {layer} states")
    bar.update(sum(e - s for s, e in wins[:done]))
    for k in range(done, len(wins)):
        s, e = wins[k]
        ids = data["ids"][s:e].tolist()
        out = run_layers(target, embed(target, ids), DynamicCache(), range(layer), start=0)
        h[s:e] = out[0].to(torch.bfloat16)
        bar.update(e - s)
        if time.perf_counter() - saved > 60 or k == len(wins) - 1:
            _save(path, {"h": h, "done": k + 1, "layer": layer})
            saved = time.perf_counter()
    bar.close()
    return h


def _save(path: Path, blob: dict) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save(blob, tmp)
    tmp.replace(path)


def train_exit(pair, folder, *, layer: int, minutes: float = 10.0, lr: float = 1e-3, batch: int = 256,
               max_tokens: int | None = None, intermediate: int = 2048, seed: int = 0,
               windows: int = TRAIN_WINDOWS, steps: int | None = None) -> tuple[dict, dict]:
    """The adapter for exit layer `layer`, trained for about `minutes` (or `steps`) on `windows` windows of
    the pass in `folder` -> (its file's dict, a report)."""
    torch.manual_seed(seed)
    folder = Path(folder)
    data = load_shards(folder, max_tokens)
    target = pair.target
    w_full = head_weight(target.get_output_embeddings()).to(torch.bfloat16)
    keep = kept_tokens(data["ids"], pair.tokenizer)
    w_keep = w_full[keep].contiguous()
    all_wins = windows_of(data["seg"])
    val = all_wins[VAL_EVERY - 1:: VAL_EVERY][:VAL_WINDOWS]
    rest = [w for i, w in enumerate(all_wins) if i % VAL_EVERY != VAL_EVERY - 1]
    pick = torch.randperm(len(rest), generator=torch.Generator().manual_seed(seed))[:windows].tolist()
    train = [rest[i] for i in sorted(pick)]
    hl = exit_states(target, data, train + val, layer, folder / f"exit-L{layer}.pt")
    score = answer_rows(data, pair.tokenizer)
    rows = _rows(train, score)
    model = fresh(target, layer, intermediate).train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    t0, step, log, stopped = time.perf_counter(), 0, [], "minutes"
    while (frac := (time.perf_counter() - t0) / (minutes * 60)) < 1:
        if steps is not None and step >= steps:
            stopped = "steps"
            break
        schedule(opt, lr, step, frac)
        idx = rows[torch.randint(len(rows), (batch,))]
        log.append(learn(model, opt, *_losses(model, w_keep, hl[idx], data["h"][idx]), P_WEIGHT))
        step += 1
        if step % 50 == 0:
            v, p = (sum(x) / 50 for x in zip(*log[-50:], strict=True))
            print(f"exit L{layer}: step {step}, {time.perf_counter() - t0:.0f} s, feat {v:.3f} ce {p:.3f}",
                  file=sys.stderr, flush=True)
    model.eval()
    val_rows = _rows(val, score)
    report = {"design": f"an adapter on layer {layer}'s residual stream (RMSNorm, SiLU MLP {intermediate} "
                        "wide, residual, output RMSNorm) -> the target's post-norm last state; the target's "
                        f"LM head restricted to {len(keep)} tokens",
              "exit_layer": layer, "trained_on": trained_on(folder, data), "kept_tokens": len(keep),
              "pass_tokens": int(len(data["ids"])), "train_windows": len(train),
              "train_rows": int(len(rows)), "held_out_windows": len(val), "steps": step,
              "rows_seen": step * batch, "train_s": round(time.perf_counter() - t0, 1), "stopped_by": stopped,
              "lr": lr, "batch": batch, "loss_first": mean_losses(log[:10]),
              "loss_last": mean_losses(log[-10:]),
              "held_out_first_draft_agreement": agreement(model, target, w_keep, w_full, keep, hl, data,
                                                          val_rows)}
    brief = {k: report[k] for k in ("trained_on", "exit_layer", "held_out_first_draft_agreement")}
    return pack_exit(model, keep, {"report": brief}), report


def _rows(wins, score: torch.Tensor) -> torch.Tensor:
    """The scored rows of `wins` (a row predicts the next token: a window's last row has none)."""
    idx = torch.cat([torch.arange(s, e - 1) for s, e in wins])
    return idx[score[idx + 1]]


def _losses(model, w_keep, h_low, f):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(h_low.float())
        logits = (out @ w_keep.T).float()
    with torch.no_grad():
        p = (f @ w_keep.T).float().softmax(-1)
    return F.smooth_l1_loss(out.float(), f.float()), -(p * logits.log_softmax(-1)).sum(-1).mean()


@torch.no_grad()
def agreement(model, target, w_keep, w_full, keep, hl, data, rows, chunk: int = 512) -> dict:
    """Teacher-forced on held-out rows: how often the first draft is the target's greedy token, trained
    (the adapter, kept tokens) and untrained (the target's final norm and whole LM head on layer L), by
    kind (chat, code)."""
    hits = {(k, w): 0 for k in (0, 1) for w in ("trained", "untrained")}
    count = {0: 0, 1: 0}
    norm = target.model.norm
    for i in range(0, len(rows), chunk):
        idx = rows[i: i + chunk]
        y = (data["h"][idx] @ w_full.T).float().argmax(-1)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            trained = keep[(model(hl[idx].float()) @ w_keep.T).float().argmax(-1)]
            untrained = (norm(hl[idx].float()).to(torch.bfloat16) @ w_full.T).float().argmax(-1)
        kind = data["kind"][idx + 1].long()
        for k in (0, 1):
            sel = kind == k
            count[k] += int(sel.sum())
            hits[(k, "trained")] += int((trained[sel] == y[sel]).sum())
            hits[(k, "untrained")] += int((untrained[sel] == y[sel]).sum())
    return {name: {w: round(hits[(k, w)] / max(count[k], 1), 4) for w in ("trained", "untrained")}
            for k, name in ((0, "chat"), (1, "code"))} | {"rows": count[0] + count[1]}

