"""python -m specviz selfspec: the self-speculative settings (early-exit layer, layer-skip set)
calibrated on a pair, printed and cached (calibration/selfspec.py)."""
from __future__ import annotations

import argparse
import json

from ..calibration.selfspec import (
    cache_file,
    cached,
    calibrate_exit_layer,
    calibrate_skip_layers,
    reuse_probe,
)
from ..machine import loadavg
from ..run.flags import add_pair_args, load_from_args


def main(argv=None) -> int:
    """python -m specviz selfspec [--force] [--probe L]: calibrate both methods on the
    default pair (or --target/--draft), print the results (JSON) and cache them."""
    ap = argparse.ArgumentParser(prog="python -m specviz selfspec", description=main.__doc__)
    add_pair_args(ap)
    ap.add_argument("--force", action="store_true", help="recalibrate even if cached")
    ap.add_argument("--only", choices=["early-exit", "layer-skip"], default=None)
    ap.add_argument("--probe", type=int, default=None, help="also time the KV-reuse saving at exit layer L")
    args = ap.parse_args(argv)
    pair = load_from_args(args)
    out = {"load_before": loadavg()}
    if args.force and cache_file(pair).exists():
        data = json.loads(cache_file(pair).read_text())
        for k in [args.only] if args.only else ["early-exit", "layer-skip"]:
            data.pop(k, None)
        cache_file(pair).write_text(json.dumps(data))
    if args.only in (None, "early-exit"):
        out["early-exit"] = cached(pair, "early-exit", calibrate_exit_layer)
    if args.only in (None, "layer-skip"):
        out["layer-skip"] = cached(pair, "layer-skip", calibrate_skip_layers)
    if args.probe:
        out["reuse_probe"] = reuse_probe(pair, args.probe)
    out["load_after"] = loadavg()
    print(json.dumps(out, indent=1))
    return 0
