"""python -m specviz heads data   [--tokens N] [--out DIR]           the feature pass (features.py)
python -m specviz heads answers [--minutes M] [--out DIR] [--raw-code]   the target's own answers (answers.py)
python -m specviz heads taps   [--data DIR] [--also DIR,DIR]   a low and a middle layer's inputs (taps.py)
python -m specviz heads eagle  [--minutes M] [--data DIR] [--also DIR] [--init FILE | --resume] [--taps]
python -m specviz heads medusa [--minutes M] [--heads K] [--also DIR]   Medusa heads on the same pass
python -m specviz heads exit   [--layer L] [--minutes M]    train early-exit's adapter on the same pass
python -m specviz heads accept [--n N] [--kinds eagle,medusa,exit]   held-out acceptance by position
python -m specviz heads all    [--tokens N] [--minutes M] [--medusa-minutes M] [--taps] [--ship]   all of it
python -m specviz heads train  [--heads K] [--tokens N] ...          Medusa heads from a bf16 stdlib pass
python -m specviz heads info

The trained files go to cache_root()/heads/<target key>/ (eagle.pt, heads.pt and their report.json);
`--ship` writes them to assets/drafts/<target key>/ instead, where a fresh clone finds them."""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..errors import ModelError, RequestError

COMMANDS = ("data", "answers", "taps", "eagle", "medusa", "exit", "accept", "all", "train", "info")


