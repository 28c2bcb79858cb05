"""Training EAGLE's head (engine/eagle_head.py) on one feature pass (features.py): EAGLE-1's recipe.

Per window of the pass (ids x, the target's states f), row i reads (e(x_{i+1}), f_i + noise) and
predicts f_{i+1}. Two losses, EAGLE-1's weights:
- feature regression: smooth L1 of the prediction against f_{i+1} (weight 1);
- soft cross-entropy: the head's q over the kept tokens against the target's own law there,
  softmax(lm_head_keep(f_{i+1})) (weight 0.1), the target's frozen LM head restricted to the kept
  tokens (the KEEP most frequent of the pass, plus the special tokens).
The target never runs here; its embedding and LM head are read once. AdamW, linear warm-up then
linear decay over the time cap, bf16 autocast (oneDNN), fp32 master weights.
Reported: held-out top-1 agreement of the head's first draft with the target's greedy token
(teacher-forced, over the target's whole vocabulary), on chat and on code windows."""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from ..engine.trained.eagle_head import EagleHead, config_of, head_weight, pack, unpack
from .data import progress
from .features import load_shards, trained_on, windows_of
from .taps import join_taps, load_taps

KEEP = 32768
NOISE = 0.2  # EAGLE's uniform feature noise, in units of the features' standard deviation
P_WEIGHT = 0.1  # EAGLE-1's weight of the soft cross-entropy (feature loss: 1)
VAL_EVERY = 25  # every 25th window of the pass is held out for the report
# of the rows with fused taps, the share trained without them: on the page the second and later drafts
# read the head's own predicted state, which has none
TAP_DROP = 0.3


def kept_tokens(ids: torch.Tensor, tokenizer, keep: int = KEEP) -> torch.Tensor:
    """The `keep` most frequent ids of the pass, plus every special token, sorted."""
    counts = Counter(ids.tolist())
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    picked = dict.fromkeys(sorted(special))
    for t, _ in counts.most_common():
        if len(picked) >= keep:
            break
        picked.setdefault(t)
    return torch.tensor(sorted(picked), dtype=torch.long)


def answer_rows(data: dict, tokenizer) -> torch.Tensor:
    """Per row of the pass: True where the row's next token is text the drafts will have to predict on the
    page: code, and in chat the assistant's turns (after the template's assistant header). A chat window's
    system and user rows are read (the head attends to them) but not scored: on the page the prompt is
    given, never drafted. In the pass's chat windows 69 % of the rows are the assistant's (shard 3)."""
    start = tokenizer.convert_tokens_to_ids("<|im_start|>") if hasattr(tokenizer, "convert_tokens_to_ids") \
        else None
    role = tokenizer.convert_tokens_to_ids("assistant") if start is not None else None
    ids, seg = data["ids"].long(), data["seg"]
    code = data["kind"].bool()
    unk = getattr(tokenizer, "unk_token_id", None)
    if start in (None, unk) or role in (None, unk):
        return torch.ones(len(ids), dtype=torch.bool)
    # a header is <|im_start|> then its role's token; a row belongs to the last header opened before it
    # in its window
    opened = torch.zeros(len(ids), dtype=torch.bool)
    opened[1:] = (ids[:-1] == start) & (seg[1:] == seg[:-1])
    idx = torch.arange(len(ids))
    last = torch.cummax(torch.where(opened, idx, -1), 0).values
    new_win = torch.ones(len(ids), dtype=torch.bool)
    new_win[1:] = seg[1:] != seg[:-1]
    win_start = torch.cummax(torch.where(new_win, idx, -1), 0).values
    in_answer = (last >= win_start) & (ids[last.clamp(min=0)] == role)
    # row i predicts token i + 1: scored where that token is the assistant's (its header's own row too)
    nxt = torch.zeros(len(ids), dtype=torch.bool)
    nxt[:-1] = in_answer[1:] & (seg[1:] == seg[:-1])
    return code | nxt


