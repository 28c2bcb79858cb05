"""The page's own decode path, measured by gpu-check on token ids, without gradio: both sides on
the graph backend (models/gpu_path.py), the engines and the race exactly as the page calls them
(run/race.py), and the figures the page would show (engine/metrics.run_stats)."""
from __future__ import annotations

import time
from types import SimpleNamespace

import torch

from ..engine.events import RunSummary
from ..engine.metrics import run_stats
from ..engine.pair import OURS
from .race import RaceInfo, race
from .request import RunRequest

# each tried once (self-speculation calibrates on text first: its eager fallback is a CPU test)
CHAIN = ("draft", "adaptive", "lookup", "suffix", "hybrid", "staged")
# run eagerly over a dynamic cache beside the graphs (the page says so): each tried once, on fewer tokens
# (an eager step cost 20.7 ms on the 2026-11-28 H200), for its tokens and that it runs on a GPU at all
TREES = ("tree", "hybrid-tree", "suffix-tree", "lookahead")
TREE_TOKENS = 32


class IdTokenizer:
    """Text for token ids (random weights have no tokenizer to speak of): "<id>"."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(f"<{i}>" for i in ids)

    def __len__(self):
        return 1 << 20


def page_pair(target, draft):
    """The Pair protocol's fields (engine/pair.py) for two loaded models."""
    spec = SimpleNamespace(name="gpu-check", label="random weights", target="target", draft="draft")
    return SimpleNamespace(target=target, draft=draft, tokenizer=IdTokenizer(), spec=spec,
                           device=next(target.parameters()).device, dtype=next(target.parameters()).dtype,
                           eos_ids=[], precision_label="", precision_note="", quantize=None, costs=None,
                           calibration="", note="", unmeasured=(), baseline_pair=None, draft_step=None,
                           engine=OURS, has_chat_template=False, max_positions=None, close=lambda: None)


def _difference(pair, prompt, base, spec, temperature: float) -> dict:
    """Where a greedy run's two sides part: the target's logits for both tokens there (a gap within
    the type's rounding is a near-tie among random weights, read through two kernels; a wide one is a
    bug). Sampled runs differ by design: nothing."""
    a, b = base.token_ids, spec.token_ids
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), None)
    if first is None or temperature > 0:
        return {"first_difference": first}
    from ..engine.gpu.measure import tie_gap
    return {"first_difference": first,
            "logit_gap_at_difference": tie_gap(pair.target, list(prompt) + a[:first], a[first], b[first])}


def shown(pair, req, prompt, mode: str = "fair") -> dict:
    """One race as the page runs it -> what the page would show (and the tokens)."""
    info = RaceInfo(mode)
    out = {s: ev for s, ev in race(pair, req, prompt, mode, info=info) if isinstance(ev, RunSummary)}
    base, spec = out["baseline"], out["speculative"]
    st = run_stats(spec, base, pair.costs)
    return {"mode": mode, "method": req.method, "gamma": req.gamma, "temperature": req.temperature,
            "plain_tok_s": base.tokens_per_s, "speculative_tok_s": spec.tokens_per_s,
            "shown_speedup": st.speedup, "c": st.c, "c_basis": st.c_basis, "v": st.verify_cost,
            "alpha": st.alpha,
            "tokens_per_round": st.tau, "plain_s": base.elapsed, "speculative_s": spec.elapsed,
            "prompt_read_s": {"baseline": base.prefill, "speculative": spec.prefill},
            "identical": base.token_ids == spec.token_ids,
            **_difference(pair, prompt, base, spec, req.temperature), "wall_s": info.wall,
            "path": spec.extra.get("path", ""), "_tokens": (base.token_ids, spec.token_ids)}


def _clean(d: dict) -> dict:
    return {k: v for k, v in d.items() if not k.startswith("_")}


