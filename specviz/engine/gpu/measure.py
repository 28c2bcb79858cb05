"""What `python -m specviz gpu-check` measures, one function per figure (cli/gpu_check.py runs them).

Timing: on CUDA, events on the current stream around `calls` back-to-back calls (median of
`repeats`); on a CPU, perf_counter. The models are built here from the configs in configs/ with
random weights and a fixed seed, on the device: no download, no network.
"""
from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch

from .graphs import cache_len, drive, plain_greedy, plain_loop, speculative_greedy, speculative_loop  # noqa: F401
from .scheduler import WATCHDOG_S, run_sides
from .static import StaticModel

CONFIGS = Path(__file__).resolve().parent / "configs"
TARGET_CONFIG = "qwen2.5-coder-1.5b-instruct.json"
DRAFT_CONFIG = "qwen2.5-coder-0.5b-instruct.json"
BIG_CONFIG = "qwen2.5-coder-7b-instruct.json"  # the pair for cards of 24 GB or more (issue 58)
# --cpu-tiny: the same architectures shrunk, so the check's own code runs in the suite in seconds
TINY = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=512, max_position_embeddings=1024)
TINY_LAYERS = {TARGET_CONFIG: 4, DRAFT_CONFIG: 2}
DROP = ("_model_name_or_path", "transformers_version", "architectures", "dtype", "torch_dtype")


def config(name: str, tiny: bool = False):
    """A transformers config from configs/ (tiny: shrunk to TINY's shapes)."""
    from transformers import AutoConfig
    d = {k: v for k, v in json.loads((CONFIGS / name).read_text()).items() if k not in DROP}
    if tiny:
        d.update(TINY, num_hidden_layers=TINY_LAYERS[name], max_window_layers=TINY_LAYERS[name])
        d["layer_types"] = d.get("layer_types", ["full_attention"])[: TINY_LAYERS[name]]
        d.update(bos_token_id=0, eos_token_id=1, pad_token_id=0)
        d["initializer_range"] = 0.2  # spread logits: no near-ties among tiny random weights
    return AutoConfig.for_model(d.pop("model_type"), **d)


@torch.no_grad()
def build(name: str, device, dtype, seed: int = 0, tiny: bool = False):
    """The architecture of configs/`name` with random weights made on `device` (seeded)."""
    from transformers import AutoModelForCausalLM
    torch.manual_seed(seed)
    cfg = config(name, tiny)
    with torch.device(device):  # made where it runs: no 1.5B initialised on the host first
        try:
            model = AutoModelForCausalLM.from_config(cfg, dtype=dtype)
        except TypeError:  # a transformers that still calls it torch_dtype
            model = AutoModelForCausalLM.from_config(cfg, torch_dtype=dtype)
    return model.to(device=device, dtype=dtype).eval().requires_grad_(False)  # no-ops unless one was ignored


def weight_bytes(model) -> int:
    """Bytes a batch-1 step reads: every parameter once (a tied matrix once), but the input
    embedding table, of which a step reads one row (unless it is also the output layer)."""
    emb, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    seen = set() if emb.data_ptr() == head.data_ptr() else {emb.data_ptr()}
    total = 0
    for t in model.parameters():
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


# ------------------------------------------------------------------ timing


def cuda(device) -> bool:
    return torch.device(device).type == "cuda"


TIMING = dict(calls=10, repeats=5, warmup=2)  # per_call_s's defaults (gpu-check --cpu-tiny: fewer)


def per_call_s(fn, device, calls: int | None = None, repeats: int | None = None,
               warmup: int | None = None) -> float:
    """Median seconds of one fn() over `repeats` batches of `calls` back-to-back calls."""
    calls, repeats, warmup = (v if v is not None else TIMING[k]
                              for k, v in (("calls", calls), ("repeats", repeats), ("warmup", warmup)))
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if cuda(device):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(calls):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3 / calls)
        else:
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - t0) / calls)
    return statistics.median(times)


def wall_s(fn, device):
    """(fn()'s result, its wall seconds with the device drained before and after)."""
    if cuda(device):
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    out = fn()
    if cuda(device):
        torch.cuda.synchronize(device)
    return out, time.perf_counter() - t0


def prompt_ids(n: int, vocab: int, seed: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab, (n,), generator=g).tolist()


def dynamic_cache(model):
    """transformers' DynamicCache for `model` (its config where the constructor takes one)."""
    from transformers import DynamicCache
    try:
        return DynamicCache(config=model.config)
    except TypeError:  # an older signature
        return DynamicCache()


