"""python -m specviz gpu-check: the whole GPU verdict in one command of a few minutes.

Needs only torch, transformers and accelerate (no gradio, no network, no model download): the
default pair's architectures (engine/gpu/configs/) with random weights made on the GPU, seeded.
In fp16 and bf16 it measures each side's 1-token step (transformers eager, our static cache eager,
and that cache replayed as a CUDA graph), the draft's c, v(k) for k = 1..16, the step against the
floor (weight bytes / measured device-to-device copy bandwidth), a greedy speculative run against
plain (draft = target, α = 1, and a truncated draft: identical tokens required), and the race:
both sides at once on two streams against each alone (the interference ratio). It writes one JSON
(--out) after every section, so a run cut short keeps what it measured, and prints a summary.

Exit codes: 0 measured; 1 measured, but a greedy speculative run's tokens differed from plain's
(the JSON gives the target's logit gap where they part: a near-tie of random weights, or a bug);
3 no CUDA: one line, nothing measured.

--cpu-tiny runs the same code on a CPU with tiny shapes, without the CUDA-only steps (graphs,
streams, events, bandwidth), and says so: the test suite runs it so that this command cannot rot.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from pathlib import Path

NO_CUDA = 3  # exit code: no CUDA device, nothing measured
DIFFERENT = 1  # exit code: measured, but greedy speculative tokens differed from plain's
DTYPES = ("fp16", "bf16")
RACE_STEPS = 64  # the race's baseline steps (the speculative side: as many tokens' worth of rounds)
COPY_MIB = 1024  # the bandwidth copy
CUDA_ONLY = ("CUDA graphs", "two-stream race", "CUDA events", "copy bandwidth and the floor")


def _args(argv):
    ap = argparse.ArgumentParser(prog="python -m specviz gpu-check", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="the JSON (default: <cache>/gpu_check/<date>.json)")
    ap.add_argument("--cpu-tiny", action="store_true",
                    help="tiny shapes on the CPU, CUDA-only steps skipped (what the test suite runs)")
    ap.add_argument("--dtypes", default=None,
                    help="comma-separated among fp16, bf16, fp32 (default: the card's own half type first, "
                         "then the other; --cpu-tiny: bf16)")
    ap.add_argument("--gamma", type=int, default=4, help="draft tokens per round in the speculative runs")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128 (--cpu-tiny: 24)")
    ap.add_argument("--prompt-len", type=int, default=None, help="default 64 (--cpu-tiny: 16)")
    ap.add_argument("--truncated-layers", type=int, default=None,
                    help="layers of the truncated draft (the target's first ones; default a quarter)")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile section")
    ap.add_argument("--no-big", action="store_true", help="skip the 7B shapes")
    ap.add_argument("--skip", default="", help="comma-separated sections not to run (e.g. eager_ways,"
                    "eager_lengths: diagnostics two earlier runs answered), listed as skipped")
    ap.add_argument("--tuned", action="store_true",
                    help="also compile with inductor's coordinate-descent tuning (gpt-fast's setting), "
                         "last. On an H200 (2026-11-28) it failed inside a graph capture and left the "
                         "device unusable for the sections after it")
    ap.add_argument("--budget-s", type=float, default=330.0,
                    help="sections not started by then are skipped (and listed) so the run ends in time")
    args = ap.parse_args(argv)
    defaults = (("new_tokens", 128, 24), ("prompt_len", 64, 16))
    for key, gpu, tiny in defaults:
        if getattr(args, key) is None:
            setattr(args, key, tiny if args.cpu_tiny else gpu)
    return args


def dtype_order(args, half: str | None) -> list[str]:
    """The types to measure, the card's own half type first (what the app runs: measured even if
    the budget runs out before the other)."""
    if args.dtypes:
        return [d.strip() for d in args.dtypes.split(",") if d.strip()]
    if args.cpu_tiny and half is None:
        return ["bf16"]
    return sorted(DTYPES, key=lambda d: d != half)


def _default_out() -> Path:
    from ..paths import cache_root
    return cache_root() / "gpu_check" / f"{datetime.datetime.now(datetime.UTC):%Y-%m-%dT%H%M%S}.json"


def _environment(args, torch, dev, gpu: bool) -> dict:
    import transformers

    from .. import machine
    env = {"date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "torch": torch.__version__, "transformers": transformers.__version__,
           "mode": "cpu-tiny" if args.cpu_tiny else "cuda", "device": str(dev)}
    if not gpu:
        env.update(name=machine.cpu_model(), skipped=[f"{s}: CUDA only, not run on a CPU" for s in CUDA_ONLY])
    else:
        cap = torch.cuda.get_device_capability(dev)
        env.update(name=torch.cuda.get_device_name(dev), capability=list(cap),
                   half_type=machine.half_for_capability(cap), skipped=[],
                   bf16_emulated=tuple(cap) < (8, 0))
    return env


def _side(m, torch, model, prompt, floor_gbs, graphs: bool) -> dict:
    """One model's 1-token step three ways, and against the bandwidth floor."""
    eager, finite = m.eager_step_s(model, prompt)
    max_len = len(prompt) + 32
    static = m.static_step_s(m.StaticModel(model, max_len, graphs=False), prompt)
    out = {"params": sum(p.numel() for p in model.parameters()), "weight_bytes": m.weight_bytes(model),
           "finite_logits": finite, "step_eager_ms": eager * 1e3, "step_static_eager_ms": static * 1e3}
    if graphs:
        out["step_graph_ms"] = m.static_step_s(m.StaticModel(model, max_len, graphs=True), prompt) * 1e3
    if floor_gbs:
        out["floor_ms"] = out["weight_bytes"] / (floor_gbs * 1e9) * 1e3
        best = out.get("step_graph_ms", static * 1e3)
        out["step_over_floor"] = best / out["floor_ms"]
    return out