@torch.no_grad()
def page_checks(target, draft, prompt: list[int], new: int, gamma: int) -> dict:
    """The page's path: draft = target (c must come out ~1, the speedup <= 1), the real-size draft,
    sampling, and every chain method's greedy tokens against plain's (the tree and Jacobi methods' too,
    eager beside the graphs, on fewer tokens)."""
    from ..engine.costs import MAX_VERIFY_TOKENS, CostModel
    from ..models.gpu_path import use_graphs
    # as a load does: graphs captured, then the costs timed on them (the hybrid and auto γ price by them)
    untimed = CostModel(plain_step_s=1.0, verify_s=(1.0,) * MAX_VERIFY_TOKENS, draft_step_s=1.0)
    t0 = time.perf_counter()
    costs, note = use_graphs(target, draft, untimed)
    load_s = time.perf_counter() - t0  # the graphs' captures (every size and span) and the cost timing
    greedy = RunRequest(prompt="", method="draft", gamma=gamma, max_new_tokens=new, temperature=0.0)
    same = page_pair(target, target)
    shown(same, greedy, prompt)  # first runs: the pools' third cache is captured here, untimed
    r = {"load_costs": {"plain_step_ms": costs.plain_step_s * 1e3, "c": costs.c, "load_s": load_s,
                        "v": {k: costs.verify_cost(k) for k in (1, 4, 8, 16)}, "note": note},
         "self": _clean(shown(same, greedy, prompt))}
    pair = page_pair(target, draft)
    pair.costs = costs
    shown(pair, greedy, prompt)
    fair = shown(pair, greedy, prompt)
    r["draft"] = _clean(fair)
    sampled = RunRequest(prompt="", method="draft", gamma=gamma, max_new_tokens=new, temperature=1.0,
                         seed=1)
    r["draft_sampled"] = _clean(shown(pair, sampled, prompt))
    r["methods"] = _methods(pair, prompt, CHAIN, new, gamma)
    r["trees"] = _methods(pair, prompt, TREES, min(new, TREE_TOKENS), gamma)
    r["per_call"] = per_call(target, draft, prompt, new, gamma)
    return r


def per_call(target, draft, prompt: list[int], new: int, gamma: int) -> dict:
    """A ZeroGPU call's path on this card: fresh graph pools (a forked process has none), the call's
    preparation (models/gpu_path.for_this_call: its graphs captured, the costs timed on them), then
    that greedy race -> the preparation's seconds against what the race shows."""
    from ..engine.backends.graphs import Graphs
    from ..engine.kvcache import runtime
    from ..models.gpu_path import for_this_call
    saved = [(m, runtime(m).backend, runtime(m).sizes) for m in (target, draft)]
    try:
        for m in (target, draft):
            runtime(m).backend = Graphs()
        pair = page_pair(target, draft)
        made, capture_s, costs_s = for_this_call(pair, len(prompt) + new + gamma + 1)
        req = RunRequest(prompt="", method="draft", gamma=gamma, max_new_tokens=new, temperature=0.0)
        m = shown(pair, req, prompt)
        return {"graphs": made, "capture_s": capture_s, "costs_s": costs_s, "c": pair.costs.c,
                **{k: m[k] for k in ("plain_tok_s", "speculative_tok_s", "shown_speedup", "identical",
                                     "plain_s", "speculative_s")}}
    except Exception as err:  # noqa: BLE001 - its own row
        return {"error": f"{type(err).__name__}: {err}"[:300]}
    finally:
        for m, b, sizes in saved:
            runtime(m).backend, runtime(m).sizes = b, sizes


def _methods(pair, prompt, methods, new: int, gamma: int) -> dict:
    """Each method's greedy race as the page runs it: its tokens against plain's, what it shows, the
    path it ran on; a method that fails is its own row."""
    out = {}
    for method in methods:
        req = RunRequest(prompt="", method=method, gamma=gamma, max_new_tokens=new, temperature=0.0,
                         gamma_auto=method in ("draft", "hybrid"))  # auto γ: priced by the load's costs
        try:
            m = shown(pair, req, prompt)
            # where a greedy run parted from plain, the target's logit gap there (a bf16 tie, or a bug: the
            # 2026-11-29 H200 run saw the three tree methods part, and could not say which)
            out[method] = {k: m[k] for k in ("identical", "shown_speedup", "tokens_per_round", "plain_tok_s",
                                             "speculative_tok_s", "path", "first_difference",
                                             "logit_gap_at_difference") if k in m}
        except Exception as err:  # noqa: BLE001 - one method's failure is its own row
            out[method] = {"error": f"{type(err).__name__}: {err}"[:300]}
    return out