def batch_of(data, wins, emb, std: float, noise: bool):
    """(emb rows, noisy features, next features, row mask) for windows `wins`, padded to the longest.
    The mask keeps the rows data["score"] marks (answer_rows)."""
    n = max(e - s for s, e in wins) - 1
    b, h = len(wins), data["h"].shape[1]
    e_in = torch.zeros(b, n, h, dtype=torch.bfloat16)
    f_in = torch.zeros(b, n, h, dtype=torch.bfloat16)
    f_out = torch.zeros(b, n, h, dtype=torch.bfloat16)
    mask = torch.zeros(b, n, dtype=torch.bool)
    for j, (s, e) in enumerate(wins):
        m = e - s - 1
        e_in[j, :m] = emb[data["ids"][s + 1: e].long()]
        f_in[j, :m] = data["h"][s: e - 1]
        f_out[j, :m] = data["h"][s + 1: e]
        mask[j, :m] = data["score"][s + 1: e]
    if noise:
        f_in = f_in + ((torch.rand_like(f_in, dtype=torch.float32) - 0.5) * 2 * NOISE * std).to(f_in.dtype)
    if "tap_row" in data:  # fused taps: each row's beside f_t, zeros where it has none or drops them
        taps = torch.zeros(b, n, data["tapx"].shape[1], dtype=torch.bfloat16)
        for j, (s, e) in enumerate(wins):
            r = data["tap_row"][s: e - 1].long()
            ok = r >= 0
            taps[j, : e - s - 1][ok] = data["tapx"][r[ok]]
        if noise:
            taps = taps * (torch.rand(b, n, 1) >= TAP_DROP).to(taps.dtype)
        f_in = torch.cat([f_in, taps], -1)
    return e_in, f_in, f_out, mask


def losses(model, w_keep, batch):
    e_in, f_in, f_out, mask = batch
    pos = torch.arange(e_in.shape[1])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(e_in, f_in, pos)
        logits = (out[mask] @ w_keep.T).float()
    with torch.no_grad():
        p = (f_out[mask] @ w_keep.T).float().softmax(-1)
    vloss = F.smooth_l1_loss(out[mask].float(), f_out[mask].float())
    ploss = -(p * logits.log_softmax(-1)).sum(-1).mean()
    return vloss, ploss


@torch.no_grad()
def agreement(model, w_keep, w_full, keep, data, wins, emb) -> dict:
    """Teacher-forced: how often the head's first draft (argmax over the kept tokens) is the target's
    greedy token (argmax of its whole LM head on f_{i+1}), on chat and on code windows."""
    hit = {0: [0, 0], 1: [0, 0]}
    for i in range(0, len(wins), 8):
        e_in, f_in, f_out, mask = batch_of(data, wins[i: i + 8], emb, 0.0, False)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(e_in, f_in, torch.arange(e_in.shape[1]))
            draft = keep[(out[mask] @ w_keep.T).float().argmax(-1)]
            target = (f_out[mask] @ w_full.T).float().argmax(-1)
        kinds = torch.cat([data["kind"][s + 1: e][data["score"][s + 1: e]] for s, e in wins[i: i + 8]]).long()
        for k in (0, 1):
            sel = kinds == k
            hit[k][0] += int((draft[sel] == target[sel]).sum())
            hit[k][1] += int(sel.sum())
    return {name: round(hit[k][0] / hit[k][1], 4) if hit[k][1] else None
            for k, name in ((0, "chat"), (1, "code"))} | {
        "rows": hit[0][1] + hit[1][1]}


CKPT = "eagle-train.pt"  # the training's checkpoint in the pass's folder (resume)
CKPT_EVERY = 300.0  # seconds between two checkpoints


def start_from(init, taps=None) -> tuple[EagleHead, dict]:
    """A head to go on training: a checkpoint of this loop (its weights, optimizer, step and seconds),
    or a trained file (eagle.pt: int8 rows, dequantised). taps: layers the head is to fuse; a head
    without them gets a FusedTaps at 0 (the same head to start with) and a new optimizer."""
    blob = torch.load(init, map_location="cpu", weights_only=False)
    if "state" in blob:
        model = EagleHead(blob["config"])
        model.load_state_dict(blob["state"])
        got = blob
    else:  # a trained file keeps its kept vocabulary and says what it was trained on before
        model, keep = unpack(blob)
        before = (blob.get("report") or {}).get("trained_on")
        got = {"from_file": str(init), "keep": keep, "trained_before": before}
    if taps and list(model.cfg.get("taps") or []) != list(taps):
        if model.cfg.get("taps"):
            raise RuntimeError(f"{init} fuses layers {model.cfg['taps']}, not {list(taps)}")
        fused = EagleHead({**model.cfg, "taps": list(taps)})
        fused.load_state_dict(model.state_dict(), strict=False)
        model, got = fused, {k: v for k, v in got.items() if k != "opt"} | {"fused_from": str(init)}
    return model.requires_grad_(True), got