def _parser() -> argparse.ArgumentParser:
    from ..run.flags import add_pair_args
    ap = argparse.ArgumentParser(prog="python -m specviz heads", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=COMMANDS)
    add_pair_args(ap)
    ap.add_argument("--heads", type=int, default=3, help="K heads: tokens t+2..t+K+1 (default 3)")
    ap.add_argument("--tokens", type=int, default=None,
                    help="data: tokens the target reads (default 1,000,000; ~330 tokens/s w4a8 on 2 cores); "
                         "train: corpus tokens of the bf16 pass (default 16000); eagle/medusa: at most this "
                         "many of the pass")
    ap.add_argument("--data", "--out", dest="data", default=None,
                    help="the feature pass's folder (default cache_root()/features/<target key>)")
    ap.add_argument("--also", default=None,
                    help="eagle, medusa: answers passes to train on beside --data (heads answers' folders, "
                         "comma-separated), their windows read --also-times as often")
    ap.add_argument("--also-times", type=int, default=2)
    ap.add_argument("--raw-code", action="store_true",
                    help="answers: code tasks only, completed with no chat template (the bench's code task)")
    ap.add_argument("--at-once", type=int, default=1,
                    help="answers: prompts a batched generate answers at once (default 1: the draft's chain)")
    ap.add_argument("--start", type=int, default=0,
                    help="answers: a new folder's first prompt (past the prompts another folder read)")
    ap.add_argument("--p-weight", type=float, default=None,
                    help="eagle: the soft cross-entropy's weight, the feature loss's being 1 "
                         "(default EAGLE-1's 0.1)")
    ap.add_argument("--taps", action="store_true",
                    help="eagle, all: fuse the inputs of a low and a middle layer of the target (heads taps' "
                         "files beside the passes) into the head's first draft of a round")
    ap.add_argument("--layer", type=int, default=6, help="exit: the exit layer L (default 6)")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--minutes", type=float, default=15.0, help="time cap of the training loop (default 15)")
    ap.add_argument("--lr", type=float, default=None)
    ap.add_argument("--batch", type=int, default=32, help="train: positions per step")
    ap.add_argument("--loss", choices=["ce", "mse"], default="ce",
                    help="train: ce vs the target's greedy tokens; mse vs its logits through EᵀE")
    ap.add_argument("--medusa-minutes", type=float, default=8.0, help="all: Medusa's time cap (default 8)")
    ap.add_argument("--init", default=None,
                    help="eagle/all: start from this head (a shipped eagle.pt, or a training checkpoint)")
    ap.add_argument("--resume", action="store_true",
                    help="eagle/all: go on from the pass folder's training checkpoint (eagle-train.pt), "
                         "its minutes counted in --minutes")
    ap.add_argument("--n", type=int, default=10, help="accept: held-out prompts of each kind (default 10)")
    ap.add_argument("--kinds", default="eagle,medusa,exit",
                    help="accept: the trained drafts to measure (default all three)")
    ap.add_argument("--note", default=None,
                    help="eagle/medusa/exit: this stretch in a few words, for the card's table")
    ap.add_argument("--ship", action="store_true",
                    help="eagle/medusa: write into assets/drafts/ (the repo's shipped drafts), not the cache")
    return ap


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if not 1 <= args.heads <= 8 or (args.tokens is not None and args.tokens < 64):
        print("error: use 1..8 heads and at least 64 tokens", file=sys.stderr)
        return 2
    try:
        if args.command in ("data", "answers", "taps", "eagle", "medusa", "exit"):
            return _on_features(args)
        if args.command == "accept":
            return _accept(args)
        if args.command == "all":
            return _all(args)
        return _legacy(args)
    except (RequestError, ModelError, RuntimeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _load(args, precision: str):
    from ..run.flags import load_from_args
    args.precision = precision if args.precision == "auto" else args.precision
    if args.quantize == "auto":
        args.quantize = "none"
    return load_from_args(args)


def _fast_precision() -> str:
    """The target's fastest prompt read here: w4a8 where its kernel runs, else bf16."""
    from ..engine.cpu import lowbit
    return "w4a8" if "w4a8" in lowbit.available() else "bf16"


def _on_features(args) -> int:
    from ..engine.trained import store
    t0 = time.perf_counter()
    # the pass and the exit's layer-L states read the target as it runs here; the heads train on its states
    pair = _load(args, _fast_precision() if args.command in ("data", "answers", "taps", "exit") else "bf16")
    folder = Path(args.data) if args.data else store.features_dir(pair)
    if args.command == "answers":
        from .answers import run_answers
        folder = folder if args.data else folder.with_name("answers-raw" if args.raw_code else "answers")
        meta = run_answers(pair, folder, args.minutes, log=lambda s: print(s, file=sys.stderr),
                           raw_code=args.raw_code, batch=args.at_once, start=args.start)
        print(json.dumps({"folder": str(folder), "tokens": meta.get("tokens", 0),
                          "prompts": meta.get("next_window", 0), "seconds": meta.get("seconds", 0)}))
        return 0
    if args.command == "taps":
        from .taps import run_taps
        for f in [folder, *[Path(x) for x in (args.also or "").split(",") if x]]:
            run_taps(pair.target, f, log=lambda s: print(s, file=sys.stderr))
        return 0
    if args.command == "data":
        from .features import run_pass
        meta = run_pass(pair.target, pair.tokenizer, folder, args.tokens or 1_000_000,
                        log=lambda s: print(s, file=sys.stderr))
        print(json.dumps({"folder": str(folder), "tokens": meta["tokens"], "seconds": meta["seconds"]}))
        return 0
    if args.command == "eagle":
        from .eagle_train import P_WEIGHT, train_eagle
        model, report = train_eagle(pair, folder, minutes=args.minutes, epochs=args.epochs,
                                    lr=args.lr or 6e-4, max_tokens=args.tokens, init=args.init,
                                    resume=args.resume, also=args.also and args.also.split(","),
                                    also_times=args.also_times, p_weight=args.p_weight or P_WEIGHT,
                                    taps=args.taps)
        kind = "eagle"
    elif args.command == "exit":
        from .exit_train import train_exit
        model, report = train_exit(pair, folder, layer=args.layer, minutes=args.minutes, lr=args.lr or 1e-3,
                                   max_tokens=args.tokens)
        kind = "exit"
    else:
        from .medusa_train import train_medusa
        model, report = train_medusa(pair, folder, k=args.heads, minutes=args.minutes, epochs=args.epochs,
                                     lr=args.lr or 1e-3, max_tokens=args.tokens,
                                     also=args.also and args.also.split(","), also_times=args.also_times)
        kind = "medusa"
    report["total_s"] = round(time.perf_counter() - t0, 1)
    if args.note:
        report["note"] = args.note
    path = store.save(pair, kind, model, report, ship=args.ship)
    print(json.dumps({"path": str(path), **report}, indent=1))
    return 0


def _all(args) -> int:
    """The pass (resumed, or as it stands when --tokens is not given and one exists), EAGLE's head,
    Medusa's heads and their held-out acceptance, on one load of the target in its fastest precision
    here (the heads learn the law of the target the page runs: its w4a8 LM head where it has one)."""
    from ..engine.trained import store
    from .eagle_train import train_eagle
    from .features import run_pass
    from .medusa_train import train_medusa
    pair = _load(args, _fast_precision())
    folder = Path(args.data) if args.data else store.features_dir(pair)
    if args.tokens or not (folder / "meta.json").is_file():
        run_pass(pair.target, pair.tokenizer, folder, args.tokens or 1_000_000,
                 log=lambda s: print(s, file=sys.stderr))
    if args.taps:
        from .taps import run_taps
        run_taps(pair.target, folder, log=lambda s: print(s, file=sys.stderr))
    blob, rep = train_eagle(pair, folder, minutes=args.minutes, epochs=args.epochs if args.epochs > 1 else 50,
                            lr=args.lr or 6e-4, init=args.init, resume=args.resume, taps=args.taps)
    print(json.dumps({"eagle": str(store.save(pair, "eagle", blob, rep, ship=args.ship)), **rep}, indent=1))
    blob, rep = train_medusa(pair, folder, k=args.heads, minutes=args.medusa_minutes, epochs=50, lr=1e-3)
    print(json.dumps({"medusa": str(store.save(pair, "medusa", blob, rep, ship=args.ship)), **rep}, indent=1))
    return _accept(args, pair)


def _accept(args, pair=None) -> int:
    """Held-out acceptance of each trained draft found for the target, written into its report."""
    from ..engine.trained import store
    from .acceptance import held_out_prompts, measure
    pair = pair or _load(args, _fast_precision())
    prompts = held_out_prompts(args.n)
    for kind, method in (("eagle", "eagle"), ("medusa", "heads"), ("exit", "early-exit")):
        path = store.find(pair, kind)
        if path is None or kind not in args.kinds.split(","):
            continue
        got = measure(pair, method, prompts=prompts)
        rep = store.report(pair, kind) or {}
        rep["acceptance_by_position"] = {k: v["acceptance"] for k, v in got.items()}
        rep["held_out_runs"] = {"greedy": True, "gamma": 5, "new_tokens": 64,
                                "precision": _fast_precision(), "kept_lm_head": kept_form(pair), **got}
        path.with_name(f"{kind}-report.json").write_text(json.dumps(rep, indent=1))
        print(json.dumps({method: got}, indent=1))
    return 0


def kept_form(pair) -> str:
    """The form the trained drafts' kept LM head runs in beside this target (eagle_head.KEPT_LOWBIT)."""
    from ..engine.trained.eagle_head import KEPT_LOWBIT, lowbit_for
    return KEPT_LOWBIT if lowbit_for(pair.target) else "float"


def _legacy(args) -> int:
    from ..engine.proposers import heads as store
    args.tokens = args.tokens or 16_000
    pair = _load(args, "auto")
    if args.command == "info":
        print(json.dumps({"path": str(store.heads_dir(pair)), "report": store.report(pair)}, indent=1))
        return 0
    from .train import train
    t0 = time.perf_counter()
    heads, report = train(pair, k=args.heads, n_tokens=args.tokens, epochs=args.epochs,
                          minutes=args.minutes, lr=args.lr or 1e-3, batch=args.batch, loss=args.loss)
    report["total_s"] = round(time.perf_counter() - t0, 1)
    path = store.save(pair, heads, report)
    print(json.dumps({"path": str(path), **report}, indent=1))
    held = report["held_out"]
    agree = ", ".join(f"head {j + 1}: {a:.1%} (untrained {b:.1%})" for j, (a, b) in
                      enumerate(zip(held["top1"], held["top1_untrained"], strict=True)))
    print(f"held-out top-1 agreement with the target: {agree}", file=sys.stderr)
    return 0