@torch.no_grad()
def eager_step_s(model, prompt: list[int], **kw) -> tuple[float, bool]:
    """transformers' own forward with its DynamicCache (the engine's eager path today): a 1-token
    step after the prompt -> (seconds, whether the prompt's logits were finite)."""
    dev = next(model.parameters()).device
    cache = dynamic_cache(model)
    logits = model(input_ids=torch.tensor([prompt], device=dev), past_key_values=cache, use_cache=True).logits
    finite = bool(torch.isfinite(logits).all())
    tok = logits[:, -1:].argmax(-1)
    return per_call_s(lambda: model(input_ids=tok, past_key_values=cache, use_cache=True), dev, **kw), finite


@torch.no_grad()
def static_step_s(sm: StaticModel, prompt: list[int], rows: int = 1, **kw) -> float:
    """One forward of `rows` rows after the prompt over the static cache: replayed graph if
    sm.use_graphs, else eager (the same forward)."""
    sm.run(torch.tensor(prompt, device=sm.device), 0)
    sm.capture(rows)
    ids = torch.tensor(prompt[:rows], device=sm.device)
    return per_call_s(lambda: sm.run(ids, len(prompt)), sm.device, **kw)


# a kernel's kind by its name (lower case): the first kind with a matching part
KINDS = (("attention", ("fmha", "flash", "attention", "cudnn", "sdpa", "mem_eff")),
         ("gemm", ("gemm", "gemv", "cutlass", "xmma", "cublas", "matmul", "splitk", "addmm", "linear")),
         ("fused", ("triton",)),
         ("copy", ("memcpy", "memset", "copy", "index_put", "scatter")))


def kind_of(name: str) -> str:
    low = name.lower()
    return next((k for k, parts in KINDS if any(p in low for p in parts)), "other")


@torch.no_grad()
def step_census(sm: StaticModel, prompt: list[int], steps: int = 5) -> dict:
    """Where a 1-row step's device time goes: the step's forward run eagerly (compiled, if sm is; a
    replayed graph runs the same kernels back to back) under the profiler, `steps` times -> per
    step: kernels, their summed device ms, and both by kind (kind_of). Against the graph step's
    time the sum says how much of it is kernels and how much the gaps between them: fewer, fused
    kernels cut the one, faster GEMVs the other. On a CPU (--cpu-tiny) the top-level CPU ops stand
    in for kernels: the code path, not the figures."""
    from torch.profiler import ProfilerActivity, profile
    gpu = cuda(sm.device)
    sm.run(torch.tensor(prompt, device=sm.device), 0)
    ids = torch.tensor([[prompt[0]]], device=sm.device)
    # a tensor of its own, as capture() passes: a compiled forward meets the inputs it was compiled
    # for (a view into sm.positions could fail a guard and compile again, tens of seconds on a GPU)
    pos = torch.arange(len(prompt), len(prompt) + 1, device=sm.device)
    span = sm.span_for(len(prompt) + 1)
    sm._forward(ids, pos, span)  # warm (a compiled forward compiles here, or hits its cache)
    if gpu:
        torch.cuda.synchronize(sm.device)
    with profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            sm._forward(ids, pos, span)
        if gpu:
            torch.cuda.synchronize(sm.device)
    kinds: dict[str, dict] = {}
    for e in prof.events():
        on_device = str(getattr(e, "device_type", "")).endswith("CUDA")
        if (gpu and not on_device) or (not gpu and (on_device or e.cpu_parent is not None)):
            continue
        k = kinds.setdefault(kind_of(e.name), {"kernels": 0, "ms": 0.0})
        k["kernels"] += 1 / steps
        k["ms"] += e.time_range.elapsed_us() / 1e3 / steps
    kinds = {name: {"kernels": round(k["kernels"], 1), "ms": round(k["ms"], 4)} for name, k in kinds.items()}
    return {"kernels": round(sum(k["kernels"] for k in kinds.values()), 1),
            "kernel_ms": round(sum(k["ms"] for k in kinds.values()), 4), "by_kind": kinds,
            "of": "CUDA kernels" if gpu else "top-level CPU ops (--cpu-tiny: the code path only)"}


def verify_curve(sm: StaticModel, prompt: list[int], ks=range(1, 17), **kw) -> dict[int, float]:
    """Seconds of a forward of k rows for each k (v(k) = these / the 1-row one)."""
    return {k: static_step_s(sm, prompt, rows=k, **kw) for k in ks}


