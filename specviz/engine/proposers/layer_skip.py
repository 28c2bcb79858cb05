"""Layer skip (Draft & Verify / SWIFT, no training): the full target minus a
set of skipped layers drafts; the full target verifies. The skip set comes
from a short measured calibration (specviz.calibration.selfspec), or `skip_layers`."""
from __future__ import annotations

import re

from ...errors import RequestError
from ..layers import decoder_parts, n_layers
from ..proposer import TEXT, Option, check_options, register, target_vocab
from .early_exit import LayerSubsetProposer


def parse_skip(value) -> tuple[int, ...]:
    """'3,5-7' or [3, 5, 6, 7] -> (3, 5, 6, 7)."""
    if isinstance(value, str):
        out = []
        for part in filter(None, re.split(r"[,\s]+", value.strip())):
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", part)
            if not m:
                raise RequestError(f"Skip layers: {part!r} is not a layer number or range like 4-9.")
            lo, hi = int(m[1]), int(m[2] or m[1])
            if hi < lo:
                raise RequestError(f"Skip layers: {part!r} runs backwards (an empty range); write {hi}-{lo}.")
            out.extend(range(lo, hi + 1))
        return tuple(sorted(set(out)))
    try:
        return tuple(sorted({int(i) for i in value}))
    except (TypeError, ValueError):
        raise RequestError(f"Skip layers must be layer numbers, not {value!r}.") from None


def ranges(ids) -> str:
    """(4, 6, 7, 8, 9) -> '4,6-9' (parse_skip's inverse, for the run header)."""
    runs: list[list[int]] = []
    for i in sorted(ids):
        if runs and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _skip_set(value) -> tuple[int, ...]:
    skip = parse_skip(value)
    if any(i < 0 for i in skip):
        raise RequestError("Skip layers are numbered from 0.")
    return skip


OPTIONS = (Option("skip_layers", "Skip layers", "Layers the draft pass skips, numbered from 0, e.g. 4,6-9. "
                  "Blank (default): the calibrated skip set, measured once per pair and cached.",
                  type=TEXT, parse=_skip_set, short="layers skipped", show=ranges, placeholder="e.g. 4,6-9"),)


def check_skip_options(options: dict) -> dict:
    return check_options(OPTIONS, options)


def kept_layers(model, skip) -> tuple[int, ...]:
    n = n_layers(model)
    bad = [i for i in skip if not 0 <= i < n]
    if bad:
        raise RequestError(f"Skip layers {bad} are out of range: this target has layers 0..{n - 1}.")
    kept = tuple(i for i in range(n) if i not in set(skip))
    if not kept:
        raise RequestError(f"That skip set skips all {n} layers: keep at least one for the draft.")
    return kept


# the page's note before a run (issue 71): when this method tends to lose, in plain words
LOSES = (
    "When it tends to lose: a draft step costs most of a full target step (it runs most of the "
    "target's layers, c near 1), so even drafts that pass often do not pay for themselves.")


@register("layer-skip", "layer skip (self)", loses_when=LOSES, order=21, options=OPTIONS,
          description="the target minus a calibrated set of skipped layers drafts (Draft & Verify / SWIFT)")
def _build_layer_skip(pair, req=None):
    decoder_parts(pair.target)
    skip = check_skip_options(dict(getattr(req, "options", None) or {})).get("skip_layers")
    if skip is None:  # calibration/selfspec.resolve_options chooses it above the engine (run/runner.py)
        raise RequestError("layer-skip needs a skip set: set skip_layers, or run it through "
                           "specviz.run.runner, which calibrates one for this pair.")
    return LayerSubsetProposer(pair.target, kept_layers(pair.target, skip),
                               vocab_size=target_vocab(pair.target), name="layer-skip")