class Check:
    """The sections in order, the JSON written after each, the budget enforced between them."""

    def __init__(self, args, torch, dev, gpu: bool | None = None):
        # gpu: the CUDA-only sections run (a test sets it on a CPU, under fake CUDA calls)
        self.args, self.torch, self.dev = args, torch, dev
        self.gpu = not args.cpu_tiny if gpu is None else gpu
        self.t0 = time.perf_counter()
        self.out = Path(args.out) if args.out else _default_out()
        self.result = {"environment": _environment(args, torch, dev, self.gpu), "dtypes": {}}
        self.first = True  # the first type measured (the card's own half type) gets the page's sections

    def save(self) -> None:
        self.result["seconds"] = round(time.perf_counter() - self.t0, 1)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.out.write_text(json.dumps(self.result, indent=1, default=float))

    def section(self, where: dict, key: str, fn) -> None:
        """where[key] = fn(), unless the budget is spent (then listed as skipped); errors recorded."""
        if key in self.args.skip.split(","):
            where[key] = {"skipped": "--skip"}
        elif time.perf_counter() - self.t0 > self.args.budget_s:
            where[key] = {"skipped": "over the time budget"}
        else:
            t0 = time.perf_counter()
            try:
                where[key] = fn()
            except Exception as err:  # noqa: BLE001 - one failed figure must not lose the others
                where[key] = {"error": f"{type(err).__name__}: {err}"[:500]}
            # each section's seconds, in the order run: what the next run's budget is planned by
            self.result.setdefault("section_s", []).append([key, round(time.perf_counter() - t0, 1)])
        self.save()

    def run(self) -> dict:
        from ..engine.gpu import measure as m
        torch, args, gpu = self.torch, self.args, self.gpu
        if gpu:
            self.section(self.result, "bandwidth", lambda: m.copy_gbs(self.dev, mib=COPY_MIB))
        gbs = self.result.get("bandwidth", {}).get("copy_gbs")
        names = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
        for name in dtype_order(args, self.result["environment"].get("half_type")):
            r = self.result["dtypes"].setdefault(name, {})
            self._dtype(m, r, names[name], gbs, gpu)
            if gpu:
                torch.cuda.empty_cache()
        self.result["verdict"] = verdict(self.result)
        self.save()
        return self.result

    def _dtype(self, m, r: dict, dtype, gbs, gpu: bool) -> None:
        torch, args = self.torch, self.args
        target = m.build(m.TARGET_CONFIG, self.dev, dtype, seed=0, tiny=args.cpu_tiny)
        draft = m.build(m.DRAFT_CONFIG, self.dev, dtype, seed=1, tiny=args.cpu_tiny)
        prompt = m.prompt_ids(args.prompt_len, target.config.vocab_size)
        self.section(r, "target", lambda: _side(m, torch, target, prompt, gbs, gpu))
        self.section(r, "draft", lambda: _side(m, torch, draft, prompt, gbs, gpu))
        r["c"] = c_values(r)
        self.section(r, "fusion", lambda: _fusion(m, target, draft, prompt, gpu))
        self.section(r, "census", lambda: _census(m, target, draft, prompt, gpu))
        self.section(r, "v", lambda: _curve(m, target, prompt, gpu))
        max_len = m.cache_len(len(prompt), args.new_tokens, args.gamma)
        layers = args.truncated_layers or max(1, target.config.num_hidden_layers // 4)
        self.section(r, "spec_self", lambda: m.spec_vs_plain(
            target, target, prompt, args.new_tokens, args.gamma, max_len, graphs=gpu))
        self.section(r, "spec_truncated", lambda: {**m.spec_vs_plain(
            target, target, prompt, args.new_tokens, args.gamma, max_len, n_layers=layers, graphs=gpu),
            "draft_layers": layers})
        self.section(r, "eager_ways", lambda: m.eager_ways(target, prompt))
        self.section(r, "eager_lengths", lambda: m.eager_lengths(target, prompt_len=2 * len(prompt)))
        if self.first:  # the page's path, once: the app's type
            from ..run.gpu_page import page_checks
            self.section(r, "page", lambda: page_checks(target, draft, prompt, args.new_tokens, args.gamma))
            from ..run.gpu_page import head_checks  # EAGLE's head on the graph path (issue 70)
            self.section(r, "head", lambda: head_checks(target, draft, prompt, args.new_tokens, args.gamma,
                                                        gpu))
        if gpu and self.first and not args.no_big:
            self.section(r, "big", lambda: _big(m, self.dev, dtype, draft, prompt, gbs))
        self.section(r, "race", lambda: m.race(target, draft, prompt, RACE_STEPS, args.gamma,
                                               m.cache_len(len(prompt), RACE_STEPS, args.gamma)))
        if self.first:  # two threads on one device (its watchdog ends a stuck one in 20 s)
            from ..run.gpu_page import page_parallel
            self.section(r, "page_parallel", lambda: page_parallel(target, draft, prompt, args.new_tokens,
                                                                   args.gamma))
        if gpu and self.first and not args.no_compile:  # last: its compiles take the longest
            self.section(r, "compiled", lambda: _compiled(m, target, draft, prompt, gbs, args.gamma))
            if args.tuned:
                self.section(r, "compiled_tuned", lambda: _compiled_tuned(m, target, draft, prompt, gbs))
        self.first = False


def _curve(m, target, prompt, gpu: bool) -> dict:
    sm = m.StaticModel(target, len(prompt) + 32, graphs=gpu)
    t = m.verify_curve(sm, prompt)
    return {"v": {k: s / t[1] for k, s in t.items()}, "ms": {k: s * 1e3 for k, s in t.items()},
            "how": "graph replays" if gpu else "static cache, eager"}


def _floor_ms(model, m, gbs) -> float | None:
    return m.weight_bytes(model) / (gbs * 1e9) * 1e3 if gbs else None


def _compiled(m, target, draft, prompt, gbs, gamma: int | None) -> dict:
    """Inductor's kernels inside our captured graphs: the target's step and verify (gamma None: no
    verify), the draft's step."""
    from ..engine.backends.compiled import inductor
    t0 = time.perf_counter()
    sm = m.StaticModel(target, len(prompt) + 32, compile=inductor)
    step = m.static_step_s(sm, prompt, rows=1)
    out = {"census": {"target": _safely(lambda: m.step_census(sm, prompt))}}
    if gamma is not None:
        verify = m.static_step_s(sm, prompt, rows=gamma + 1)
        out.update(target_verify_ms=verify * 1e3, v=verify / step, verify_rows=gamma + 1)
    dm = m.StaticModel(draft, len(prompt) + 32, compile=inductor)
    d = m.static_step_s(dm, prompt, rows=1)
    out["census"]["draft"] = _safely(lambda: m.step_census(dm, prompt))
    ft, fd = _floor_ms(target, m, gbs), _floor_ms(draft, m, gbs)
    return {"target_step_ms": step * 1e3, **out, "draft_step_ms": d * 1e3, "c": d / step,
            "seconds": time.perf_counter() - t0, "target_over_floor": step * 1e3 / ft if ft else None,
            "draft_over_floor": d * 1e3 / fd if fd else None}


def _safely(fn) -> dict:
    """fn()'s figures, or the error in one line: a diagnostic never costs its section's figures."""
    try:
        return fn()
    except Exception as err:  # noqa: BLE001 - recorded, and the section goes on
        return {"error": f"{type(err).__name__}: {err}"[:300]}


def _census(m, target, draft, prompt, gpu) -> dict:
    """Each side's graph step (joined projections, prompt + 32 positions) against the device time of
    its kernels (measure.step_census): the rest of the step is the gaps between kernels."""
    out = {}
    for name, model in (("target", target), ("draft", draft)):
        sm = m.StaticModel(model, len(prompt) + 32, graphs=gpu)
        step = m.static_step_s(sm, prompt) * 1e3
        c = m.step_census(sm, prompt)
        out[name] = {**c, "step_ms": step, "gaps_ms": step - c["kernel_ms"]}
    return out


def _fusion(m, target, draft, prompt, gpu) -> dict:
    """The graph step with q/k/v and gate/up joined and the norms and rotary folded (engine/gpu/fuse.py,
    the default on CUDA) against joined but unfolded (transformers' norm and rotary modules), at the
    prompt + 32 positions (joined against separate answered on 2026-11-28: 3.36 against 3.79 ms, the
    H200's 1.5B); and at the page's capacity,
    attention reading the whole cache under a mask or the smallest span holding the prompt
    (gpu/static.py's SPANS)."""
    from ..engine.backends.graphs import CAPACITY
    out = {}
    for name, model in (("target", target), ("draft", draft)):
        def ms(n_pos, model=model, **kw):
            return m.static_step_s(m.StaticModel(model, n_pos, graphs=gpu, **kw), prompt) * 1e3
        out[name] = {"joined_ms": ms(len(prompt) + 32, fuse=True),
                     "unfolded_ms": ms(len(prompt) + 32, fuse=True, fold=False),
                     f"joined_{CAPACITY}_whole_ms": ms(CAPACITY, fuse=True, spans=()),
                     f"joined_{CAPACITY}_spans_ms": ms(CAPACITY, fuse=True)}
    return out


def _compiled_tuned(m, target, draft, prompt, gbs) -> dict:
    """The compiled steps again with inductor's coordinate-descent tuning (as gpt-fast compiles)."""
    import torch
    torch._dynamo.reset()
    with torch._inductor.config.patch(coordinate_descent_tuning=True):
        return _compiled(m, target, draft, prompt, gbs, None)  # no verify: the steps' compiles are long


def _big(m, dev, dtype, draft, prompt, gbs) -> dict:
    """Qwen2.5-Coder-7B-Instruct's shapes (random weights): the graph step, floor, v(k) and the
    0.5B draft's c against it; freed afterwards."""
    import torch
    big = m.build(m.BIG_CONFIG, dev, dtype, seed=2)
    try:
        sm = m.StaticModel(big, len(prompt) + 32)
        t = {k: m.static_step_s(sm, prompt, rows=k) for k in (1, 2, 5, 9, 17)}
        d = m.static_step_s(m.StaticModel(draft, len(prompt) + 32), prompt, rows=1)
        floor = _floor_ms(big, m, gbs)
        return {"params": sum(p.numel() for p in big.parameters()), "weight_bytes": m.weight_bytes(big),
                "step_graph_ms": t[1] * 1e3, "floor_ms": floor,
                "step_over_floor": t[1] * 1e3 / floor if floor else None,
                "v": {k: s / t[1] for k, s in t.items()}, "c_draft_0.5b": d / t[1]}
    finally:
        del big
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def c_values(r: dict) -> dict:
    """The draft's step ÷ the target's, each way it was timed."""
    t, d = r.get("target", {}), r.get("draft", {})
    out = {}
    for way in ("eager", "static_eager", "graph"):
        a, b = d.get(f"step_{way}_ms"), t.get(f"step_{way}_ms")
        if a and b:
            out[way] = a / b
    return out


def _within(v, lo, hi):
    return None if v is None else lo <= v <= hi


def _best(r: dict, key: str):
    """The lower of the compiled sections' figure (tuned or not): the page would compile the faster way."""
    got = [r.get(k, {}).get(key) for k in ("compiled", "compiled_tuned")]
    got = [x for x in got if isinstance(x, (int, float))]
    return min(got) if got else None


def verdict(result: dict) -> dict:
    """Issue 58's GPU bars, each True, False, or None (not measured)."""
    out = {}
    for name, r in result["dtypes"].items():
        over = r.get("target", {}).get("step_over_floor") if "step_graph_ms" in r.get("target", {}) else None
        page, race = r.get("page", {}), r.get("race", {})
        self_run = page.get("self", {})
        v = {"graph_step_le_2x_floor": None if over is None else over <= 2.0,
             "c_graph_le_half": _within(r.get("c", {}).get("graph"), 0, 0.5),
             "compiled_step_le_2x_floor": _within(_best(r, "target_over_floor"), 0, 2.0),
             "compiled_c_le_half": _within(_best(r, "c"), 0, 0.5),
             "page_plain_ge_150_tok_s": _within(page.get("draft", {}).get("plain_tok_s"), 150, float("inf")),
             "self_draft_c_0.9_to_1.1": _within(self_run.get("c"), 0.9, 1.1),
             "self_draft_speedup_le_1": _within(self_run.get("shown_speedup"), 0, 1.0),
             "race_identical": race.get("identical_to_alone"),
             "page_race_identical": r.get("page_parallel", {}).get("same_tokens_as_fair"),
             "big_measured": None if "big" not in r else "step_graph_ms" in r["big"],
             "head_c_le_0.15": _within(r.get("head", {}).get("c"), 0, 0.15),
             "eagle_page_identical": r.get("head", {}).get("page", {}).get("identical")}
        out[name] = {k: x for k, x in v.items() if x is not None or name == next(iter(result["dtypes"]))}
    return out


def _ms(v) -> str:
    return "–" if v is None else f"{v:.2f}"


def summary(result: dict) -> list[str]:
    env = result["environment"]
    head = f"gpu-check · {env.get('name')} · torch {env['torch']} · transformers {env['transformers']}"
    if env.get("capability"):
        head += f" · sm {env['capability'][0]}.{env['capability'][1]}, half type {env['half_type']}"
        head += " (bf16 emulated here)" if env.get("bf16_emulated") else ""
    lines = [head]
    if env["mode"] == "cpu-tiny":
        lines.append("CPU, tiny shapes: the code path only; skipped " + ", ".join(CUDA_ONLY))
    bw = result.get("bandwidth", {})
    if "copy_gbs" in bw:
        lines.append(f"device copy bandwidth {bw['copy_gbs']:.0f} GB/s (read + written bytes)")
    for name, r in result["dtypes"].items():
        lines += _dtype_lines(name, r)
    for name, v in result.get("verdict", {}).items():
        lines.append(f"verdict {name}: " + ", ".join(f"{k} {x}" for k, x in v.items()))
    lines.append(f"{result.get('seconds', 0):.0f} s")
    return lines


def _dtype_lines(name: str, r: dict) -> list[str]:
    lines = []
    for side in ("target", "draft"):
        s = r.get(side, {})
        if "step_eager_ms" not in s:
            lines.append(f"[{name}] {side}: {s}")
            continue
        lines.append(f"[{name}] {side} {s['params'] / 1e9:.2f}B step ms: eager {_ms(s['step_eager_ms'])} · "
                     f"static {_ms(s['step_static_eager_ms'])} · graphs {_ms(s.get('step_graph_ms'))} · "
                     f"floor {_ms(s.get('floor_ms'))}"
                     + (f" ({s['step_over_floor']:.2f}x)" if s.get("step_over_floor") else "")
                     + ("" if s["finite_logits"] else " · LOGITS NOT FINITE"))
    lines.append(f"[{name}] c: " + ", ".join(f"{k} {v:.2f}" for k, v in r.get("c", {}).items()))
    v = r.get("v", {}).get("v")
    if v:
        shown = (1, 2, 4, 5, 8, 12, 16)
        lines.append(f"[{name}] v(k): " + " ".join(f"{k}:{v[k]:.2f}" for k in shown if k in v))
    for key in ("spec_self", "spec_truncated"):
        s = r.get(key, {})
        if "identical" in s:
            same = "identical" if s["identical"] else f"DIFFERENT from token {s['first_difference']}"
            lines.append(f"[{name}] {key}: {same}, α {s['alpha']:.2f}, "
                         f"{s['tokens_per_round']:.2f} tokens/round, {s['speedup']:.2f}x plain")
        elif s:
            lines.append(f"[{name}] {key}: {s}")
    lines += _census_lines(name, "census", r.get("census", {}))
    lines += _census_lines(name, "compiled census", r.get("compiled", {}).get("census", {}))
    for side, f in r.get("fusion", {}).items():
        if isinstance(f, dict):
            lines.append(f"[{name}] {side} graph step ms: " + ", ".join(f"{k} {v:.2f}" for k, v in f.items()))
    ways = r.get("eager_ways", {}).get("step_ms")
    if ways:
        lines.append(f"[{name}] eager step ms: " + ", ".join(f"{k} {v:.1f}" for k, v in ways.items()))
    for key in ("self", "draft", "draft_sampled", "parallel"):
        p = r.get("page_parallel", {}) if key == "parallel" else r.get("page", {}).get(key, {})
        if "plain_tok_s" in p:
            lines.append(f"[{name}] page {key}: plain {p['plain_tok_s']:.0f} tok/s, speculative "
                         f"{p['speculative_tok_s']:.0f} tok/s, shown {p['shown_speedup']:.2f}x, "
                         f"c {p['c']:.2f}" + _parting(p))
    call = r.get("page", {}).get("per_call", {})
    if "capture_s" in call:
        lines.append(f"[{name}] page per_call (ZeroGPU's path): {call['graphs']} graphs captured in "
                     f"{call['capture_s']:.2f} s, costs timed in {call['costs_s']:.2f} s (c "
                     f"{call['c']:.2f}), then plain {call['plain_tok_s']:.0f} tok/s, speculative "
                     f"{call['speculative_tok_s']:.0f} tok/s ({call['plain_s']:.2f} s and "
                     f"{call['speculative_s']:.2f} s)")
    elif call:
        lines.append(f"[{name}] page per_call: {call}")
    for key in ("methods", "trees"):
        rows = r.get("page", {}).get(key, {})
        if rows:
            lines.append(f"[{name}] page {key}: " + "; ".join(
                f"{m} " + (f"ERROR {x['error'][:80]}" if "error" in x else
                           f"{'identical' if x['identical'] else 'DIFFERENT'} {x['shown_speedup']:.2f}x"
                           f"{_parting(x)}")
                for m, x in rows.items()))
    for key in ("compiled", "compiled_tuned", "big", "head"):
        if r.get(key):
            figures = ", ".join(f"{k} {v:.2f}" for k, v in r[key].items() if isinstance(v, float))
            lines.append(f"[{name}] {key}: {figures}")
    race = r.get("race", {})
    if "interference" in race:
        lines.append(f"[{name}] race: together ÷ alone " +
                     ", ".join(f"{k} {v:.2f}" for k, v in race["interference"].items()))
    return lines


def _census_lines(name: str, label: str, census: dict) -> list[str]:
    """A line per side: its kernels, their device ms by kind, against the step where it was timed."""
    out = []
    for side, c in census.items():
        if isinstance(c, dict) and "by_kind" in c:
            step = f" in a {c['step_ms']:.2f} ms step" if "step_ms" in c else ""
            out.append(f"[{name}] {label} {side}: {c['kernels']:.0f} kernels, {c['kernel_ms']:.2f} ms of them"
                       f"{step} (" + ", ".join(f"{k} {v['ms']:.2f} ms/{v['kernels']:.0f}"
                                               for k, v in c["by_kind"].items()) + ")")
        elif isinstance(c, dict) and "error" in c:
            out.append(f"[{name}] {label} {side}: {c['error']}")
    return out


def _parting(p: dict) -> str:
    """Where a greedy page run's sides parted, and the target's logit gap there against the type's
    rounding (a tie, or a bug)."""
    gap = p.get("logit_gap_at_difference")
    if not gap:
        return ""
    kind = "a tie" if gap["gap"] <= gap["type_eps"] else "NOT A TIE"
    return (f", parted at token {p['first_difference']}: gap {gap['gap']:.3g} against rounding "
            f"{gap['type_eps']:.3g} ({kind})")


def main(argv=None) -> int:
    args = _args(list(argv or []))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here needs the network: never wait on one
    import torch
    if not args.cpu_tiny and not torch.cuda.is_available():
        print(f"gpu-check: no CUDA device here (torch {torch.__version__}): nothing measured, exit "
              f"{NO_CUDA}; --cpu-tiny runs the same code on tiny CPU shapes", file=sys.stderr)
        return NO_CUDA
    dev = torch.device("cpu" if args.cpu_tiny else "cuda:0")
    if not args.cpu_tiny:  # as the app runs on a GPU (models/gpu_path.py says why)
        from ..models.gpu_path import no_cudnn_attention
        no_cudnn_attention()
    else:  # the code path, not the figures: one short timing each
        from ..engine.gpu import measure
        measure.TIMING.update(calls=1, repeats=2, warmup=1)
    check = Check(args, torch, dev)
    result = check.run()
    print("\n".join(summary(result)))
    print(f"written: {check.out}")
    return DIFFERENT if differs(result) else 0


def differs(result: dict) -> bool:
    """A greedy speculative run whose tokens were not plain's."""
    return any(r.get(k, {}).get("identical") is False for r in result["dtypes"].values()
               for k in ("spec_self", "spec_truncated"))