def copy_gbs(device, mib: int = 1024, **kw) -> dict:
    """Device-to-device copy bandwidth: (read + written bytes) / time of one copy of `mib` MiB."""
    n = mib * 2**20
    src = torch.empty(n, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    s = per_call_s(lambda: dst.copy_(src), device, **kw)
    return {"bytes_copied": n, "copy_s": s, "copy_gbs": 2 * n / s / 1e9, "counts": "read + written bytes"}


def spec_vs_plain(target, draft_model, prompt, new: int, gamma: int, max_len: int, n_layers=None,
                  graphs=None) -> dict:
    """A greedy speculative run against plain, both over static caches: identical tokens required.
    Graphs are captured and each run made once untimed first: the timed runs are prompt + decode."""
    dev = next(target.parameters()).device
    base = StaticModel(target, max_len, graphs=graphs)
    ver = StaticModel(target, max_len, graphs=graphs)
    dra = StaticModel(draft_model, max_len, n_layers=n_layers, graphs=graphs)
    base.capture(1), ver.capture(gamma + 1), dra.capture(1)
    runs = {"plain": lambda: plain_greedy(base, prompt, new),
            "speculative": lambda: speculative_greedy(ver, dra, prompt, new, gamma)}
    for run in runs.values():
        run()
    (plain, t_plain), (spec, t_spec) = (wall_s(run, dev) for run in runs.values())
    first = next((i for i, (a, b) in enumerate(zip(plain, spec.tokens, strict=True)) if a != b), None)
    tie = None if first is None else tie_gap(target, prompt + plain[:first], plain[first], spec.tokens[first])
    return {"gamma": gamma, "new_tokens": new, "identical": spec.tokens == plain, "first_difference": first,
            "logit_gap_at_difference": tie,
            "alpha": spec.alpha, "tokens_per_round": spec.tokens_per_round, "rounds": len(spec.accepted),
            "plain_s": t_plain, "speculative_s": t_spec, "speedup": t_plain / t_spec,
            "note": "wall time of the prompt read + decode; graphs captured and one untimed run first"}


@torch.no_grad()
def tie_gap(target, prefix: list[int], a: int, b: int) -> dict:
    """Where plain and speculative greedy part: the target's logits for the two tokens after the
    common prefix (one eager forward). A gap within the type's rounding is a near-tie, not a bug."""
    sm = StaticModel(target, len(prefix) + 1, graphs=False)
    row = sm.run(torch.tensor(prefix, device=sm.device), 0)[0, -1].float()
    top = row.max().item()
    return {"plain_token_logit": row[a].item(), "speculative_token_logit": row[b].item(), "max_logit": top,
            "gap": abs(row[a].item() - row[b].item()), "type_eps": torch.finfo(sm.dtype).eps * abs(top)}


# ------------------------------------------------------------------ the race


@torch.no_grad()
def race(target, draft, prompt, new: int, gamma: int, max_len: int, repeats: int = 3,
         watchdog_s: float = WATCHDOG_S, parts=None) -> dict:
    """Both sides of a greedy race over graphs: the baseline (plain_loop) and the speculative side
    (speculative_loop), each alone and then together, driven by one thread on two streams
    (scheduler.run_sides) -> the interference (together ÷ alone, per side) and whether the
    together runs gave each side's alone tokens. Every graph is captured before the first run,
    and each side runs once untimed."""
    base, ver, dra = (StaticModel(target, max_len), StaticModel(target, max_len), StaticModel(draft, max_len))
    base.capture(1), ver.capture(gamma + 1), dra.capture(1)
    loops = {"baseline": lambda: plain_loop(base, prompt, new),
             "speculative": lambda: speculative_loop(ver, dra, prompt, new, gamma)}
    dev = next(target.parameters()).device

    def tokens(v):
        return v if isinstance(v, list) else v.tokens

    first = {k: drive(f()) for k, f in loops.items()}  # untimed: every shape warmed
    ref = {k: tokens(v) for k, v in first.items()}
    alone = {k: [] for k in loops}
    both = {k: [] for k in loops}
    same = True
    for _ in range(repeats):
        for k, f in loops.items():
            vals, secs = run_sides({k: f()}, dev, watchdog_s=watchdog_s, parts=parts)
            alone[k].append(secs[k])
            same &= tokens(vals[k]) == ref[k]
        vals, secs = run_sides({k: f() for k, f in loops.items()}, dev, watchdog_s=watchdog_s, parts=parts)
        for k in loops:
            both[k].append(secs[k])
            same &= tokens(vals[k]) == ref[k]
    med = {k: (statistics.median(alone[k]), statistics.median(both[k])) for k in loops}
    spec = first["speculative"]
    return {"new_tokens": new, "gamma": gamma, "rounds": len(spec.accepted),
            "tokens_per_round": spec.tokens_per_round, "identical_to_alone": same,
            "identical_to_plain": spec.tokens == ref["baseline"],
            **{f"{k}_alone_s": a for k, (a, _) in med.items()},
            **{f"{k}_together_s": b for k, (_, b) in med.items()},
            "interference": {k: b / a for k, (a, b) in med.items()},
            "speedup_alone": med["baseline"][0] / med["speculative"][0],
            "speedup_together": med["baseline"][1] / med["speculative"][1],
            "note": "one scheduler thread, a stream per side, events polled with query(); "
                    "together ÷ alone per side, each side's stream time by CUDA events"}


# ------------------------------------------------------------------ where the eager step goes

EAGER_WAYS = ("bare", "logits_to_keep", "generate_like")


def _eager_kwargs(way: str, p: int, dev) -> dict:
    if way == "bare":  # what gpu-check timed on 2026-11-28
        return {}
    if way == "logits_to_keep":
        return {"logits_to_keep": 1}
    return {"logits_to_keep": 1, "attention_mask": torch.ones((1, p + 1), dtype=torch.long, device=dev),
            "cache_position": torch.tensor([p], device=dev), "position_ids": torch.tensor([[p]], device=dev)}


@torch.no_grad()
def eager_ways(model, prompt: list[int], steps: int = 8, profile: bool = True) -> dict:
    """ms a 1-token step of transformers' forward over a DynamicCache costs when called three ways
    (bare; logits_to_keep; as generate calls it) and generate itself; the profiler's top operators
    (self CPU time) of the bare and generate-like steps: where the eager step's time goes.
    2026-11-28 H200: all alike (launch-bound, ~920 kernels a step); the H100's extra 80 ms was
    cuDNN planning each new key length (eager_lengths)."""
    dev = next(model.parameters()).device
    out, tables = {}, {}
    for way in EAGER_WAYS:
        step, _ = _eager_step(model, prompt, way, dev)
        step(0), step(1)
        _, s = wall_s(lambda st=step: [st(2 + i) for i in range(steps)], dev)
        out[way] = s / steps * 1e3
        if profile and way in ("bare", "generate_like"):
            tables[way] = _top_ops(lambda st=step: [st(2 + steps + i) for i in range(3)], dev)
    ids = torch.tensor([prompt], device=dev)
    gen = lambda n: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n,  # noqa: E731
                                   min_new_tokens=n, do_sample=False, pad_token_id=0)
    gen(4)
    (_, a), (_, b) = wall_s(lambda: gen(8), dev), wall_s(lambda: gen(8 + steps * 2), dev)
    out["generate"] = (b - a) / (steps * 2) * 1e3
    return {"step_ms": out, "top_ops_self_cpu": tables}