def train_eagle(pair, folder, *, minutes: float = 30.0, epochs: int = 1, lr: float = 3e-4,
                max_tokens: int | None = None, batch: int = 4, seed: int = 0,
                intermediate: int = 3072, init=None, resume: bool = False, also=None,
                also_times: int = 2, p_weight: float = P_WEIGHT, taps: bool = False) -> tuple[dict, dict]:
    """The head trained on the pass in `folder` (about `minutes`), as a file's dict, and a report.
    also: a second pass (answers.py: the target's own answers), its training windows read `also_times`
    as often as the first pass's; its held-out windows reported apart.
    init: a head to start from (start_from); resume: go on from the folder's checkpoint (CKPT) with
    its optimizer, its step and the minutes it already spent (of `minutes`). A checkpoint is written
    every CKPT_EVERY seconds. p_weight: the soft cross-entropy's weight. taps: fuse the taps' pass
    (taps.py) where the folders have one: rows without it train the head as it reads later drafts."""
    torch.manual_seed(seed)
    target = pair.target
    data, first, (val, train), (also_val, also_train), layers = read_passes(
        pair, folder, max_tokens, also, also_times, taps)
    w_full = head_weight(target.get_output_embeddings()).to(torch.bfloat16)
    emb = target.get_input_embeddings().weight.detach().to(torch.bfloat16)
    std = float(data["h"][: 100_000].float().std())
    ckpt = Path(folder) / CKPT
    init = ckpt if resume and ckpt.is_file() else init
    model, got = start_from(init, layers) if init else (
        EagleHead({**config_of(target, intermediate), **({"taps": list(layers)} if layers else {})}), {})
    keep = got["keep"] if "keep" in got else kept_tokens(first["ids"], pair.tokenizer)  # a file's own
    w_keep = w_full[keep].contiguous()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.95), weight_decay=0.0)
    if "opt" in got:
        opt.load_state_dict(got["opt"])
    total = minutes * 60
    t0, step, seen, log = time.perf_counter() - got.get("seconds", 0.0), got.get("step", 0), 0, []
    saved = began = time.perf_counter()
    bar = progress(epochs * sum(e - s for s, e in train), "training the EAGLE head")
    stopped = "epochs"
    for ep in range(epochs):
        order = torch.randperm(len(train)).tolist()
        for i in range(0, len(order), batch):
            frac = (time.perf_counter() - t0) / total
            if frac >= 1:
                stopped = "minutes"
                break
            schedule(opt, lr, step, frac)
            ws = [train[j] for j in order[i: i + batch]]
            batch_losses = losses(model, w_keep, batch_of(data, ws, emb, std, True))
            log.append(learn(model, opt, *batch_losses, p_weight))
            step += 1
            seen += sum(e - s for s, e in ws)
            bar.update(sum(e - s for s, e in ws))
            if step % 10 == 0:
                v, p = (sum(x) / 10 for x in zip(*log[-10:], strict=True))
                bar.set_postfix_str(f"ep {ep} feat {v:.3f} ce {p:.3f}")
            if time.perf_counter() - saved >= CKPT_EVERY:
                _checkpoint(ckpt, model, opt, step, time.perf_counter() - t0, got, keep)
                saved = time.perf_counter()
        if stopped == "minutes":
            break
    bar.close()
    _checkpoint(ckpt, model, opt, step, time.perf_counter() - t0, got, keep)
    model.eval()
    held = agreement(model, w_keep, w_full, keep, data, val, emb)
    if also_val:  # EAGLE's 0-α: the first draft on the target's own text, every earlier state true
        held["own_answers"] = agreement(model, w_keep, w_full, keep, data, also_val, emb)
    fused = (f"; f_t plus the inputs of the target's layers {model.cfg['taps']} (FusedTaps) on the rows the "
             "target read" if model.cfg.get("taps") else "")
    report = {"design": "EAGLE-1 head: fc([e(x_{t+1}); f_t]) + one decoder layer -> f_{t+1}; the target's "
                        f"LM head restricted to {len(keep)} tokens" + fused,
              "trained_on": (f"{got['trained_before']}; then " if got.get("trained_before") else "")
              + trained_on(folder, first) + own_answers(also_train, also_times) + (
                  "; its first draft of a round also reads what the target's layers "
                  f"{' and '.join(map(str, model.cfg['taps']))} read" if model.cfg.get("taps") else ""),
              "config": model.cfg, "kept_tokens": len(keep),
              "pass_tokens": int(len(first["ids"])),
              "train_windows": len(train), "held_out_windows": len(val), "steps": step,
              "tokens_seen": seen, "epochs_seen": round(seen / max(1, sum(e - s for s, e in train)), 2),
              "train_s": round(time.perf_counter() - t0, 1), "stretch_s": round(time.perf_counter() - began),
              "stopped_by": stopped, "lr": lr, "batch": batch, "p_weight": p_weight,
              "loss_first": mean_losses(log[:10]), "loss_last": mean_losses(log[-10:]),
              "held_out_first_draft_agreement": held, "feature_std": round(std, 4),
              "started_from": got.get("from_file") or ("checkpoint" if got else "scratch")}
    brief = {k: report[k] for k in ("trained_on", "pass_tokens", "held_out_first_draft_agreement")}
    return pack(model, keep, {"report": brief}), report


