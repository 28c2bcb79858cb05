"""What `python -m specviz gpu-check` measures, one function per figure (cli/gpu_check.py runs them).

Timing: on CUDA, events on the current stream around `calls` back-to-back calls (median of
`repeats`); on a CPU, perf_counter. The models are built here from the configs in configs/ with
random weights and a fixed seed, on the device: no download, no network.
"""
from __future__ import annotations

import json
import statistics
import threading
import time
from pathlib import Path

import torch

from .graphs import cache_len, plain_greedy, speculative_greedy  # noqa: F401 - cache_len: for gpu-check
from .static import StaticModel

CONFIGS = Path(__file__).resolve().parent / "configs"
TARGET_CONFIG = "qwen2.5-coder-1.5b-instruct.json"
DRAFT_CONFIG = "qwen2.5-coder-0.5b-instruct.json"
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

BARRIER_S, RACE_JOIN_S = 60.0, 120.0  # a broken start or a stuck side ends the section, not the check


def _side(work, stream, barrier, out: dict, key: str) -> None:
    """One side in its own thread on its own stream, timed by events on that stream."""
    with torch.cuda.stream(stream):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        barrier.wait(timeout=BARRIER_S)  # a side that failed to start breaks it: no hang
        start.record(stream)
        out[key + "_last"] = work().clone()  # a graph's output buffer: cloned before anyone replays it again
        end.record(stream)
        out[key] = (start, end)


def _together(works: dict, device) -> dict[str, float]:
    streams = {k: torch.cuda.Stream(device) for k in works}
    torch.cuda.synchronize(device)
    barrier = threading.Barrier(len(works))
    out: dict = {}
    threads = [threading.Thread(target=_side, args=(w, streams[k], barrier, out, k))
               for k, w in works.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=RACE_JOIN_S)
    if any(t.is_alive() for t in threads):
        raise TimeoutError(f"a race side ran past {RACE_JOIN_S} s")
    torch.cuda.synchronize(device)
    return {k: out[k][0].elapsed_time(out[k][1]) / 1e3 for k in works}


@torch.no_grad()
def race(target, draft, prompt, steps: int, gamma: int, max_len: int, repeats: int = 3) -> dict:
    """The page's parallel mode on one GPU: the baseline (target 1-token steps) and the speculative
    side (γ draft steps + a γ+1 verify per round, as many tokens' worth of rounds) at once on two
    streams against each alone -> the interference ratio (together ÷ alone, per side). Every
    graph is captured before any thread starts (a capture fails on other threads' CUDA work)."""
    dev = next(target.parameters()).device
    base, ver, dra = (StaticModel(target, max_len), StaticModel(target, max_len), StaticModel(draft, max_len))
    for sm, rows in ((base, 1), (ver, gamma + 1), (dra, 1)):
        sm.run(torch.tensor(prompt, device=dev), 0)
        sm.capture(rows)
    one, block = torch.tensor(prompt[:1], device=dev), torch.tensor(prompt[:gamma + 1], device=dev)
    p, rounds = len(prompt), max(1, steps // (gamma + 1))

    def baseline():
        for _ in range(steps):
            out = base.run(one, p)
        return out

    def speculative():
        for _ in range(rounds):
            for j in range(gamma):
                dra.run(one, p + j)
            out = ver.run(block, p)
        return out

    works = {"baseline": baseline, "speculative": speculative}
    alone = {k: [] for k in works}
    both = {k: [] for k in works}
    for _ in range(repeats):
        for k, w in works.items():
            alone[k].append(_together({k: w}, dev)[k])
        for k, s in _together(works, dev).items():
            both[k].append(s)
    med = {k: (statistics.median(alone[k]), statistics.median(both[k])) for k in works}
    return {"steps": steps, "gamma": gamma, "rounds": rounds,
            **{f"{k}_alone_s": a for k, (a, _) in med.items()},
            **{f"{k}_together_s": b for k, (_, b) in med.items()},
            "interference": {k: b / a for k, (a, b) in med.items()},
            "note": "together ÷ alone per side, each timed by CUDA events on its own stream and thread"}