@torch.no_grad()
def page_parallel(target, draft, prompt: list[int], new: int, gamma: int) -> dict:
    """The page's parallel race (a thread and a stream per side, run/race.py) against its fair race
    (each side timed alone): the same tokens, and the interference (parallel ÷ fair, per side)."""
    greedy = RunRequest(prompt="", method="draft", gamma=gamma, max_new_tokens=new, temperature=0.0)
    pair = page_pair(target, draft)
    fair = shown(pair, greedy, prompt)
    par = shown(pair, greedy, prompt, "parallel")
    return {**_clean(par), "same_tokens_as_fair": par["_tokens"] == fair["_tokens"],
            "interference": {"baseline": par["plain_s"] / fair["plain_s"],
                             "speculative": par["speculative_s"] / fair["speculative_s"]}}


HEAD_KEEP = 32768  # the kept tokens of the shipped head's LM head (heads/eagle_train.KEEP)


@torch.no_grad()
def head_checks(target, draft, prompt: list[int], new: int, gamma: int, gpu: bool) -> dict:
    """EAGLE's head on the graph path (engine/gpu/head.py), with a random head of the shipped one's
    shape (one layer, its MLP 3072 wide, the LM head over 32,768 kept tokens), saved as a trained file
    in a scratch cache: the head's 1-row step as the load times it (its graph replayed; eager beside
    it) against the target's graph step -> c; then eagle's greedy race as the page runs it (its tokens
    against plain's; a random head drafts what it drafts, so τ says little)."""
    import os
    import tempfile

    from ..engine.gpu import measure as m
    from ..engine.proposers.eagle import load_drafter
    from ..engine.trained import store
    from ..engine.trained.eagle_head import EagleHead, config_of, pack
    from ..models.gpu_path import use_graphs
    torch.manual_seed(3)
    vocab = target.get_output_embeddings().out_features
    keep = torch.randperm(vocab)[:min(HEAD_KEEP, vocab)].sort().values
    blob = pack(EagleHead(config_of(target)), keep)
    saved = os.environ.get("SPECVIZ_CACHE")
    with tempfile.TemporaryDirectory() as scratch:
        os.environ["SPECVIZ_CACHE"] = scratch
        try:
            use_graphs(target, draft, None)  # the page's graph path (captured at load): the head's too
            pair = page_pair(target, draft)
            store.save(pair, "eagle", blob, {"random": True})
            d = load_drafter(pair)  # timed as a load does (each step synchronised): its graphs on a GPU
            eager = d.time_step(target.device)
            step = m.static_step_s(m.StaticModel(target, len(prompt) + 32, graphs=gpu), prompt) * 1e3
            head = _head_step_ms(m, d, target, len(prompt))  # back to back, as the target's step is timed
            out = {"head_step_ms": head, "head_step_load_ms": d.step_s * 1e3,
                   "head_step_eager_ms": eager * 1e3, "target_step_ms": step, "c": head / step,
                   "c_load": d.step_s * 1e3 / step,
                   "how": "graph replays" if gpu else "eager (a CPU)",
                   "graphs": sorted(f"{n}x{w}" for st in d.statics for (n, w) in st.graphs)}
            req = RunRequest(prompt="", method="eagle", gamma=gamma, max_new_tokens=new, temperature=0.0)
            race = shown(pair, req, prompt)
            out["page"] = {k: race[k] for k in ("identical", "shown_speedup", "tokens_per_round", "alpha",
                                                "plain_tok_s", "speculative_tok_s", "c", "path")}
            return out
        finally:
            if saved is None:
                os.environ.pop("SPECVIZ_CACHE", None)
            else:
                os.environ["SPECVIZ_CACHE"] = saved


def _head_step_ms(m, d, target, rows: int) -> float:
    """The head's 1-row step (its graph on a GPU, the kept LM head included) after `rows` read rows,
    timed back to back as measure.static_step_s times the target's (events around a batch of calls)."""
    from ..engine.backends.graphs import CAPACITY
    st = d.take_static(CAPACITY, graphs=target.device.type == "cuda")
    try:
        return m.per_call_s(st.step_after(rows), st.device) * 1e3
    finally:
        d.give_static(st)