def read_passes(pair, folder, max_tokens, also, also_times: int, taps: bool):
    """(the rows of the pass and of the answers passes after it, the pass's own ids and kinds, its
    (held-out, training) windows with the answers' training windows read also_times as often, the
    answers' (held-out, training) windows, the taps' layers or None)."""
    data = load_shards(folder, max_tokens)
    data["score"] = answer_rows(data, pair.tokenizer)
    val, train = split(windows_of(data["seg"]))
    first = {k: data[k] for k in ("ids", "kind")}
    also_val, also_train = [], []
    folders = [Path(folder)]
    if also is not None:
        data, also_val, also_train = join_answers(data, also)
        train += also_train * also_times
        folders += [Path(f) for f in (also if isinstance(also, list | tuple) else [also])]
    layers = tap_layers(data, folders, max_tokens) if taps else None
    return data, first, (val, train), (also_val, also_train), layers


def tap_layers(data: dict, folders: list, max_tokens: int | None) -> list[int]:
    """The taps' layers the folders' sidecars hold (taps.py), their rows joined into data (tap_row, tapx)
    in the order the folders' rows are; RuntimeError where none has them or they differ."""
    layers = {tuple(json.loads((f / "meta.json").read_text()).get("taps", {}).get("layers") or ())
              for f in folders} - {()}
    if len(layers) != 1:
        raise RuntimeError(f"--taps needs the taps of one set of layers beside the passes (found "
                           f"{layers or 'none'}): python -m specviz heads taps --data DIR --also DIRS")
    caps = [max_tokens, *[None] * (len(folders) - 1)]
    got = [load_taps(f, cap) for f, cap in zip(folders, caps, strict=True)]
    data["tap_row"], data["tapx"] = join_taps(got)
    if len(data["tap_row"]) != len(data["ids"]):
        raise RuntimeError("the taps' rows do not line up with the passes' rows")
    return list(next(iter(layers)))


def own_answers(train: list, times: int) -> str:
    """The report's words for the answers pass's part, if any."""
    if not train:
        return ""
    return (f"; and {sum(e - s for s, e in train):,} tokens of the target's own answers ({len(train):,} "
            f"prompts and answers, read {times} times as often)")


def split(wins: list, every: int = VAL_EVERY) -> tuple[list, list]:
    """(held-out, training) windows: every `every`-th held out, at most 200."""
    val = wins[every - 1:: every][:200]
    return val, [w for i, w in enumerate(wins) if i % every != every - 1]


# the answers pass's prompts alternate 3 chat to 2 code (period 5): every 25th window would hold out
# chat only (it did, 2026-11-29); every 12th holds out both kinds in their share
ANSWERS_VAL_EVERY = 12


def join_answers(data: dict, also) -> tuple[dict, list, list]:
    """The first pass's data with the rows of the answers passes in `also` (a folder, or a list of them)
    after it, and the answers' (held-out, training) windows. Their rows are scored on the answers only
    (the prompt is given on the page, never drafted); their window ids follow the first pass's."""
    folders = also if isinstance(also, list | tuple) else [also]
    val, train = [], []
    for folder in folders:
        extra = load_shards(Path(folder))
        n = len(data["ids"])
        extra["seg"] = extra["seg"] + int(data["seg"].max()) + 1
        extra["score"] = extra.pop("ans").bool()
        data = {k: torch.cat([data[k], extra[k]]) for k in data}
        v, t = split([(s + n, e + n) for s, e in windows_of(extra["seg"])], ANSWERS_VAL_EVERY)
        val, train = val + v, train + t
    return data, val, train


def schedule(opt, lr: float, step: int, frac: float) -> None:
    """The learning rate: warm-up over the first 30 steps, then linear decay with the time spent (frac)."""
    for g in opt.param_groups:
        g["lr"] = lr * min(1.0, (step + 1) / 30) * max(0.05, 1 - frac)


def learn(model, opt, vloss, ploss, p_weight: float) -> tuple[float, float]:
    """One optimiser step on vloss + p_weight · ploss (gradients clipped at 0.5) -> the two losses."""
    loss = vloss + p_weight * ploss
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    opt.step()
    return float(vloss.detach()), float(ploss.detach())


def _checkpoint(path, model, opt, step: int, seconds: float, got: dict, keep: torch.Tensor) -> None:
    """The loop's state, with the kept vocabulary and what a file it started from had read (a resume
    keeps both, whatever pass it is given)."""
    tmp = path.with_suffix(".tmp")
    torch.save({"config": model.cfg, "state": model.state_dict(), "opt": opt.state_dict(), "step": step,
                "seconds": seconds, "keep": keep, "trained_before": got.get("trained_before")}, tmp)
    tmp.replace(path)


def mean_losses(xs) -> list | None:
    return [round(sum(x) / len(x), 4) for x in zip(*xs, strict=True)] if xs else None

