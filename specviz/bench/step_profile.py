"""Where one plain decoding step goes: the weight matmuls vs everything else, per side.

    python -m specviz step-profile [--precision w8a8] [--steps 24] [--context 64] [--json]

Loads the default pair in one precision (both sides), runs `steps` KV-cached one-token
forwards after a `context`-token prefill, and reports per side:
- step: median wall ms of a one-token forward (the plain step);
- matmul: the time inside the weight matmuls of those same steps (every Linear or low-bit twin,
  timed in place by hooks; re-running a matmul alone reads its weights from a warm cache and
  came out 40 % low on the 1.5B, 2026-11-25); where the layers run as two C calls each
  (engine/cpu/kernel_layer.py, w4a8) the hooks cannot see inside, so the same steps are re-run on
  the module path for this column;
- other: step - matmul (norms, rotary, attention, the cache, Python and dispatch);
- bytes: weights read per step (every tensor once, but of the input embedding table only one
  row: a 151,936 x 1536 fp32 table is 0.93 GB held, 6 KB read), and GB/s = bytes / step;
- floor: bytes / the machine's plain-sum read bandwidth (hosting/bandwidth.measure_cpu_read_gbs),
  and step as a fraction of it (the issue's "% of the memory floor").
Numbers are this machine's; run it alone on the cores.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch import nn


def _linears(model) -> list[nn.Module]:
    """The weight matmuls: nn.Linear, our low-bit twins (engine/cpu/lowbit.py) and torch.ao's
    quantised Linear, all leaf modules named *Linear."""
    return [m for m in model.modules() if type(m).__name__.endswith("Linear") and not list(m.children())]


class _MatmulClock:
    """Wall time inside the model's matmul modules (hooks; the CPU forward is synchronous)."""

    def __init__(self, model):
        self.total, self.calls, self._t = 0.0, 0, 0.0
        self.hooks = []
        for m in _linears(model):
            self.hooks += [m.register_forward_pre_hook(self._pre), m.register_forward_hook(self._post)]

    def _pre(self, *_):
        self._t = time.perf_counter()

    def _post(self, *_):
        self.total += time.perf_counter() - self._t
        self.calls += 1

    def remove(self):
        for h in self.hooks:
            h.remove()


def step_bytes(model) -> int:
    """Weight bytes one decoding step reads: every tensor once, the input embedding table
    one row (unless it is also the output layer, which reads it whole)."""
    from ..engine.cpu import lowbit
    from ..hosting.bandwidth import weight_bytes
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and getattr(out, "weight", None) is emb
    # fbgemm's prepacked weights are opaque objects, not tensors: int8 + a scale per row, or fp16
    packed = sum(m.in_features * m.out_features + 4 * m.out_features if isinstance(m, lowbit.W8A8Linear)
                 else 2 * m.in_features * m.out_features for m in model.modules()
                 if isinstance(m, (lowbit.W8A8Linear, lowbit.Fp16Linear)))
    return weight_bytes(model) + packed - (0 if tied else emb.numel() * emb.element_size() - emb[0].nbytes)


@torch.inference_mode()
def profile_side(model, context: int = 64, steps: int = 24, seed: int = 0) -> dict:
    """One side's step split (see the module doc)."""
    from ..engine.cpu import kernel_layer
    from ..engine.forward import crop_cache, forward_logits, new_cache
    vocab = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, min(vocab, 32000), (context + steps + 1,), generator=g).tolist()
    cache = new_cache(model)
    forward_logits(model, ids[:context], cache, 1)
    for i in range(2):  # warm
        forward_logits(model, [ids[context + i]], cache, 1)
    def timed(span):
        clock = _MatmulClock(model)
        times, mm = [], []
        try:
            for i in span:
                clock.total, clock.calls = 0.0, 0
                t = time.perf_counter()
                forward_logits(model, [ids[context + i]], cache, 1)
                times.append(time.perf_counter() - t)
                mm.append(clock.total)
        finally:
            clock.remove()
        return statistics.median(times), statistics.median(mm), clock.calls

    step, matmul, calls = timed(range(2, steps))
    if kernel_layer.covers(model):
        # its layers' Linears run inside two C calls a layer, past the hooks: the split is timed on
        # the module path (the same kernels on the same bytes), the step is what runs
        crop_cache(cache, context + 2)
        with kernel_layer.off():
            _, matmul, calls = timed(range(2, steps))
    nbytes = step_bytes(model)
    return {"step_ms": step * 1e3, "matmul_ms": matmul * 1e3, "other_ms": (step - matmul) * 1e3,
            "matmul_calls": calls, "bytes": nbytes, "gbs": nbytes / step / 1e9}


def report(sides: dict[str, dict], sum_gbs: float | None) -> list[str]:
    lines = ["| side | step ms | matmul ms | other ms | matmul calls | GB/step | GB/s | floor ms "
             "| % of floor |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, r in sides.items():
        floor = r["bytes"] / (sum_gbs * 1e9) * 1e3 if sum_gbs else None
        pct = f"{floor / r['step_ms']:.0%}" if floor else "n/a"
        fl = f"{floor:.1f}" if floor else "n/a"
        lines.append(f"| {name} | {r['step_ms']:.1f} | {r['matmul_ms']:.1f} | {r['other_ms']:.1f} | "
                     f"{r['matmul_calls']} | {r['bytes'] / 1e9:.2f} | {r['gbs']:.1f} | {fl} | {pct} |")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m specviz step-profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--precision", default="w8a8", help="fp32, bf16 or a low-bit format (both sides)")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--lean", choices=("on", "off"), default=None,
                    help="the lean Llama-family decoder (engine/cpu/lean.py) on or off; default: the pair's")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    from ..hosting.bandwidth import measure_cpu_read_gbs
    from ..models import PAIRS, load_pair
    bw = measure_cpu_read_gbs(1.0)
    pair = load_pair(PAIRS["default"], device="cpu", precision=args.precision, quantize="none",
                     draft_vocab=0, lean=None if args.lean is None else args.lean == "on")
    sides = {"target": profile_side(pair.target, args.context, args.steps),
             "draft": profile_side(pair.draft, args.context, args.steps)}
    if args.json:
        print(json.dumps({"precision": pair.precision_label, "sum_gbs": bw["sum_gbs"], "sides": sides}))
    else:
        print(f"{pair.precision_label}; plain-sum read {bw['sum_gbs']:.1f} GB/s, "
              f"{torch.get_num_threads()} threads")
        print("\n".join(report(sides, bw["sum_gbs"])))
    return 0
