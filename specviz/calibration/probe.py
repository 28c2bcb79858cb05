"""A candidate timed on a slice of the model before the whole model is converted to it.

Packing costs more than timing (docs/why.md#probe), and a first calibration packed five. Where a
format loses by 3x, its whole-model timing only repeats what a few layers already say. So each
low-bit candidate is first packed and timed on a slice: the first decoder layers whose weights at 4
bits pass SLICE_BYTES (more than a CPU's last-level cache, so no format runs from cache) and
PROBE_HEAD rows of the output layer. One whose slice scores PROBE_PRUNE times the best slice's is
not packed whole. The margin covers what a slice leaves out (most of the output layer). Nothing is
chosen on a slice: the survivors are timed whole, as before, and the page says what was pruned and
by how much."""
from __future__ import annotations

import copy

from torch import nn

from ..engine.cpu import lowbit

SLICE_BYTES = 64 << 20  # 2x this EPYC's 32 MB L3: 1.5B 3 of 28 layers, 0.5B 10 of 24
PROBE_HEAD = 1024
PROBE_PRUNE = 1.6
# tokens cached before a slice's timed forwards: the same for every format, and each slice reads them
# first (100, the whole model's context, made a 1-thread prefill of a bf16-activation slice cost more
# than its timed steps)
CONTEXT = 16


def _layer_bytes(layer: nn.Module) -> float:
    return sum(m.weight.numel() for m in layer.modules() if isinstance(m, nn.Linear)) / 2


def sliced(model) -> nn.Module | None:
    """The model's first layers (see SLICE_BYTES) and PROBE_HEAD rows of its output layer, sharing
    their tensors with it; None for a model without a `model.layers` decoder stack, or one so small
    that the slice would be all of it (then timing it whole costs no more)."""
    body = getattr(model, "model", None)
    layers = getattr(body, "layers", None)
    head = model.get_output_embeddings()
    w = getattr(getattr(head, "proj", head), "weight", None)  # vocab_trim.TrimmedHead keeps a proj
    if not isinstance(layers, nn.ModuleList) or not len(layers) or w is None or w.dim() != 2:
        return None
    k = max(1, int(-(-SLICE_BYTES // max(_layer_bytes(layers[0]), 1))))
    if k >= len(layers):
        return None
    part, top = copy.copy(body), copy.copy(model)
    part._modules, top._modules = dict(body._modules), dict(model._modules)
    part.layers = nn.ModuleList(list(layers)[:k])
    top.model = part
    top.config = part.config = copy.copy(model.config)
    top.config.num_hidden_layers = k
    small = nn.Linear(w.shape[1], min(PROBE_HEAD, w.shape[0]), bias=False)
    small.weight = nn.Parameter(w[:small.out_features], requires_grad=False)
    top.set_output_embeddings(small)
    return top


def prune(model, cands: list[str], time, score, hope: float | None = None,
          make=None) -> tuple[list[str], dict]:
    """(the candidates worth converting whole, what their slices said: {"layers": k, "scores": {format:
    s}, "pruned": {format: ratio}}). time(model, enough) -> timings, stopping early once
    enough(timings so far); score(timings, partial or not) -> s, a lower bound when partial. hope:
    a draft's compile factor, given to the formats that would compile (calibrate._compiled_draft).
    make(slice, format) -> the slice in a float or int8 format (calibrate.convert on a copy): with
    it the float candidates are sliced too, so one that loses is never held whole (the 1.5B in
    fp32 is 7.1 GB, in bf16 3.5: a background calibration beside the serving pair peaked at
    16.7 GB, issue 41). No low-bit candidate, or fewer than two candidates: nothing probed."""
    from . import draft_compile
    low = [p for p in cands if p in lowbit.FORMATS or make is not None]
    part = sliced(model) if len(low) > 1 and any(p in lowbit.FORMATS for p in low) else None
    if part is None:
        return cands, {}
    scores, hopes, full = {}, {}, {}
    for p in low:
        twin = lowbit.lowbit_copy(part, p) if p in lowbit.FORMATS else make(part, p)
        hopes[p] = hope if hope and draft_compile.unwanted(twin) is None else 1.0
        behind = lambda t: bool(full) and score(t) / hopes[p] > PROBE_PRUNE * min(full.values())  # noqa: B023, E731
        t = time(twin, behind)
        scores[p] = score(t)
        if not behind(t):
            full[p] = scores[p]
        del twin
    best = min(full.values())
    out = {p: s / best for p, s in scores.items() if s / hopes[p] > PROBE_PRUNE * best}
    return [p for p in cands if p not in out], {"layers": part.config.num_hidden_layers, "scores": scores,
                                                 "pruned": out, "partial": sorted(set(scores) - set(full))}


def note(side: str, probed: dict) -> str:
    """' (target not timed whole: w8 3.6x, w4 3.4x w4a8's time on 3 layers)' or ''."""
    if not probed.get("pruned"):
        return ""
    best = min((p for p in probed["scores"] if p not in probed["pruned"]), key=probed["scores"].get)
    part = probed.get("partial", ())  # timed until behind: their ratio is a lower bound
    ratios = ", ".join(f"{p} {'>' if p in part else ''}{r:.1f}x"
                       for p, r in sorted(probed["pruned"].items(), key=lambda x: x[1]))
    return f" ({side} not timed whole: {ratios} {best}'s time on {probed['layers']} layers)"
