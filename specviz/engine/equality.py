"""Greedy equality, honestly: speculative output must equal plain output, but in
bf16 a verify forward of k+1 tokens is not bit-identical to k+1 single steps
(other kernel blocking), so at an exact or near tie the argmax may flip.

compare_greedy() finds the first differing position and the target's top-2
logit gap there, from both runs' own logits (TokenEvent.gap), and calls it a
near-tie only when both gaps are at most NEAR_TIE[precision]; anything else
is a mismatch, i.e. a bug.

Thresholds: bf16 keeps 8 significant bits, so a logit in [16, 32) (the top
logits of the default pair on code, measured 14-30) is a multiple of 0.125;
the two paths round differently in each of 28 layers. 0.5 = 4 bf16 steps
there. fp16 has 11 bits: 4 steps at [16, 32) = 0.0625. In fp32 both paths
should agree to ~1e-4 (summation order only), so 1e-3 is generous and still
catches any real bug: a wrong token there is never within 1e-3 of the top.
"""
from __future__ import annotations

from dataclasses import dataclass

from .events import RoundEvent, TokenEvent

NEAR_TIE = {"bfloat16": 0.5, "float16": 0.0625, "float32": 1e-3}


def near_tie_threshold(precision: str) -> float:
    """The gap below which a flip counts as numerical, for the target's dtype
    ("torch.bfloat16", "float32", ...; an int8 target runs fp32 activations)."""
    for name, thr in NEAR_TIE.items():
        if name in (precision or ""):
            return thr
    return NEAR_TIE["float32"]


@dataclass
class Equality:
    verdict: str  # "identical" | "near-tie" | "mismatch"
    position: int | None = None  # first differing output position (0-based)
    base_token: int | None = None
    spec_token: int | None = None
    gap_base: float | None = None  # the target's top-2 logit gap there, in each run
    gap_spec: float | None = None
    threshold: float = 0.0

    @property
    def ok(self) -> bool:
        return self.verdict != "mismatch"

    @property
    def gap(self) -> float | None:
        gaps = [g for g in (self.gap_base, self.gap_spec) if g is not None]
        return max(gaps) if gaps else None

    def message(self) -> str:
        if self.verdict == "identical":
            return "identical to plain decoding"
        where = f"first difference at token {self.position}"
        if self.gap is None:
            return f"DIFFERENT from plain decoding ({where}, no logit gap recorded): a bug"
        detail = f"{where}, target top-2 logit gap {self.gap:.3g} (near-tie threshold {self.threshold:g})"
        if self.verdict == "near-tie":
            return f"differs from plain decoding at a numerical near-tie ({detail})"
        return f"DIFFERENT from plain decoding ({detail}): a bug, not rounding"


def output_tokens(events) -> list[TokenEvent]:
    """The output tokens of a run's events (plain TokenEvents or RoundEvents)."""
    out = []
    for ev in events:
        if isinstance(ev, RoundEvent):
            out += [t for t in ev.tokens if t.in_output]
        elif isinstance(ev, TokenEvent) and ev.in_output:
            out.append(ev)
    return out


def compare_greedy(base: list[TokenEvent], spec: list[TokenEvent], precision: str = "float32") -> Equality:
    """Compare two greedy outputs token by token (see the module docstring)."""
    thr = near_tie_threshold(precision)
    for i, (b, s) in enumerate(zip(base, spec, strict=False)):
        if b.token_id != s.token_id:
            gaps = [g for g in (b.gap, s.gap) if g is not None]
            near = len(gaps) == 2 and max(gaps) <= thr
            return Equality("near-tie" if near else "mismatch", i, b.token_id, s.token_id, b.gap, s.gap, thr)
    if len(base) != len(spec):  # one stopped early with the same prefix: nothing numerical explains that
        i = min(len(base), len(spec))
        return Equality("mismatch", i, threshold=thr)
    return Equality("identical", threshold=thr)
