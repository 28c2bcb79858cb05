"""Command-line flags shared by the CLI, the app, the bench, the heads trainer,
self-speculation calibration and the method race: the model pair, the methods'
declared options, presets. Loading a pair from them lives here too, so none of
those imports the CLI."""
from __future__ import annotations

import argparse

from ..calibration.calibrate import PRECISIONS
from ..engine.proposer import Option
from ..engine.proposers import method_spec
from .request import METHODS, RequestError


def add_pair_args(p: argparse.ArgumentParser) -> None:
    """Model pair options shared by the CLI, the app and the bench."""
    p.add_argument("--pair", default=None, help="registry pair name (default: the embedded offline pair)")
    p.add_argument("--target", default=None, help="target model: local directory or Hub id")
    p.add_argument("--draft", default=None, help="draft model: local directory or Hub id")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--precision", choices=list(PRECISIONS), default="auto",
                   help="what both models run in. fp32/bf16: the exact dequantised weights in that float "
                        "type. Low-bit weights on a CPU (engine/cpu/lowbit.py): w16 fp16 weights, w8 int8 "
                        "weights, w4 int4 groups of 32, w8a8 int8 weights + 7-bit per-token activations, "
                        "w4a8 int4 groups of 32 + 8-bit per-block activations (our own kernel, built "
                        "with gcc at setup); the last two are a different, faster target, shared by "
                        "plain and speculative. auto (default): "
                        "timed at load, cached per pair and machine: on a CPU fp32, bf16 where it runs "
                        "natively, and the low-bit formats; the fastest wins and is named in the output. "
                        "Models under 100M parameters stay fp32; on a GPU its half type")
    p.add_argument("--quantize", choices=["auto", "none", "int8", "draft-int8"], default="auto",
                   help="CPU only, on top of --precision. draft-int8: dynamic int8 weights for the draft "
                        "only (output unchanged); int8: both models (a different, faster target, for both "
                        "sides; needs --precision auto or fp32); auto (default): int8 joins the draft's "
                        "candidates and the fastest measured wins; none: no int8")
    p.add_argument("--draft-vocab", type=int, default=None, metavar="N",
                   help="the draft's output layer keeps the N most frequent tokens of the bundled corpora "
                        "(lossless: the target verifies over its full vocabulary); 0 keeps all. Default: "
                        "32768 on a CPU for vocabularies of 65,536 or more")
    p.add_argument("--engine", choices=["specviz", "vllm"], default="specviz",
                   help="vllm: run both sides on vLLM servers (`bash scripts/setup.sh vllm` once), started "
                        "from .venv-vllm, or the ones given with --vllm-url")
    p.add_argument("--vllm-url", action="append", default=[], metavar="URL",
                   help="with --engine vllm: a running vLLM server (repeat it: a plain one for the baseline "
                        "and one with speculative_config; each is recognised by its /metrics)")
    p.add_argument("--cache", choices=["auto", "dynamic", "static", "graphs"], default="auto",
                   help="KV cache of both models: auto (default): graphs on a CUDA GPU for the Llama family, "
                        "dynamic elsewhere; dynamic; static (preallocated; a rollback moves a pointer); "
                        "graphs (a static cache replayed as CUDA graphs, captured at load; eager on a CPU)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the forwards over a static cache (CUDA graphs on a GPU); the first "
                        "steps compile, which takes a while on a CPU")


def load_from_args(args, progress=None, allow_local_paths=True):
    from ..models import load_pair, resolve_pair
    pair = args.pair if (args.pair or args.target or args.draft) else "default"
    spec = resolve_pair(pair, args.target, args.draft, allow_local_paths=allow_local_paths)
    if pair == "default" and not (args.target or args.draft):
        from ..hosting.spaces import default_pair
        spec = default_pair()  # on a Space without the embedded packages: the same models from the Hub
    if getattr(args, "engine", "specviz") == "vllm":
        from ..hosting.vllm import load_vllm
        return load_vllm(spec, urls=args.vllm_url, device=args.device or "cpu", progress=progress)
    pair = load_pair(spec, device=args.device, progress=progress, quantize=args.quantize,
                     precision=getattr(args, "precision", "auto"),
                     draft_vocab=getattr(args, "draft_vocab", None))
    apply_cache_args(pair, args)
    return pair


def apply_cache_args(pair, args) -> str:
    """--cache/--compile onto both models (baseline, verify and draft use the same kind), except
    that the default (dynamic) leaves a draft step load compiled (calibration/draft_compile.py)."""
    from ..engine.forward import cache_kind, set_cache
    from ..hosting.spaces import ZEROGPU_NO_COMPILE, on_zerogpu
    compile = getattr(args, "compile", False)
    if compile and on_zerogpu():  # ZeroGPU has no torch.compile: say so, run uncompiled
        compile = False
        pair.note = " ".join(n for n in (getattr(pair, "note", ""), ZEROGPU_NO_COMPILE) if n)
    chosen = cache_kind(pair.target)[0]  # what the load chose: graphs on a GPU (models/gpu_path.py)
    kind = getattr(args, "cache", "auto")
    kind = chosen if kind == "auto" else kind
    if kind == "graphs":
        if chosen != "graphs" or compile:
            from ..models.gpu_path import use_graphs
            pair.costs, _ = use_graphs(pair.target, pair.draft, pair.costs, compile=compile)
        return cache_kind(pair.target)[0] + (" + compile" if compile else "")
    kind = "static" if compile else kind
    step = pair.draft_step
    keep = step is not None and step.compiled and kind == "dynamic"  # the draft's measured compiled step
    used = [set_cache(m, kind, compile=compile) for m in (pair.target, pair.draft)
            if m is not None and not (keep and m is pair.draft)]
    return used[0]


def method_flags() -> dict[str, list[tuple[str, Option]]]:
    """The CLI's method settings, from each method's declared options (MethodSpec.options):
    flag name -> the (method, option) pairs that use it, in menu order."""
    flags: dict[str, list[tuple[str, Option]]] = {}
    for method in METHODS:
        for opt in method_spec(method).options:
            if opt.cli:
                flags.setdefault(opt.name, []).append((method, opt))
    return flags


def add_method_args(p: argparse.ArgumentParser) -> None:
    for uses in method_flags().values():
        text = "; ".join(f"{method}: {opt.help}" for method, opt in uses).replace("%", "%%")
        p.add_argument(uses[0][1].flag, default=None, help=text)


def method_options(args) -> dict:
    """-> RunRequest.options (the method's MethodSpec.check_options validates them)."""
    return {k: getattr(args, k) for k in method_flags() if getattr(args, k, None) is not None}


def preset_settings(args) -> tuple[str, int, bool]:
    """(prompt, γ, chat template) from the flags, each falling back to --preset's value."""
    preset = preset_named(args.preset)
    prompt = args.prompt if args.prompt is not None else preset.get("prompt")
    if prompt is None:
        raise RequestError("give --prompt or --preset")
    gamma = args.gamma if args.gamma is not None else preset.get("gamma", 4)
    chat = args.chat if args.chat is not None else preset.get("chat_template", False)
    return prompt, gamma, chat


def preset_named(name: str | None) -> dict:
    if not name:
        return {}
    from ..prompts import load_presets
    by_name = {p["name"]: p for p in load_presets()}
    if name not in by_name:
        raise RequestError(f"unknown preset {name!r}: one of {', '.join(by_name)}")
    return by_name[name]