def _eager_step(model, prompt: list[int], way: str, dev):
    """A 1-token step after the prompt over a fresh DynamicCache, called `way` -> (step(i), cache)."""
    cache, p = dynamic_cache(model), len(prompt)
    model(input_ids=torch.tensor([prompt], device=dev), past_key_values=cache, use_cache=True)
    tok = torch.tensor([[5]], device=dev)
    return lambda i: model(input_ids=tok, past_key_values=cache, use_cache=True,
                           **_eager_kwargs(way, p + i, dev)), cache


def _top_ops(fn, dev, rows: int = 12) -> list[str]:
    from torch.profiler import ProfilerActivity, profile
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda(dev) else [])
    with profile(activities=acts) as prof:
        fn()
        if cuda(dev):
            torch.cuda.synchronize(dev)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
    return table.splitlines()


@torch.no_grad()
def eager_lengths(model, prompt_len: int = 300, steps: int = 12) -> dict:
    """ms of transformers' eager step over a DynamicCache at a new key length each step (as
    decoding meets them) and at one repeated length, with SDPA's cuDNN backend on and off (CUDA):
    cuDNN plans per shape (models/gpu_path.no_cudnn_attention)."""
    dev = next(model.parameters()).device
    vocab = model.config.vocab_size

    def median_ms(n_prompt: int, fresh: bool) -> float:
        step, cache = _eager_step(model, prompt_ids(n_prompt, vocab, seed=n_prompt), "bare", dev)
        step(0)
        ms = []
        for _ in range(steps):
            if not fresh:
                cache.crop(-(cache.get_seq_length() - n_prompt))
            _, s = wall_s(lambda: step(0), dev)
            ms.append(s * 1e3)
        return statistics.median(ms)

    out = {}
    ways = (True, False) if cuda(dev) else (None,)
    for i, on in enumerate(ways):
        if on is not None:
            torch.backends.cuda.enable_cudnn_sdp(on)
        base = prompt_len + 400 * i
        out["cudnn_on" if on else "cudnn_off" if on is False else "cpu"] = {
            "fresh_lengths_ms": median_ms(base, True), "same_length_ms": median_ms(base + 200, False)}
    if cuda(dev):
        torch.backends.cuda.enable_cudnn_sdp(False)  # what the app sets on a GPU
    return out
