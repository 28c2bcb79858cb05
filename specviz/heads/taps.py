"""The fused taps' pass: beside each shard of a feature pass (features.py) or an answers pass (answers.py),
the inputs of a low and a middle layer of the target for every row, the data FusedTaps learns from
(engine/trained/eagle_head.py; EAGLE-3 reads the same layers' inputs, 2 and L // 2).

python -m specviz heads taps --data DIR [--also DIR,DIR] reads each window's ids again through the
target's w4a8 C stack, stopped after the middle layer: half a prompt read, ~390 tokens/s on 2 cores
(Zen 4, 2026-11-30), where the whole pass read 140-210. Writes shard-NNNN.taps.pt (n, 2·H) bf16 beside
shard-NNNN.pt, one at a time (tmp + rename): an interrupted pass resumes at the first shard without one."""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from ..engine.forward import new_cache
from .features import shards_upto, windows_of


def layers_for(target) -> tuple[int, int]:
    """EAGLE-3's low and middle taps, 2 and L // 2 (a target of under 6 layers: 1 and L - 1)."""
    n = int(target.config.num_hidden_layers)
    return (2, n // 2) if n >= 6 else (1, max(1, n - 1))


def sidecar(shard: Path) -> Path:
    return shard.with_name(shard.name.replace(".pt", ".taps.pt"))


@torch.inference_mode()
def read_taps(model, ids: list[int], layers) -> torch.Tensor:
    """(n, len(layers)·H) bf16: the inputs of `layers` for one window read as a prompt; on the w4a8 C
    stack only as far as the last of them, else through the module path with pre-hooks."""
    from ..engine.cpu import kernel_layer, lean_forward
    body = model.model
    structs = lean_forward._structs(body) if lean_forward._stack_serves(body) else None
    boxes = [[] for _ in layers]
    n = len(ids)
    if structs is not None:
        h = body.embed_tokens(torch.tensor([ids])).contiguous()
        cos, sin = body.rotary_emb(h, torch.arange(n).unsqueeze(0))
        top = max(layers)
        cache = new_cache(model, n + 8, dynamic=True)
        if kernel_layer.forward_stack(structs[:top], h, cos[0].contiguous(), sin[0].contiguous(), cache,
                                      taps=list(zip(layers, boxes, strict=True))):
            return torch.cat([b[-1][0] for b in boxes], -1).to(torch.bfloat16)
    hs = [body.layers[i].register_forward_pre_hook(
        lambda m, a, kw, b=b: b.append(a[0] if a else kw["hidden_states"]), with_kwargs=True)
        for i, b in zip(layers, boxes, strict=True)]
    try:
        model(torch.tensor([ids]), use_cache=False)
    finally:
        for handle in hs:
            handle.remove()
    return torch.cat([b[-1][0] for b in boxes], -1).to(torch.bfloat16)


def run_taps(model, folder: Path, layers=None, log=print) -> dict:
    """Sidecars for every shard of the pass in `folder` that has none; meta.json records the layers."""
    from .data import progress
    layers = tuple(layers or layers_for(model))
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text())
    if meta.get("taps", {}).get("layers") not in (None, list(layers)):
        raise RuntimeError(f"{folder} has taps of layers {meta['taps']['layers']}, not {list(layers)}")
    todo = [s for s in meta["shards"] if not sidecar(folder / s["file"]).is_file()]
    bar = progress(sum(s["tokens"] for s in todo), f"taps of layers {list(layers)}")
    t0 = time.perf_counter()
    for s in todo:
        d = torch.load(folder / s["file"], weights_only=True)
        x = torch.cat([read_taps(model, d["ids"][a:b].tolist(), layers) for a, b in windows_of(d["seg"])])
        dst = sidecar(folder / s["file"])
        torch.save(x, dst.with_suffix(".tmp"))
        dst.with_suffix(".tmp").replace(dst)
        bar.update(s["tokens"])
    bar.close()
    got = meta.get("taps", {})
    meta["taps"] = {"layers": list(layers),
                    "seconds": round(got.get("seconds", 0) + time.perf_counter() - t0, 1)}
    meta_path.write_text(json.dumps(meta, indent=1))
    log(f"{folder}: taps of layers {list(layers)} beside {len(meta['shards'])} shards")
    return meta


def load_taps(folder: Path, max_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """For the shards load_shards(folder, max_tokens) reads: (per row the index of its taps' row, -1 for
    none; the taps' rows, None where no shard has a sidecar)."""
    rows, parts, m = [], [], 0
    for s in shards_upto(folder, max_tokens):
        path = sidecar(folder / s["file"])
        if path.is_file():
            x = torch.load(path, weights_only=True)
            rows.append(torch.arange(m, m + len(x), dtype=torch.int32))
            parts.append(x)
            m += len(x)
        else:
            rows.append(torch.full((s["tokens"],), -1, dtype=torch.int32))
    return torch.cat(rows), torch.cat(parts) if parts else None


def join_taps(got: list) -> tuple[torch.Tensor, torch.Tensor]:
    """load_taps' answers of passes joined one after another, as their rows are."""
    rows, parts, m = [], [], 0
    for r, x in got:
        rows.append(torch.where(r >= 0, r + m, r))
        if x is not None:
            parts.append(x)
            m += len(x)
    return torch.cat(rows), torch.cat(parts)
