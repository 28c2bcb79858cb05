"""python -m specviz heads train [--heads K] [--tokens N] [--epochs E] [--minutes M] [--lr LR]
python -m specviz heads info

Trains Medusa heads for the pair's target by self-distillation and caches them
(cache_root()/heads/<target key>/heads.pt, report.json beside it)."""
from __future__ import annotations

import argparse
import json
import sys
import time

from ..errors import ModelError, RequestError


def _parser() -> argparse.ArgumentParser:
    from ..run.flags import add_pair_args
    ap = argparse.ArgumentParser(prog="python -m specviz heads", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["train", "info"])
    add_pair_args(ap)
    ap.add_argument("--heads", type=int, default=3, help="K heads: tokens t+2..t+K+1 (default 3)")
    ap.add_argument("--tokens", type=int, default=16_000,
                    help="corpus tokens the target reads once (~30 tokens/s for the 1.5B bf16 on 2 cores; "
                         "cached); default 16000")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=15.0, help="time cap of the training loop (default 15)")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch", type=int, default=32, help="positions per step")
    ap.add_argument("--loss", choices=["ce", "mse"], default="ce",
                    help="ce: vs the target's greedy tokens (exact, LM head in the loop); mse: vs its "
                         "logits through EᵀE (much cheaper per step)")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.heads <= 8 or args.tokens < 64:
        print("error: use 1..8 heads and at least 64 tokens", file=sys.stderr)
        return 2
    if args.quantize == "auto":
        args.quantize = "none"  # train on the target's own float weights
    from ..engine.proposers import heads as store
    from ..run.flags import load_from_args
    try:
        pair = load_from_args(args)
        if args.command == "info":
            print(json.dumps({"path": str(store.heads_dir(pair)), "report": store.report(pair)}, indent=1))
            return 0
        from .train import train
        t0 = time.perf_counter()
        heads, report = train(pair, k=args.heads, n_tokens=args.tokens, epochs=args.epochs,
                              minutes=args.minutes, lr=args.lr, batch=args.batch, loss=args.loss)
        report["total_s"] = round(time.perf_counter() - t0, 1)
        path = store.save(pair, heads, report)
    except (RequestError, ModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"path": str(path), **report}, indent=1))
    held = report["held_out"]
    agree = ", ".join(f"head {j + 1}: {a:.1%} (untrained {b:.1%})" for j, (a, b) in
                      enumerate(zip(held["top1"], held["top1_untrained"], strict=True)))
    print(f"held-out top-1 agreement with the target: {agree}", file=sys.stderr)
    return 0
